"""Helpers shared by nsa_core's Triton code: host-side (next power of two, interpreter on?) and
the one @triton.jit matmul wrapper the selection and decode kernels use."""

from __future__ import annotations

import os

from nsa_core._triton import tl, triton  # optional: the host helpers work without triton (None)


def np2(x: int) -> int:
    """The smallest power of two >= x (1 for x <= 1)."""
    return 1 << max(0, (int(x) - 1).bit_length())


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


if triton is not None:

    @triton.jit
    def dot(a, b, IEEE: tl.constexpr):
        """a @ b: IEEE fp32 (no tf32) for fp32 inputs, else in b's dtype with fp32 accumulation."""
        if IEEE:
            r = tl.dot(a, b, input_precision="ieee")
        else:
            r = tl.dot(a.to(b.dtype), b)
        return r
