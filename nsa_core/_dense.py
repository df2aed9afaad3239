"""Dense masked attention, the engine of every reference branch (docs/semantics.md), and the q/k/v checks.

``masked_attention`` computes softmax(q k^T * scale + mask) v with GQA over an explicit mask,
in float64 when given float64 (the oracle) or through torch SDPA (``engine="sdpa"``): each
branch's reference (compression/, selection/, window/ ``reference.py``) only supplies its mask.
Queries are the last ``Tq`` positions of ``S`` keys: query i sits at position ``S - Tq + i``
(prefill: Tq == S; decode: Tq == 1). Work is chunked over queries so paper-scale cases fit in
memory, but there is no per-token Python loop. Shapes are checked by nsa_core._shapes.check_qkv.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from nsa_core._shapes import check_qkv

# elements of one [B, HQ, chunk, S] score tensor; bounds the memory of the dense paths
_SCORE_BUDGET = 1 << 26


def _positions(Tq: int, S: int, device) -> torch.Tensor:
    if Tq > S:
        raise ValueError(f"more queries ({Tq}) than keys ({S})")
    return torch.arange(S - Tq, S, device=device)


def _chunk(B: int, HQ: int, S: int, span: int | None = None) -> int:
    """Queries per chunk so one [B, HQ, chunk, keys] score tensor stays within the budget.

    ``span``: when each query sees at most ``span`` keys (sliding window), a chunk of C queries
    needs only C + span keys, so the chunk does not shrink as S grows.
    """
    if span is None:
        return max(1, _SCORE_BUDGET // max(1, B * HQ * S))
    X = _SCORE_BUDGET // max(1, B * HQ)  # C * (C + span) <= X
    fit = int((math.sqrt(span * span + 4 * X) - span) // 2)
    return max(1, min(fit, max(64, span)))  # chunks near the span waste little on masked keys


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, t_pos: torch.Tensor,
                     mask_fn: Callable[[torch.Tensor, int, int], torch.Tensor], scale: float | None = None,
                     engine: str = "math", key_range: Callable[[int, int], tuple[int, int]] | None = None,
                     return_probs: bool = False, span: int | None = None):
    """softmax(q k^T * scale + mask) v with GQA, rows with no visible key -> 0 (no NaN).

    q [B, Tq, HQ, dk], k [B, S, G, dk], v [B, S, G, dv], t_pos [Tq] query positions
    -> o [B, Tq, HQ, dv]. Heads are group-major: query head hq belongs to group hq // (HQ/G).
    mask_fn(t, c0, c1) -> bool [C, S'] or [B, G, C, S'] for queries c0..c1 (positions t) over
    the keys of key_range(t0, t1) -> (s0, s1) (default all keys; used to skip far keys);
    ``span`` bounds the keys one query sees (sizes the chunks when key_range is given).
    """
    B, Tq, HQ, G, S = check_qkv(q, k, v)
    h = HQ // G
    dv = v.shape[-1]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    t_all = t_pos
    outs, probs = [], []
    C = _chunk(B, HQ, S, span)
    for c0 in range(0, Tq, C):
        c1 = min(Tq, c0 + C)
        t = t_all[c0:c1]
        s0, s1 = key_range(int(t[0]), int(t[-1]) + 1) if key_range else (0, S)
        kc, vc = k[:, s0:s1], v[:, s0:s1]
        m = mask_fn(t, c0, c1)
        if m.dim() == 2:
            m = m[None, None].expand(B, G, c1 - c0, s1 - s0)
        has = m.any(-1)  # [B, G, C]
        qc = q[:, c0:c1].reshape(B, c1 - c0, G, h, q.shape[-1])
        if engine == "math":
            s = torch.einsum("bcghd,bsgd->bghcs", qc, kc) * scale
            keep = m[:, :, None] | ~has[:, :, None, :, None]
            s = s.masked_fill(~keep, float("-inf"))
            p = torch.softmax(s, dim=-1) * has[:, :, None, :, None].to(s.dtype)
            o = torch.einsum("bghcs,bsgd->bcghd", p, vc)
            if return_probs:
                probs.append(p.permute(0, 3, 1, 2, 4).reshape(B, c1 - c0, HQ, s1 - s0))
        elif engine == "sdpa":
            if return_probs:
                raise ValueError("the sdpa engine does not return probabilities")
            qh = qc.permute(0, 2, 3, 1, 4).reshape(B, HQ, c1 - c0, -1)
            kh = kc.permute(0, 2, 1, 3).repeat_interleave(h, dim=1)
            vh = vc.permute(0, 2, 1, 3).repeat_interleave(h, dim=1)
            keep = (m | ~has[..., None])[:, :, None].expand(B, G, h, c1 - c0, s1 - s0)
            oh = torch.nn.functional.scaled_dot_product_attention(
                qh, kh, vh, attn_mask=keep.reshape(B, HQ, c1 - c0, s1 - s0), scale=scale)
            oh = oh * has[:, :, None, :, None].expand(B, G, h, c1 - c0, 1).reshape(B, HQ, c1 - c0, 1).to(oh.dtype)
            o = oh.reshape(B, G, h, c1 - c0, dv).permute(0, 3, 1, 2, 4)
        else:
            raise ValueError(f"unknown engine {engine!r}")
        outs.append(o.reshape(B, c1 - c0, HQ, dv))
    o = torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]
    if return_probs:
        return o, (torch.cat(probs, dim=1) if len(probs) > 1 else probs[0])
    return o


def full_attention(q, k, v, scale=None, engine: str = "math"):
    """Full causal attention (the equivalence anchor)."""
    check_qkv(q, k, v, causal=True)
    t_pos = _positions(q.shape[1], k.shape[1], q.device)
    return masked_attention(q, k, v, t_pos, lambda t, c0, c1: causal_mask(t, k.shape[1]), scale, engine)


def causal_mask(t_pos: torch.Tensor, S: int) -> torch.Tensor:
    s = torch.arange(S, device=t_pos.device)
    return s[None, :] <= t_pos[:, None]
