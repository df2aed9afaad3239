"""Flash backends for the compressed and sliding branches (``backend="flash"``; docs/routing.md).

Both branches are ordinary attention with a structured visibility pattern, so they run on a
flash kernel *without a mask* once the queries are packed to match the pattern:

* **Sliding** (keys max(0, t-w+1)..t): a causal window, ``window_size=(w-1, 0)`` in flash-attn
  and torch's ``varlen_attn``; SDPA backends that take a mask (cuDNN, memory-efficient) run
  query tiles against their ``tile + w - 1`` keys with a band mask.
* **Compressed** (token c visible to t iff ``c*d + l - 1 <= t``): the d consecutive queries
  ``t = l-1 + m*d .. l-1 + m*d + d-1`` all see exactly the compressed tokens ``0..m``. Folding
  those d queries into the head axis (``[B, T, HQ, D] -> [B, Tc, d*HQ, D]``, group-major so GQA
  still maps head -> group) turns the pattern into plain causal attention over Tc = T/d rows
  and Tc keys: any causal flash kernel runs it, with GQA, batch, and its own backward.
  Queries with ``t < l - 1`` see nothing and get 0 (no NaN).

Paths (``_flash_kernels.PATHS``): fa3, fa2, varlen, sdpa-flash, sdpa-cudnn, sdpa-efficient.
``path=None`` takes the path nsa_core.routing measured best on this GPU (fa2-probe thresholds),
then the first that can run the call in that order; ``path=`` pins one (``sdpa-math`` runs
the same packing on CPU, for tests). Selection scores (p_cmp) are recomputed by ``functional.block_scores`` rather than
taken from a kernel's ``lse``: the scores need every q.k of the visible compressed tokens,
which a flash kernel never materialises; the lse would save only the normalisation (numbers
in docs/benchmarks.md, fa2-probe section).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from nsa_core import _flash_kernels as _k
from nsa_core.config import NSAConfig

PATHS = tuple(_k.PATHS)
PathUnavailable = _k.PathUnavailable


class FlashUnavailable(RuntimeError):
    """No flash path can run this call on this machine; the message lists each path's reason."""


def available_paths(device_type: str = "cuda") -> dict:
    """{path: {"present", "reason", "branches"}} in preference order (cheap: no kernel call)."""
    return {p: _k.status(p, device_type) for p in PATHS}


def _routed(branch: str, device: torch.device) -> str | None:
    """The path nsa_core.routing measured best for this branch here (None when it has none)."""
    if device.type != "cuda":
        return None
    from nsa_core import routing

    return routing.cached_decide(str(device)).path(branch)


def _pick(path: str | None, branch: str, q, k, v) -> str:
    if path is not None:
        _k.check(path, q, k, v, branch)
        return path
    first = _routed(branch, q.device)
    order = ([first] if first else []) + [p for p in PATHS if p != first]
    reasons = []
    for p in order:
        try:
            _k.check(p, q, k, v, branch)
            return p
        except _k.PathUnavailable as e:
            reasons.append(str(e))
    raise FlashUnavailable(f"no flash path for the {branch} branch on {q.device.type} "
                           f"({q.dtype}, dk={q.shape[-1]}, dv={v.shape[-1]}): " + "; ".join(reasons)
                           + ". Use backend='sdpa'.")


def choose_path(branch: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    """The path ``path=None`` would use for these tensors (FlashUnavailable if none)."""
    return _pick(None, branch, q, k, v)


def _check(q, k, v, what):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"{what}: q, k, v must be [B, T, heads, dim]; got "
                         f"q{tuple(q.shape)} k{tuple(k.shape)} v{tuple(v.shape)}")
    B, Tq, HQ, dk = q.shape
    if k.shape[0] != B or v.shape[0] != B or k.shape[:3] != v.shape[:3]:
        raise ValueError(f"{what}: batch / length / groups disagree: q{tuple(q.shape)} k{tuple(k.shape)} "
                         f"v{tuple(v.shape)}")
    if k.shape[3] != dk:
        raise ValueError(f"{what}: q head dim {dk} != k head dim {k.shape[3]}")
    if k.shape[2] == 0 or HQ % k.shape[2]:
        raise ValueError(f"{what}: query heads HQ={HQ} must be a multiple of KV groups G={k.shape[2]}")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"{what}: dtype mismatch q {q.dtype}, k {k.dtype}, v {v.dtype}")


def sliding_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: int, scale: float | None = None,
                      *, path: str | None = None) -> torch.Tensor:
    """Sliding window: query i (position S - Tq + i) over keys max(0, t-w+1)..t.

    q [B, Tq, HQ, dk], k [B, S, G, dk], v [B, S, G, dv] -> o [B, Tq, HQ, dv]. Differentiable.
    Raises FlashUnavailable when no flash path can run it (e.g. on CPU), PathUnavailable
    when the pinned ``path`` cannot.
    """
    _check(q, k, v, "flash.sliding_attention")
    if isinstance(w, bool) or not isinstance(w, int) or w <= 0:
        raise ValueError(f"flash.sliding_attention: window w must be a positive int, got {w!r}")
    if q.shape[1] > k.shape[1]:
        raise ValueError(f"flash.sliding_attention: more queries ({q.shape[1]}) than keys ({k.shape[1]})")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    p = _pick(path, "win", q, k, v)
    if q.shape[1] == 0:
        return _zeros(q, k, v, v.shape[-1])
    return _k.window(q, k, v, w, scale, p)


def _zeros(q, k, v, dv) -> torch.Tensor:
    """o = 0 [B, Tq, HQ, dv], still connected to autograd (gradients 0), as the reference."""
    z = q.new_zeros(*q.shape[:3], dv)
    if q.requires_grad or k.requires_grad or v.requires_grad:
        z = z + 0 * (q.sum() + k.sum() + v.sum())
    return z


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
    _check(q, kc, vc, "flash.compressed_attention")
    B, Tq, HQ, dk = q.shape
    G, dv = kc.shape[2], vc.shape[-1]
    if isinstance(S, bool) or not isinstance(S, int) or S < Tq:
        raise ValueError(f"flash.compressed_attention: S={S!r} must be an int >= Tq={Tq}")
    scale = 1.0 / math.sqrt(dk) if scale is None else float(scale)
    p = _pick(path, "cmp", q, kc, vc)
    n_all = cfg.num_cmp(S)  # chunks that hold queries up to position S-1
    nc = min(kc.shape[1], n_all)  # tokens beyond num_cmp(S) are visible to no query
    if nc == 0 or Tq == 0:
        return _zeros(q, kc, vc, dv)
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
