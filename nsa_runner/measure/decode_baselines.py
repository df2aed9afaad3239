"""Full-attention decode baseline of the decode-bench stage (measurement only; not part of nsa_core).

``FullDecode`` runs plain attention of one decode query over all cached keys with nsa_core's
own decode kernels (nsa_core.decode.kernels), flash-decoding style, so the decode benchmark can
compare the NSA step with the strongest full-attention step on the same machine.
"""

from __future__ import annotations

import torch

from nsa_core.decode.kernels import LOG2E, _cmp_partial_kernel, _combine_kernel, _p2, chunking, pdl_default, split_dk


class FullDecode:
    """Full-attention decode baseline, flash-decoding style, with the same kernels: split-K over
    all s = pos + 1 cached keys (_cmp_partial_kernel with l = d = 1: every token visible), then
    the parallel merge of _combine_kernel (no gates). SDPA has no split over the keys for a single
    decode query, so at small batch it leaves most SMs idle; this is the strong baseline there.

    q [B, HQ, dk] (contiguous [HQ, dk]); K/V [B, G, cap, dk|dv] contiguous; pos 0-dim int64.
    __call__() -> o [B, G, h, dv] in q's dtype (a view of the output buffer). pdl: programmatic
    dependent launch between its two kernels, as the NSA step has it (None: where the device has it).
    """

    def __init__(self, q, K, V, pos, scale: float, chunk: int | None = None, warps: int = 4,
                 max_chunks: int = 64, pdl: bool | None = None):
        B, HQ, dk = q.shape
        _, G, cap, dv = V.shape
        if q.stride(2) != 1 or q.stride(1) != dk or not K.is_contiguous() or not V.is_contiguous():
            raise ValueError("FullDecode: q must have contiguous [HQ, dk]; K, V must be contiguous [B, G, cap, D]")
        self.q, self.K, self.V, self.pos = q, K, V, pos
        self.B, self.G, self.h, self.dk, self.dv, self.cap = B, G, HQ // G, dk, dv, cap
        self.BG, self.HP, self.BK, self.BV = B * G, _p2(self.h, 16), _p2(dk, 16), _p2(dv, 16)
        self.BVS = min(self.BV, 32)
        self.BT, self.CH, self.NCH = chunking(cap, self.BG, self.BK, q.device, chunk, max_chunks)
        f32 = dict(dtype=torch.float32, device=q.device)
        self.m_p = torch.empty(self.BG, self.NCH, self.HP, **f32)
        self.l_p = torch.empty(self.BG, self.NCH, self.HP, **f32)
        self.acc_p = torch.empty(self.BG, self.NCH, self.HP, self.BV, **f32)
        self.o = torch.empty(B, HQ, dv, dtype=q.dtype, device=q.device)
        self.dummy = torch.empty(1, **f32)
        self.gates = torch.empty(B, HQ, 3, dtype=q.dtype, device=q.device)  # not read (GATED=False)
        self.qk_scale = scale * LOG2E
        self.ieee = q.dtype == torch.float32
        self.warps = warps
        self.DK0, self.BK1 = split_dk(dk)
        self.pdl = pdl_default(q.device) if pdl is None else bool(pdl)
        self._pdl = {"launch_pdl": True} if self.pdl else {}

    def __call__(self) -> torch.Tensor:
        _cmp_partial_kernel[(self.BG, self.NCH)](
            self.pos, self.q, self.q.stride(0), self.K, self.V, self.dummy, self.m_p, self.l_p, self.acc_p, self.cap,
            self.qk_scale, G=self.G, H=self.h, DK=self.dk, DV=self.dv, L=1, STRIDE=1, HP=self.HP, DK0=self.DK0,
            BK1=self.BK1, BV=self.BV, BT=self.BT, CH=self.CH, NCH=self.NCH, DO_O=True, DO_LOGITS=False,
            IEEE=self.ieee, PDL=self.pdl, num_warps=self.warps, **self._pdl)
        _combine_kernel[(self.BG, self.BV // self.BVS)](
            self.m_p, self.l_p, self.acc_p, self.dummy, self.dummy, self.dummy, self.gates, 0, self.o, self.NCH, 1,
            G=self.G, H=self.h, DV=self.dv, HP=self.HP, BV=self.BV, BVS=self.BVS, BC=_p2(self.NCH), NS_SEL=0,
            NS_WIN=0, BSEL=1, BWIN=1, DO_CMP=True, GATED=False, EARLY=self.NCH <= 16, PDL=self.pdl, num_warps=4,
            **self._pdl)
        return self.o.view(self.B, self.G, self.h, self.dv)
