"""The built-in implementation: ``nsa_core`` (registered in pyproject.toml like any adapter).

Its ``selection_attention`` is the Triton selection kernel (what ``triton-fwd`` / ``triton-bwd``
have always checked); the other parts are the functional API with ``backend="auto"`` (the
router's choice on this machine, DESIGN §3).
"""

from __future__ import annotations

from nsa_runner.impls import Impl


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    return F.select_blocks(q, k_cmp, cfg)


def _selection_attention(q, k, v, block_idx, block_count, cfg):
    from nsa_core.selection import attention as triton_sel

    return triton_sel.selection_attention(q, k, v, block_idx, block_count, cfg.l_sel, deterministic=True)


def _compressed_attention(q, k_cmp, v_cmp, cfg):
    from nsa_core import functional as F

    return F.compressed_attention(q, k_cmp, v_cmp, cfg, backend="auto")


def _sliding_attention(q, k, v, cfg):
    from nsa_core import functional as F

    return F.sliding_attention(q, k, v, cfg, backend="auto")


def _nsa_attention(q, k_cmp, v_cmp, k_sel, v_sel, k_win, v_win, gates, cfg):
    from nsa_core import functional as F

    return F.nsa_attention(q, k_cmp, v_cmp, k_sel, v_sel, k_win, v_win, gates, cfg, backend="auto")


def make() -> Impl:
    return Impl(
        name="nsa_core",
        parts={"select": _select, "selection_attention": _selection_attention,
               "compressed_attention": _compressed_attention, "sliding_attention": _sliding_attention,
               "nsa_attention": _nsa_attention},
        description="this project's NSA library: Triton selection kernel; other parts through the router "
                    "(backend='auto')",
    )
