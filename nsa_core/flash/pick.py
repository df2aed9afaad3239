"""Which flash path runs a call: the path routing measured best here, else the first that can.

``pick(path, branch, q, k, v)``: a pinned ``path`` is checked and kept (PathUnavailable if it
cannot run the call); ``path=None`` takes the path nsa_core.routing measured best on this GPU
(fa2-probe thresholds), then the first in ``PATHS`` order (fa3, fa2, fa4, varlen, sdpa-flash,
sdpa-cudnn, sdpa-efficient) that can run it, else FlashUnavailable listing each path's reason.
Used by the fast paths of the compressed branch (compression/fast.py) and the sliding branch
(window/fast.py); docs/routing.md.
"""

from __future__ import annotations

import torch

from nsa_core.flash import adapters as _k

PATHS = tuple(_k.PATHS)
PathUnavailable = _k.PathUnavailable


class FlashUnavailable(RuntimeError):
    """No flash path can run this call on this machine; the message lists each path's reason."""


def _routed(branch: str, device: torch.device, S: int | None = None) -> str | None:
    """The path nsa_core.routing measured best for this branch here at key length ``S`` (None
    when it has none)."""
    if device.type != "cuda":
        return None
    from nsa_core import routing

    return routing.cached_decide(str(device)).path(branch, S)


def pick(path: str | None, branch: str, q, k, v, S: int | None = None) -> str:
    """``S``: the sequence's key length (the thresholds' S; for cmp the raw, not compressed, length)."""
    if path is not None:
        _k.check(path, q, k, v, branch)
        return path
    first = _routed(branch, q.device, S)
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


def zeros_out(q, k, v, dv) -> torch.Tensor:
    """o = 0 [B, Tq, HQ, dv], still connected to autograd (gradients 0), as the reference."""
    z = q.new_zeros(*q.shape[:3], dv)
    if q.requires_grad or k.requires_grad or v.requires_grad:
        z = z + 0 * (q.sum() + k.sum() + v.sum())
    return z
