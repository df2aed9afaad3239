"""Compressed branch reference (docs/semantics.md): avg phi, visibility, the compressed attention.

Compressed token i covers raw tokens [i*d, i*d + l) and is visible to query t iff
i*d + l - 1 <= t. Dense math over an explicit mask (nsa_core._dense), float64-capable: the oracle
the fast path (compression/fast.py) is compared with.
"""

from __future__ import annotations

import torch

from nsa_core._dense import _positions, masked_attention
from nsa_core.config import NSAConfig


def cmp_visibility_mask(t_pos: torch.Tensor, n_cmp: int, cfg: NSAConfig) -> torch.Tensor:
    """Bool [Tq, n_cmp]: compressed token i is visible to query t iff i*d + l - 1 <= t."""
    i = torch.arange(n_cmp, device=t_pos.device)
    return (i[None, :] * cfg.d + cfg.l - 1) <= t_pos[:, None]


def compress_avg(x: torch.Tensor, cfg: NSAConfig) -> torch.Tensor:
    """avg phi: x [B, T, G, D] -> [B, Tc, G, D], token i = mean of x[:, i*d : i*d + l]."""
    B, T, G, D = x.shape
    Tc = cfg.num_cmp(T)
    if Tc == 0:
        return x.new_zeros(B, 0, G, D)
    return x.unfold(1, cfg.l, cfg.d)[:, :Tc].mean(dim=-1)


def compressed_attention(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, S: int, cfg: NSAConfig,
                         scale: float | None = None, engine: str = "math", return_probs: bool = False):
    """Queries (the last Tq of S positions) over COMPRESSED keys kc/vc [B, Tc, G, D].

    Compressed token i is visible to query t iff i*d + l - 1 <= t; a query that sees none
    gets o = 0 and an empty score row (no NaN).
    """
    Tq = q.shape[1]
    Tc = kc.shape[1]
    if Tc == 0:
        engine = "math"  # no key at all: o = 0 exactly, still connected to autograd (grad 0)
    t_pos = _positions(Tq, S, q.device)
    return masked_attention(q, kc, vc, t_pos, lambda t, c0, c1: cmp_visibility_mask(t, Tc, cfg),
                            scale, engine, return_probs=return_probs)
