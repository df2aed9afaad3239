"""Compressed branch on a flash kernel (``backend="flash"``; docs/routing.md).

Compressed token c is visible to t iff ``c*d + l - 1 <= t``: the d consecutive queries
``t = l-1 + m*d .. l-1 + m*d + d-1`` all see exactly the compressed tokens ``0..m``. Folding
those d queries into the head axis (``[B, T, HQ, D] -> [B, Tc, d*HQ, D]``, group-major so GQA
still maps head -> group) turns the pattern into plain causal attention over Tc = T/d rows
and Tc keys: any causal flash kernel runs it, with GQA, batch, and its own backward.
Queries with ``t < l - 1`` see nothing and get 0 (no NaN). ``path=None`` picks the path as
nsa_core.flash.pick does; ``path="sdpa-math"`` runs the same packing on CPU, for tests.

Selection scores (p_cmp) are recomputed by ``functional.block_scores`` rather than taken from a
kernel's ``lse``: the scores need every q.k of the visible compressed tokens, which a flash
kernel never materialises; the lse would save only the normalisation (numbers in
docs/benchmarks.md, fa2-probe section).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from nsa_core._shapes import check_qkv
from nsa_core.config import NSAConfig
from nsa_core.flash import adapters as _k
from nsa_core.flash.pick import pick, zeros_out


def fold_queries(q: torch.Tensor, S: int, cfg: NSAConfig, m0: int, n_rows: int) -> tuple[torch.Tensor, int]:
    """Queries of visibility chunks m0 .. m0+n_rows-1, zero-padded: -> ([B, n_rows*d, HQ, D], start).

    q [B, Tq, HQ, D] holds positions S-Tq .. S-1. Chunk m holds positions l-1+m*d .. l-1+m*d+d-1,
    which all see compressed tokens 0..m. Row r of the result is query index ``start + r``
    (positions outside q are zero rows; their outputs are dropped).
    """
    B, Tq, HQ, D = q.shape
    p0 = S - Tq
    start = cfg.l - 1 + m0 * cfg.d - p0  # query index of chunk m0's first position (may be < 0)
    end = start + n_rows * cfg.d
    lo, hi = max(0, start), min(Tq, end)
    qs = F.pad(q[:, lo:hi], (0, 0, 0, 0, lo - start, end - hi))
    return qs, start


def _fold(qs: torch.Tensor, n_rows: int, d: int, G: int) -> torch.Tensor:
    B, _, HQ, D = qs.shape
    h = HQ // G
    return qs.reshape(B, n_rows, d, G, h, D).permute(0, 1, 3, 2, 4, 5).reshape(B, n_rows, G * d * h, D)


def _unfold(of: torch.Tensor, n_rows: int, d: int, G: int, HQ: int) -> torch.Tensor:
    B, _, _, Dv = of.shape
    h = HQ // G
    return of.reshape(B, n_rows, G, d, h, Dv).permute(0, 1, 3, 2, 4, 5).reshape(B, n_rows * d, HQ, Dv)


def compressed_attention(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, S: int, cfg: NSAConfig,
                         scale: float | None = None, *, path: str | None = None) -> torch.Tensor:
    """Compressed branch on a flash kernel.

    q [B, Tq, HQ, dk]: the last Tq of S positions (query i at S - Tq + i). kc [B, Tc, G, dk],
    vc [B, Tc, G, dv]: already-compressed keys/values; token c is visible to t iff
    c*d + l - 1 <= t. -> o [B, Tq, HQ, dv]; a query that sees no token gets 0. Differentiable.
    """
    check_qkv(q, kc, vc, "flash.compressed_attention")
    B, Tq, HQ, dk = q.shape
    G, dv = kc.shape[2], vc.shape[-1]
    if isinstance(S, bool) or not isinstance(S, int) or S < Tq:
        raise ValueError(f"flash.compressed_attention: S={S!r} must be an int >= Tq={Tq}")
    scale = 1.0 / math.sqrt(dk) if scale is None else float(scale)
    p = pick(path, "cmp", q, kc, vc)
    n_all = cfg.num_cmp(S)  # chunks that hold queries up to position S-1
    nc = min(kc.shape[1], n_all)  # tokens beyond num_cmp(S) are visible to no query
    if nc == 0 or Tq == 0:
        return zeros_out(q, kc, vc, dv)
    d = cfg.d
    # first chunk with a query in it: position S-Tq lies in chunk (S-Tq - (l-1)) // d (or before chunk 0)
    m0 = max(0, (S - Tq - (cfg.l - 1)) // d)
    rows = n_all - m0
    qs, start = fold_queries(q, S, cfg, m0, rows)
    qf = _fold(qs, rows, d, G)
    k_, v_ = kc[:, :nc], vc[:, :nc]
    n_causal = max(0, nc - m0)  # chunks m0 .. nc-1: chunk m sees tokens 0..m (bottom-right causal)
    parts = []
    if n_causal:
        parts.append(_k.causal(qf[:, :n_causal], k_, v_, scale, p))
    if rows > n_causal:  # fewer tokens given than exist at S: later chunks see all nc of them
        parts.append(_k.full(qf[:, n_causal:], k_, v_, scale, p))
    of = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    o = _unfold(of, rows, d, G, HQ)  # [B, rows*d, HQ, dv]: row r is query index start + r
    lead = max(0, start)  # queries before chunk m0 (only possible when start > 0): they see nothing
    o = o[:, lead - start: lead - start + Tq - lead]
    if lead:
        o = torch.cat([o.new_zeros(B, lead, HQ, dv), o], dim=1)
    return o
