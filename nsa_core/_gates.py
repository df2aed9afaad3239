"""Gate combine of NSA (Eq. 5): ``o = g_cmp*o_cmp + g_slc*o_slc + g_win*o_win``, one Triton pass.

The torch expression is five elementwise kernels forward (three broadcast products, two sums)
and about nine backward, each streaming whole ``[B, T, HQ, dv]`` tensors (1 GiB each in bf16 at
T=64K, HQ=64, dv=128). Here the forward reads the three branch outputs and the gates once and
writes o; the backward reads do, the three outputs and the gates once and writes the three
branch gradients and the gate gradient (a row reduction). fp32 arithmetic inside, outputs in
the input dtype. Numbers: docs/benchmarks.md ("Fused selection scoring", gate combine).

``combine(gates, o_cmp, o_slc, o_win)`` picks this path on CUDA (or under TRITON_INTERPRET=1
when ``force=True``) and falls back to the torch expression elsewhere.
"""

from __future__ import annotations

import os

import torch

from nsa_core._triton import tl, triton  # None / None where triton is missing or broken

BR = 16  # rows (b, t, head) per program


def _np2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


if triton is not None:

    @triton.jit
    def _row_ptrs(r, T, HQ, sb, st, sh):
        h = r % HQ
        bt = r // HQ
        return (bt // T) * sb + (bt % T) * st + h * sh

    @triton.jit
    def _rows_and_gates(G, n_rows, T, HQ, sgb, sgt, sgh, DV: tl.constexpr, BV: tl.constexpr, BR: tl.constexpr):
        """This program's BR rows (b*T + t)*HQ + head, their masks, and the three gates (fp32) of each row."""
        r = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)
        m_r = r < n_rows
        v = tl.arange(0, BV)
        pg = G + _row_ptrs(r, T, HQ, sgb, sgt, sgh)
        g0 = tl.load(pg, mask=m_r, other=0.0).to(tl.float32)
        g1 = tl.load(pg + 1, mask=m_r, other=0.0).to(tl.float32)
        g2 = tl.load(pg + 2, mask=m_r, other=0.0).to(tl.float32)
        return r, m_r, v, m_r[:, None] & (v < DV)[None, :], g0, g1, g2

    @triton.jit
    def _fwd_kernel(G, OC, OS, OW, O, n_rows, T, HQ,
                    sgb, sgt, sgh, scb, sct, sch, ssb, sst, ssh, swb, swt, swh,
                    DV: tl.constexpr, BV: tl.constexpr, BR: tl.constexpr):
        r, m_r, v, m, g0, g1, g2 = _rows_and_gates(G, n_rows, T, HQ, sgb, sgt, sgh, DV, BV, BR)
        oc = tl.load(OC + _row_ptrs(r, T, HQ, scb, sct, sch)[:, None] + v[None, :], mask=m, other=0.0)
        os_ = tl.load(OS + _row_ptrs(r, T, HQ, ssb, sst, ssh)[:, None] + v[None, :], mask=m, other=0.0)
        ow = tl.load(OW + _row_ptrs(r, T, HQ, swb, swt, swh)[:, None] + v[None, :], mask=m, other=0.0)
        o = g0[:, None] * oc.to(tl.float32) + g1[:, None] * os_.to(tl.float32) + g2[:, None] * ow.to(tl.float32)
        tl.store(O + r[:, None] * DV + v[None, :], o.to(O.dtype.element_ty), mask=m)

    @triton.jit
    def _bwd_kernel(G, OC, OS, OW, DO, DG, DOC, DOS, DOW, n_rows, T, HQ,
                    sgb, sgt, sgh, scb, sct, sch, ssb, sst, ssh, swb, swt, swh, sdb, sdt, sdh,
                    DV: tl.constexpr, BV: tl.constexpr, BR: tl.constexpr):
        r, m_r, v, m, g0, g1, g2 = _rows_and_gates(G, n_rows, T, HQ, sgb, sgt, sgh, DV, BV, BR)
        do = tl.load(DO + _row_ptrs(r, T, HQ, sdb, sdt, sdh)[:, None] + v[None, :], mask=m, other=0.0).to(tl.float32)
        oc = tl.load(OC + _row_ptrs(r, T, HQ, scb, sct, sch)[:, None] + v[None, :], mask=m, other=0.0).to(tl.float32)
        os_ = tl.load(OS + _row_ptrs(r, T, HQ, ssb, sst, ssh)[:, None] + v[None, :], mask=m, other=0.0).to(tl.float32)
        ow = tl.load(OW + _row_ptrs(r, T, HQ, swb, swt, swh)[:, None] + v[None, :], mask=m, other=0.0).to(tl.float32)
        out = r[:, None] * DV + v[None, :]
        tl.store(DOC + out, (g0[:, None] * do).to(DOC.dtype.element_ty), mask=m)
        tl.store(DOS + out, (g1[:, None] * do).to(DOS.dtype.element_ty), mask=m)
        tl.store(DOW + out, (g2[:, None] * do).to(DOW.dtype.element_ty), mask=m)
        tl.store(DG + r * 3, tl.sum(do * oc, 1).to(DG.dtype.element_ty), mask=m_r)
        tl.store(DG + r * 3 + 1, tl.sum(do * os_, 1).to(DG.dtype.element_ty), mask=m_r)
        tl.store(DG + r * 3 + 2, tl.sum(do * ow, 1).to(DG.dtype.element_ty), mask=m_r)


def _s(x):
    return x.stride(0), x.stride(1), x.stride(2)


class _Combine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gates, o_cmp, o_slc, o_win):
        B, T, HQ, dv = o_cmp.shape
        o = torch.empty(B, T, HQ, dv, dtype=o_cmp.dtype, device=o_cmp.device)
        n = B * T * HQ
        if n:
            _fwd_kernel[(triton.cdiv(n, BR),)](
                gates, o_cmp, o_slc, o_win, o, n, T, HQ, *_s(gates), *_s(o_cmp), *_s(o_slc), *_s(o_win),
                DV=dv, BV=max(16, _np2(dv)), BR=BR, num_warps=4)
        ctx.save_for_backward(gates, o_cmp, o_slc, o_win)
        return o

    @staticmethod
    def backward(ctx, do):
        gates, o_cmp, o_slc, o_win = ctx.saved_tensors
        if do.stride(-1) != 1:
            do = do.contiguous()
        B, T, HQ, dv = o_cmp.shape
        dg = torch.empty(B, T, HQ, 3, dtype=gates.dtype, device=gates.device)
        doc, dos, dow = (torch.empty(B, T, HQ, dv, dtype=x.dtype, device=x.device) for x in (o_cmp, o_slc, o_win))
        n = B * T * HQ
        if n:
            _bwd_kernel[(triton.cdiv(n, BR),)](
                gates, o_cmp, o_slc, o_win, do, dg, doc, dos, dow, n, T, HQ,
                *_s(gates), *_s(o_cmp), *_s(o_slc), *_s(o_win), *_s(do),
                DV=dv, BV=max(16, _np2(dv)), BR=BR, num_warps=4)
        return dg, doc, dos, dow


def _torch(gates, o_cmp, o_slc, o_win):
    g = gates.to(o_cmp.dtype)
    return g[..., 0:1] * o_cmp + g[..., 1:2] * o_slc + g[..., 2:3] * o_win


def fused_ok(gates, o_cmp, o_slc, o_win, force: bool = False) -> bool:
    """The Triton path applies: outputs of one dtype (fp32/fp16/bf16; gates any of them), one shape,
    last dims contiguous, on CUDA (or ``force`` under TRITON_INTERPRET=1)."""
    if triton is None:
        return False
    xs = (gates, o_cmp, o_slc, o_win)
    floats = (torch.float32, torch.float16, torch.bfloat16)
    if len({x.device for x in xs}) != 1 or len({x.dtype for x in xs[1:]}) != 1:
        return False
    if o_cmp.dtype not in floats or gates.dtype not in floats or o_cmp.dim() != 4:
        return False
    if not (o_cmp.shape == o_slc.shape == o_win.shape) or gates.shape != (*o_cmp.shape[:3], 3):
        return False
    if any(x.stride(-1) != 1 for x in xs) or o_cmp.shape[-1] > 512:
        return False
    interp = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    return o_cmp.device.type == "cuda" or (force and interp)


def combine(gates: torch.Tensor, o_cmp: torch.Tensor, o_slc: torch.Tensor, o_win: torch.Tensor, *,
            force: bool = False) -> torch.Tensor:
    """Eq. 5 gate combine. gates [B, T, HQ, 3] (cmp, slc, win); o_* [B, T, HQ, dv] -> o (o_cmp.dtype).

    Fused Triton forward/backward where ``fused_ok``; the torch expression otherwise (same result
    up to rounding: the fused path sums in fp32 and rounds once).
    """
    if fused_ok(gates, o_cmp, o_slc, o_win, force):
        return _Combine.apply(gates, o_cmp, o_slc, o_win)
    return _torch(gates, o_cmp, o_slc, o_win)
