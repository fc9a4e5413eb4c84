"""Run a kiln op on numpy inputs: placeholders in, compiled for the CPU, numpy out."""
import numpy as np

import kiln


def run(build, *inputs, device="cpu"):
    """build(*tensors) -> tensor or list of tensors; returns numpy array(s)."""
    g = kiln.Graph()
    ts = [g.placeholder(list(np.shape(a)), kiln.dtype(np.asarray(a).dtype), f"in{i}")
          for i, a in enumerate(inputs)]
    out = build(*ts)
    many = isinstance(out, (list, tuple))
    outs = list(out) if many else [out]
    exe = g.compile(outs, device=device)
    res = [r.numpy() for r in exe.run({t: a for t, a in zip(ts, inputs)})]
    return res if many else res[0]
