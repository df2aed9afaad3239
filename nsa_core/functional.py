"""Functional NSA API (DESIGN §3). This file is a contract: add to it, never rename.

Layout everywhere: ``[B, T, heads, dim]``. Queries ``q [B, T, HQ, dk]``; each branch's keys /
values ``[B, T, G, dk|dv]`` with ``HQ % G == 0`` (the h = HQ/G heads of a group are contiguous:
query head ``hq`` belongs to group ``hq // h``). Scale ``1/sqrt(dk)``.

Backends per branch: ``"reference"`` (explicit masks + dense math, float64-capable, the
oracle), ``"sdpa"`` (torch SDPA with the same masks), ``"triton"`` (selection only),
``"flash"`` (compressed / sliding), ``"auto"`` (nsa_core.routing decides). ``nsa_attention``
also takes a dict ``{"cmp": ..., "slc": ..., "win": ..., "score": ...}`` ("score": the selection
scoring + top-n, ``select_blocks(backend=...)``: "auto" | "reference" | "triton").
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from nsa_core import _dense
from nsa_core._shapes import check_qkv
from nsa_core.compression import reference as _cmp_ref
from nsa_core.config import BRANCHES, NSAConfig  # noqa: F401  (functional.BRANCHES stays public)
from nsa_core.selection import reference as _slc_ref
from nsa_core.window import reference as _win_ref

BACKENDS = {
    "cmp": ("reference", "sdpa", "flash"),
    "slc": ("reference", "sdpa", "triton"),
    "win": ("reference", "sdpa", "flash"),
}

# scores of one query chunk in select_blocks: [B, HQ, chunk, Tc] elements
_SELECT_BUDGET = 1 << 25


def _engine(backend: str, branch: str) -> str | None:
    """Map a dense backend name to the engine of nsa_core._dense; None for kernel backends."""
    if backend == "reference":
        return "math"
    if backend == "sdpa":
        return "sdpa"
    if backend in BACKENDS[branch]:
        return None
    raise ValueError(f"unknown backend {backend!r} for branch {branch!r}; expected one of {BACKENDS[branch]}")


def _resolve(backend, branch: str, device: torch.device, S: int | None = None) -> str:
    """A concrete backend name; "auto" asks the router (thresholds are per key length S)."""
    if isinstance(backend, dict):
        backend = backend.get(branch, "reference")
    if backend == "auto":
        from nsa_core import routing

        backend = routing.cached_decide(str(device.type)).backend(branch, S=S)
    return backend


def _check_group(q: torch.Tensor, k: torch.Tensor, what: str, v: torch.Tensor | None = None) -> None:
    check_qkv(q, k, v, what, causal=True, same_dtype=False)


# ---- compression -------------------------------------------------------------------------

def compress(x: torch.Tensor, cfg: NSAConfig, phi: Callable[[torch.Tensor], torch.Tensor] | None = None
             ) -> torch.Tensor:
    """Compress raw branch keys/values ``x [B, T, G, D] -> [B, Tc, G, D]`` (Eq. 7).

    Token i summarises raw tokens [i*d, i*d + l); Tc = compressed tokens visible at t = T-1.
    ``cfg.phi == "avg"``: the mean. ``"mlp"``: pass the learnable ``phi`` (maps blocks
    ``[B, Tc, G, l, D] -> [B, Tc, G, D]``, e.g. ``NSAAttention.phi_k``).
    """
    if x.dim() != 4:
        raise ValueError(f"compress: x must be [B, T, G, D], got {tuple(x.shape)}")
    if phi is None:
        if cfg.phi == "mlp":
            raise ValueError("compress: cfg.phi='mlp' needs the learnable phi module (phi=...)")
        return _cmp_ref.compress_avg(x, cfg)
    Tc = cfg.num_cmp(x.shape[1])
    if Tc == 0:
        return x.new_zeros(x.shape[0], 0, *x.shape[2:])
    blocks = x.unfold(1, cfg.l, cfg.d)[:, :Tc].permute(0, 1, 2, 4, 3)  # [B, Tc, G, l, D]
    return phi(blocks)


# ---- selection ---------------------------------------------------------------------------

@torch.no_grad()
def block_scores(q: torch.Tensor, kc: torch.Tensor, S: int, cfg: NSAConfig, scale: float | None = None
                 ) -> torch.Tensor:
    """Per-group selection scores (Eqs. 8-10) for the last Tq of S positions.

    q [B, Tq, HQ, dk], kc COMPRESSED keys [B, Tc, G, dk] -> [B, Tq, G, NB] (float32 or float64),
    NB = ceil(S / l_sel). p_cmp is the softmax over visible compressed tokens (empty -> 0).
    """
    B, Tq, HQ, dk = q.shape
    G = kc.shape[2]
    h = HQ // G
    Tc = kc.shape[1]
    NB = cfg.num_sel_blocks(S)
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = q.new_zeros(B, Tq, G, NB, dtype=cdt)
    if Tc == 0:
        return out
    scale = 1.0 / math.sqrt(dk) if scale is None else scale
    W = _slc_ref.overlap_matrix(Tc, NB, cfg, device=q.device, dtype=cdt)  # [Tc, NB]
    kcf = kc.to(cdt)
    t_all = torch.arange(S - Tq, S, device=q.device)
    C = max(1, _SELECT_BUDGET // max(1, B * HQ * Tc))
    for c0 in range(0, Tq, C):
        c1 = min(Tq, c0 + C)
        t = t_all[c0:c1]
        qc = q[:, c0:c1].to(cdt).reshape(B, c1 - c0, G, h, dk)
        s = torch.einsum("bcghd,bsgd->bcghs", qc, kcf) * scale
        vis = _cmp_ref.cmp_visibility_mask(t, Tc, cfg)  # [C, Tc]
        has = vis.any(-1)
        s = s.masked_fill(~(vis | ~has[:, None])[None, :, None, None, :], float("-inf"))
        p = torch.softmax(s, dim=-1) * has[None, :, None, None, None].to(cdt)
        out[:, c0:c1] = p.sum(dim=3) @ W  # sum heads of the group (Eq. 10), then map (Eq. 9)
    return out


@torch.no_grad()
def select_blocks(q: torch.Tensor, k_cmp: torch.Tensor, cfg: NSAConfig, *,
                  phi: Callable[[torch.Tensor], torch.Tensor] | None = None,
                  scale: float | None = None, backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Top-n selection blocks per (token, group) (Eqs. 8-11).

    q [B, T, HQ, dk]; k_cmp RAW compression-branch keys [B, T, G, dk] (compressed here).
    -> block_idx [B, T, G, n] int32 (chosen ids ascending, then -1), block_count [B, T, G] int32.
    All heads of a group share the choice (GQA consistency).
    backend: "reference" (torch block_scores + topn_blocks, float64-capable: the oracle),
    "triton" (the fused kernel of nsa_core.selection.scoring), "auto" (triton on CUDA where it
    supports the call, else reference). The two agree except at near-ties (DESIGN §7).
    """
    _check_group(q, k_cmp, "select_blocks")
    S = k_cmp.shape[1]
    kc = compress(k_cmp, cfg, phi)
    return _select_on(q, kc, S, cfg, scale, backend)


SELECT_BACKENDS = ("auto", "reference", "triton")


def select_backend(backend, q: torch.Tensor, kc: torch.Tensor, S: int, cfg: NSAConfig) -> tuple[str, str]:
    """(concrete scoring/top-n backend, reason) for ``select_blocks`` / ``nsa_attention``.

    ``backend`` may be an nsa_attention backend: a dict uses its "score" key (default "auto"),
    the string "auto" stays "auto", any other branch backend name means the reference.
    """
    if isinstance(backend, dict):
        backend = backend.get("score", "auto")
    elif backend in {b for bs in BACKENDS.values() for b in bs} - set(SELECT_BACKENDS):
        backend = "reference"  # a branch backend name ("sdpa", "flash"): the torch scoring path
    if backend not in SELECT_BACKENDS:
        raise ValueError(f"select_blocks: unknown backend {backend!r}; expected one of {SELECT_BACKENDS}")
    if backend != "auto":
        return backend, "requested"
    from nsa_core.selection import scoring

    why = scoring.supports(q, kc, S, cfg)
    return ("reference", f"fused kernel not used: {why}") if why else ("triton", "CUDA + triton: fused kernel")


def _select_on(q, kc, S, cfg, scale, backend, lse=None):
    backend, _ = select_backend(backend, q, kc, S, cfg)
    if backend == "triton":
        from nsa_core.selection import scoring

        return scoring.fused_select_blocks(q if q.stride(-1) == 1 else q.contiguous(),
                                           kc if kc.stride(-1) == 1 else kc.contiguous(), S, cfg, scale, lse=lse)
    scores = block_scores(q, kc, S, cfg, scale)
    t_pos = torch.arange(S - q.shape[1], S, device=q.device)
    return _slc_ref.topn_blocks(scores, t_pos, cfg)


# ---- branches ----------------------------------------------------------------------------

def compressed_attention(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, cfg: NSAConfig,
                         backend: str = "reference", *, phi_k=None, phi_v=None,
                         scale: float | None = None) -> torch.Tensor:
    """Compressed branch. RAW keys/values in ([B, T, G, dk|dv]); o [B, T, HQ, dv].

    A query that sees no compressed token yet (t + 1 < l) gets o = 0.
    """
    _check_group(q, k_cmp, "compressed_attention", v_cmp)
    backend = _resolve(backend, "cmp", q.device, k_cmp.shape[1])
    S = k_cmp.shape[1]
    kc, vc = compress(k_cmp, cfg, phi_k), compress(v_cmp, cfg, phi_v)
    return _compressed_on(q, kc, vc, S, cfg, backend, scale)


def _compressed_on(q, kc, vc, S, cfg, backend, scale, return_lse=False):
    """o_cmp, or (o_cmp, lse or None) with ``return_lse`` (only flash paths return an lse)."""
    eng = _engine(backend, "cmp")
    if eng is not None:
        o = _cmp_ref.compressed_attention(q, kc, vc, S, cfg, scale, eng)
        return (o, None) if return_lse else o
    from nsa_core.compression import fast

    return fast.compressed_attention(q, kc, vc, S, cfg, scale=scale, return_lse=return_lse)


def selection_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_idx: torch.Tensor,
                        block_count: torch.Tensor, cfg: NSAConfig, backend: str = "reference", *,
                        scale: float | None = None) -> torch.Tensor:
    """Selected branch (Eq. 12): raw tokens of the selected l_sel-blocks, causal. o [B, T, HQ, dv]."""
    _check_group(q, k, "selection_attention", v)
    backend = _resolve(backend, "slc", q.device, k.shape[1])
    eng = _engine(backend, "slc")
    if eng is not None:
        return _slc_ref.selection_attention(q, k, v, block_idx, block_count, cfg.l_sel, scale, eng)
    from nsa_core.selection import attention as triton_sel

    return triton_sel.selection_attention(q, k, v, block_idx, block_count, cfg.l_sel, scale=scale)


def sliding_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: NSAConfig,
                      backend: str = "reference", *, scale: float | None = None) -> torch.Tensor:
    """Sliding-window branch: keys max(0, t-w+1)..t. o [B, T, HQ, dv]."""
    _check_group(q, k, "sliding_attention", v)
    backend = _resolve(backend, "win", q.device, k.shape[1])
    eng = _engine(backend, "win")
    if eng is not None:
        return _win_ref.sliding_attention(q, k, v, cfg.w, scale, eng)
    from nsa_core.window import fast

    return fast.sliding_attention(q, k, v, cfg.w, scale=scale)


def full_attention(q, k, v, backend: str = "reference", *, scale: float | None = None) -> torch.Tensor:
    """Full causal attention with GQA (the equivalence anchor and the speed baseline)."""
    _check_group(q, k, "full_attention", v)
    return _dense.full_attention(q, k, v, scale, _engine(backend, "win") or "sdpa")


def nsa_attention(q, k_cmp, v_cmp, k_sel, v_sel, k_win, v_win, gates, cfg: NSAConfig,
                  backend="reference", *, phi_k=None, phi_v=None, scale: float | None = None,
                  return_selection: bool = False):
    """Full NSA attention (Eq. 5 without the output projection).

    q [B, T, HQ, dk]; k_*/v_* [B, T, G, dk|dv] (RAW per-branch keys/values; the compression
    branch is compressed here); gates [B, T, HQ, 3] in [0, 1], order (cmp, slc, win).
    -> o [B, T, HQ, dv]  (and (block_idx, block_count) with return_selection=True).
    Selection scoring + top-n: backend "auto" -> the fused Triton kernel on CUDA; a dict may
    name it with the key "score" ("auto" | "reference" | "triton"; default "auto"); any other
    string backend -> the reference scoring (see select_backend).
    """
    for name, kk, vv in (("cmp", k_cmp, v_cmp), ("slc", k_sel, v_sel), ("win", k_win, v_win)):
        _check_group(q, kk, f"nsa_attention({name} branch)", vv)
    if not (v_cmp.shape[-1] == v_sel.shape[-1] == v_win.shape[-1]):
        raise ValueError(f"nsa_attention: the branches' value dims must agree (dv of cmp/sel/win = "
                         f"{v_cmp.shape[-1]}/{v_sel.shape[-1]}/{v_win.shape[-1]})")
    if not (k_cmp.shape[1] == k_sel.shape[1] == k_win.shape[1]):
        raise ValueError(f"nsa_attention: the branches' key lengths must agree "
                         f"({k_cmp.shape[1]}/{k_sel.shape[1]}/{k_win.shape[1]})")
    B, T, HQ, _ = q.shape
    if gates.shape != (B, T, HQ, 3):
        raise ValueError(f"nsa_attention: gates must be [B, T, HQ, 3] = [{B}, {T}, {HQ}, 3], got {tuple(gates.shape)}")
    S = k_cmp.shape[1]
    kc, vc = compress(k_cmp, cfg, phi_k), compress(v_cmp, cfg, phi_v)
    cmp_backend = _resolve(backend, "cmp", q.device, S)
    lse = None
    if cmp_backend == "flash" and select_backend(backend, q, kc, S, cfg)[0] == "triton":
        # the compressed branch's flash kernel returns its per-head log-sum-exp (where the path
        # exposes it): the fused scoring then skips its own first pass over the compressed keys
        o_cmp, lse = _compressed_on(q, kc, vc, S, cfg, cmp_backend, scale, return_lse=True)
    else:
        o_cmp = _compressed_on(q, kc, vc, S, cfg, cmp_backend, scale)
    with torch.no_grad():  # selection is a discrete choice: no gradient flows through it
        block_idx, block_count = _select_on(q.detach(), kc.detach(), S, cfg, scale, backend, lse)
    o_slc = selection_attention(q, k_sel, v_sel, block_idx, block_count, cfg, _resolve(backend, "slc", q.device, S),
                                scale=scale)
    o_win = sliding_attention(q, k_win, v_win, cfg, _resolve(backend, "win", q.device, S), scale=scale)
    from nsa_core import _gates  # Eq. 5: one fused Triton pass on CUDA, the torch expression elsewhere

    if backend == "reference":
        o = _gates._torch(gates, o_cmp, o_slc, o_win)
    else:
        o = _gates.combine(gates, o_cmp, o_slc, o_win)
    return (o, (block_idx, block_count)) if return_selection else o
