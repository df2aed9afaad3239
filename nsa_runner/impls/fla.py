"""Adapter: fla's NSA (``fla.ops.nsa.parallel_nsa``, flash-linear-attention; optional dependency,
pure Python: ``pip install fla-core einops``, carry the wheels to an offline GPU).

Parts and how they map onto DESIGN §3:

- ``selection_attention``: fla's selection kernel (``ParallelNSAFunction``) given OUR block
  indices: the formats agree (``[B, T, G, n]`` ids, ``-1`` / future ids skipped, ``block_count``
  per (token, group)); forward and backward.
- ``select``: fla's top-n (``parallel_nsa_topk`` over ``mean_pooling`` of the raw keys); its ids
  come sorted by score and padded with -1 — the adapter sorts them ascending and counts them.
- ``compressed_attention``: ``mean_pooling`` + ``parallel_nsa_compression``.
- ``nsa_attention``: the whole ``parallel_nsa`` (cmp + top-n + slc, + window through flash-attn).

Where fla's semantics differ from DESIGN §2 (each is a constraint, so such a case is a SKIP that
names it, and the comparable cases are checked with our tolerances):

- compression block = stride = selection block (``l = d = l'``: fla pools non-overlapping blocks of
  the selection block size; DESIGN allows overlapping ``l > d`` and ``l' > l``, Eq. 9's overlap
  mapping then weights several compressed blocks per selection block; with ``l = d = l'`` Eq. 9
  is the identity and both agree);
- one K/V for all three branches (DESIGN: each branch its own ``k_*/v_*``);
- ``n`` must be a power of two (fla fills ``next_power_of_2(n)`` slots) and ``l' >= 2n``;
- forced blocks: fla forces block 0 and the local blocks ``t//l'`` and ``t//l' - 1`` like DESIGN
  §2 (this wheel's version); ties are broken by its bitonic sort, not by the lower index, so
  ``select`` is compared with DESIGN §7's near-tie rule;
- a query with no selected block gives 0/0 = NaN (DESIGN: 0): ragged selections are not run;
- heads per group must be a power of two, >= 16 on CUDA (a ``tl.dot`` tile; the Triton
  interpreter on CPU takes any power of two); the window branch needs flash-attn (CUDA, fp16/bf16).

No ``decode_step``: ``parallel_nsa`` attends whole sequences (no KV cache, no one-token step), so
decode-bench records fla's points as SKIP ("fla: does not provide decode_step (...)").
"""

from __future__ import annotations

import os
import sys

from nsa_runner.impls import Case, Constraints, Impl

HINT = "pip install fla-core einops   (pure Python; offline: carry the wheels, pip install --no-deps)"


def _same(a, b) -> bool:
    return a is b or (a.shape == b.shape and a.data_ptr() == b.data_ptr() and a.stride() == b.stride())


def _pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _one_config_under_the_interpreter() -> bool:
    """Under TRITON_INTERPRET=1 fla's autotuners would benchmark their configs, which needs a GPU
    driver; keep each one's first config (results do not depend on the config). Returns True when
    something was changed."""
    if not _interpreting():
        return False
    from triton.runtime.autotuner import Autotuner

    changed = False
    for mod_name, mod in list(sys.modules.items()):
        if not mod_name.startswith("fla.") or mod is None:
            continue
        for obj in list(vars(mod).values()):
            f, depth = obj, 0
            while f is not None and depth < 4:
                if isinstance(f, Autotuner) and len(f.configs) > 1:
                    f.configs, changed = f.configs[:1], True
                f, depth = getattr(f, "fn", None), depth + 1
    return changed


def _check(case: Case, part: str) -> str | None:
    """l = d = l', n a power of 2, l' >= 2n, one shared K/V, no empty selection, h >= 16 on CUDA, window: flash-attn"""
    h = case.h
    if case.device == "cuda" and h < 16:
        return f"heads per group must be a power of two >= 16 on CUDA (case has HQ/G = {case.HQ}/{case.G} = {h})"
    cfg = case.cfg
    if part == "selection_attention":
        if cfg is not None and not _pow2(cfg.l_sel):
            return f"selection block l' must be a power of two (case has l'={cfg.l_sel})"
        if case.empty_rows:
            return "a query with no selected block gives 0/0 = NaN (DESIGN §2: 0): ragged selections not comparable"
        return None
    if cfg is None:
        return None
    if getattr(cfg, "phi", "avg") != "avg":
        return f"compression is mean pooling only (case has phi={cfg.phi!r})"
    if part == "compressed_attention":
        if cfg.l != cfg.d or not _pow2(cfg.l):
            return (f"compression blocks must not overlap: needs l = d, a power of two (case has l={cfg.l} "
                    f"d={cfg.d})")
        return None
    if not (cfg.l == cfg.d == cfg.l_sel) or not _pow2(cfg.l_sel):
        return (f"one block size for compression and selection: needs l = d = l' (a power of two), so Eq. 9 is the "
                f"identity (case has l={cfg.l} d={cfg.d} l'={cfg.l_sel})")
    if not _pow2(cfg.n_sel) or cfg.l_sel < 2 * cfg.n_sel:
        return f"n must be a power of two and l' >= 2n (case has n={cfg.n_sel}, l'={cfg.l_sel})"
    if part == "nsa_attention":
        if not case.shared_kv:
            return "one shared K/V for all branches (DESIGN: k_cmp/k_sel/k_win apart): needs a shared-K/V case"
        if case.window:
            if case.device != "cuda" or not _fa2_present():
                return "its window branch calls flash-attn (CUDA, not installed / not here): needs window gate 0"
            if case.dtype == "fp32":
                return "its window branch (flash-attn) needs fp16/bf16"
    return None


def _fa2_present() -> bool:
    """fla's window branch calls FA-2's flash_attn_func: the real package, not FA-4's flash_attn namespace."""
    from nsa_core.flash.detect import detect

    return bool(detect("fa2", do_import=False)["present"])


def make() -> Impl:
    base = dict(name="fla", description="flash-linear-attention's parallel_nsa (fla.ops.nsa), through an adapter",
                differences={
                    "select": "fla pools non-overlapping blocks of l' and scores blocks directly (l = d = l' only); "
                              "ties broken by a bitonic sort: compared with DESIGN §7's near-tie rule",
                    "nsa_attention": "one shared K/V for cmp/slc/win; l = d = l'; window via flash-attn "
                                     "(off: gate 0, where flash-attn is missing)",
                    "selection_attention": "a query with no selected block gives NaN (DESIGN: 0); fp32 runs its dots "
                                           "in tf32 (checked with the tf32 tolerance); its backward accumulates dk/dv "
                                           "with atomics (not bitwise repeatable: reported, not required)",
                    "decode_step": "this adapter wraps parallel_nsa, which attends whole sequences (no KV cache, "
                                   "no one-token step)"},
                constraints=Constraints(dtypes=("fp32", "fp16", "bf16"), max_head_dim=256, heads_per_group_pow2=True,
                                        varlen=True, check=_check, fp32_dots_tf32=True,
                                        deterministic_backward=False))
    # fla's kernels are @triton.autotune'd: ~70 s per new shape on the H100 (prefill-bench's first T,
    # measured). Triton's own on-disk autotune cache keeps the winners, so a second run on this
    # machine skips it; read when fla's autotuners are built (at import), an explicit value wins.
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    try:
        import fla.ops.nsa.parallel as P
        from fla.ops.nsa.compression import parallel_nsa_compression
        from fla.ops.utils.pooling import mean_pooling
    except ImportError as e:
        missing = getattr(e, "name", "") or ""
        why = "fla is not installed" if missing.split(".")[0] == "fla" else f"fla cannot be imported: {e}"
        return Impl(parts={p: _unavailable for p in ("select", "selection_attention", "compressed_attention",
                                                      "nsa_attention")}, unavailable=why, hint=HINT, **base)
    note = "Triton interpreter: fla's autotune reduced to one config" if _one_config_under_the_interpreter() else ""

    def selection_attention(q, k, v, block_idx, block_count, cfg):
        return P.ParallelNSAFunction.apply(q, k, v, block_idx, block_count, cfg.l_sel, q.shape[-1] ** -0.5, None)

    def select(q, k_cmp, cfg):
        import torch

        kc = mean_pooling(k_cmp, cfg.l_sel, None)
        ids = P.parallel_nsa_topk(q, kc, k_cmp.shape[1], None, cfg.n_sel, cfg.l_sel, q.shape[-1] ** -0.5)
        big = torch.iinfo(torch.int32).max  # fla: by score, -1 padded -> ascending, -1 after, counted
        srt = torch.sort(torch.where(ids >= 0, ids, torch.full_like(ids, big)), dim=-1).values
        idx = torch.where(srt == big, torch.full_like(srt, -1), srt).to(torch.int32)
        return idx.contiguous(), (ids >= 0).sum(-1).to(torch.int32)

    def compressed_attention(q, k_cmp, v_cmp, cfg):
        kc, vc = mean_pooling(k_cmp, cfg.l, None), mean_pooling(v_cmp, cfg.l, None)
        o, _lse = parallel_nsa_compression(q, kc, vc, k_cmp.shape[1], cfg.l, q.shape[-1] ** -0.5)
        return o.to(q.dtype)

    def nsa_attention(q, k_cmp, v_cmp, k_sel, v_sel, k_win, v_win, gates, cfg):
        if not (_same(k_cmp, k_sel) and _same(v_cmp, v_sel)):
            raise ValueError("fla: one K/V for the cmp and slc branches (pass the same tensors)")
        window = bool((gates[..., 2] != 0).any())
        if window and not (_same(k_win, k_sel) and _same(v_win, v_sel)):
            raise ValueError("fla: one K/V for all branches (pass the same tensors)")
        return P.parallel_nsa(q, k_sel, v_sel, gates[..., 0], gates[..., 1], gates[..., 2] if window else None,
                              block_counts=cfg.n_sel, block_size=cfg.l_sel, window_size=cfg.w if window else 0)

    return Impl(parts={"select": select, "selection_attention": selection_attention,
                       "compressed_attention": compressed_attention, "nsa_attention": nsa_attention}, note=note,
                **base)


def _unavailable(*args, **kwargs):
    raise RuntimeError("fla is not available here")
