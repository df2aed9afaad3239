"""Fused selection scoring + top-n (NSA Eqs. 8-11) in Triton: ``select_blocks(backend="triton")``.

For every (token, KV group) the selection scores of DESIGN §2 (softmax over the visible
compressed tokens per head, summed over the h heads of the group, mapped onto the l'-blocks
by the overlap weights of Eq. 9) and the top-n of Eq. 11 (block 0 and the two local blocks
forced, ties to the lower index), without materialising ``[T, HQ, Tc]`` anywhere.

Four layers (STYLE.md):
  1. ``@triton.jit`` kernels
     ``_score_kernel``  one program per (tile of BT tokens, batch x group): the group's h heads
                        of BT tokens (BM = BT*HP query rows) are loaded once; pass 1 streams the
                        visible compressed keys and keeps an online log-sum-exp per row (exp2
                        domain) -- skipped when the caller passes the compressed branch's own
                        lse (HAS_LSE; nsa_attention does on the flash paths that return it);
                        pass 2 streams them again *block-major*: each step owns NBT
                        selection blocks, loads the compressed tokens that overlap them
                        (NBT*a + b - 1 <= BC of them), computes p = exp2(q.k*scale*log2e - lse),
                        sums the h heads (reshape + sum) and maps onto the blocks with one small
                        fp32 dot against the overlap weights (built from iota, never stored).
                        Every block is written by exactly one step: no carry, no atomics.
                        Output: a compact fp32 score row [NB] per (token, group).
     ``_topn_kernel``   RB (token, group) rows per program: packs (score bits, -index) into an
                        int64 key (scores are >= 0, so fp32 bits order like the values; equal
                        scores -> the lower index wins); the forced blocks are chosen up front,
                        non-candidates get -1; n - 3 rounds of an int64 row max pick the rest;
                        the chosen ids are written ascending through a cumsum of the chosen
                        flags, then -1.
  2. host launcher ``fused_select_blocks_launch``: tiles, grid, chunking of the query rows so
     the compact score buffer stays under ``SCORE_BUDGET_BYTES``.
  3. autograd: none. Selection is a discrete choice (DESIGN §2: no gradient flows through it),
     so there is no ``torch.autograd.Function`` in this file.
  4. public ``fused_select_blocks`` (compressed keys in) with its input checks (ValueError).

Exactness: fp32 inputs use IEEE fp32 dots (no tf32) for q.k and for the overlap map, so the
kernel's choice equals the float64 reference except at near-ties (DESIGN §7). bf16 / fp16
inputs: q.k on tensor cores with fp32 accumulation, softmax / head sum / overlap map in fp32.
The design and the numbers behind it: docs/benchmarks.md, "Fused selection scoring".
"""

from __future__ import annotations

import math

import torch

from nsa_core._kernel_utils import interpreting, np2
from nsa_core._triton import tl, triton  # optional: the module imports without triton, the functions then raise
from nsa_core.config import NSAConfig

try:
    from triton.runtime.errors import OutOfResources
except (Exception, SystemExit):  # pragma: no cover - older triton / none / broken
    class OutOfResources(Exception):  # noqa: N818 - stands in for triton's name
        pass

__all__ = ["fused_select_blocks", "fused_select_blocks_launch", "topn_from_scores", "supports", "available", "CONFIG"]

LOG2E = 1.4426950408889634
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_H = 64

# Launch settings. BM = query rows per score program (BT tokens x HP heads), BC = compressed
# tokens per step. From the H100 sweep in docs/benchmarks.md ("Fused selection scoring").
CONFIG = {
    # BM_fp32: the rows of an fp32 launch (exact IEEE dots, no tensor cores): a 256-row IEEE tile
    # compiled for 90-105 s on the H100 (h = 1, dk = 128: a full oneshot's triton-fwd case, cold),
    # asked for 228 KiB of shared memory, was refused and compiled again smaller; on a CPU box's
    # ptxas (bench/compile_times.py) that one specialisation took 153 s. fp32 scoring serves the
    # checks (the float32 parity inputs), not the timed bf16 / fp16 paths.
    "score": {"BM": 256, "BM_fp32": 64, "BC": 64, "num_warps": 4, "num_stages": 2},
    "topn": {"num_warps": 1, "rows_elems": 1024},
}
# Shared memory per score program, by the estimate q tile (BM x BK) + key tiles (BC x BK x stages),
# in bytes of the input dtype. Seen on the H100 (227 KiB per block): bf16 BK=128 BM=256 and fp32
# BK=128 BM=256 (estimate 192 KiB) compile; fp32 BK=256 BM=256 (estimate 384 KiB, Triton asked for
# 328 KiB) does not. Wider rows (fp32, dk > 128) get a smaller BM (then BC) to stay under this.
SMEM_BUDGET_BYTES = 192 * 1024
# The estimate is a first guess, not the compiler's figure: on the H100 fp32 BK=128 BM=256 with
# one head per group (estimate 192 KiB) asked for 228 KiB (Triton's layout conversions of the
# per-head score tile). When Triton refuses a launch for shared memory (OutOfResources, raised
# before anything runs) the launcher halves BM, then BC, and retries; the fitting launch is
# remembered per (dtype, dk, heads per group, geometry, device) in _FITTED (what shrank and why:
# _SHRUNK).
_FITTED: dict[tuple, dict] = {}
_SHRUNK: list[str] = []
# The compact score buffer [B, chunk, G, NB] fp32 is bounded by this; longer inputs run in chunks.
SCORE_BUDGET_BYTES = 1 << 29
MAX_NB = 1 << 14  # selection blocks per row the one-program top-n handles (T <= 1M with l' = 64)


def available() -> bool:
    """True when triton imports (on CPU the kernels run only with TRITON_INTERPRET=1)."""
    return triton is not None


# ---- 1. kernels ---------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _score_kernel(
        Q, KC, SC, LSE,
        sqb, sqt, sqh, skb, skt, skg, slb, slt, slh,
        Tq, T0, Q_OFF, Tc, NB, TCH, qk_scale,
        G: tl.constexpr, H: tl.constexpr, HP: tl.constexpr, BT: tl.constexpr,
        BC: tl.constexpr, NBT: tl.constexpr, NBTP: tl.constexpr,
        DK: tl.constexpr, BK: tl.constexpr,
        L: tl.constexpr, D: tl.constexpr, LSEL: tl.constexpr, A: tl.constexpr, BB: tl.constexpr,
        IEEE: tl.constexpr, MAP_DOT: tl.constexpr, HAS_LSE: tl.constexpr,
    ):
        # tiles of the chunk, the longest (last tokens) first: causal work is front-loaded
        n_tiles = tl.cdiv(TCH, BT)
        pid_t = n_tiles - 1 - tl.program_id(0)
        bg = tl.program_id(1)
        b = bg // G
        g = bg % G
        BM: tl.constexpr = BT * HP

        offs_m = tl.arange(0, BM)
        tt = offs_m // HP
        hh = offs_m % HP
        tloc = pid_t * BT + tt  # row within the chunk
        trow = T0 + tloc  # query index within q
        row_ok = (hh < H) & (tloc < TCH) & (trow < Tq)
        pos = Q_OFF + trow  # key position of the query
        nvis = tl.where(pos + 1 < L, 0, (pos + 1 - L) // D + 1)
        nvis = tl.minimum(nvis, Tc)
        nvis = tl.where(row_ok, nvis, 0)
        nvis_max = tl.max(nvis, 0)

        offs_k = tl.arange(0, BK)
        m_k = offs_k < DK
        b64 = b.to(tl.int64)
        q_ptrs = Q + b64 * sqb + trow.to(tl.int64)[:, None] * sqt + (g * H + hh)[:, None] * sqh + offs_k[None, :]
        q = tl.load(q_ptrs, mask=row_ok[:, None] & m_k[None, :], other=0.0)
        k_base = KC + b64 * skb + g * skg
        offs_c = tl.arange(0, BC)

        if HAS_LSE:
            # the compressed branch's own softmax statistics (natural log) -> log2 units
            l_ptrs = LSE + b64 * slb + trow.to(tl.int64) * slt + (g * H + hh) * slh
            lse_e = tl.load(l_ptrs, mask=nvis > 0, other=0.0)
            lse = tl.where(nvis > 0, lse_e * 1.4426950408889634, float("inf"))
        else:
            # pass 1: online log-sum-exp (log2 units) over the visible compressed tokens of each row
            m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([BM], dtype=tl.float32)
            for c0 in range(0, nvis_max, BC):
                cc = c0 + offs_c
                kb = tl.load(k_base + cc.to(tl.int64)[:, None] * skt + offs_k[None, :],
                             mask=(cc < nvis_max)[:, None] & m_k[None, :], other=0.0)
                if IEEE:
                    s = tl.dot(q, tl.trans(kb), input_precision="ieee")
                else:
                    s = tl.dot(q, tl.trans(kb))
                vis = cc[None, :] < nvis[:, None]
                s = tl.where(vis, s * qk_scale, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                l_i = l_i * tl.exp2(m_i - m_safe) + tl.sum(tl.exp2(s - m_safe[:, None]), 1)
                m_i = m_new
            has = l_i > 0.0
            lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("inf"))

        # pass 2, block-major: step i owns blocks j0 .. j0+NBT-1 and reads the compressed tokens
        # c_start .. c_start+BC-1 (those overlapping them: j0*A - BB + 1 .. (j0+NBT)*A - 1)
        tt_r = pid_t * BT + tl.arange(0, BT)  # the BT rows of the score tile
        r_ok = (tt_r < TCH) & (T0 + tt_r < Tq)
        sc_rows = SC + ((b64 * TCH + tt_r.to(tl.int64)) * G + g) * NB
        offs_j = tl.arange(0, NBTP)
        # blocks that overlap a visible token of some row of this tile
        n_blk = tl.where(nvis_max > 0, ((nvis_max - 1) * D + L - 1) // LSEL + 1, 0)
        n_blk = tl.minimum(n_blk, NB)
        for j0 in range(0, n_blk, NBT):
            c_start = j0 * A - (BB - 1)
            cc = c_start + offs_c
            c_ok = (cc >= 0) & (cc < nvis_max)
            kb = tl.load(k_base + cc.to(tl.int64)[:, None] * skt + offs_k[None, :],
                         mask=c_ok[:, None] & m_k[None, :], other=0.0)
            if IEEE:
                s = tl.dot(q, tl.trans(kb), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(kb))
            vis = (cc[None, :] < nvis[:, None]) & (cc >= 0)[None, :]
            p = tl.where(vis, tl.exp2(s * qk_scale - lse[:, None]), 0.0)
            pg = tl.sum(tl.reshape(p, [BT, HP, BC]), 1)  # Eq. 10: sum over the heads of the group
            # overlap weights (Eq. 9) of token cc with block j0 + jj, in units of D
            jj = j0 + offs_j
            lo = tl.maximum(cc[:, None] * D, jj[None, :] * LSEL)
            hi = tl.minimum(cc[:, None] * D + L, (jj[None, :] + 1) * LSEL)
            w = tl.where((offs_j < NBT)[None, :] & c_ok[:, None], tl.maximum(hi - lo, 0) // D, 0).to(tl.float32)
            if MAP_DOT:  # [BT, BC] x [BC, NBTP] (tl.dot needs BT >= 16)
                sc = tl.dot(pg, w, input_precision="ieee")
            else:
                sc = tl.sum(pg[:, :, None] * w[None, :, :], 1)
            j_ok = (offs_j < NBT) & (jj < n_blk)
            tl.store(sc_rows[:, None] + jj[None, :], sc, mask=r_ok[:, None] & j_ok[None, :])

    @triton.jit
    def _topn_kernel(
        SC, IDX, CNT, Tq, T0, Q_OFF, Tc, NB, TCH, n_rows,
        G: tl.constexpr, N: tl.constexpr, NP: tl.constexpr, NBP: tl.constexpr, RB: tl.constexpr,
        L: tl.constexpr, D: tl.constexpr, LSEL: tl.constexpr, A: tl.constexpr, BB: tl.constexpr,
        MASK_UNSEEN: tl.constexpr,
    ):
        r = tl.program_id(0) * RB + tl.arange(0, RB)  # rows (b*TCH + tloc)*G + g of the chunk
        r_ok = r < n_rows
        g = r % G
        bt = r // G
        tloc = bt % TCH
        b = bt // TCH
        trow = T0 + tloc
        pos = Q_OFF + trow
        cur = pos // LSEL
        nvis = tl.where(pos + 1 < L, 0, (pos + 1 - L) // D + 1)
        nvis = tl.minimum(nvis, Tc)
        j = tl.arange(0, NBP)[None, :]
        cand = (j <= cur[:, None]) & r_ok[:, None]
        # a block with no visible overlapping token scores exactly 0 (the score kernel skips it)
        live = cand & (j < NB)
        if MASK_UNSEEN:
            live = live & (j * A - (BB - 1) <= nvis[:, None] - 1)
        s = tl.load(SC + r.to(tl.int64)[:, None] * NB + j, mask=live, other=0.0)
        forced = cand & ((j == 0) | (j == cur[:, None]) | (j == cur[:, None] - 1))
        # >= 0 for every score >= 0; a sign bit (-0.0, or NaN from non-finite inputs) counts as 0, so a
        # candidate never drops out of the race and block_count stays min(n, t // l' + 1)
        bits = tl.maximum(s.to(tl.int32, bitcast=True), 0).to(tl.int64)
        # forced blocks are chosen up front; the others compete (-1: out of the race)
        key = tl.where(cand & ~forced, (bits << 32) | (NBP - j).to(tl.int64), -1)
        ci = forced.to(tl.int32)  # 1 where chosen
        # 3 forced when t // l' >= 2; below that every candidate is forced: N - 3 rounds suffice
        for _ in tl.static_range(N - 3):
            mx = tl.max(key, 1)
            take = (key == mx[:, None]) & (mx[:, None] >= 0)
            ci = tl.where(take, 1, ci)
            key = tl.where(take, -1, key)
        cnt = tl.sum(ci, 1)
        slot = tl.cumsum(ci, 1) - 1
        out_row = (b.to(tl.int64) * Tq + trow) * G + g
        tl.store(IDX + out_row[:, None] * N + slot, (j + 0 * slot), mask=ci > 0)
        offs_n = tl.arange(0, NP)[None, :]
        tl.store(IDX + out_row[:, None] * N + offs_n, tl.full([RB, NP], -1, tl.int32),
                 mask=(offs_n >= cnt[:, None]) & (offs_n < N) & r_ok[:, None])
        tl.store(CNT + out_row, cnt, mask=r_ok)


# ---- 2. host launcher ---------------------------------------------------------------------

def _geometry(q: torch.Tensor, kc: torch.Tensor, S: int, cfg: NSAConfig, config: dict) -> dict:
    B, Tq, HQ, dk = q.shape
    G = kc.shape[2]
    h = HQ // G
    HP = np2(h)
    A, BB = cfg.l_sel // cfg.d, cfg.l // cfg.d
    BK = max(16, np2(dk))
    bm = config["BM_fp32"] if q.dtype == torch.float32 and "BM_fp32" in config else config["BM"]
    BM, BC = max(16, HP, int(bm)), max(int(config["BC"]), np2(A + BB - 1), 16)
    smem = lambda bm, bc: (bm * BK + bc * BK * int(config["num_stages"])) * q.element_size()  # noqa: E731
    while smem(BM, BC) > SMEM_BUDGET_BYTES and BM > max(16, HP):  # fp32 / wide heads: fewer rows first
        BM //= 2
    while smem(BM, BC) > SMEM_BUDGET_BYTES and BC // 2 >= max(16, np2(A + BB - 1)):
        BC //= 2
    BT = max(1, np2(BM // HP))  # tokens per program; BM = BT*HP >= 16 rows
    NBT = (BC - (BB - 1)) // A  # blocks owned per pass-2 step (>= 1 by the choice of BC)
    return dict(B=B, Tq=Tq, HQ=HQ, dk=dk, G=G, h=h, HP=HP, BT=BT, BC=BC, NBT=NBT,
                NBTP=max(16, np2(NBT)), BK=BK, A=A, BB=BB,
                NB=cfg.num_sel_blocks(S), Tc=min(kc.shape[1], cfg.num_cmp(S)), S=S)


def _launch_topn(sc, block_idx, block_count, B, Tq, G, t0, tch, S, Tc, NB, cfg, c_t, mask_unseen):
    NBP = max(16, np2(NB))
    # rows per program: about rows_elems keys in all (one row per program at long S)
    re = int(c_t["rows_elems"])
    RB = min(64, 1 << max(0, (re // NBP).bit_length() - 1)) if re >= NBP else 1
    n_rows = B * tch * G
    _topn_kernel[(triton.cdiv(n_rows, RB),)](
        sc, block_idx, block_count, Tq, t0, S - Tq, Tc, NB, tch, n_rows,
        G=G, N=cfg.n_sel, NP=np2(cfg.n_sel), NBP=NBP, RB=RB, L=cfg.l, D=cfg.d, LSEL=cfg.l_sel,
        A=cfg.l_sel // cfg.d, BB=cfg.l // cfg.d, MASK_UNSEEN=mask_unseen,
        num_warps=c_t["num_warps"] if NBP <= 4096 else max(4, c_t["num_warps"]))


def fused_select_blocks_launch(q: torch.Tensor, kc: torch.Tensor, S: int, cfg: NSAConfig,
                               scale: float | None = None, *, config: dict | None = None,
                               chunk: int | None = None, lse: torch.Tensor | None = None
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the score and top-n kernels (inputs already checked). See :func:`fused_select_blocks`.

    ``config``: {"score": {...}, "topn": {...}} launch overrides; ``chunk``: query rows per
    launch pair (default: as many as fit in SCORE_BUDGET_BYTES); ``lse``: see fused_select_blocks.
    """
    c_s = {**CONFIG["score"], **((config or {}).get("score") or {})}
    c_t = {**CONFIG["topn"], **((config or {}).get("topn") or {})}
    fit_key = _fit_key(q, kc, cfg, c_s)
    c_s.update(_FITTED.get(fit_key, {}))
    while True:
        try:
            return _launch_all(q, kc, S, cfg, scale, c_s, c_t, chunk, lse)
        except OutOfResources as e:  # raised before the launch: nothing was written yet
            smaller = _shrink(q, kc, S, cfg, c_s)
            if smaller is None:
                raise
            c_s.update(smaller)
            _FITTED[fit_key] = smaller
            _SHRUNK.append(f"{fit_key}: {e} -> " + " ".join(f"{k}={v}" for k, v in smaller.items()))


def _fit_key(q, kc, cfg, c_s) -> tuple:
    h = q.shape[2] // max(1, kc.shape[2])
    return (q.dtype, q.shape[3], h, cfg.l, cfg.d, cfg.l_sel, q.device.index, c_s["BM"], c_s.get("BM_fp32"),
            c_s["BC"], c_s["num_stages"])


def _shrink(q, kc, S, cfg, c_s) -> dict | None:
    """The next smaller score launch after Triton refused one for shared memory: fewer query rows
    (BM) first, then fewer compressed keys per tile (BC); None when both are at their minimum."""
    geo = _geometry(q, kc, S, cfg, c_s)
    BM, BC = geo["BT"] * geo["HP"], geo["BC"]
    rows = "BM_fp32" if q.dtype == torch.float32 and "BM_fp32" in c_s else "BM"  # what _geometry reads
    if BM // 2 >= max(16, geo["HP"]):
        return {rows: BM // 2, "BC": BC}
    if BC // 2 >= max(16, np2(geo["A"] + geo["BB"] - 1)):
        return {rows: BM, "BC": BC // 2}
    return None


def _launch_all(q, kc, S, cfg, scale, c_s, c_t, chunk, lse):
    geo = _geometry(q, kc, S, cfg, c_s)
    B, Tq, G, NB, n = geo["B"], geo["Tq"], geo["G"], geo["NB"], cfg.n_sel
    dev = q.device
    scale = 1.0 / math.sqrt(geo["dk"]) if scale is None else float(scale)
    block_idx = torch.empty(B, Tq, G, n, dtype=torch.int32, device=dev)
    block_count = torch.empty(B, Tq, G, dtype=torch.int32, device=dev)
    if Tq == 0:
        return block_idx, block_count
    if chunk is None:
        chunk = max(geo["BT"], SCORE_BUDGET_BYTES // max(1, B * G * NB * 4))
    chunk = min(Tq, max(1, int(chunk)))
    sc = torch.empty(B * chunk * G * NB, dtype=torch.float32, device=dev)
    for t0 in range(0, Tq, chunk):
        tch = min(chunk, Tq - t0)
        if geo["Tc"] > 0:
            grid = (triton.cdiv(tch, geo["BT"]), B * G)
            ls = (0, 0, 0) if lse is None else lse.stride()
            _score_kernel[grid](
                q, kc, sc, sc if lse is None else lse,
                q.stride(0), q.stride(1), q.stride(2), kc.stride(0), kc.stride(1), kc.stride(2), *ls,
                Tq, t0, S - Tq, geo["Tc"], NB, tch, scale * LOG2E,
                G=G, H=geo["h"], HP=geo["HP"], BT=geo["BT"], BC=geo["BC"], NBT=geo["NBT"], NBTP=geo["NBTP"],
                DK=geo["dk"], BK=geo["BK"], L=cfg.l, D=cfg.d, LSEL=cfg.l_sel, A=geo["A"], BB=geo["BB"],
                IEEE=q.dtype == torch.float32, MAP_DOT=geo["BT"] >= 16, HAS_LSE=lse is not None,
                num_warps=c_s["num_warps"], num_stages=c_s["num_stages"])
        _launch_topn(sc, block_idx, block_count, B, Tq, G, t0, tch, S, geo["Tc"], NB, cfg, c_t, True)
    return block_idx, block_count


# ---- 4. public ----------------------------------------------------------------------------

def supports(q: torch.Tensor, kc: torch.Tensor, S: int, cfg: NSAConfig) -> str | None:
    """None when the fused kernel can run this call here (compiled on CUDA), else the reason (for "auto")."""
    if triton is None:
        return "triton is not installed"
    if q.device.type != "cuda":
        return f"device {q.device.type}: the fused selection kernel runs compiled on CUDA only"
    if q.dtype not in _DTYPES or kc.dtype != q.dtype:
        return f"dtypes q {q.dtype} / kc {kc.dtype} (needs one of float32, float16, bfloat16)"
    G = kc.shape[2]
    if G == 0 or q.shape[2] % G or not 1 <= q.shape[2] // G <= MAX_H:
        return f"HQ={q.shape[2]}, G={G}: heads per group outside 1..{MAX_H}"
    if not 1 <= q.shape[3] <= 256:
        return f"dk={q.shape[3]} outside 1..256"
    if cfg.num_sel_blocks(S) > MAX_NB:
        return f"{cfg.num_sel_blocks(S)} selection blocks per row > {MAX_NB}"
    return None


def _check(q, kc, S, cfg, scale, lse=None):
    if triton is None:
        raise RuntimeError("nsa_core.selection.scoring needs triton: pip install triton")
    if not isinstance(q, torch.Tensor) or not isinstance(kc, torch.Tensor):
        raise ValueError("fused_select_blocks: q and kc must be torch.Tensors")
    if not isinstance(cfg, NSAConfig):
        raise ValueError(f"fused_select_blocks: cfg must be an NSAConfig, got {type(cfg).__name__}")
    if q.dim() != 4 or kc.dim() != 4:
        raise ValueError(f"fused_select_blocks: q [B, T, HQ, dk] and kc [B, Tc, G, dk] expected; "
                         f"got q{tuple(q.shape)} kc{tuple(kc.shape)}")
    B, Tq, HQ, dk = q.shape
    if kc.shape[0] != B or kc.shape[3] != dk:
        raise ValueError(f"fused_select_blocks: q{tuple(q.shape)} and kc{tuple(kc.shape)} disagree on B or dk")
    G = kc.shape[2]
    if G == 0 or HQ % G:
        raise ValueError(f"fused_select_blocks: query heads HQ={HQ} must be a multiple of KV groups G={G}")
    if not 1 <= HQ // G <= MAX_H:
        raise ValueError(f"fused_select_blocks: heads per group h = HQ/G = {HQ // G} is outside 1..{MAX_H}")
    if dk > 256 or dk == 0:
        raise ValueError(f"fused_select_blocks: head dim dk={dk} must be in 1..256")
    if isinstance(S, bool) or not isinstance(S, int) or S < Tq:
        raise ValueError(f"fused_select_blocks: S={S!r} must be an int >= T={Tq} (queries are the last T of S)")
    if q.dtype not in _DTYPES or kc.dtype != q.dtype:
        raise ValueError(f"fused_select_blocks: q {q.dtype} / kc {kc.dtype}: one of float32, float16, bfloat16")
    if q.device != kc.device:
        raise ValueError(f"fused_select_blocks: q on {q.device}, kc on {kc.device}; use one device")
    if q.device.type != "cuda" and not interpreting():
        raise ValueError(f"fused_select_blocks: tensors on {q.device} need a CUDA device, or TRITON_INTERPRET=1 "
                         "set before triton is imported (CPU interpreter)")
    if q.stride(-1) != 1 or kc.stride(-1) != 1:
        raise ValueError("fused_select_blocks: q and kc must be contiguous in their last dim")
    if cfg.num_sel_blocks(S) > MAX_NB:
        raise ValueError(f"fused_select_blocks: {cfg.num_sel_blocks(S)} selection blocks per row exceed "
                         f"{MAX_NB} (S={S}, l_sel={cfg.l_sel}); use backend='reference'")
    if scale is not None and not math.isfinite(float(scale)):
        raise ValueError(f"fused_select_blocks: scale must be finite, got {scale!r}")
    if lse is not None and (not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (B, Tq, HQ)
                            or lse.dtype != torch.float32 or lse.device != q.device):
        raise ValueError(f"fused_select_blocks: lse must be a float32 tensor [B, T, HQ] = [{B}, {Tq}, {HQ}] "
                         f"on {q.device}, got " + (f"{lse.dtype} {tuple(lse.shape)} on {lse.device}"
                                                   if isinstance(lse, torch.Tensor) else type(lse).__name__))


@torch.no_grad()
def topn_from_scores(scores: torch.Tensor, S: int, cfg: NSAConfig, *, config: dict | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-n kernel alone (Eq. 11) on given per-group scores [B, T, G, NB] (>= 0, float32).

    Queries are the last T of S positions. Same result contract as ``reference.topn_blocks``
    (forced blocks, ties to the lower index); used to test the top-n on its own.
    """
    if triton is None:
        raise RuntimeError("nsa_core.selection.scoring needs triton: pip install triton")
    if scores.dim() != 4 or scores.shape[3] != cfg.num_sel_blocks(S) or scores.shape[1] > S:
        raise ValueError(f"topn_from_scores: scores {tuple(scores.shape)} must be "
                         f"[B, T, G, NB={cfg.num_sel_blocks(S)}]")
    if scores.dtype != torch.float32 or bool((scores < 0).any()):
        raise ValueError("topn_from_scores: scores must be float32 and >= 0")
    B, Tq, G, NB = scores.shape
    c_t = {**CONFIG["topn"], **((config or {}).get("topn") or {})}
    idx = torch.empty(B, Tq, G, cfg.n_sel, dtype=torch.int32, device=scores.device)
    cnt = torch.empty(B, Tq, G, dtype=torch.int32, device=scores.device)
    if Tq:
        _launch_topn(scores.contiguous(), idx, cnt, B, Tq, G, 0, Tq, S, cfg.num_cmp(S), NB, cfg, c_t, False)
    return idx, cnt


@torch.no_grad()
def fused_select_blocks(q: torch.Tensor, kc: torch.Tensor, S: int, cfg: NSAConfig, scale: float | None = None,
                        *, config: dict | None = None, lse: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-n selection blocks per (token, group), fused (Eqs. 8-11).

    q [B, T, HQ, dk] (the last T of S positions; S == T for prefill), kc COMPRESSED keys
    [B, Tc, G, dk] (``functional.compress``; tokens past num_cmp(S) are ignored), one dtype of
    float32 / float16 / bfloat16, last dim contiguous, h = HQ/G in 1..64, dk <= 256.
    -> block_idx [B, T, G, n] int32 (chosen ids ascending, then -1), block_count [B, T, G] int32.
    Same contract as ``functional.select_blocks``; equal to the reference except at near-ties.
    ``lse`` [B, T, HQ] float32 (natural log, as the compressed branch's flash kernel returns it:
    ``compression.fast.compressed_attention(return_lse=True)``): each row's log-sum-exp over its
    visible compressed tokens at this ``scale``; given, the kernel skips its first pass over the
    compressed keys (rows that see nothing are masked whatever lse holds there).
    Raises ValueError for bad shapes / dtypes / devices.
    """
    _check(q, kc, S, cfg, scale, lse)
    return fused_select_blocks_launch(q, kc, S, cfg, scale, config=config, lse=lse)
