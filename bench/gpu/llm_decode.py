#!/usr/bin/env python3
"""Decoding large language models on one GPU: kiln.llm against Hugging Face transformers, in one
process, on Llama-family models with random bf16 weights (no download):

  tinyllama-1.1b   TinyLlama-1.1B's shape (22 layers, 2048 wide, 32 heads over 4 key heads)
  llama3-8b        Llama-3-8B's shape (32 layers, 4096 wide, 32 heads over 8 key heads, 128K vocab)

Each is made with transformers (random init), saved with save_pretrained (bf16 safetensors) and
loaded by kiln from that directory. Figures, each beside its peers and the ratio to the best:

  decode ms/token, batch 1      kiln; HF generate (eager, dynamic cache); HF generate with a
                                static cache compiled by generate itself (torch.compile,
                                mode="reduce-overhead")
  decode tokens/s, batch 16, 64 (8B) the same peers
  prefill 2,048 tokens (8B)     kiln's first token; one HF forward with SDPA (logits of the last)
  time to first token           load + prefill 512: kiln.llm.load + generate(1 token); HF
                                from_pretrained + generate(1 token)

The decode roofline is the bytes one step must read (the weights, and the KV cache up to the
positions the step attends over) over the copy bandwidth measured here (a 4 GiB device copy).
Memory: kiln's weights and cache, and the device memory its load took.

    llm_decode.py [--models tinyllama-1.1b,llama3-8b] [--device cuda] [--new 128] [--prompt 128]
                  [--no-compile] [--dir /tmp/kiln_llm_bench]
    llm_decode.py --models tiny --device cpu      # a smoke run of the script on a CPU
    llm_decode.py --models small --device cpu --dtype float32 --new 32   # a 130M model on a CPU
"""
import argparse
import os
import time

SHAPES = {
    "tinyllama-1.1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                           num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                           max_position_embeddings=2048, rms_norm_eps=1e-5),
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5),
    "small": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                  num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=2048),
    "tiny": dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096),
}


def log(*a):
    print(*a, flush=True)


class Bench:
    def __init__(self, a):
        import torch

        self.a, self.torch = a, torch
        self.cuda = a.device.startswith("cuda")
        self.rows = []

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def copy_bandwidth(self):
        t = self.torch
        n = (4 << 30) // 2 if self.cuda else (256 << 20) // 2
        x = t.empty(n, dtype=t.bfloat16, device=self.a.device)
        y = t.empty_like(x)
        best = float("inf")
        for _ in range(5):
            self.sync()
            t0 = time.perf_counter()
            y.copy_(x)
            self.sync()
            best = min(best, time.perf_counter() - t0)
        del x, y
        return 2 * n * 2 / best  # read and write

    def make(self, name):
        import transformers

        t = self.torch
        d = os.path.join(self.a.dir, f"{name}-{self.a.dtype}")
        cfg = transformers.LlamaConfig(**SHAPES[name], bos_token_id=1, eos_token_id=2)
        t.manual_seed(0)
        dtype = getattr(t, self.a.dtype)
        with t.device(self.a.device):
            model = transformers.LlamaForCausalLM(cfg).to(dtype).eval()
        if not os.path.exists(os.path.join(d, "config.json")):
            t0 = time.perf_counter()
            model.save_pretrained(d)
            log(f"{name}: saved {d} in {time.perf_counter() - t0:.1f} s")
        return model, d

    def hf_decode(self, model, ids, new, static):
        """(prefill s, decode s per token) of HF generate, greedy, best of 2 after a warm-up."""
        t = self.torch
        kw = dict(do_sample=False, pad_token_id=0)
        if static:
            import transformers

            kw["cache_implementation"] = "static"
            cc = transformers.CompileConfig(mode="reduce-overhead", fullgraph=True)
            cc._compile_all_devices = True  # (generate compiles on CUDA only unless told)
            kw["compile_config"] = cc

        def run(n):
            self.sync()
            t0 = time.perf_counter()
            out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
            self.sync()
            return time.perf_counter() - t0, out

        with t.no_grad():
            run(new)  # warm-up (compiles)
            first = min(run(1)[0] for _ in range(2))
            total, out = min((run(new) for _ in range(2)), key=lambda r: r[0])
        return first, (total - first) / (new - 1), out[:, ids.shape[1]:]

    def free(self):
        return self.torch.cuda.mem_get_info()[0] if self.cuda else 0

    def row(self, figure, kiln_v, peers, unit, lower_better=True, roof=None):
        best = [v for v in peers.values() if v is not None]
        if best:
            b = min(best) if lower_better else max(best)
            ratio = kiln_v / b if lower_better else b / kiln_v
        else:
            ratio = float("nan")
        peer_s = ", ".join(f"{k} {v:.3f}" if v is not None else f"{k} failed"
                           for k, v in peers.items())
        roof_s = f"; {roof:.0%} of the roofline" if roof is not None else ""
        log(f"| {figure} | kiln {kiln_v:.3f} {unit} | {peer_s} | {ratio:.2f}x the best's time"
            f"{roof_s} |")
        self.rows.append((figure, kiln_v, peers, ratio, roof))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="tinyllama-1.1b,llama3-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--dtype", default="bfloat16", help="bfloat16 or float32 weights")
    ap.add_argument("--dir", default="/tmp/kiln_llm_bench")
    a = ap.parse_args()
    import numpy as np
    import torch

    import kiln

    b = Bench(a)
    b.kdev = a.device + ":0" if a.device == "cuda" else a.device
    bw = b.copy_bandwidth()
    log(f"copy bandwidth {bw / 1e12:.2f} TB/s; torch {torch.__version__}, kiln {kiln.__version__}")
    rng = np.random.default_rng(0)
    for name in a.models.split(","):
        model, d = b.make(name)
        cfg = model.config
        V, L = cfg.vocab_size, cfg.num_hidden_layers
        kv_bytes = 2 * L * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 2
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        batches = [int(x) for x in a.batches.split(",")] if name == "llama3-8b" else [1]
        for batch in batches:
            prompt = rng.integers(3, V, size=(batch, a.prompt))
            ids = torch.tensor(prompt, device=a.device)
            peers, hf_tokens = {}, None
            try:
                _, per, hf_tokens = b.hf_decode(model, ids, a.new, static=False)
                peers["HF eager"] = per
            except Exception as e:  # noqa: BLE001
                log(f"HF eager failed: {e}")
                peers["HF eager"] = None
            if not a.no_compile:
                # generate's own compilation of the forward with a static cache (it marks each
                # CUDA graph step; a forward wrapped in torch.compile by hand had its graph
                # outputs overwritten between steps)
                try:
                    _, per, _ = b.hf_decode(model, ids, a.new, static=True)
                    peers["HF static+compile"] = per
                except Exception as e:  # noqa: BLE001
                    log(f"HF static cache + compile failed: {str(e)[:300]}")
                    peers["HF static+compile"] = None
            free0 = b.free()
            lm = kiln.llm.load(d, device=b.kdev, max_batch=batch,
                               max_length=min(a.prompt + a.new + 64, cfg.max_position_embeddings))
            used = free0 - b.free()
            prompts = [list(map(int, p)) for p in prompt]
            lm.model.generate(prompts, max_new_tokens=a.new, stop_tokens=[-1])  # warm-up
            out = min((lm.model.generate(prompts, max_new_tokens=a.new, stop_tokens=[-1])
                       for _ in range(2)), key=lambda o: o["decode_seconds"])
            per = out["decode_seconds"] / (a.new - 1)
            cache_read = batch * kv_bytes * lm.model.max_length
            roof = (weight_bytes + cache_read) / bw / per
            mem = lm.model.memory
            log(f"{name} batch {batch}: kiln weights {mem['weights'] / 2**30:.2f} GiB, cache "
                f"{mem['cache'] / 2**30:.2f} GiB, device memory taken by the load "
                f"{used / 2**30:.2f} GiB; HF weights {weight_bytes / 2**30:.2f} GiB")
            if hf_tokens is not None:
                got = np.array(out["tokens"])
                same = (got[:, :16] == hf_tokens[:, :16].cpu().numpy()).mean()
                log(f"greedy tokens equal to HF's over the first 16: {same:.0%} ({a.dtype})")
            if batch == 1:
                b.row(f"{name} decode ms/token, batch 1", per * 1e3,
                      {k: v * 1e3 if v else None for k, v in peers.items()}, "ms", roof=roof)
            else:
                b.row(f"{name} decode tokens/s, batch {batch}", batch / per,
                      {k: batch / v if v else None for k, v in peers.items()}, "tok/s",
                      lower_better=False, roof=roof)
            del lm
        if name == "llama3-8b" or name == "tiny":
            n = 2048 if name != "tiny" else 256
            ids = torch.tensor(rng.integers(3, V, size=(1, n)), device=a.device)
            with torch.no_grad():
                model(ids, use_cache=False, logits_to_keep=1)
                b.sync()
                t0 = time.perf_counter()
                model(ids, use_cache=False, logits_to_keep=1)
                b.sync()
                hf = time.perf_counter() - t0
            lm = kiln.llm.load(d, device=b.kdev, max_length=n + 64)
            p = [list(map(int, ids[0].cpu()))]
            lm.model.generate(p, max_new_tokens=1)
            k = min(lm.model.generate(p, max_new_tokens=1)["prefill_seconds"] for _ in range(2))
            b.row(f"{name} prefill {n} tokens", k * 1e3, {"HF SDPA forward": hf * 1e3}, "ms",
                  roof=2 * (weight_bytes / 2) * n / 790e12 / k if b.cuda else None)
            del lm
        # time to first token: load + prefill 512
        n = 512
        p = rng.integers(3, V, size=(1, n))
        t0 = time.perf_counter()
        lm = kiln.llm.load(d, device=b.kdev, max_length=n + 64)
        lm.model.generate([list(map(int, p[0]))], max_new_tokens=1)
        k = time.perf_counter() - t0
        del lm, model
        import transformers

        t0 = time.perf_counter()
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            d, dtype=getattr(torch, a.dtype)).to(a.device)
        with torch.no_grad():
            hf.generate(torch.tensor(p, device=a.device), max_new_tokens=1, do_sample=False,
                        pad_token_id=0)
        b.sync()
        h = time.perf_counter() - t0
        b.row(f"{name} time to first token (load + prefill {n})", k, {"HF from_pretrained": h},
              "s")
        del hf
        if b.cuda:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
