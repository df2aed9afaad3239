"""Eager decode step (DESIGN §4): the SAME branch math as prefill, for one query at position t.

A query at position ``t`` against ``s = t + 1`` cached tokens is the prefill math with
``Tq = 1`` (queries are the last Tq of S positions in nsa_core._dense): the compressed
branch sees the ``cfg.num_cmp(s)`` compressed tokens that exist, selection scores come from
``functional.block_scores`` and top-n from ``selection.reference.topn_blocks`` at ``t_pos = [t]``, the
selected branch attends the raw cache through the same block mask, and the window branch the
ring's tokens ``max(0, t-w+1)..t`` in order. Backends are resolved exactly as prefill does.
"""

from __future__ import annotations

import torch

from nsa_core import functional as F
from nsa_core.config import NSAConfig
from nsa_core.decode.cache import NSACache
from nsa_core.selection.reference import topn_blocks

_DENSE = ("reference", "sdpa")


def attend(q: torch.Tensor, gates: torch.Tensor, cache: NSACache, t: int, cfg: NSAConfig, backend="reference", *,
           block_idx: torch.Tensor | None = None, block_count: torch.Tensor | None = None,
           scale: float | None = None):
    """One decode query over the cache, which already holds tokens 0..t.

    q [B, 1, HQ, dk]; gates [B, 1, HQ, 3] in order (cmp, slc, win).
    block_idx [B, 1, G, n] / block_count [B, 1, G]: use this selection instead of computing it
    (the parity checks feed a kernel's selection to the reference).
    -> o [B, 1, HQ, dv], block_idx [B, 1, G, n] int32, block_count [B, 1, G] int32.
    """
    if q.dim() != 4 or q.shape[1] != 1:
        raise ValueError(f"decode attend: q must be [B, 1, HQ, dk], got {tuple(q.shape)}")
    if t + 1 > cache.length or t < 0:
        raise ValueError(f"decode attend: position {t} is not cached (length {cache.length})")
    dev = q.device
    s = t + 1
    kc, vc = cache.cmp_kv(cfg.num_cmp(s))
    if block_idx is None:
        scores = F.block_scores(q, kc, s, cfg, scale)
        block_idx, block_count = topn_blocks(scores, torch.tensor([t], device=dev), cfg)
    elif block_count is None:
        raise ValueError("decode attend: block_idx given without block_count")
    o_cmp = F._compressed_on(q, kc, vc, s, cfg, F._resolve(backend, "cmp", dev), scale)
    ks, vs = cache.sel_kv(s)
    b_slc = F._resolve(backend, "slc", dev)
    if b_slc not in _DENSE:
        ks, vs = ks.contiguous(), vs.contiguous()
    o_slc = F.selection_attention(q, ks, vs, block_idx, block_count, cfg, b_slc, scale=scale)
    kw, vw = cache.win_kv(t)
    o_win = F.sliding_attention(q, kw, vw, cfg, F._resolve(backend, "win", dev), scale=scale)
    g = gates.to(o_cmp.dtype)
    o = g[..., 0:1] * o_cmp + g[..., 1:2] * o_slc + g[..., 2:3] * o_win
    return o, block_idx, block_count
