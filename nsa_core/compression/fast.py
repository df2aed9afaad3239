"""Compressed branch on a flash kernel (``backend="flash"``; docs/routing.md).

Compressed token c is visible to t iff ``c*d + l - 1 <= t``: the d consecutive queries
``t = l-1 + m*d .. l-1 + m*d + d-1`` all see exactly the compressed tokens ``0..m``. Folding
those d queries into the head axis (``[B, T, HQ, D] -> [B, Tc, d*HQ, D]``, group-major so GQA
still maps head -> group) turns the pattern into plain causal attention over Tc = T/d rows
and Tc keys: any causal flash kernel runs it, with GQA, batch, and its own backward.
Queries with ``t < l - 1`` see nothing and get 0 (no NaN). ``path=None`` picks the path as
nsa_core.flash.pick does; ``path="sdpa-math"`` runs the same packing on CPU, for tests.

``return_lse=True`` also returns each query's log-sum-exp over its visible compressed tokens
(natural log, [B, Tq, HQ] float32, -inf where a query sees nothing), taken from the flash
kernel's own softmax statistics on the paths that expose them (``LSE_PATHS``: SDPA's cuDNN and
flash kernels through their aten ops, which stay differentiable in the output; ``sdpa-math``
computes it explicitly, for CPU tests); other paths return ``None``. The fused selection
scoring (nsa_core.selection.scoring) takes that lse and skips its own first pass over the
compressed keys (docs/benchmarks.md, "Fused selection scoring").
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


LSE_PATHS = ("sdpa-cudnn", "sdpa-flash", "sdpa-math")


def _sdpa_lse(q, k, v, scale: float, path: str, is_causal: bool):
    """Attention that also returns the softmax statistics: q [B, L, H, D], k/v [B, Lk, G, D]
    -> (o [B, L, H, Dv], lse [B, L, H] float32, natural log). ``is_causal`` is top-left (SDPA's).

    cuDNN / flash: the aten ops behind SDPA (GQA native, autograd through ``o``; lse carries no
    gradient). sdpa-math: explicit float32 softmax, the CPU twin for tests.
    """
    B, L, H, _ = q.shape
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if path == "sdpa-cudnn":
        r = torch.ops.aten._scaled_dot_product_cudnn_attention(qt, kt, vt, None, True, 0.0, is_causal, False,
                                                                 scale=scale)
    elif path == "sdpa-flash":
        r = torch.ops.aten._scaled_dot_product_flash_attention(qt, kt, vt, 0.0, is_causal, False, scale=scale)
    elif path == "sdpa-math":
        G = k.shape[2]
        kx, vx = kt.repeat_interleave(H // G, dim=1).float(), vt.repeat_interleave(H // G, dim=1).float()
        s = (qt.float() @ kx.transpose(-1, -2)) * scale
        if is_causal:
            s = s.masked_fill(torch.ones(L, k.shape[1], dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        r = ((torch.exp(s - lse[..., None]) @ vx).to(q.dtype), lse)
    else:
        raise ValueError(f"_sdpa_lse: no statistics from path {path!r}; expected one of {LSE_PATHS}")
    o, lse = r[0], r[1]
    return o.transpose(1, 2), lse.detach().float().reshape(B, H, L).transpose(1, 2)


def _attend(qf, k, v, scale: float, path: str, causal: bool, want_lse: bool):
    """One part of the folded problem: (o, lse or None); causal is bottom-right (adapters)."""
    if not want_lse or path not in LSE_PATHS:
        return (_k.causal if causal else _k.full)(qf, k, v, scale, path), None
    Lq, Lk = qf.shape[1], k.shape[1]
    if not causal or Lq == 1:
        return _sdpa_lse(qf, k, v, scale, path, False)
    if Lq > Lk:
        raise ValueError(f"causal: more query rows ({Lq}) than keys ({Lk})")
    qp = F.pad(qf, (0, 0, 0, 0, Lk - Lq, 0)) if Lq < Lk else qf  # top-left causal: pad to Lk rows
    o, lse = _sdpa_lse(qp, k, v, scale, path, True)
    return o[:, Lk - Lq:], lse[:, Lk - Lq:]


def compressed_attention(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, S: int, cfg: NSAConfig,
                         scale: float | None = None, *, path: str | None = None, return_lse: bool = False):
    """Compressed branch on a flash kernel.

    q [B, Tq, HQ, dk]: the last Tq of S positions (query i at S - Tq + i). kc [B, Tc, G, dk],
    vc [B, Tc, G, dv]: already-compressed keys/values; token c is visible to t iff
    c*d + l - 1 <= t. -> o [B, Tq, HQ, dv]; a query that sees no token gets 0. Differentiable.
    ``return_lse=True`` -> (o, lse [B, Tq, HQ] float32 natural log, -inf where nothing is
    visible; ``None`` when the path exposes no statistics, see ``LSE_PATHS``).
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
        z = zeros_out(q, kc, vc, dv)
        return (z, q.new_full((B, Tq, HQ), float("-inf"), dtype=torch.float32)) if return_lse else z
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
        parts.append(_attend(qf[:, :n_causal], k_, v_, scale, p, True, return_lse))
    if rows > n_causal:  # fewer tokens given than exist at S: later chunks see all nc of them
        parts.append(_attend(qf[:, n_causal:], k_, v_, scale, p, False, return_lse))
    of = parts[0][0] if len(parts) == 1 else torch.cat([x[0] for x in parts], dim=1)
    o = _unfold_rows(_unfold(of, rows, d, G, HQ), start, Tq, 0.0)  # row r of the fold: query start + r
    if not return_lse:
        return o
    if parts[0][1] is None:
        return o, None
    lf = parts[0][1] if len(parts) == 1 else torch.cat([x[1] for x in parts], dim=1)
    lse = _unfold(lf[..., None], rows, d, G, HQ)[..., 0]
    return o, _unfold_rows(lse, start, Tq, float("-inf")).contiguous()


def _unfold_rows(x: torch.Tensor, start: int, Tq: int, fill: float) -> torch.Tensor:
    """Rows of the unfolded result for query indices 0 .. Tq-1 (row r is query start + r);
    queries before the first chunk (start > 0) see nothing and get ``fill``."""
    lead = max(0, start)
    x = x[:, lead - start: lead - start + Tq - lead]
    if lead:
        x = torch.cat([x.new_full((x.shape[0], lead, *x.shape[2:]), fill), x], dim=1)
    return x
