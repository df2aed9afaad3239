"""Triton selection attention (NSA Eq. 12, paper §3.4 / Fig. 3): ``backend="triton"``.

Four layers (STYLE.md): the ``@triton.jit`` kernels live in ``nsa_core.selection._attention_kernels``;
this file holds the host launchers (tiles, grid, outputs), one ``torch.autograd.Function`` and
the public functions with their input checks.

Forward: one program per (token, KV group) loads the group's h query heads once (padded to
``HP = max(16, next_pow2(h))`` rows for ``tl.dot``) and streams the selected key blocks with an
online softmax in fp32; keys after the query are neither loaded nor attended.

Backward: ``delta = rowsum(do * o)``; dq by one program per (token, group) over the same
blocks; dk/dv through an inverted index (for each (b, g, key block) the sorted list of queries
that selected it, built with ``torch.sort`` + ``bincount``), processed per key block and split
into segments of at most ``seg`` queries so a block chosen by every query (block 0) does not
serialise the grid. Blocks split over several segments write fp32 partial tiles that a second
kernel sums in segment order: every path of the default backward is deterministic (no
atomics), so ``deterministic=True`` changes nothing there; it forbids the atomic variants.
Two atomic variants are kept for measurement (``dkv_mode``): ``"atomic"`` (each (token, group)
adds its dk/dv contributions with fp32 atomics) and ``"index_dq_atomic"`` (dk/dv by the index,
dq added with atomics from the same kernel). bench/bench_selection.py measures all three;
docs/benchmarks.md has the numbers behind the default.

fp32 inputs use IEEE fp32 dots (no tf32), so the fp32 tolerance of DESIGN §7 (1e-5) applies.
"""

from __future__ import annotations

import math

import torch

from nsa_core._kernel_utils import interpreting as _interpreting
from nsa_core._kernel_utils import np2 as _np2
from nsa_core._shapes import check_qkv
from nsa_core._triton import triton  # optional: the module imports without triton, the functions then raise

_k = None
if triton is not None:
    try:
        from nsa_core.selection import _attention_kernels as _k
    except Exception:  # noqa: BLE001 - kernels this triton cannot define: as without triton
        triton = None

__all__ = ["selection_attention", "selection_attention_fwd", "selection_attention_bwd", "available",
           "DKV_MODES"]

DKV_MODES = ("index", "atomic", "index_dq_atomic")
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_H = 16

# Launch settings, from the H100 sweeps in docs/benchmarks.md (T=64K, HQ=64, G=4, d=128, bf16).
# num_warps None = 2 when both head dims fit in 128 lanes (fastest there), else 4 (fewer registers
# per thread for the 256-wide tiles of dk=192). qt > 1 (several tokens per program sharing the
# forced blocks) and preload=True are exact alternatives that measured slower; kept for the sweep.
CONFIG = {
    "fwd": {"num_warps": None, "num_stages": 2, "preload": False, "qt": 1},
    "dq": {"num_warps": None, "num_stages": 2, "preload": False, "qt": 1},
    "dkv": {"num_warps": 4, "num_stages": 2, "rows": 32, "seg": 1024},
    "atomic": {"num_warps": 4, "num_stages": 1, "preload": False},
}
DEFAULT_DKV_MODE = "index"
LAST_COMPILED: dict = {}  # kernel name -> the last CompiledKernel launched (bench diagnostics: regs, spills)


def available() -> bool:
    """True when triton imports (on CPU the kernels run only with TRITON_INTERPRET=1)."""
    return triton is not None


# ---- input checks ---------------------------------------------------------------------------

def _check_inputs(q, k, v, block_idx, block_count, block_size, validate_indices: bool = True):
    if triton is None:
        raise RuntimeError("nsa_core.selection.attention needs triton: pip install triton")
    for name, x in (("q", q), ("k", k), ("v", v), ("block_idx", block_idx), ("block_count", block_count)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"selection_attention: {name} must be a torch.Tensor, got {type(x).__name__}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"selection_attention: dtype mix q {q.dtype}, k {k.dtype}, v {v.dtype}; use one dtype")
    B, Tq, HQ, G, S = check_qkv(q, k, v, "selection_attention")
    dk = q.shape[3]
    if Tq > S:
        raise ValueError(f"selection_attention: more queries ({Tq}) than keys ({S})")
    h = HQ // G
    if not 1 <= h <= MAX_H:
        raise ValueError(f"selection_attention: heads per group h = HQ/G = {h} is outside 1..{MAX_H}")
    if min(B, Tq, dk, v.shape[3]) == 0:
        raise ValueError(f"selection_attention: empty input q{tuple(q.shape)} v{tuple(v.shape)}")
    if dk > 256 or v.shape[3] > 256:
        raise ValueError(f"selection_attention: head dims up to 256 are supported, got dk={dk}, dv={v.shape[3]}")
    if q.dtype not in _DTYPES:
        raise ValueError(f"selection_attention: dtype {q.dtype} not supported (float32, float16, bfloat16)")
    if not (q.device == k.device == v.device == block_idx.device == block_count.device):
        raise ValueError("selection_attention: all tensors must be on one device; got "
                         f"q {q.device}, k {k.device}, v {v.device}, block_idx {block_idx.device}, "
                         f"block_count {block_count.device}")
    if q.device.type != "cuda" and not _interpreting():
        raise ValueError(f"selection_attention: tensors on {q.device} need a CUDA device, or TRITON_INTERPRET=1 "
                         "set before triton is imported (CPU interpreter)")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.stride(-1) != 1:
            raise ValueError(f"selection_attention: {name} must be contiguous in its last dim (stride {x.stride()})")
    if block_idx.dtype != torch.int32 or block_count.dtype != torch.int32:
        raise ValueError(f"selection_attention: block_idx / block_count must be int32, got "
                         f"{block_idx.dtype} / {block_count.dtype}")
    if block_idx.dim() != 4 or tuple(block_idx.shape[:3]) != (B, Tq, G) or tuple(block_count.shape) != (B, Tq, G):
        raise ValueError(f"selection_attention: block_idx {tuple(block_idx.shape)} / block_count "
                         f"{tuple(block_count.shape)} must be [B, T, G, n] / [B, T, G] = [{B}, {Tq}, {G}, n] / "
                         f"[{B}, {Tq}, {G}]")
    if not block_idx.is_contiguous() or not block_count.is_contiguous():
        raise ValueError("selection_attention: block_idx and block_count must be contiguous")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or not 1 <= block_size <= 256:
        raise ValueError(f"selection_attention: block_size must be an int in 1..256, got {block_size!r}")
    if validate_indices:
        _check_indices(block_idx, block_count, S, block_size)


def _check_indices(block_idx: torch.Tensor, block_count: torch.Tensor, S: int, block_size: int) -> None:
    """Counts in 0..n; the first count ids strictly ascending in 0..NB-1; the rest -1. One host sync."""
    n = block_idx.shape[-1]
    NB = (S + block_size - 1) // block_size
    live = torch.arange(n, device=block_idx.device) < block_count[..., None]
    bad_count = (block_count < 0) | (block_count > n)
    bad_id = live & ((block_idx < 0) | (block_idx >= NB))
    bad_pad = ~live & (block_idx != -1)
    bad_order = live[..., 1:] & (block_idx[..., 1:] <= block_idx[..., :-1]) if n > 1 else None
    flags = torch.stack([bad_count.any(), bad_id.any(), bad_pad.any(),
                         bad_order.any() if bad_order is not None else bad_count.new_zeros(())])
    bc, bi, bp, bo = flags.tolist()
    if bc:
        raise ValueError(f"selection_attention: block_count outside 0..n={n} "
                         f"(min {int(block_count.min())}, max {int(block_count.max())})")
    if bi:
        bad = block_idx[bad_id]
        raise ValueError(f"selection_attention: block id out of range 0..{NB - 1} (T={S}, block_size={block_size}): "
                         f"found {int(bad.min()) if int(bad.min()) < 0 else int(bad.max())} in a live slot")
    if bp:
        raise ValueError("selection_attention: block_idx slots at or past block_count must be -1 (padding)")
    if bo:
        raise ValueError("selection_attention: the live block ids of each (token, group) must be strictly ascending "
                         "(distinct); a repeated block would be counted twice")


# ---- host launchers -------------------------------------------------------------------------

POISON = False  # tests set True: fresh outputs are NaN-filled, so an unwritten element cannot pass


def _new(*shape, dtype, device):
    t = torch.empty(*shape, dtype=dtype, device=device)
    if POISON:
        from nsa_core.testing import fill_nan_

        fill_nan_(t)
    return t


def _warps(cfg: dict, geo: dict) -> int:
    nw = cfg.get("num_warps")
    return int(nw) if nw else (2 if geo["BK"] <= 128 and geo["BV"] <= 128 else 4)


def _geometry(q, k, v, block_idx, block_size):
    B, Tq, HQ, dk = q.shape
    S, G = k.shape[1], k.shape[2]
    dv = v.shape[3]
    h = HQ // G
    return dict(B=B, Tq=Tq, HQ=HQ, dk=dk, dv=dv, S=S, G=G, h=h, n=block_idx.shape[-1],
                NB=(S + block_size - 1) // block_size, HP=max(16, _np2(h)), BK=max(16, _np2(dk)),
                BV=max(16, _np2(dv)), BS=max(16, _np2(block_size)))


def selection_attention_fwd(q, k, v, block_idx, block_count, block_size, scale=None, *,
                            validate_indices: bool = True, config: dict | None = None):
    """Forward launcher. Shapes as in :func:`selection_attention`.

    -> (o [B, T, HQ, dv] in q.dtype, lse [B, T, HQ] float32, natural log; -inf where a query
    sees no key, and then o = 0).
    """
    _check_inputs(q, k, v, block_idx, block_count, block_size, validate_indices)
    geo = _geometry(q, k, v, block_idx, block_size)
    scale = 1.0 / math.sqrt(geo["dk"]) if scale is None else float(scale)
    cfg = {**CONFIG["fwd"], **(config or {})}
    o = _new(geo["B"], geo["Tq"], geo["HQ"], geo["dv"], dtype=q.dtype, device=q.device)
    lse = _new(geo["B"], geo["Tq"], geo["HQ"], dtype=torch.float32, device=q.device)
    qt = int(cfg.get("qt", 1))
    meta = dict(G=geo["G"], H=geo["h"], N=geo["n"], BLOCK_SIZE=block_size, DK=geo["dk"], DV=geo["dv"],
                HP=geo["HP"], BK=geo["BK"], BV=geo["BV"], BS=geo["BS"], IEEE=q.dtype == torch.float32,
                NP=_np2(geo["n"]), num_warps=_warps(cfg, geo), num_stages=cfg["num_stages"])
    if qt > 1:
        if qt not in (2, 4):
            raise ValueError(f"selection_attention_fwd: config qt must be 1, 2 or 4, got {qt}")
        # the shared multi-token kernel in forward mode: DO, DELTA, DQ and their strides are not read
        kernel, grid = _k._qt_kernel, (triton.cdiv(geo["Tq"], qt), geo["B"] * geo["G"])
        bufs, strides, tail, meta = (o, lse, o, lse, o), (0, 0, 0), (1.0,), {**meta, "QT": qt, "BWD": False}
    else:
        kernel, grid = _k._fwd_kernel, (geo["Tq"], geo["B"] * geo["G"])
        bufs, strides, tail, meta = (o, lse), (), (), {**meta, "PRELOAD": bool(cfg["preload"])}
    LAST_COMPILED["fwd"] = kernel[grid](
        q, k, v, *bufs, block_idx, block_count,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), *strides,
        geo["Tq"], geo["S"], geo["S"] - geo["Tq"], scale * _k.LOG2E, *tail, **meta)
    return o, lse


def _delta(o, do):
    B, Tq, HQ, dv = o.shape
    delta = _new(B, Tq, HQ, dtype=torch.float32, device=o.device)
    n_rows = B * Tq * HQ
    BR = 64
    _k._bwd_pre_kernel[(triton.cdiv(n_rows, BR),)](
        o, do, delta, do.stride(0), do.stride(1), do.stride(2), n_rows, Tq, HQ=HQ, DV=dv, BR=BR,
        BV=max(16, _np2(dv)), num_warps=4)
    return delta


def _inverted_index(block_idx, block_count, geo, seg: int):
    """(b, g, key block) -> sorted selecting query rows, split in segments of <= seg queries.

    Returns csr_t [P] int32 (query rows t, grouped by key = (b*G + g)*NB + j, ascending t),
    per-segment arrays seg_key / seg_start / seg_end / seg_out (int32; seg_out = -1 when the
    segment is its block's only one, else its fp32 workspace slot), the number of workspace
    slots, and for the blocks split over several segments red_key / red_start / red_end (their
    workspace slot ranges). Every key block has at least one segment, so every dk/dv row is
    written. One torch.sort over (key, t) pairs (int32 when they fit): deterministic; one host
    sync for the sizes.
    """
    B, Tq, G, n, NB = geo["B"], geo["Tq"], geo["G"], geo["n"], geo["NB"]
    dev = block_idx.device
    nkeys = B * G * NB
    kdt = torch.int32 if (nkeys + 1) * Tq < 2**31 - 1 else torch.int64
    live = torch.arange(n, device=dev, dtype=torch.int32) < block_count[..., None]  # [B, Tq, G, n]
    b_ix = torch.arange(B, device=dev, dtype=kdt).view(B, 1, 1, 1)
    g_ix = torch.arange(G, device=dev, dtype=kdt).view(1, 1, G, 1)
    t_ix = torch.arange(Tq, device=dev, dtype=kdt).view(1, Tq, 1, 1)
    combined = ((b_ix * G + g_ix) * NB + block_idx.to(kdt)) * Tq + t_ix
    combined = torch.where(live, combined, torch.full_like(combined, nkeys * Tq))  # dead slots sort last
    combined = torch.sort(combined.flatten()).values  # values are unique: the order is deterministic
    keys_sorted = combined // Tq  # nkeys for dead slots
    csr_t = (combined - keys_sorted * Tq).to(torch.int32)
    counts = torch.bincount(keys_sorted, minlength=nkeys + 1)[:nkeys]
    offsets = torch.cumsum(counts, 0) - counts
    nseg = torch.clamp((counts + seg - 1) // seg, min=1)
    multi_blk = nseg > 1
    total, n_ws, n_red = (int(x) for x in torch.stack(
        [nseg.sum(), (nseg * multi_blk).sum(), multi_blk.sum()]).tolist())
    seg_first = torch.cumsum(nseg, 0) - nseg
    seg_key = torch.repeat_interleave(torch.arange(nkeys, device=dev), nseg, output_size=total)
    local = torch.arange(total, device=dev) - seg_first[seg_key]
    seg_start = offsets[seg_key] + local * seg
    seg_end = torch.minimum(seg_start + seg, offsets[seg_key] + counts[seg_key])
    multi = multi_blk[seg_key]
    slot = torch.cumsum(multi.to(torch.int64), 0) - 1
    seg_out = torch.where(multi, slot, torch.full_like(slot, -1))
    red_key = torch.sort(multi_blk.to(torch.int8), descending=True, stable=True).indices[:n_red]
    red_start = seg_out[seg_first[red_key]]
    red_end = red_start + nseg[red_key]
    i32 = torch.int32
    return (csr_t, seg_key.to(i32), seg_start.to(i32), seg_end.to(i32), seg_out.to(i32), n_ws,
            red_key.to(i32), red_start.to(i32), red_end.to(i32))


def _bwd_setup(q, k, v, o, do, block_idx, block_size, scale):
    geo = _geometry(q, k, v, block_idx, block_size)
    geo["scale"] = 1.0 / math.sqrt(geo["dk"]) if scale is None else float(scale)
    geo["qk_scale"] = geo["scale"] * _k.LOG2E
    geo["common"] = dict(G=geo["G"], H=geo["h"], BLOCK_SIZE=block_size, DK=geo["dk"], DV=geo["dv"], BK=geo["BK"],
                         BV=geo["BV"], BS=geo["BS"], IEEE=q.dtype == torch.float32)
    geo["strides"] = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                      v.stride(0), v.stride(1), v.stride(2), do.stride(0), do.stride(1), do.stride(2))
    return geo


def _launch_dq(q, k, v, do, lse, delta, block_idx, block_count, geo, cfg=None):
    c = {**CONFIG["dq"], **(cfg or {})}
    B, Tq, HQ, S = geo["B"], geo["Tq"], geo["HQ"], geo["S"]
    dq = _new(B, Tq, HQ, geo["dk"], dtype=q.dtype, device=q.device)
    qt = int(c.get("qt", 1))
    meta = dict(N=geo["n"], HP=geo["HP"], **geo["common"], NP=_np2(geo["n"]), num_warps=_warps(c, geo),
                num_stages=c["num_stages"])
    if qt > 1:
        if qt not in (2, 4):
            raise ValueError(f"selection_attention_bwd: config qt must be 1, 2 or 4, got {qt}")
        # the shared multi-token kernel in dq mode: O (here dq) is not written
        kernel, grid, bufs = _k._qt_kernel, (triton.cdiv(Tq, qt), B * geo["G"]), (dq, lse, do, delta, dq)
        meta.update(QT=qt, BWD=True)
    else:  # DK32 / DV32 (here dq): unused without ATOMIC_DKV
        kernel, grid, bufs = _k._bwd_dq_kernel, (Tq, B * geo["G"]), (do, lse, delta, dq, dq, dq)
        meta.update(PRELOAD=bool(c["preload"]), ATOMIC_DKV=False)
    LAST_COMPILED["dq"] = kernel[grid](
        q, k, v, *bufs, block_idx, block_count, *geo["strides"],
        Tq, S, S - Tq, geo["qk_scale"], geo["scale"], **meta)
    return dq


def _launch_atomic(q, k, v, do, lse, delta, block_idx, block_count, geo, cfg=None):
    c = {**CONFIG["atomic"], **(cfg or {})}
    B, Tq, HQ, S, G = geo["B"], geo["Tq"], geo["HQ"], geo["S"], geo["G"]
    dq = _new(B, Tq, HQ, geo["dk"], dtype=q.dtype, device=q.device)
    dk32 = torch.zeros(B, S, G, geo["dk"], dtype=torch.float32, device=q.device)
    dv32 = torch.zeros(B, S, G, geo["dv"], dtype=torch.float32, device=q.device)
    _k._bwd_dq_kernel[(Tq, B * G)](
        q, k, v, do, lse, delta, dq, dk32, dv32, block_idx, block_count, *geo["strides"],
        Tq, S, S - Tq, geo["qk_scale"], geo["scale"], N=geo["n"], HP=geo["HP"], **geo["common"],
        PRELOAD=bool(c["preload"]), NP=_np2(geo["n"]), ATOMIC_DKV=True, num_warps=_warps(c, geo),
        num_stages=c["num_stages"])
    return dq, dk32.to(k.dtype), dv32.to(v.dtype)


def _launch_dkv(q, k, v, do, lse, delta, index, geo, cfg=None, dq32=None):
    """dk, dv from the inverted index; with dq32 (fp32 [B, T, HQ, dk] zeros) also adds dq atomically."""
    c = {**CONFIG["dkv"], **(cfg or {})}
    (csr_t, seg_key, seg_start, seg_end, seg_out, n_ws, red_key, red_start, red_end) = index
    B, Tq, S, G = geo["B"], geo["Tq"], geo["S"], geo["G"]
    dev = q.device
    dk_out = _new(B, S, G, geo["dk"], dtype=k.dtype, device=dev)
    dv_out = _new(B, S, G, geo["dv"], dtype=v.dtype, device=dev)
    BS = geo["BS"]
    wsk = torch.empty(max(n_ws, 1) * BS * geo["BK"], dtype=torch.float32, device=dev)
    wsv = torch.empty(max(n_ws, 1) * BS * geo["BV"], dtype=torch.float32, device=dev)
    HPd = _np2(geo["h"])
    BQ = max(1, int(c["rows"]) // HPd, 16 // HPd)
    LAST_COMPILED["dkv"] = _k._bwd_dkv_kernel[(seg_key.numel(),)](
        q, k, v, do, lse, delta, dk_out, dv_out, wsk, wsv, dq32 if dq32 is not None else delta,
        seg_key, seg_start, seg_end, seg_out, csr_t, *geo["strides"],
        Tq, S, S - Tq, geo["NB"], geo["qk_scale"], geo["scale"], HP=HPd, BQ=BQ, ATOMIC_DQ=dq32 is not None,
        **geo["common"], num_warps=_warps(c, geo), num_stages=c["num_stages"])
    if red_key.numel():
        _k._bwd_dkv_reduce_kernel[(red_key.numel(),)](
            wsk, wsv, dk_out, dv_out, red_key, red_start, red_end, S, geo["NB"], G=G, BLOCK_SIZE=geo["block_size"],
            DK=geo["dk"], DV=geo["dv"], BK=geo["BK"], BV=geo["BV"], BS=BS, num_warps=4)
    return dk_out, dv_out


def selection_attention_bwd(q, k, v, o, lse, do, block_idx, block_count, block_size, scale=None, *,
                            deterministic: bool = False, dkv_mode: str | None = None,
                            config: dict | None = None):
    """Backward launcher -> (dq, dk, dv) in the input dtype. ``o``/``lse`` from the forward.

    dkv_mode: "index" (deterministic), "atomic" or "index_dq_atomic" (fp32 atomics, not
    bitwise reproducible; refused with deterministic=True). Default: "index" when
    deterministic, else DEFAULT_DKV_MODE. config: {"dq"|"dkv"|"atomic": launch overrides}.
    """
    mode = dkv_mode or ("index" if deterministic else DEFAULT_DKV_MODE)
    if mode not in DKV_MODES:
        raise ValueError(f"selection_attention_bwd: dkv_mode {mode!r} is not one of {DKV_MODES}")
    if deterministic and mode != "index":
        raise ValueError(f"selection_attention_bwd: dkv_mode {mode!r} uses atomics; deterministic=True needs 'index'")
    if do.shape != o.shape:
        raise ValueError(f"selection_attention_bwd: do {tuple(do.shape)} must match o {tuple(o.shape)}")
    do = do.to(q.dtype)
    if do.stride(-1) != 1:
        do = do.contiguous()
    config = config or {}
    geo = _bwd_setup(q, k, v, o, do, block_idx, block_size, scale)
    geo["block_size"] = block_size
    delta = _delta(o, do)
    if mode == "atomic":
        return _launch_atomic(q, k, v, do, lse, delta, block_idx, block_count, geo, config.get("atomic"))
    seg = int({**CONFIG["dkv"], **config.get("dkv", {})}["seg"])
    index = _inverted_index(block_idx, block_count, geo, seg)
    if mode == "index":
        dq = _launch_dq(q, k, v, do, lse, delta, block_idx, block_count, geo, config.get("dq"))
        dk, dv = _launch_dkv(q, k, v, do, lse, delta, index, geo, config.get("dkv"))
        return dq, dk, dv
    dq32 = torch.zeros(geo["B"], geo["Tq"], geo["HQ"], geo["dk"], dtype=torch.float32, device=q.device)
    dk, dv = _launch_dkv(q, k, v, do, lse, delta, index, geo, config.get("dkv"), dq32=dq32)
    return dq32.to(q.dtype), dk, dv


# ---- autograd -------------------------------------------------------------------------------

class _SelectionAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, block_idx, block_count, block_size, scale, deterministic, dkv_mode):
        o, lse = selection_attention_fwd(q, k, v, block_idx, block_count, block_size, scale,
                                         validate_indices=False)
        ctx.save_for_backward(q, k, v, o, lse, block_idx, block_count)
        ctx.block_size = block_size
        ctx.scale = scale
        ctx.deterministic = deterministic
        ctx.dkv_mode = dkv_mode
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, block_idx, block_count = ctx.saved_tensors
        dq, dk, dv = selection_attention_bwd(q, k, v, o, lse, do, block_idx, block_count, ctx.block_size,
                                             ctx.scale, deterministic=ctx.deterministic, dkv_mode=ctx.dkv_mode)
        return dq, dk, dv, None, None, None, None, None, None


# ---- public ---------------------------------------------------------------------------------

def selection_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_idx: torch.Tensor,
                        block_count: torch.Tensor, block_size: int, scale: float | None = None,
                        deterministic: bool = False, *, dkv_mode: str | None = None) -> torch.Tensor:
    """Selected attention (NSA Eq. 12) with the Triton kernels; differentiable.

    q [B, T, HQ, dk], k [B, S, G, dk], v [B, S, G, dv] (one dtype: float32 / float16 /
    bfloat16; last dim contiguous; h = HQ/G in 1..16; dk, dv <= 256; queries are the last T of
    S positions, S == T for prefill); block_idx [B, T, G, n] int32 (per (token, group) the
    block_count chosen block ids, strictly ascending, then -1), block_count [B, T, G] int32.
    Block j covers keys [j*block_size, (j+1)*block_size); keys after the query are masked.
    scale defaults to 1/sqrt(dk). -> o [B, T, HQ, dv] (q.dtype); a query with no visible key
    gets 0.

    deterministic=True guarantees bitwise-identical gradients across runs (the default
    backward already is; it refuses the atomic ``dkv_mode`` variants).
    Raises ValueError for bad shapes, dtype mixes, non-contiguous inputs, out-of-range or
    unsorted block ids.
    """
    mode = dkv_mode or ("index" if deterministic else DEFAULT_DKV_MODE)
    if mode not in DKV_MODES:
        raise ValueError(f"selection_attention: dkv_mode {mode!r} is not one of {DKV_MODES}")
    if deterministic and mode != "index":
        raise ValueError(f"selection_attention: dkv_mode {mode!r} uses atomics; deterministic=True needs 'index'")
    _check_inputs(q, k, v, block_idx, block_count, block_size, validate_indices=True)
    return _SelectionAttention.apply(q, k, v, block_idx, block_count, block_size, scale, bool(deterministic), mode)
