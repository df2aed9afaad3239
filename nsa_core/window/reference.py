"""Sliding-window branch reference (docs/semantics.md): query t attends keys max(0, t-w+1)..t.

Dense math over an explicit mask (nsa_core._dense), float64-capable: the oracle the fast path
(window/fast.py) is compared with.
"""

from __future__ import annotations

import torch

from nsa_core._dense import _positions, masked_attention
from nsa_core._shapes import check_qkv


def sliding_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: int,
                      scale: float | None = None, engine: str = "math") -> torch.Tensor:
    """Attention over keys max(0, t-w+1)..t."""
    def key_range(t0, t1):
        return max(0, t0 - w + 1), t1

    def mask_fn(t, c0, c1):
        s0, s1 = key_range(int(t[0]), int(t[-1]) + 1)
        s = torch.arange(s0, s1, device=t.device)
        return (s[None, :] <= t[:, None]) & (s[None, :] > t[:, None] - w)

    check_qkv(q, k, v, causal=True)
    t_pos = _positions(q.shape[1], k.shape[1], q.device)
    return masked_attention(q, k, v, t_pos, mask_fn, scale, engine, key_range=key_range, span=w)
