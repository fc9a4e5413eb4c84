"""The (batch, seq) sweep of the dynamic-shape benchmarks: bench_gpu.cpp's bert_sweep_shapes LCG,
shared by bench/gpu/bert_dynamic.py and bench/cpu/bert_dynamic.py so that both time the same
sequence of shapes."""


def sweep_shapes(calls, max_batch=32, max_seq=512):
    """`calls` shapes: batch in 1..max_batch, sequence in 16..max_seq."""
    state, out = 2026, []
    mask = (1 << 64) - 1

    def nxt():
        nonlocal state
        state = (state * 6364136223846793005 + 1442695040888963407) & mask
        return state >> 33

    for _ in range(calls):
        b = 1 + nxt() % max_batch
        out.append((b, 16 + nxt() % (max_seq - 15)))
    return out
