"""Core ML import of MIL's recurrent ops (src/io/coreml/ops_rnn.cpp): lstm (forward, reverse and
bidirectional, with and without biases and peepholes, every activation MIL names, fp16 from
iOS17), the forms coremltools' torch frontend emits for torch.nn.LSTM (gate reordering and bias
sums as ops of the program, squeezed or split initial states, batch_first), gru (iOS15's and
iOS18's reset_after and input_bias), rnn, and inputs of unknown length and batch. Each test
builds a one-op program on fresh random weights and inputs, runs it with kiln on the CPU and
compares every output (the sequence or last step, the last hidden and cell states) with a
float64 numpy time loop written here from coremltools' op definitions (fp32 to rtol 1e-4, fp16 to
1e-2). lstm's clip and activations that MIL's recurrent ops do not name must fail on import with
a ValueError naming the parameter."""
import numpy as np
import pytest

import kiln
from coreml_util import IOS15, IOS16, IOS17, IOS18, check, mb, program, randn, run, save
from coremltools.converters.mil.mil import get_new_symbol


def act(name, v):
    """MIL's recurrent activations with the activation ops' default parameters."""
    n = name.lower()
    if n == "sigmoid":
        return 1 / (1 + np.exp(-v))
    if n in ("tanh", "scaled_tanh"):
        return np.tanh(v)
    if n == "relu":
        return np.maximum(v, 0)
    if n == "linear":
        return v
    if n in ("hard_sigmoid", "sigmoid_hard"):
        return np.clip(0.2 * v + 0.5, 0, 1)
    raise ValueError(name)


def f64(*arrays):
    return [None if a is None else np.asarray(a, np.float64) for a in arrays]


def lstm_ref(x, h, c, wih, whh, b=None, p=None, acts=("sigmoid", "tanh", "tanh"), reverse=False):
    """MIL lstm, one direction: gates i, f, o, z (weights and bias), peepholes i, f, o; the
    hidden states in the order the steps are taken, the last h and c."""
    x, h, c, wih, whh, b, p = f64(x, h, c, wih, whh, b, p)
    gh = whh.shape[0]
    b = np.zeros(gh) if b is None else b
    p = np.zeros(3 * gh // 4) if p is None else p
    wi, wf, wo, wz = np.split(wih, 4)
    ri, rf, ro, rz = np.split(whh, 4)
    bi, bf, bo, bz = np.split(b, 4)
    pi, pf, po = np.split(p, 3)
    ra, ca, oa = acts
    ys = []
    for t in (reversed(range(len(x))) if reverse else range(len(x))):
        xt = x[t]
        i = act(ra, xt @ wi.T + h @ ri.T + bi + c * pi)
        f = act(ra, xt @ wf.T + h @ rf.T + bf + c * pf)
        z = act(ca, xt @ wz.T + h @ rz.T + bz)
        c = f * c + i * z
        o = act(ra, xt @ wo.T + h @ ro.T + bo + c * po)
        h = o * act(oa, c)
        ys.append(h)
    return np.stack(ys), h, c


def gru_ref(x, h, wih, whh, b=None, input_bias=None, acts=("sigmoid", "tanh"), reverse=False,
            reset_after=False):
    """MIL gru: gates r, o, z; without reset_after o = a(Wo x + Ro (r * h) + b), with it (iOS18)
    o = a(Wo x + input_bias + r * (Ro h + b))."""
    x, h, wih, whh, b, ib = f64(x, h, wih, whh, b, input_bias)
    gh = whh.shape[0]
    b = np.zeros(gh) if b is None else b
    ib = np.zeros(gh) if ib is None else ib
    wr, wo, wz = np.split(wih, 3)
    rr, ro, rz = np.split(whh, 3)
    br, bo, bz = np.split(b, 3)
    ir, io, iz = np.split(ib, 3)
    ys = []
    for t in (reversed(range(len(x))) if reverse else range(len(x))):
        xt = x[t]
        z = act(acts[0], xt @ wz.T + iz + h @ rz.T + bz)
        r = act(acts[0], xt @ wr.T + ir + h @ rr.T + br)
        if reset_after:
            o = act(acts[1], xt @ wo.T + io + r * (h @ ro.T + bo))
        else:
            o = act(acts[1], xt @ wo.T + io + (r * h) @ ro.T + bo)
        h = (1 - z) * o + z * h
        ys.append(h)
    return np.stack(ys), h


def rnn_ref(x, h, wih, whh, b=None, activation="tanh", reverse=False):
    x, h, wih, whh, b = f64(x, h, wih, whh, b)
    b = np.zeros(whh.shape[0]) if b is None else b
    ys = []
    for t in (reversed(range(len(x))) if reverse else range(len(x))):
        h = act(activation, x[t] @ wih.T + h @ whh.T + b)
        ys.append(h)
    return np.stack(ys), h


def seq_out(ys, output_sequence):
    return ys if output_sequence else ys[-1:]


T, B, I, H = 5, 3, 4, 6


# ---- lstm ----


@pytest.mark.parametrize("direction,output_sequence,has_bias,acts,target", [
    ("forward", True, True, None, IOS15),
    ("forward", False, False, None, IOS15),
    ("reverse", True, True, None, IOS15),
    ("reverse", False, True, None, IOS16),
    ("forward", True, True, ("hard_sigmoid", "scaled_tanh", "linear"), IOS15),
    ("reverse", True, False, ("TANH", "relu", "Sigmoid"), IOS17),
    ("forward", True, True, ("sigmoid", "hard_sigmoid", "relu"), IOS18),
])
def test_lstm(tmp_path, rng, direction, output_sequence, has_bias, acts, target):
    x, h0, c0 = randn(rng, T, B, I), randn(rng, B, H), randn(rng, B, H)
    wih, whh = randn(rng, 4 * H, I, scale=0.5), randn(rng, 4 * H, H, scale=0.5)
    b = randn(rng, 4 * H) if has_bias else None
    kw = {} if acts is None else dict(recurrent_activation=acts[0], cell_activation=acts[1],
                                      activation=acts[2])
    if has_bias:
        kw["bias"] = b

    @program(((T, B, I), np.float32), ((B, H), np.float32), ((B, H), np.float32), target=target)
    def prog(x, h, c):
        return mb.lstm(x=x, initial_h=h, initial_c=c, weight_ih=wih, weight_hh=whh,
                       direction=direction, output_sequence=output_sequence, **kw)

    ys, h, c = lstm_ref(x, h0, c0, wih, whh, b, acts=acts or ("sigmoid", "tanh", "tanh"),
                        reverse=direction == "reverse")
    check(tmp_path, prog, {"x": x, "h": h0, "c": c0}, [seq_out(ys, output_sequence), h, c],
          target=target)


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_lstm_peephole(tmp_path, rng, direction):
    x, h0, c0 = randn(rng, T, B, I), randn(rng, B, H), randn(rng, B, H)
    wih, whh = randn(rng, 4 * H, I, scale=0.5), randn(rng, 4 * H, H, scale=0.5)
    b, p = randn(rng, 4 * H), randn(rng, 3 * H)

    @program(((T, B, I), np.float32), ((B, H), np.float32), ((B, H), np.float32), target=IOS15)
    def prog(x, h, c):
        return mb.lstm(x=x, initial_h=h, initial_c=c, weight_ih=wih, weight_hh=whh, bias=b,
                       peephole=p, direction=direction, output_sequence=True)

    want = lstm_ref(x, h0, c0, wih, whh, b, p, reverse=direction == "reverse")
    check(tmp_path, prog, {"x": x, "h": h0, "c": c0}, list(want), target=IOS15)


def bidirectional_ref(x, h0, c0, fwd, back, output_sequence):
    """A bidirectional lstm's outputs: both halves aligned with x's steps, states (B, 2H)."""
    ys_f, h_f, c_f = lstm_ref(x, h0[:, :H], c0[:, :H], *fwd)
    ys_r, h_r, c_r = lstm_ref(x, h0[:, H:], c0[:, H:], *back, reverse=True)
    h, c = np.concatenate([h_f, h_r], 1), np.concatenate([c_f, c_r], 1)
    y = np.concatenate([ys_f, ys_r[::-1]], 2) if output_sequence else h[None]
    return [y, h, c]


@pytest.mark.parametrize("output_sequence,biases,peepholes,target", [
    (True, (True, True), (False, False), IOS15),
    (False, (True, True), (False, False), IOS15),
    (True, (False, False), (True, True), IOS16),
    (True, (True, False), (False, True), IOS17),
])
def test_lstm_bidirectional(tmp_path, rng, output_sequence, biases, peepholes, target):
    x, h0, c0 = randn(rng, T, B, I), randn(rng, B, 2 * H), randn(rng, B, 2 * H)
    dirs = []
    for has_b, has_p in zip(biases, peepholes):
        dirs.append((randn(rng, 4 * H, I, scale=0.5), randn(rng, 4 * H, H, scale=0.5),
                     randn(rng, 4 * H) if has_b else None, randn(rng, 3 * H) if has_p else None))
    (wf, rf, bf, pf), (wb, rb, bb, pb) = dirs
    kw = {k: v for k, v in dict(bias=bf, peephole=pf, bias_back=bb, peephole_back=pb).items()
          if v is not None}

    @program(((T, B, I), np.float32), ((B, 2 * H), np.float32), ((B, 2 * H), np.float32),
             target=target)
    def prog(x, h, c):
        return mb.lstm(x=x, initial_h=h, initial_c=c, weight_ih=wf, weight_hh=rf,
                       weight_ih_back=wb, weight_hh_back=rb, direction="bidirectional",
                       output_sequence=output_sequence, **kw)

    want = bidirectional_ref(x, h0, c0, dirs[0], dirs[1], output_sequence)
    check(tmp_path, prog, {"x": x, "h": h0, "c": c0}, want, target=target)


def test_lstm_fp16(tmp_path, rng):
    """iOS17's fp16 lstm (bidirectional, biases), to fp16's precision."""
    x, h0, c0 = (randn(rng, T, B, I, dtype=np.float16), randn(rng, B, 2 * H, dtype=np.float16),
                 randn(rng, B, 2 * H, dtype=np.float16))
    dirs = [(randn(rng, 4 * H, I, dtype=np.float16, scale=0.5),
             randn(rng, 4 * H, H, dtype=np.float16, scale=0.5),
             randn(rng, 4 * H, dtype=np.float16), None) for _ in range(2)]
    (wf, rf, bf, _), (wb, rb, bb, _) = dirs

    @program(((T, B, I), np.float16), ((B, 2 * H), np.float16), ((B, 2 * H), np.float16),
             target=IOS17)
    def prog(x, h, c):
        return mb.lstm(x=x, initial_h=h, initial_c=c, weight_ih=wf, weight_hh=rf, bias=bf,
                       weight_ih_back=wb, weight_hh_back=rb, bias_back=bb,
                       direction="bidirectional", output_sequence=True)

    want = bidirectional_ref(x, h0, c0, dirs[0], dirs[1], True)
    check(tmp_path, prog, {"x": x, "h": h0, "c": c0}, want, target=IOS17, rtol=1e-2, atol=1e-2)


def test_lstm_unknown_length_and_batch(tmp_path, rng):
    """Symbolic sequence length and batch: a bidirectional lstm's split and joined states."""
    x, h0, c0 = randn(rng, 7, 2, I), randn(rng, 2, 2 * H), randn(rng, 2, 2 * H)
    dirs = [(randn(rng, 4 * H, I, scale=0.5), randn(rng, 4 * H, H, scale=0.5),
             randn(rng, 4 * H), None) for _ in range(2)]
    (wf, rf, bf, _), (wb, rb, bb, _) = dirs
    s, n = get_new_symbol(), get_new_symbol()

    @program(((s, n, I), np.float32), ((n, 2 * H), np.float32), ((n, 2 * H), np.float32))
    def prog(x, h, c):
        return mb.lstm(x=x, initial_h=h, initial_c=c, weight_ih=wf, weight_hh=rf, bias=bf,
                       weight_ih_back=wb, weight_hh_back=rb, bias_back=bb,
                       direction="bidirectional", output_sequence=True)

    want = bidirectional_ref(x, h0, c0, dirs[0], dirs[1], True)
    check(tmp_path, prog, {"x": x, "h": h0, "c": c0}, want)


# ---- torch.nn.LSTM as coremltools' torch frontend converts it ----


def torch_lstm_ref(x, h0, c0, layers):
    """torch.nn.LSTM (one layer, gates i, f, g, o; b_ih + b_hh), h0 and c0 (D, B, H); the
    output (T, B, D*H) and h_n, c_n (D, B, H)."""
    outs, hs, cs = [], [], []
    for d, (w_ih, w_hh, b_ih, b_hh) in enumerate(layers):
        w_ih, w_hh, b_ih, b_hh = f64(w_ih, w_hh, b_ih, b_hh)
        h, c = h0[d].astype(np.float64), c0[d].astype(np.float64)
        ys = [None] * len(x)
        for t in (range(len(x)) if d == 0 else reversed(range(len(x)))):
            g = x[t] @ w_ih.T + h @ w_hh.T + b_ih + b_hh
            i, f, gg, o = np.split(g, 4, axis=-1)
            c = act("sigmoid", f) * c + act("sigmoid", i) * np.tanh(gg)
            h = act("sigmoid", o) * np.tanh(c)
            ys[t] = h
        outs.append(np.stack(ys))
        hs.append(h)
        cs.append(c)
    return np.concatenate(outs, 2), np.stack(hs), np.stack(cs)


def ifzo_to_ifoz(w):
    """The torch frontend's gate reordering, as split and concat ops of the program."""
    parts = mb.split(x=w, split_sizes=np.array([w.shape[0] // 4] * 4), axis=0)
    return mb.concat(values=[parts[0], parts[1], parts[3], parts[2]], axis=0)


@pytest.mark.parametrize("bidirectional,has_bias,batch_first", [
    (False, True, False), (False, False, True), (True, True, True), (True, False, False)])
def test_lstm_torch_frontend_form(tmp_path, rng, bidirectional, has_bias, batch_first):
    """The ops that coremltools' torch frontend (frontend/torch/ops.py, lstm and _add_mil_lstm)
    emits for torch.nn.LSTM with PyTorch's weights: lstm with direction forward or
    bidirectional, output_sequence true, the weights' gates reordered and the biases summed by
    ops of the program, initial states squeezed (or split and joined) from (D, B, H)."""
    D = 2 if bidirectional else 1
    layers = [(randn(rng, 4 * H, I, scale=0.5), randn(rng, 4 * H, H, scale=0.5),
               randn(rng, 4 * H, scale=0.5), randn(rng, 4 * H, scale=0.5)) for _ in range(D)]
    x, h0, c0 = randn(rng, T, B, I), randn(rng, D, B, H), randn(rng, D, B, H)
    xs = (B, T, I) if batch_first else (T, B, I)

    @program((xs, np.float32), ((D, B, H), np.float32), ((D, B, H), np.float32), target=IOS15)
    def prog(x, h, c):
        if batch_first:
            x = mb.transpose(x=x, perm=[1, 0, 2])
        w = [(ifzo_to_ifoz(w_ih), ifzo_to_ifoz(w_hh)) for w_ih, w_hh, _, _ in layers]
        bias = [ifzo_to_ifoz(mb.add(x=b_ih, y=b_hh)) for _, _, b_ih, b_hh in layers]
        if bidirectional:
            def states(s):
                halves = mb.split(x=s, split_sizes=np.array([1, 1]), axis=0)
                return mb.squeeze(x=mb.concat(values=list(halves), axis=2), axes=[0])

            kw = dict(weight_ih_back=w[1][0], weight_hh_back=w[1][1], direction="bidirectional")
            if has_bias:
                kw.update(bias=bias[0], bias_back=bias[1])
        else:
            def states(s):
                return mb.squeeze(x=s, axes=[0])

            kw = dict(direction="forward", bias=bias[0] if has_bias else None)
        y, hn, cn = mb.lstm(x=x, initial_h=states(h), initial_c=states(c), weight_ih=w[0][0],
                            weight_hh=w[0][1], output_sequence=True, **kw)
        if batch_first:
            y = mb.transpose(x=y, perm=[1, 0, 2])
        if bidirectional:
            hn, cn = [mb.stack(values=list(mb.split(x=s, num_splits=2, axis=1)), axis=0)
                      for s in (hn, cn)]
        else:
            hn, cn = mb.expand_dims(x=hn, axes=[0]), mb.expand_dims(x=cn, axes=[0])
        return y, hn, cn

    if not has_bias:
        layers = [(w_ih, w_hh, np.zeros(4 * H), np.zeros(4 * H)) for w_ih, w_hh, _, _ in layers]
    y, hn, cn = torch_lstm_ref(x.astype(np.float64), h0, c0, layers)
    feeds = {"x": x.transpose(1, 0, 2) if batch_first else x, "h": h0, "c": c0}
    check(tmp_path, prog, feeds, [y.transpose(1, 0, 2) if batch_first else y, hn, cn],
          target=IOS15)


# ---- gru ----


@pytest.mark.parametrize("direction,output_sequence,has_bias,acts,target", [
    ("forward", True, True, ("sigmoid", "tanh"), IOS15),
    ("forward", False, False, ("sigmoid", "tanh"), IOS15),
    ("reverse", True, True, ("sigmoid", "tanh"), IOS16),
    ("reverse", False, True, ("tanh", "sigmoid"), IOS17),
    ("forward", True, True, ("hard_sigmoid", "relu"), IOS17),
    ("forward", True, True, ("sigmoid", "linear"), IOS18),
])
def test_gru(tmp_path, rng, direction, output_sequence, has_bias, acts, target):
    x, h0 = randn(rng, T, B, I), randn(rng, B, H)
    wih, whh = randn(rng, 3 * H, I, scale=0.5), randn(rng, 3 * H, H, scale=0.5)
    b = randn(rng, 3 * H) if has_bias else None
    kw = {"bias": b} if has_bias else {}

    @program(((T, B, I), np.float32), ((B, H), np.float32), target=target)
    def prog(x, h):
        return mb.gru(x=x, initial_h=h, weight_ih=wih, weight_hh=whh, direction=direction,
                      output_sequence=output_sequence, recurrent_activation=acts[0],
                      activation=acts[1], **kw)

    ys, h = gru_ref(x, h0, wih, whh, b, acts=acts, reverse=direction == "reverse")
    check(tmp_path, prog, {"x": x, "h": h0}, [seq_out(ys, output_sequence), h], target=target)


@pytest.mark.parametrize("reset_after,has_input_bias,has_bias,direction", [
    (True, True, True, "forward"), (True, False, True, "reverse"), (True, True, False, "forward"),
    (False, True, True, "forward"), (False, False, True, "reverse")])
def test_gru_ios18(tmp_path, rng, reset_after, has_input_bias, has_bias, direction):
    """iOS18's gru: reset_after (the reset gate scales the hidden state's product and `bias`,
    PyTorch's GRU) and input_bias."""
    x, h0 = randn(rng, T, B, I), randn(rng, B, H)
    wih, whh = randn(rng, 3 * H, I, scale=0.5), randn(rng, 3 * H, H, scale=0.5)
    b = randn(rng, 3 * H) if has_bias else None
    ib = randn(rng, 3 * H) if has_input_bias else None
    kw = {k: v for k, v in dict(bias=b, input_bias=ib).items() if v is not None}

    @program(((T, B, I), np.float32), ((B, H), np.float32), target=IOS18)
    def prog(x, h):
        return mb.gru(x=x, initial_h=h, weight_ih=wih, weight_hh=whh, direction=direction,
                      output_sequence=True, reset_after=reset_after, **kw)

    want = gru_ref(x, h0, wih, whh, b, ib, reverse=direction == "reverse",
                   reset_after=reset_after)
    check(tmp_path, prog, {"x": x, "h": h0}, list(want), target=IOS18)


def test_gru_fp16(tmp_path, rng):
    x, h0 = randn(rng, T, B, I, dtype=np.float16), randn(rng, B, H, dtype=np.float16)
    wih = randn(rng, 3 * H, I, dtype=np.float16, scale=0.5)
    whh = randn(rng, 3 * H, H, dtype=np.float16, scale=0.5)
    b = randn(rng, 3 * H, dtype=np.float16)

    @program(((T, B, I), np.float16), ((B, H), np.float16), target=IOS17)
    def prog(x, h):
        return mb.gru(x=x, initial_h=h, weight_ih=wih, weight_hh=whh, bias=b,
                      output_sequence=True)

    check(tmp_path, prog, {"x": x, "h": h0}, list(gru_ref(x, h0, wih, whh, b)), target=IOS17,
          rtol=1e-2, atol=1e-2)


# ---- rnn ----


@pytest.mark.parametrize("direction,output_sequence,has_bias,activation,target", [
    ("forward", True, True, "tanh", IOS15),
    ("forward", False, False, "relu", IOS15),
    ("reverse", True, True, "sigmoid", IOS16),
    ("reverse", False, True, "tanh", IOS17),
    ("forward", True, True, "sigmoid_hard", IOS15),
    ("forward", True, False, "scaled_tanh", IOS18),
    ("reverse", True, True, "linear", IOS15),
])
def test_rnn(tmp_path, rng, direction, output_sequence, has_bias, activation, target):
    x, h0 = randn(rng, T, B, I), randn(rng, B, H)
    wih, whh = randn(rng, H, I, scale=0.5), randn(rng, H, H, scale=0.3)
    b = randn(rng, H) if has_bias else None
    kw = {"bias": b} if has_bias else {}

    @program(((T, B, I), np.float32), ((B, H), np.float32), target=target)
    def prog(x, h):
        return mb.rnn(x=x, initial_h=h, weight_ih=wih, weight_hh=whh, direction=direction,
                      output_sequence=output_sequence, activation=activation, **kw)

    ys, h = rnn_ref(x, h0, wih, whh, b, activation, reverse=direction == "reverse")
    check(tmp_path, prog, {"x": x, "h": h0}, [seq_out(ys, output_sequence), h], target=target)


def test_rnn_pytorch_form(tmp_path, rng):
    """coremltools' torch frontend for torch.nn.RNN (rnn_tanh, rnn_relu): rnn with
    output_sequence true and the summed bias computed by an add op."""
    x, h0 = randn(rng, T, B, I), randn(rng, 1, B, H)
    wih, whh = randn(rng, H, I, scale=0.5), randn(rng, H, H, scale=0.3)
    b_ih, b_hh = randn(rng, H), randn(rng, H)

    @program(((T, B, I), np.float32), ((1, B, H), np.float32), target=IOS15)
    def prog(x, h):
        y, hn = mb.rnn(x=x, initial_h=mb.squeeze(x=h, axes=[0]), weight_ih=wih, weight_hh=whh,
                       bias=mb.add(x=b_ih, y=b_hh), output_sequence=True, activation="relu")
        return y, mb.expand_dims(x=hn, axes=[0])

    ys, h = rnn_ref(x, h0[0], wih, whh, b_ih.astype(np.float64) + b_hh, "relu")
    check(tmp_path, prog, {"x": x, "h": h0}, [ys, h[None]], target=IOS15)


# ---- forms kiln does not take ----


def test_lstm_clip_fails(tmp_path, rng):
    """MIL's clip bounds the cell state, which kiln's recurrent ops do not do."""
    wih, whh = randn(rng, 4 * H, I), randn(rng, 4 * H, H)

    @program(((T, B, I), np.float32), ((B, H), np.float32), ((B, H), np.float32), target=IOS15)
    def prog(x, h, c):
        return mb.lstm(x=x, initial_h=h, initial_c=c, weight_ih=wih, weight_hh=whh,
                       clip=np.float32(0.5), output_sequence=True)

    path = save(prog, tmp_path / "m.mlpackage", target=IOS15)
    with pytest.raises(kiln.ValueError, match="'clip'"):
        run(path, {"x": randn(rng, T, B, I), "h": randn(rng, B, H), "c": randn(rng, B, H)})


def test_unknown_activation_fails(tmp_path, rng):
    """An activation name that MIL's recurrent ops do not define (gru does not check them)."""
    wih, whh = randn(rng, 3 * H, I), randn(rng, 3 * H, H)

    @program(((T, B, I), np.float32), ((B, H), np.float32), target=IOS15)
    def prog(x, h):
        return mb.gru(x=x, initial_h=h, weight_ih=wih, weight_hh=whh, activation="softsign")

    path = save(prog, tmp_path / "m.mlpackage", target=IOS15)
    with pytest.raises(kiln.ValueError, match="'activation'.*softsign"):
        run(path, {"x": randn(rng, T, B, I), "h": randn(rng, B, H)})
