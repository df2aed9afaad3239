"""Compressed branch on a flash kernel (``backend="flash"``; docs/routing.md).

Compressed token c is visible to t iff ``c*d + l - 1 <= t``: the d consecutive queries
``t = l-1 + m*d .. l-1 + m*d + d-1`` all see exactly the compressed tokens ``0..m``. Folding
those d queries into the head axis (``[B, T, HQ, D] -> [B, Tc, d*HQ, D]``, row-major: a *view*
of q, no copy) turns the pattern into plain causal attention over Tc = T/d rows and Tc keys:
any causal flash kernel runs it, with GQA, batch, and its own backward. Folded head
``j*HQ + hq`` (row j of the chunk) reads KV head ``j*G + hq // h`` of the keys/values repeated d
times along the group axis (``[B, Tc, d*G, D]``, small), so GQA maps every query head to its
own group. Each part's output is copied once into the [B, T, HQ, dv] result.
Queries with ``t < l - 1`` see nothing and get 0 (no NaN). ``path=None`` picks the path as
nsa_core.flash.pick does; ``path="sdpa-math"`` runs the same packing on CPU, for tests.

``return_lse=True`` also returns each query's log-sum-exp over its visible compressed tokens
(natural log, [B, Tq, HQ] float32, -inf where a query sees nothing), taken from the flash
kernel's own softmax statistics on the paths that expose them (``LSE_PATHS``: SDPA's cuDNN and
flash kernels through their aten ops, which stay differentiable in the output; FA-4's
``return_lse`` through ``flash.adapters.attention_lse``; ``sdpa-math``
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


def _expand_groups(x: torch.Tensor, d: int) -> torch.Tensor:
    """[B, L, G, D] -> [B, L, d*G, D]: KV head ``j*G + g`` is group g (the fold's head order below)."""
    B, L, G, D = x.shape
    return x.unsqueeze(2).expand(B, L, d, G, D).reshape(B, L, d * G, D)


def _chunks(x: torch.Tensor, a: int, n: int, d: int) -> torch.Tensor:
    """Rows a .. a+n*d-1 of x [B, T, H, *] as n chunks of d rows: [B, n, d*H, *], a view when x is
    contiguous. Folded head ``j*H + hq`` is row j of the chunk, head hq; with H = G*h query heads
    that is KV head ``(j*H + hq) // h = j*G + hq // h`` of ``_expand_groups``: GQA still maps each
    query head to its own group."""
    return x[:, a:a + n * d].reshape(x.shape[0], n, d * x.shape[2], *x.shape[3:])


LSE_PATHS = ("sdpa-cudnn", "sdpa-flash", "sdpa-math", *_k.LSE_PATHS)  # _k: flash-attn packages with an lse


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
    if path in _k.LSE_PATHS:  # FA-4's return_lse (bottom-right causal)
        return _k.attention_lse(qf, k, v, scale, path, causal)
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
    dv = vc.shape[-1]
    if isinstance(S, bool) or not isinstance(S, int) or S < Tq:
        raise ValueError(f"flash.compressed_attention: S={S!r} must be an int >= Tq={Tq}")
    scale = 1.0 / math.sqrt(dk) if scale is None else float(scale)
    p = pick(path, "cmp", q, kc, vc, S=S)
    n_all = cfg.num_cmp(S)  # chunks that hold queries up to position S-1
    nc = min(kc.shape[1], n_all)  # tokens beyond num_cmp(S) are visible to no query
    if nc == 0 or Tq == 0:
        z = zeros_out(q, kc, vc, dv)
        return (z, q.new_full((B, Tq, HQ), float("-inf"), dtype=torch.float32)) if return_lse else z
    l, d, p0 = cfg.l, cfg.d, S - Tq
    kx, vx = _expand_groups(kc[:, :nc], d), _expand_groups(vc[:, :nc], d)
    out = q.new_zeros(B, Tq, HQ, dv)  # queries before chunk 0 see nothing: 0
    lse = q.new_full((B, Tq, HQ), float("-inf"), dtype=torch.float32) if return_lse else None
    has_lse = True

    def put(a: int, n: int, o, ls) -> None:  # chunk outputs -> rows a .. a+n*d-1 (one strided copy)
        nonlocal has_lse
        _chunks(out, a, n, d).copy_(o)
        if lse is not None and ls is not None:
            _chunks(lse, a, n, d).copy_(ls)
        has_lse = has_lse and ls is not None

    # chunk m holds positions l-1+m*d .. l-1+m*d+d-1 (query index pos - p0) and sees tokens 0..m:
    # the chunks wholly inside q are a view of q (no copy); at most a first and a last chunk are
    # partial (decode-like queries start mid-chunk; the last chunk may end past S-1)
    m0 = max(0, (p0 - (l - 1)) // d)  # first chunk holding a query
    m_lo = m0 if l - 1 + m0 * d >= p0 else m0 + 1
    m_hi = max(m_lo, min(n_all, (S - (l - 1)) // d))  # chunks m_lo .. m_hi-1 lie wholly inside q
    row = lambda m: l - 1 + m * d - p0  # noqa: E731 - query index of chunk m's first position
    c1 = min(m_hi, nc)
    if c1 > m_lo:  # chunk m sees tokens 0..m: bottom-right causal against the first c1 tokens
        o, ls = _attend(_chunks(q, row(m_lo), c1 - m_lo, d), kx[:, :c1], vx[:, :c1], scale, p, True, return_lse)
        put(row(m_lo), c1 - m_lo, o, ls)
    f0 = max(m_lo, nc)
    if m_hi > f0:  # fewer tokens given than exist at S: these chunks see all nc of them
        o, ls = _attend(_chunks(q, row(f0), m_hi - f0, d), kx, vx, scale, p, False, return_lse)
        put(row(f0), m_hi - f0, o, ls)
    for m in sorted({m0, n_all - 1}):
        if m_lo <= m < m_hi or not m0 <= m < n_all:
            continue
        a, b = max(0, row(m)), min(Tq, row(m) + d)  # the part of chunk m inside q, zero-padded to d rows
        qm = F.pad(q[:, a:b], (0, 0, 0, 0, a - row(m), row(m) + d - b)).reshape(B, 1, d * HQ, dk)
        ne = min(m + 1, nc)
        o, ls = _attend(qm, kx[:, :ne], vx[:, :ne], scale, p, False, return_lse)
        out[:, a:b] = o.reshape(B, d, HQ, dv)[:, a - row(m): b - row(m)]
        if lse is not None and ls is not None:
            lse[:, a:b] = ls.reshape(B, d, HQ)[:, a - row(m): b - row(m)]
        has_lse = has_lse and ls is not None
    if not return_lse:
        return out
    return out, (lse if has_lse else None)
