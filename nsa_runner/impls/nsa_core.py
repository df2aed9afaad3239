"""The built-in implementation: ``nsa_core`` (registered in pyproject.toml like any adapter).

Its ``selection_attention`` is the Triton selection kernel (what ``triton-fwd`` / ``triton-bwd``
have always checked); the other parts are the functional API with ``backend="auto"`` (the
router's choice on this machine, DESIGN §3). ``decode_step`` (contract: ``nsa_runner.impls.DECODE_STEP``)
is the attention part of nsa_core's static decode step (``StaticDecoder.attn``: append + three
branches + gates; triton kernels on CUDA when Triton is installed, torch elsewhere) over an
``NSACache`` filled from the context. decode-bench times nsa_core through its whole layer step
instead (projections included, ``--kernel``); this part is what an adapter's step is compared with.
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


def _decode_step(k_cmp, v_cmp, k_sel, v_sel, k_win, v_win, cfg, capacity):
    import torch

    from nsa_core import functional as F
    from nsa_core.decode.cache import NSACache

    B, t0, G, dk = k_sel.shape
    dv = v_sel.shape[-1]
    cache = NSACache.empty(cfg, B, G, dk, dv, max(int(capacity), t0 + 1), dtype=k_sel.dtype, device=k_sel.device)
    with torch.no_grad():
        cache.fill_(k_cmp, v_cmp, k_sel, v_sel, k_win, v_win, F.compress(k_cmp, cfg), F.compress(v_cmp, cfg))
    state = {}

    def step(t, q, k_cmp, v_cmp, k_sel, v_sel, k_win, v_win, gates):
        dec = state.get("dec")
        if dec is None:  # the query heads are known at the first step
            dec = state["dec"] = _static_decoder(cache, q.shape[2], cfg)
        dec.pos.fill_(int(t))
        with torch.no_grad():
            o = dec.attn(q[:, 0], *(x[:, 0].contiguous() for x in (k_cmp, v_cmp, k_sel, v_sel, k_win, v_win)),
                         gates[:, 0])
        cache.length = max(cache.length, int(t) + 1)
        blk = dec.blk
        big = torch.iinfo(torch.int64).max
        srt = torch.sort(torch.where(blk >= 0, blk, torch.full_like(blk, big)), dim=-1).values
        idx = torch.where(srt == big, torch.full_like(srt, -1), srt)
        return o[:, None], idx[:, None].to(torch.int32), (blk >= 0).sum(-1)[:, None].to(torch.int32)

    return step


def _static_decoder(cache, HQ: int, cfg):
    """nsa_core's StaticDecoder over ``cache``, for its attention part only: the layer it is built on
    (model dim 1) gives the shapes it checks; its projections are never used."""
    from nsa_core import NSAAttention
    from nsa_core.decode.static import StaticDecoder

    layer = NSAAttention(1, HQ, cache.groups, cache.K_sel.shape[-1], cache.V_sel.shape[-1], cfg)
    layer = layer.to(device=cache.device, dtype=cache.dtype).eval()
    kernel = "triton" if cache.device.type == "cuda" and _has_triton() else "torch"
    return StaticDecoder(layer, cache, impl=kernel)


def _has_triton() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def make() -> Impl:
    return Impl(
        name="nsa_core",
        parts={"select": _select, "selection_attention": _selection_attention,
               "compressed_attention": _compressed_attention, "sliding_attention": _sliding_attention,
               "nsa_attention": _nsa_attention, "decode_step": _decode_step},
        description="this project's NSA library: Triton selection kernel; other parts through the router "
                    "(backend='auto')",
    )
