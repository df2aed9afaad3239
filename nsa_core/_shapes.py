"""The one q/k/v shape checker of nsa_core: every backend's input checks start here."""

from __future__ import annotations

import torch


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None, what: str = "", *,
              causal: bool = False, same_dtype: bool = True) -> tuple[int, int, int, int, int]:
    """Shapes of q [B, Tq, HQ, dk], k [B, S, G, dk] and (when given) v [B, S, G, dv].

    HQ must be a multiple of G (the h = HQ/G heads of a group are contiguous). ``causal``: the
    queries are the last Tq of the S key positions, so Tq <= S. ``same_dtype``: q, k, v share
    one dtype. Returns (B, Tq, HQ, G, S); raises ValueError naming the problem, prefixed with
    ``what``.
    """
    pre = f"{what}: " if what else ""
    named = [("q", q), ("k", k)] + ([("v", v)] if v is not None else [])
    if any(x.dim() != 4 for _, x in named):
        got = " ".join(f"{n}{tuple(x.shape)}" for n, x in named)
        raise ValueError(f"{pre}q, k, v must be [B, T, heads, dim]; got {got}")
    B, Tq, HQ, dk = q.shape
    Bk, S, G, dk2 = k.shape
    if Bk != B or (v is not None and v.shape[0] != B):
        raise ValueError(f"{pre}batch mismatch: " + ", ".join(f"{n} {x.shape[0]}" for n, x in named))
    if v is not None and (v.shape[1] != S or v.shape[2] != G):
        raise ValueError(f"{pre}k {tuple(k.shape)} and v {tuple(v.shape)} disagree on [B, T, G]")
    if dk2 != dk:
        raise ValueError(f"{pre}q head dim {dk} != k head dim {dk2}")
    if G == 0 or HQ % G:
        raise ValueError(f"{pre}query heads HQ={HQ} must be a multiple of KV groups G={G}")
    if causal and Tq > S:
        raise ValueError(f"{pre}more queries ({Tq}) than keys ({S}): queries are the last Tq of S positions")
    if same_dtype and any(x.dtype != q.dtype for _, x in named):
        raise ValueError(f"{pre}dtype mismatch: " + ", ".join(f"{n} {x.dtype}" for n, x in named))
    return B, Tq, HQ, G, S
