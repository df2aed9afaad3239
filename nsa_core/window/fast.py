"""Sliding branch on a flash kernel (``backend="flash"``; docs/routing.md).

Keys max(0, t-w+1)..t form a causal window: ``window_size=(w-1, 0)`` in flash-attn and torch's
``varlen_attn``; SDPA backends that take a mask (cuDNN, memory-efficient) run query tiles
against their ``tile + w - 1`` keys with a band mask (nsa_core.flash.adapters.window).
``path=None`` picks the path as nsa_core.flash.pick does; ``path="sdpa-math"`` runs the same
tiling on CPU, for tests.
"""

from __future__ import annotations

import math

import torch

from nsa_core._shapes import check_qkv
from nsa_core.flash import adapters as _k
from nsa_core.flash.pick import pick, zeros_out


def sliding_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: int, scale: float | None = None,
                      *, path: str | None = None) -> torch.Tensor:
    """Sliding window: query i (position S - Tq + i) over keys max(0, t-w+1)..t.

    q [B, Tq, HQ, dk], k [B, S, G, dk], v [B, S, G, dv] -> o [B, Tq, HQ, dv]. Differentiable.
    Raises FlashUnavailable when no flash path can run it (e.g. on CPU), PathUnavailable
    when the pinned ``path`` cannot.
    """
    check_qkv(q, k, v, "flash.sliding_attention")
    if isinstance(w, bool) or not isinstance(w, int) or w <= 0:
        raise ValueError(f"flash.sliding_attention: window w must be a positive int, got {w!r}")
    if q.shape[1] > k.shape[1]:
        raise ValueError(f"flash.sliding_attention: more queries ({q.shape[1]}) than keys ({k.shape[1]})")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    p = pick(path, "win", q, k, v, S=k.shape[1])
    if q.shape[1] == 0:
        return zeros_out(q, k, v, v.shape[-1])
    return _k.window(q, k, v, w, scale, p)
