"""A real, tiny Triton launch (env-pairing): ``out = x * 2 + y`` over 1000 fp32 elements.

Importing this module imports triton. On CPU, TRITON_INTERPRET=1 must be set before that
(the executor does it for ``--device cpu``): the kernel then runs in the Triton interpreter.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit
def _axpy_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * 2.0 + y, mask=mask)


def launch(device: str, n: int = 1000) -> dict:
    """Run the kernel on ``device``; returns {"ok", "max_abs", "mode", "n"} (raises on launch errors)."""
    gen = torch.Generator(device="cpu").manual_seed(1234)
    x = torch.randn(n, generator=gen).to(device)
    y = torch.randn(n, generator=gen).to(device)
    out = torch.full_like(x, float("nan"))  # an unwritten element cannot pass
    block = 256
    _axpy_kernel[(triton.cdiv(n, block),)](x, y, out, n, BLOCK=block)
    if device != "cpu":
        torch.cuda.synchronize()
    ref = x.double() * 2 + y.double()
    max_abs = float((out.double() - ref).abs().max())
    finite = bool(torch.isfinite(out).all())
    mode = "interpreter" if os.environ.get("TRITON_INTERPRET") == "1" else "compiled"
    return {"ok": finite and max_abs <= 1e-6, "max_abs": max_abs if finite else None, "mode": mode, "n": n}
