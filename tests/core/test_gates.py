"""Fused gate combine (nsa_core._gates, NSA Eq. 5) vs the torch expression in float64: forward and
every gradient. On CPU the Triton kernels run in the interpreter (fp32 / fp16); outputs of the
fused path are fresh allocations, so an unwritten element would hold garbage and fail."""

from __future__ import annotations

import importlib
import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="needs triton: pip install triton")

from nsa_core import _gates  # noqa: E402
from nsa_core.testing import compare  # noqa: E402

DEV = "cuda" if CUDA else "cpu"


@pytest.fixture(autouse=True, scope="module")
def _interpreted():
    if not CUDA:
        os.environ["TRITON_INTERPRET"] = "1"
        if type(_gates._fwd_kernel).__name__ != "InterpretedFunction":
            importlib.reload(_gates)
    yield


@pytest.mark.parametrize("dtype,gdtype,dv,strided", [
    (torch.float32, torch.float32, 24, False),
    (torch.float16, torch.float16, 16, True),
    (torch.float32, torch.float16, 40, True),
])
def test_combine_matches_torch_float64(dtype, gdtype, dv, strided):
    B, T, HQ = 2, 13, 6  # rows not a multiple of the 16-row tile
    gen = torch.Generator().manual_seed(dv)

    def r(*s):
        return torch.randn(*s, generator=gen)

    g64 = torch.rand(B, T, HQ, 3, generator=gen, dtype=torch.float64)
    os64 = [r(B, T, HQ, dv).double() for _ in range(3)]
    if strided:  # o_cmp as a [B, HQ, T, dv] tensor viewed [B, T, HQ, dv] (non-contiguous rows)
        base = os64[0].transpose(1, 2).contiguous()
        os64[0] = base.transpose(1, 2)
    do = r(B, T, HQ, dv).double()
    leaves = [g64.to(DEV, gdtype).requires_grad_(True)] + [x.to(DEV, dtype).requires_grad_(True) for x in os64]
    assert _gates.fused_ok(*leaves, force=True)
    o = _gates.combine(*leaves, force=True)
    o.backward(do.to(DEV, dtype))
    ref_leaves = [x.detach().cpu().double().requires_grad_(True) for x in leaves]  # the rounded inputs
    ro = _gates._torch(*ref_leaves)
    ro.backward(do.to(dtype).double())
    assert o.dtype == dtype
    assert compare(o, ro, dtype).ok, compare(o, ro, dtype)
    for name, a, b in zip(("gates", "o_cmp", "o_slc", "o_win"), leaves, ref_leaves, strict=True):
        c = compare(a.grad, b.grad, a.dtype)
        assert c.ok, f"{name}: {c}"


def test_combine_falls_back_off_cuda_without_force():
    xs = [torch.rand(1, 3, 2, 3, device=DEV)] + [torch.randn(1, 3, 2, 8, device=DEV) for _ in range(3)]
    assert _gates.fused_ok(*xs) == CUDA
    assert not _gates.fused_ok(xs[0], xs[1], xs[2].double(), xs[3], force=True)  # dtype mix
