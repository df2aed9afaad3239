"""Fused Triton kernels for the static NSA decode step (``StaticDecoder(impl="triton")``).

The default step (``Workspace.attn``, phi avg) is five launches, each reading the position from a
device scalar (graph capturable) and, on sm_90+, launched with programmatic dependent launch (PDL:
the next kernel's programs start while the previous kernel runs and wait for it, ``_pdl_start``):

  _append_cmp_kernel  split-K over the compressed cache, one program per (b*g, chunk): chunk 0 first
                      writes token t to K_sel/V_sel, the window ring and the raw ring; the chunk whose
                      range holds the compressed token completing at t writes it before reading it;
                      then the h heads of the group against the chunk's visible compressed keys: stats
                      (m, l), the partial o_cmp, and per 64-key tile the block partials of Eq. 9 (A to a
                      token's own selection block, C to the next; tune selection="blocks") or the logits
                      (selection="logits").
  _block_scores_kernel one program per (b*g, slice of blocks): block scores from the partials and the
                      merged stats (Eqs. 9-10).  [logits: _cmp_probs_kernel, p normalised and summed over
                      the heads (Eq. 10) per (b*g, chunk)]
  _topn_kernel        one program per (b*g): top-n with block 0 and the two local blocks forced, ties to
                      the lower block id (one max-reduction per pick over a packed (score, -id) key) ->
                      block ids [b*g, n] (-1 = unused).  [logits: _select_kernel, scores + top-n]
  _selwin_kernel      one program per (b*g, tile): tiles 0..n-1 are the selected blocks (raw tokens <= t),
                      the next ceil(w / BS) tiles the window ring (slots <= t); partial (m, l, o) per tile.
  _combine_kernel     one program per (b*g, slice of value columns): merges the compressed chunks and the
                      tiles of each branch (grouped independent loads, _merge_rows), applies the gates
                      (Eq. 5) -> o [B, HQ, dv] in the cache dtype.

Other arrangements (``Workspace.tune``, measured in docs/benchmarks.md): six launches (_append_kernel +
_cmp_partial_kernel, as ``branches`` runs them and phi="mlp" needs), selection="blocks-row" (scores and
top-n in one program per row, _scores_topn_kernel), tiles="merged" (_fused_tiles_kernel: tiles and merge
in one launch, the row's last program merging).

Two-launch variants: ``impl="fused"`` (append + split-K compressed pass with logits, probabilities and
top-n in each row's last program; tiles + merge) and ``impl="split"`` (issue 14: split-K in both launches
sized from the SM count, ``split_plan``; kernel 1 = compressed chunks that keep per-tile block partials
instead of logits, the row's last chunk scores the blocks and picks the top-n, plus window chunks;
kernel 2 = selected-block programs, compressed-merge programs, the row's last program merges and gates).
See the comments above each kernel group.

Softmax runs in the exp2 domain (qk_scale = scale * log2 e) in fp32; fp32 caches use IEEE
dots (no tf32). Rows of padding heads (HP > h) are computed and never stored.
"""

from __future__ import annotations

import torch

from nsa_core._triton import PROBLEM, tl, triton

if triton is None:  # imported only where triton is usable
    raise ImportError(f"nsa_core's Triton kernels need triton: {PROBLEM}")

from nsa_core._kernel_utils import dot as _dot
from nsa_core.decode.labels import scope as _scope

LOG2E = 1.4426950408889634
NEG = tl.constexpr(-1.0e30)  # a global a jit function may read must be a constexpr
KEY_MIN = tl.constexpr(-(2**63))  # a top-n key that never wins
NEG_INF_ORDERED = tl.constexpr(-2139095041)  # order-preserving int32 of float -inf (0xFF800000 ^ 0x7FFFFFFF)



@triton.jit
def _pdl_start(PDL: tl.constexpr):
    """Programmatic dependent launch (sm_90+, ``launch_pdl=True``): wait until the previous kernel of
    the stream has finished and its stores are visible (before this program touches global memory),
    then let the next kernel's programs launch while this one runs (they wait the same way)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _load_q(Q, s_qb, b, g, oh, mh, H: tl.constexpr, DK: tl.constexpr, DK0: tl.constexpr, BK1: tl.constexpr):
    """The group's h query rows split along the key dim: q0 [HP, DK0] (columns 0..DK0-1) and, when
    BK1 > 0, q1 [HP, BK1] (columns DK0..): dk = 192 is 128 + 64, no padding to 256."""
    o0 = tl.arange(0, DK0)
    base = Q + b * s_qb + (g * H + oh)[:, None] * DK
    q0 = tl.load(base + o0[None, :], mask=mh[:, None] & (o0 < DK)[None, :], other=0.0)
    q1 = q0
    if BK1 > 0:
        o1 = DK0 + tl.arange(0, BK1)
        q1 = tl.load(base + o1[None, :], mask=mh[:, None] & (o1 < DK)[None, :], other=0.0)
    return q0, q1


@triton.jit
def _qk(q0, q1, KB, rows, mrow, DK: tl.constexpr, DK0: tl.constexpr, BK1: tl.constexpr, IEEE: tl.constexpr):
    """q . k for the key rows ``rows`` of KB ([HP, len(rows)]), the key dim in the two parts of _load_q."""
    o0 = tl.arange(0, DK0)
    k0 = tl.load(KB + rows[:, None] * DK + o0[None, :], mask=mrow[:, None] & (o0 < DK)[None, :], other=0.0)
    sc = _dot(q0, tl.trans(k0), IEEE)
    if BK1 > 0:
        o1 = DK0 + tl.arange(0, BK1)
        k1 = tl.load(KB + rows[:, None] * DK + o1[None, :], mask=mrow[:, None] & (o1 < DK)[None, :], other=0.0)
        sc += _dot(q1, tl.trans(k1), IEEE)
    return sc


@triton.jit
def _num_cmp(pos, L: tl.constexpr, STRIDE: tl.constexpr):
    """Compressed tokens visible at position pos: 0 if pos + 1 < l else (pos + 1 - l) // d + 1."""
    s = pos + 1
    return tl.where(s >= L, (s - L) // STRIDE + 1, 0)


@triton.jit
def _cmp_visible(POS, L: tl.constexpr, STRIDE: tl.constexpr):
    """(position t from the device scalar, compressed tokens visible at t)."""
    pos = tl.load(POS).to(tl.int64)
    return pos, _num_cmp(pos, L, STRIDE)


@triton.jit
def _sel_rows(TBL, s_tbl, b, g, bg64, kpos, CAP, PS, G: tl.constexpr, PAGED: tl.constexpr):
    """Rows of K_sel / V_sel holding tokens kpos (int64, may be < 0 for an unused slot: masked by
    the caller) of sequence b, group g: dense bg * CAP + kpos; paged (nsa_core.decode.cache)
    (TBL[b, kpos // PS] * G + g) * PS + kpos % PS."""
    if PAGED:
        page = tl.load(TBL + b * s_tbl + kpos // PS, mask=(kpos >= 0) & (kpos < CAP), other=0).to(tl.int64)
        return (page * G + g) * PS + kpos % PS
    else:
        return bg64 * CAP + kpos


@triton.jit
def _emits(pos, L: tl.constexpr, STRIDE: tl.constexpr):
    """(does a compressed block complete at pos, its index (pos + 1 - l) // d)."""
    return (pos + 1 >= L) & ((pos + 1 - L) % STRIDE == 0), (pos + 1 - L) // STRIDE


@triton.jit
def _ring_mean(R, new, pos, bg64, od, md, D: tl.constexpr, L: tl.constexpr, BL: tl.constexpr):
    """phi = avg of the block ending at pos: the raw ring's l-1 other slots plus the new token (fp32).
    Slot pos % l is not read (the new token comes from ``new``), so it may be rewritten meanwhile."""
    rows = tl.arange(0, BL)
    mr = (rows < L) & (rows != pos % L)
    blk = tl.load(R + (bg64 * L + rows[:, None]) * D + od[None, :], mask=mr[:, None] & md[None, :],
                  other=0.0).to(tl.float32)
    return (tl.sum(blk, 0) + new.to(tl.float32)) / L


@triton.jit
def _append_token(pos, b, g, bg64, KC, VC, KS, VS, KW, VW, s_kc, s_vc, s_ks, s_vs, s_kw, s_vw,
                  K_SEL, V_SEL, K_WIN, V_WIN, K_RAW, V_RAW, K_CMP, V_CMP, CAP, CCAP, TBL, s_tbl, PS,
                  G: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, W: tl.constexpr, L: tl.constexpr,
                  STRIDE: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BL: tl.constexpr, AVG: tl.constexpr,
                  PAGED: tl.constexpr):
    """Token pos of (b, g) -> K_sel/V_sel row, window ring slot pos % w, raw ring slot pos % l; with
    AVG also the compressed token that completes at pos (masked by the emit condition)."""
    row = _sel_rows(TBL, s_tbl, b, g, bg64, pos, CAP, PS, G, PAGED)
    _put(KS, s_ks, b, g, K_SEL, row, DK, BK)
    _put(VS, s_vs, b, g, V_SEL, row, DV, BV)
    _put(KW, s_kw, b, g, K_WIN, bg64 * W + pos % W, DK, BK)
    _put(VW, s_vw, b, g, V_WIN, bg64 * W + pos % W, DV, BV)
    _put(KC, s_kc, b, g, K_RAW, bg64 * L + pos % L, DK, BK)
    _put(VC, s_vc, b, g, V_RAW, bg64 * L + pos % L, DV, BV)
    if AVG:
        emit, ci = _emits(pos, L, STRIDE)
        if emit:
            _store_cmp_token(K_CMP, V_CMP, K_RAW, V_RAW, KC, VC, s_kc, s_vc, b, g, pos, bg64, ci, CCAP, DK, DV, L,
                             BK, BV, BL)


@triton.jit
def _new_vec(X, s_x, b, g, D: tl.constexpr, BD: tl.constexpr):
    """The new token's vector of (b, g) from X [B, G, D] (batch stride s_x) -> (values, offsets, mask)."""
    od = tl.arange(0, BD)
    md = od < D
    return tl.load(X + b * s_x + g * D + od, mask=md), od, md


@triton.jit
def _put(X, s_x, b, g, DST, row, D: tl.constexpr, BD: tl.constexpr):
    """The new token's vector of (b, g) -> row ``row`` of DST [*, D]."""
    x, od, md = _new_vec(X, s_x, b, g, D, BD)
    tl.store(DST + row * D + od, x, mask=md)


@triton.jit
def _store_cmp_token(K_CMP, V_CMP, K_RAW, V_RAW, KC, VC, s_kc, s_vc, b, g, pos, bg64, ci, CCAP, DK: tl.constexpr,
                     DV: tl.constexpr, L: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BL: tl.constexpr):
    """Compressed token ci = avg of the block ending at pos (new token from KC / VC) -> K_cmp/V_cmp row ci."""
    kc, ok, mk = _new_vec(KC, s_kc, b, g, DK, BK)
    vc, ov, mv = _new_vec(VC, s_vc, b, g, DV, BV)
    mean_k = _ring_mean(K_RAW, kc, pos, bg64, ok, mk, DK, L, BL)
    mean_v = _ring_mean(V_RAW, vc, pos, bg64, ov, mv, DV, L, BL)
    tl.store(K_CMP + (bg64 * CCAP + ci) * DK + ok, mean_k.to(K_CMP.dtype.element_ty), mask=mk)
    tl.store(V_CMP + (bg64 * CCAP + ci) * DV + ov, mean_v.to(V_CMP.dtype.element_ty), mask=mv)


@triton.jit
def _append_kernel(POS, KC, VC, KS, VS, KW, VW, s_kc, s_vc, s_ks, s_vs, s_kw, s_vw,
                   K_SEL, V_SEL, K_WIN, V_WIN, K_RAW, V_RAW, K_CMP, V_CMP, CAP, CCAP, TBL, s_tbl, PS,
                   G: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, W: tl.constexpr, L: tl.constexpr,
                   STRIDE: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BL: tl.constexpr, AVG: tl.constexpr,
                   PAGED: tl.constexpr, PDL: tl.constexpr):
    _pdl_start(PDL)
    bg = tl.program_id(0)
    _append_token(tl.load(POS).to(tl.int64), bg // G, bg % G, bg.to(tl.int64), KC, VC, KS, VS, KW, VW,
                  s_kc, s_vc, s_ks, s_vs, s_kw, s_vw, K_SEL, V_SEL, K_WIN, V_WIN, K_RAW, V_RAW, K_CMP, V_CMP,
                  CAP, CCAP, TBL, s_tbl, PS, G, DK, DV, W, L, STRIDE, BK, BV, BL, AVG, PAGED)


@triton.jit
def _cmp_chunk(q0, q1, K_CMP, V_CMP, LOGITS, M_P, L_P, ACC_P, bg64, c, lo, hi, CCAP, NCH, qk_scale, oh, ov, mh, mv,
               DK: tl.constexpr, DV: tl.constexpr, HP: tl.constexpr, DK0: tl.constexpr, BK1: tl.constexpr,
               BV: tl.constexpr, BT: tl.constexpr, DO_O: tl.constexpr, DO_LOGITS: tl.constexpr, IEEE: tl.constexpr):
    """Chunk c = compressed tokens lo..hi-1 of row bg: online-softmax stats (m, l) per head, the partial
    o_cmp (DO_O) and the logits (DO_LOGITS, log2 domain) -> M_P / L_P / ACC_P row bg * NCH + c, LOGITS."""
    m_i, l_i, acc = _attend_range(q0, q1, K_CMP, V_CMP, bg64 * CCAP, lo, hi, hi, qk_scale, oh, ov, mh, mv,
                                  LOGITS, LOGITS, LOGITS, bg64, 1, 1, LOGITS, CCAP, DK, DV, HP, DK0, BK1, BV, BT,
                                  1, 1, False, DO_O, DO_LOGITS, IEEE)
    _store_partial(M_P, L_P, ACC_P, bg64 * NCH + c, m_i, l_i, acc, oh, HP, BV, DO_O)


@triton.jit
def _cmp_partial_kernel(POS, Q, s_qb, K_CMP, V_CMP, LOGITS, M_P, L_P, ACC_P, CCAP, qk_scale,
                        G: tl.constexpr, H: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                        L: tl.constexpr, STRIDE: tl.constexpr, HP: tl.constexpr, DK0: tl.constexpr,
                        BK1: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, CH, NCH,
                        DO_O: tl.constexpr, DO_LOGITS: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr):
    _pdl_start(PDL)
    bg = tl.program_id(0)
    c = tl.program_id(1)
    b = bg // G
    g = bg % G
    pos, nvis = _cmp_visible(POS, L, STRIDE)
    lo = c.to(tl.int64) * CH
    _cmp_program(Q, s_qb, K_CMP, V_CMP, LOGITS, M_P, L_P, ACC_P, b, g, bg.to(tl.int64), c, lo,
                 tl.minimum(lo + CH, nvis), CCAP, NCH, qk_scale, G, H, DK, DV, HP, DK0, BK1, BV, BT, DO_O, DO_LOGITS,
                 IEEE)


@triton.jit
def _cmp_program(Q, s_qb, K_CMP, V_CMP, LOGITS, M_P, L_P, ACC_P, b, g, bg64, c, lo, hi, CCAP, NCH, qk_scale,
                 G: tl.constexpr, H: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, HP: tl.constexpr,
                 DK0: tl.constexpr, BK1: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, DO_O: tl.constexpr,
                 DO_LOGITS: tl.constexpr, IEEE: tl.constexpr):
    """Chunk c (compressed tokens lo..hi-1) of row bg with the group's query rows (dk in two parts)."""
    oh = tl.arange(0, HP)
    ov = tl.arange(0, BV)
    mh = oh < H
    mv = ov < DV
    q0, q1 = _load_q(Q, s_qb, b, g, oh, mh, H, DK, DK0, BK1)
    _cmp_chunk(q0, q1, K_CMP, V_CMP, LOGITS, M_P, L_P, ACC_P, bg64, c, lo, hi, CCAP, NCH, qk_scale, oh, ov, mh, mv,
               DK, DV, HP, DK0, BK1, BV, BT, DO_O, DO_LOGITS, IEEE)


@triton.jit
def _append_in_chunk(pos, b, g, bg64, c, lo, hi, KC, VC, KS, VS, KW, VW, s_kc, s_vc, s_ks, s_vs, s_kw, s_vw,
                     K_SEL, V_SEL, K_WIN, V_WIN, K_RAW, V_RAW, K_CMP, V_CMP, CAP, CCAP, TBL, s_tbl, PS,
                     G: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, W: tl.constexpr, L: tl.constexpr,
                     STRIDE: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BL: tl.constexpr, AVG: tl.constexpr,
                     PAGED: tl.constexpr):
    """The append inside a split-K compressed pass: chunk 0 writes token pos to K_sel/V_sel, the window
    ring and the raw ring; with AVG the compressed token that completes at pos is written by the chunk
    whose range holds it, before that chunk reads it (phi from the ring's other slots + the new token,
    so chunk 0's ring write may run meanwhile)."""
    if c == 0:
        _append_token(pos, b, g, bg64, KC, VC, KS, VS, KW, VW, s_kc, s_vc, s_ks, s_vs, s_kw, s_vw,
                      K_SEL, V_SEL, K_WIN, V_WIN, K_RAW, V_RAW, K_CMP, V_CMP, CAP, CCAP, TBL, s_tbl, PS,
                      G, DK, DV, W, L, STRIDE, BK, BV, BL, False, PAGED)
    if AVG:
        emit, ci = _emits(pos, L, STRIDE)
        if emit & (ci >= lo) & (ci < hi):  # the one program that reads row ci in this kernel writes it
            _store_cmp_token(K_CMP, V_CMP, K_RAW, V_RAW, KC, VC, s_kc, s_vc, b, g, pos, bg64, ci, CCAP, DK, DV, L,
                             BK, BV, BL)
            tl.debug_barrier()


@triton.jit
def _append_cmp_kernel(POS, Q, s_qb, KC, VC, KS, VS, KW, VW, s_kc, s_vc, s_ks, s_vs, s_kw, s_vw,
                       K_SEL, V_SEL, K_WIN, V_WIN, K_RAW, V_RAW, K_CMP, V_CMP, CAP, CCAP, TBL, s_tbl, PS,
                       LOGITS, M_P, L_P, ACC_P, ABUF, CBUF, TMX, NB, NTILE, qk_scale, CH, NCH,
                       G: tl.constexpr, H: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, W: tl.constexpr,
                       L: tl.constexpr, STRIDE: tl.constexpr, HP: tl.constexpr, DK0: tl.constexpr,
                       BK1: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BL: tl.constexpr, BT: tl.constexpr,
                       A: tl.constexpr, BQ: tl.constexpr, BLOCKS: tl.constexpr, DO_LOGITS: tl.constexpr,
                       IEEE: tl.constexpr, PAGED: tl.constexpr, PDL: tl.constexpr):
    """_append_kernel + the split-K compressed pass in one launch (phi avg). Grid (B*G, NCH). For the
    selection it keeps either the logits (DO_LOGITS: _cmp_probs_kernel + _select_kernel follow) or, with
    BLOCKS, per BT-tile block partials of Eq. 9 (4x fewer values than logits at a = 4:
    _scores_topn_kernel follows; see _attend_range)."""
    _pdl_start(PDL)
    bg = tl.program_id(0)
    c = tl.program_id(1)
    b = bg // G
    g = bg % G
    bg64 = bg.to(tl.int64)
    pos, nvis = _cmp_visible(POS, L, STRIDE)
    lo = c.to(tl.int64) * CH
    hi = tl.minimum(lo + CH, nvis)
    _append_in_chunk(pos, b, g, bg64, c, lo, hi, KC, VC, KS, VS, KW, VW, s_kc, s_vc, s_ks, s_vs, s_kw, s_vw,
                     K_SEL, V_SEL, K_WIN, V_WIN, K_RAW, V_RAW, K_CMP, V_CMP, CAP, CCAP, TBL, s_tbl, PS,
                     G, DK, DV, W, L, STRIDE, BK, BV, BL, True, PAGED)
    oh = tl.arange(0, HP)
    ov = tl.arange(0, BV)
    mh = oh < H
    q0, q1 = _load_q(Q, s_qb, b, g, oh, mh, H, DK, DK0, BK1)
    m_i, l_i, acc = _attend_range(q0, q1, K_CMP, V_CMP, bg64 * CCAP, lo, hi, hi, qk_scale, oh, ov, mh, ov < DV,
                                  ABUF, CBUF, TMX, bg64, NB, NTILE, LOGITS, CCAP, DK, DV, HP, DK0, BK1, BV, BT, A, BQ,
                                  BLOCKS, True, DO_LOGITS, IEEE)
    _store_partial(M_P, L_P, ACC_P, bg64 * NCH + c, m_i, l_i, acc, oh, HP, BV, True)


@triton.jit
def _scores_topn_kernel(POS, M_P, L_P, ABUF, CBUF, TMX, SC, BLK, NB, NTILE, NCH,
                        H: tl.constexpr, HP: tl.constexpr, L: tl.constexpr, STRIDE: tl.constexpr,
                        LSEL: tl.constexpr, NSEL: tl.constexpr, A: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
                        BJ: tl.constexpr, BNB: tl.constexpr, PDL: tl.constexpr):
    """Block scores (Eqs. 9-10) from the compressed pass's block partials and merged stats, then the top-n
    (Eq. 11) -> BLK. One program per (b*g) (_block_scores_topn)."""
    _pdl_start(PDL)
    pos, nvis = _cmp_visible(POS, L, STRIDE)
    _block_scores_topn(pos, nvis, M_P, L_P, ABUF, CBUF, TMX, SC, BLK, tl.program_id(0).to(tl.int64), NB, NTILE,
                       NCH, H, HP, LSEL, NSEL, A, BT, BC, BJ, BNB)


@triton.jit
def _block_scores_kernel(POS, M_P, L_P, ABUF, CBUF, TMX, SC, NB, NTILE, NCH,
                         H: tl.constexpr, HP: tl.constexpr, L: tl.constexpr, STRIDE: tl.constexpr,
                         LSEL: tl.constexpr, A: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BJ: tl.constexpr,
                         EARLY: tl.constexpr, PDL: tl.constexpr):
    """Block scores of blocks s*BJ .. (s+1)*BJ - 1 of row bg -> SC (_block_scores_slice). Grid (B*G, NB / BJ)."""
    _pdl_start(PDL)
    bg64 = tl.program_id(0).to(tl.int64)
    j0 = tl.program_id(1) * BJ
    pos, nvis = _cmp_visible(POS, L, STRIDE)
    cur = pos // LSEL
    if j0 <= cur:
        if EARLY:  # every load issued before the first reduction (one memory round, not two)
            Mp, Lp = _stats_load(M_P, L_P, bg64, NCH, HP, BC)
            tm, tmp, vt, vp, av, cv, j, mj = _bs_load(j0, cur, nvis, ABUF, CBUF, TMX, bg64, NB, NTILE, H, HP, A,
                                                      BT, BJ)
            Mh, invZ = _stats_math(Mp, Lp, H, HP)
            _bs_math(tm, tmp, vt, vp, av, cv, j, mj, Mh, invZ, SC, bg64, NB, HP, A, BT, BJ)
        else:
            Mh, invZ = _merged_stats(M_P, L_P, bg64, NCH, H, HP, BC)
            _block_scores_slice(j0, cur, nvis, Mh, invZ, ABUF, CBUF, TMX, SC, bg64, NB, NTILE, H, HP, A, BT, BJ)


@triton.jit
def _topn_kernel(POS, SC, BLK, NB, LSEL: tl.constexpr, NSEL: tl.constexpr, BNB: tl.constexpr, EARLY: tl.constexpr,
                 PDL: tl.constexpr):
    """Top-n (Eq. 11) of row bg's block scores SC -> BLK. One program per (b*g). EARLY: the scores are
    loaded beside the position, not after it (_pick_topn sets every block past cur to -inf)."""
    _pdl_start(PDL)
    bg64 = tl.program_id(0).to(tl.int64)
    oj = tl.arange(0, BNB)
    if EARLY:
        sc = tl.load(SC + bg64 * NB + oj, mask=oj < NB, other=0.0)
        cur = tl.load(POS).to(tl.int64) // LSEL
    else:
        cur = tl.load(POS).to(tl.int64) // LSEL
        sc = tl.load(SC + bg64 * NB + oj, mask=(oj <= cur) & (oj < NB), other=0.0)
    _pick_topn(sc, oj, cur, BLK, bg64, NSEL, BNB)


@triton.jit
def _merged_stats(M_P, L_P, bg64, NCH, H: tl.constexpr, HP: tl.constexpr, BC: tl.constexpr):
    """The softmax stats of row bg merged over its NCH split-K chunks -> (max M_h, 1 / Z_h) per head
    (1 / Z = 0 for padding heads and where nothing was visible). Reads other programs' results (.cg)."""
    Mp, Lp = _stats_load(M_P, L_P, bg64, NCH, HP, BC)
    return _stats_math(Mp, Lp, H, HP)


@triton.jit
def _stats_load(M_P, L_P, bg64, NCH, HP: tl.constexpr, BC: tl.constexpr):
    """Row bg's per-chunk maxima and sums [BC, HP] (_merged_stats' loads)."""
    oh = tl.arange(0, HP)
    oc = tl.arange(0, BC)
    rows = bg64 * NCH + oc
    mc = oc < NCH
    Mp = tl.load(M_P + rows[:, None] * HP + oh[None, :], mask=mc[:, None], other=NEG, cache_modifier=".cg")
    Lp = tl.load(L_P + rows[:, None] * HP + oh[None, :], mask=mc[:, None], other=0.0, cache_modifier=".cg")
    return Mp, Lp


@triton.jit
def _stats_math(Mp, Lp, H: tl.constexpr, HP: tl.constexpr):
    oh = tl.arange(0, HP)
    Mh = tl.max(Mp, 0)
    Z = tl.sum(Lp * tl.exp2(Mp - Mh[None, :]), 0)
    return Mh, tl.where((Z > 0.0) & (oh < H), 1.0 / tl.where(Z > 0.0, Z, 1.0), 0.0)


@triton.jit
def _probs_rows(M_P, L_P, LOGITS, PSUM, bg64, lo, hi, CCAP, NCH, H: tl.constexpr, HP: tl.constexpr,
                BT: tl.constexpr, BC: tl.constexpr):
    """P[i] = sum over the group's heads of softmax_i (Eq. 10) for compressed tokens lo..hi-1 of row bg,
    normalised with the merged stats of all NCH chunks -> PSUM. Reads other programs' results (.cg)."""
    oh = tl.arange(0, HP)
    mh = oh < H
    Mh, invZ = _merged_stats(M_P, L_P, bg64, NCH, H, HP, BC)
    ot = tl.arange(0, BT)
    for i0 in range(lo, hi, BT):
        ii = i0 + ot
        mi = ii < hi
        lg = tl.load(LOGITS + (bg64 * HP + oh[:, None]) * CCAP + ii[None, :], mask=mh[:, None] & mi[None, :],
                     other=float("-inf"), cache_modifier=".cg")
        pr = tl.exp2(lg - Mh[:, None]) * invZ[:, None]
        tl.store(PSUM + bg64 * CCAP + ii, tl.sum(pr, 0), mask=mi)


@triton.jit
def _cmp_probs_kernel(POS, M_P, L_P, LOGITS, PSUM, CCAP, CH, NCH,
                      H: tl.constexpr, L: tl.constexpr, STRIDE: tl.constexpr, HP: tl.constexpr, BT: tl.constexpr,
                      BC: tl.constexpr, PDL: tl.constexpr):
    """P of the tokens of chunk c (one program per (b*g, chunk))."""
    _pdl_start(PDL)
    c = tl.program_id(1)
    pos, nvis = _cmp_visible(POS, L, STRIDE)
    lo = c.to(tl.int64) * CH
    _probs_rows(M_P, L_P, LOGITS, PSUM, tl.program_id(0).to(tl.int64), lo, tl.minimum(lo + CH, nvis), CCAP, NCH, H,
                HP, BT, BC)


@triton.jit
def _topn(pos, nvis, PSUM, BLK, bg64, CCAP, NB, LSEL: tl.constexpr, NSEL: tl.constexpr, A: tl.constexpr,
          BQ: tl.constexpr, BNB: tl.constexpr):
    """Block scores (Eq. 9: sum_{m<a} sum_{n<b} P[j*a + m - n]) and top-n (Eq. 11) of row bg -> BLK[bg, :]."""
    oj = tl.arange(0, BNB)
    sc = tl.zeros([BNB], dtype=tl.float32)
    for mm in tl.static_range(A):
        for nn in tl.static_range(BQ):
            idx = oj * A + mm - nn
            okj = (idx >= 0) & (idx < nvis) & (oj < NB)
            sc += tl.load(PSUM + bg64 * CCAP + idx, mask=okj, other=0.0)
    _pick_topn(sc, oj, pos // LSEL, BLK, bg64, NSEL, BNB)


@triton.jit
def _select_kernel(POS, PSUM, BLK, CCAP, NB,
                   L: tl.constexpr, STRIDE: tl.constexpr, LSEL: tl.constexpr, NSEL: tl.constexpr,
                   A: tl.constexpr, BQ: tl.constexpr, BNB: tl.constexpr, PDL: tl.constexpr):
    _pdl_start(PDL)
    pos, nvis = _cmp_visible(POS, L, STRIDE)
    _topn(pos, nvis, PSUM, BLK, tl.program_id(0).to(tl.int64), CCAP, NB, LSEL, NSEL, A, BQ, BNB)


@triton.jit
def _tile(q0, q1, tile, pos, b, g, bg64, BLK, K_SEL, V_SEL, K_WIN, V_WIN, M_T, L_T, ACC_T, CAP, qk_scale,
          TBL, s_tbl, PS, oh, ov, mv, G: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, W: tl.constexpr,
          LSEL: tl.constexpr, NSEL: tl.constexpr, NS_SEL: tl.constexpr, NT: tl.constexpr, HP: tl.constexpr,
          DK0: tl.constexpr, BK1: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr, IEEE: tl.constexpr,
          PAGED: tl.constexpr, EARLY: tl.constexpr):
    """Tile ``tile`` of row bg: tiles 0..NS_SEL-1 are the selected blocks (raw tokens <= t), the next
    ones the window ring (slots <= t) -> partial (m, l, o) at M_T / L_T / ACC_T row bg * NT + tile."""
    os_ = tl.arange(0, BS)
    if tile < NS_SEL:  # a selected block: raw tokens j*l_sel .. of it that are <= t
        j = tl.load(BLK + bg64 * NSEL + tile)
        kpos = (j * LSEL + os_).to(tl.int64)
        m_s = (os_ < LSEL) & (kpos >= 0) & (kpos <= pos)  # j = -1 (unused slot) gives kpos < 0
        rows = _sel_rows(TBL, s_tbl, b, g, bg64, kpos, CAP, PS, G, PAGED)
        k_base = K_SEL
        v_base = V_SEL
    else:  # a tile of the window ring: slots <= t (all of them once t >= w - 1)
        kpos = ((tile - NS_SEL) * BS + os_).to(tl.int64)
        m_s = (kpos < W) & (kpos <= pos)
        rows = bg64 * W + kpos
        k_base = K_WIN
        v_base = V_WIN
    vptr = v_base + rows[:, None] * DV + ov[None, :]
    vmask = m_s[:, None] & mv[None, :]
    if EARLY:  # V is loaded beside K (one memory round), not after the row max
        vb = tl.load(vptr, mask=vmask, other=0.0)
        sc = _qk(q0, q1, k_base, rows, m_s, DK, DK0, BK1, IEEE)
        sc = tl.where(m_s[None, :], sc * qk_scale, float("-inf"))
        m = tl.maximum(tl.max(sc, 1), NEG)
        p = tl.exp2(sc - m[:, None])
    else:
        sc = _qk(q0, q1, k_base, rows, m_s, DK, DK0, BK1, IEEE)
        sc = tl.where(m_s[None, :], sc * qk_scale, float("-inf"))
        m = tl.maximum(tl.max(sc, 1), NEG)
        p = tl.exp2(sc - m[:, None])
        vb = tl.load(vptr, mask=vmask, other=0.0)
    acc = _dot(p, vb, IEEE)
    row = bg64 * NT + tile
    tl.store(M_T + row * HP + oh, m)
    tl.store(L_T + row * HP + oh, tl.sum(p, 1))
    tl.store(ACC_T + (row * HP + oh[:, None]) * BV + ov[None, :], acc)


@triton.jit
def _selwin_kernel(POS, Q, s_qb, BLK, K_SEL, V_SEL, K_WIN, V_WIN, M_T, L_T, ACC_T, CAP, qk_scale, TBL, s_tbl, PS,
                   G: tl.constexpr, H: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, W: tl.constexpr,
                   LSEL: tl.constexpr, NSEL: tl.constexpr, NS_SEL: tl.constexpr, NT: tl.constexpr,
                   HP: tl.constexpr, DK0: tl.constexpr, BK1: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr,
                   IEEE: tl.constexpr, PAGED: tl.constexpr, EARLY: tl.constexpr, PDL: tl.constexpr):
    _pdl_start(PDL)
    bg = tl.program_id(0)
    b = bg // G
    g = bg % G
    oh = tl.arange(0, HP)
    ov = tl.arange(0, BV)
    q0, q1 = _load_q(Q, s_qb, b, g, oh, oh < H, H, DK, DK0, BK1)
    _tile(q0, q1, tl.program_id(1), tl.load(POS).to(tl.int64), b, g, bg.to(tl.int64), BLK, K_SEL, V_SEL, K_WIN,
          V_WIN, M_T, L_T, ACC_T, CAP, qk_scale, TBL, s_tbl, PS, oh, ov, ov < DV, G, DK, DV, W, LSEL, NSEL, NS_SEL,
          NT, HP, DK0, BK1, BV, BS, IEEE, PAGED, EARLY)


@triton.jit
def _merge_rows(M_X, L_X, ACC_X, row0, count, ov, BR: tl.constexpr, HP: tl.constexpr, BV: tl.constexpr,
                BO: tl.constexpr):
    """Merge the partials in rows row0 .. row0+count-1 (count <= BR) of M_X / L_X [*, HP] and ACC_X
    [*, HP, BV] -> normalised o [HP, BO] for the BO value columns ov (0 where nothing was visible).
    The rows are loaded in groups of at most 16 whose loads do not depend on each other (an unrolled
    loop; not one dependent load per row). Reads other programs' results (.cg)."""
    oh = tl.arange(0, HP)
    orr = tl.arange(0, BR)
    rows = row0 + orr
    Mt = tl.load(M_X + rows[:, None] * HP + oh[None, :], mask=(orr < count)[:, None], other=NEG, cache_modifier=".cg")
    Lt = tl.load(L_X + rows[:, None] * HP + oh[None, :], mask=(orr < count)[:, None], other=0.0, cache_modifier=".cg")
    Mh = tl.max(Mt, 0)
    Z = tl.sum(Lt * tl.exp2(Mt - Mh[None, :]), 0)
    RG: tl.constexpr = 16 if BR > 16 else BR
    og = tl.arange(0, RG)
    o = tl.zeros([HP, BO], dtype=tl.float32)
    for r0 in tl.static_range(0, BR, RG):
        rr = row0 + r0 + og
        mr = (r0 + og) < count
        mg = tl.load(M_X + rr[:, None] * HP + oh[None, :], mask=mr[:, None], other=NEG, cache_modifier=".cg")
        acc = tl.load(ACC_X + (rr[:, None, None] * HP + oh[None, :, None]) * BV + ov[None, None, :],
                      mask=mr[:, None, None], other=0.0, cache_modifier=".cg")
        o += tl.sum(acc * tl.exp2(mg - Mh[None, :])[:, :, None], 0)
    return o / tl.where(Z > 0.0, Z, 1.0)[:, None]


@triton.jit
def _merge_load(M_X, L_X, ACC_X, row0, count, ov, BR: tl.constexpr, HP: tl.constexpr, BV: tl.constexpr):
    """_merge_rows' loads for BR <= 16 rows in one group: (M [BR, HP], L [BR, HP], acc [BR, HP, len(ov)])."""
    oh = tl.arange(0, HP)
    orr = tl.arange(0, BR)
    rows = row0 + orr
    mr = orr < count
    Mt = tl.load(M_X + rows[:, None] * HP + oh[None, :], mask=mr[:, None], other=NEG, cache_modifier=".cg")
    Lt = tl.load(L_X + rows[:, None] * HP + oh[None, :], mask=mr[:, None], other=0.0, cache_modifier=".cg")
    acc = tl.load(ACC_X + (rows[:, None, None] * HP + oh[None, :, None]) * BV + ov[None, None, :],
                  mask=mr[:, None, None], other=0.0, cache_modifier=".cg")
    return Mt, Lt, acc


@triton.jit
def _merge_math(Mt, Lt, acc, HP: tl.constexpr, BO: tl.constexpr):
    """_merge_rows' arithmetic on _merge_load's values (the same operations in the same order)."""
    Mh = tl.max(Mt, 0)
    Z = tl.sum(Lt * tl.exp2(Mt - Mh[None, :]), 0)
    o = tl.zeros([HP, BO], dtype=tl.float32)
    o += tl.sum(acc * tl.exp2(Mt - Mh[None, :])[:, :, None], 0)
    return o / tl.where(Z > 0.0, Z, 1.0)[:, None]


@triton.jit
def _combine_slice(M_P, L_P, ACC_P, M_T, L_T, ACC_T, GATES, s_gb, O, NCH, NT, b, g, bg64, vs,
                   G: tl.constexpr, H: tl.constexpr, DV: tl.constexpr, HP: tl.constexpr, BV: tl.constexpr,
                   BVS: tl.constexpr, BC: tl.constexpr, NS_SEL: tl.constexpr, NS_WIN: tl.constexpr,
                   BSEL: tl.constexpr, BWIN: tl.constexpr, DO_CMP: tl.constexpr, GATED: tl.constexpr,
                   EARLY: tl.constexpr):
    """Value columns vs*BVS.. of row bg: merge the compressed chunks (DO_CMP), the selected-block tiles
    and the window tiles, weight by the gates (GATED; else 1) -> O [B, HQ, dv]. EARLY (every source of
    at most 16 rows): all loads first, then the arithmetic; else source by source (_combine_late)."""
    oh = tl.arange(0, HP)
    ov = vs * BVS + tl.arange(0, BVS)
    mh = oh < H
    mv = ov < DV
    gate = GATES + b * s_gb + (g * H + oh) * 3
    o = tl.zeros([HP, BVS], dtype=tl.float32)
    if EARLY:  # every source's loads issued before the first reduction (one memory round, not six)
        if DO_CMP:
            mc, lc, ac = _merge_load(M_P, L_P, ACC_P, bg64 * NCH, NCH, ov, BC, HP, BV)
            if GATED:
                g0 = tl.load(gate + 0, mask=mh, other=0.0).to(tl.float32)
        if NS_SEL > 0:
            ms, ls, as_ = _merge_load(M_T, L_T, ACC_T, bg64 * NT, NS_SEL, ov, BSEL, HP, BV)
            g1 = tl.load(gate + 1, mask=mh, other=0.0).to(tl.float32)
        if NS_WIN > 0:
            mw, lw, aw = _merge_load(M_T, L_T, ACC_T, bg64 * NT + NS_SEL, NS_WIN, ov, BWIN, HP, BV)
            g2 = tl.load(gate + 2, mask=mh, other=0.0).to(tl.float32)
        if DO_CMP:
            oc = _merge_math(mc, lc, ac, HP, BVS)
            if GATED:
                oc = g0[:, None] * oc
            o += oc
        if NS_SEL > 0:
            o += g1[:, None] * _merge_math(ms, ls, as_, HP, BVS)
        if NS_WIN > 0:
            o += g2[:, None] * _merge_math(mw, lw, aw, HP, BVS)
    else:
        o = _combine_late(o, M_P, L_P, ACC_P, M_T, L_T, ACC_T, gate, NCH, NT, bg64, ov, mh, HP, BV, BVS, BC, NS_SEL,
                          NS_WIN, BSEL, BWIN, DO_CMP, GATED)
    rows = b.to(tl.int64) * G * H + g * H + oh
    tl.store(O + rows[:, None] * DV + ov[None, :], o.to(O.dtype.element_ty), mask=mh[:, None] & mv[None, :])


@triton.jit
def _combine_late(o, M_P, L_P, ACC_P, M_T, L_T, ACC_T, gate, NCH, NT, bg64, ov, mh, HP: tl.constexpr,
                  BV: tl.constexpr, BVS: tl.constexpr, BC: tl.constexpr, NS_SEL: tl.constexpr, NS_WIN: tl.constexpr,
                  BSEL: tl.constexpr, BWIN: tl.constexpr, DO_CMP: tl.constexpr, GATED: tl.constexpr):
    """_combine_slice's sources one after another (any row count: _merge_rows loads in groups of 16)."""
    if DO_CMP:
        oc = _merge_rows(M_P, L_P, ACC_P, bg64 * NCH, NCH, ov, BC, HP, BV, BVS)
        if GATED:
            oc = tl.load(gate + 0, mask=mh, other=0.0).to(tl.float32)[:, None] * oc
        o += oc
    if NS_SEL > 0:
        os_ = _merge_rows(M_T, L_T, ACC_T, bg64 * NT, NS_SEL, ov, BSEL, HP, BV, BVS)
        o += tl.load(gate + 1, mask=mh, other=0.0).to(tl.float32)[:, None] * os_
    if NS_WIN > 0:
        ow = _merge_rows(M_T, L_T, ACC_T, bg64 * NT + NS_SEL, NS_WIN, ov, BWIN, HP, BV, BVS)
        o += tl.load(gate + 2, mask=mh, other=0.0).to(tl.float32)[:, None] * ow
    return o


@triton.jit
def _combine_kernel(M_P, L_P, ACC_P, M_T, L_T, ACC_T, GATES, s_gb, O, NCH, NT,
                    G: tl.constexpr, H: tl.constexpr, DV: tl.constexpr, HP: tl.constexpr, BV: tl.constexpr,
                    BVS: tl.constexpr, BC: tl.constexpr, NS_SEL: tl.constexpr, NS_WIN: tl.constexpr,
                    BSEL: tl.constexpr, BWIN: tl.constexpr, DO_CMP: tl.constexpr, GATED: tl.constexpr,
                    EARLY: tl.constexpr, PDL: tl.constexpr):
    """One program per (b*g, slice of BVS value columns)."""
    _pdl_start(PDL)
    bg = tl.program_id(0)
    _combine_slice(M_P, L_P, ACC_P, M_T, L_T, ACC_T, GATES, s_gb, O, NCH, NT, bg // G, bg % G, bg.to(tl.int64),
                   tl.program_id(1), G, H, DV, HP, BV, BVS, BC, NS_SEL, NS_WIN, BSEL, BWIN, DO_CMP, GATED, EARLY)


# ---- the fused step: two launches (impl="fused") ------------------------------------------------
# Each kernel's programs of one (b, g) row count themselves done on an atomic counter; the LAST
# one of the row (acquire: it sees every other program's stores) does the row's serial tail
# (kernel 1: probabilities + top-n; kernel 2: the merge + gates) and resets the counter, so the
# next step (or graph replay) starts from 0. No program ever waits for another.

@triton.jit
def _last_of_row(COUNT, bg64, n):
    """True in the program that finishes row bg last (of n); resets the row's counter there."""
    tl.debug_barrier()  # every thread's stores of this program are issued before it counts itself
    done = tl.atomic_add(COUNT + bg64, 1, sem="acq_rel")
    tl.debug_barrier()  # the acquire of the counting thread precedes every thread's reads that follow
    last = done == n - 1
    if last:
        tl.atomic_xchg(COUNT + bg64, 0)
    return last


@triton.jit
def _fused_cmp_kernel(POS, Q, s_qb, KC, VC, KS, VS, KW, VW, s_kc, s_vc, s_ks, s_vs, s_kw, s_vw,
                      K_SEL, V_SEL, K_WIN, V_WIN, K_RAW, V_RAW, K_CMP, V_CMP, CAP, CCAP, TBL, s_tbl, PS,
                      LOGITS, M_P, L_P, ACC_P, PSUM, BLK, COUNT, NB, qk_scale, CH, NCH,
                      G: tl.constexpr, H: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, W: tl.constexpr,
                      L: tl.constexpr, STRIDE: tl.constexpr, LSEL: tl.constexpr, NSEL: tl.constexpr,
                      A: tl.constexpr, BQ: tl.constexpr, BNB: tl.constexpr, HP: tl.constexpr, DK0: tl.constexpr,
                      BK1: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BL: tl.constexpr, BT: tl.constexpr,
                      BC: tl.constexpr, APPEND: tl.constexpr, AVG: tl.constexpr, IEEE: tl.constexpr,
                      PAGED: tl.constexpr):
    """Append (chunk 0; the compressed token that completes is written by the chunk that reads it),
    the split-K compressed pass with logits, and in the row's last program the probabilities (Eq. 10)
    and top-n (Eqs. 9, 11). Grid (B*G, NCH)."""
    bg = tl.program_id(0)
    c = tl.program_id(1)
    b = bg // G
    g = bg % G
    bg64 = bg.to(tl.int64)
    pos = tl.load(POS).to(tl.int64)
    nvis = _num_cmp(pos, L, STRIDE)
    lo = c.to(tl.int64) * CH
    hi = tl.minimum(lo + CH, nvis)
    if APPEND:
        _append_in_chunk(pos, b, g, bg64, c, lo, hi, KC, VC, KS, VS, KW, VW, s_kc, s_vc, s_ks, s_vs, s_kw, s_vw,
                         K_SEL, V_SEL, K_WIN, V_WIN, K_RAW, V_RAW, K_CMP, V_CMP, CAP, CCAP, TBL, s_tbl, PS,
                         G, DK, DV, W, L, STRIDE, BK, BV, BL, AVG, PAGED)
    _cmp_program(Q, s_qb, K_CMP, V_CMP, LOGITS, M_P, L_P, ACC_P, b, g, bg64, c, lo, hi, CCAP, NCH, qk_scale,
                 G, H, DK, DV, HP, DK0, BK1, BV, BT, True, True, IEEE)
    if _last_of_row(COUNT, bg64, NCH):
        _probs_rows(M_P, L_P, LOGITS, PSUM, bg64, 0, nvis, CCAP, NCH, H, HP, BT, BC)
        tl.debug_barrier()
        _topn(pos, nvis, PSUM, BLK, bg64, CCAP, NB, LSEL, NSEL, A, BQ, BNB)


@triton.jit
def _fused_tiles_kernel(POS, Q, s_qb, BLK, K_SEL, V_SEL, K_WIN, V_WIN, M_T, L_T, ACC_T, CAP, qk_scale, TBL, s_tbl,
                        PS, M_P, L_P, ACC_P, GATES, s_gb, O, NCH, COUNT,
                        G: tl.constexpr, H: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, W: tl.constexpr,
                        LSEL: tl.constexpr, NSEL: tl.constexpr, NS_SEL: tl.constexpr, NS_WIN: tl.constexpr,
                        NT: tl.constexpr, HP: tl.constexpr, DK0: tl.constexpr, BK1: tl.constexpr, BV: tl.constexpr,
                        BVS: tl.constexpr, BS: tl.constexpr, BC: tl.constexpr, BSEL: tl.constexpr,
                        BWIN: tl.constexpr, IEEE: tl.constexpr, PAGED: tl.constexpr, PDL: tl.constexpr):
    """The selected-block and window tiles, and in the row's last program the merge of every chunk and
    tile with the gates (Eq. 5) -> O. Grid (B*G, NS_SEL + NS_WIN)."""
    _pdl_start(PDL)
    bg = tl.program_id(0)
    b = bg // G
    g = bg % G
    bg64 = bg.to(tl.int64)
    pos = tl.load(POS).to(tl.int64)
    oh = tl.arange(0, HP)
    ov = tl.arange(0, BV)
    mh = oh < H
    mv = ov < DV
    q0, q1 = _load_q(Q, s_qb, b, g, oh, mh, H, DK, DK0, BK1)
    _tile(q0, q1, tl.program_id(1), pos, b, g, bg64, BLK, K_SEL, V_SEL, K_WIN, V_WIN, M_T, L_T, ACC_T, CAP, qk_scale,
          TBL, s_tbl, PS, oh, ov, mv, G, DK, DV, W, LSEL, NSEL, NS_SEL, NT, HP, DK0, BK1, BV, BS, IEEE, PAGED, False)
    if _last_of_row(COUNT, bg64, NS_SEL + NS_WIN):
        for vs in tl.static_range(BV // BVS):
            _combine_slice(M_P, L_P, ACC_P, M_T, L_T, ACC_T, GATES, s_gb, O, NCH, NT, b, g, bg64, vs, G, H, DV, HP,
                           BV, BVS, BC, NS_SEL, NS_WIN, BSEL, BWIN, True, True, False)


# ---- the split step: two launches, split-K everywhere (impl="split", issue 14) ---------------------
# Both grids put the program within a row on axis 0 (launch order: a row's programs are adjacent), so
# rows complete one after another and each row's last-arriver tail overlaps the other rows' reads.
# Kernel 1, grid (NCH + NW, B*G): programs 0..NCH-1 are split-K chunks of the compressed cache, the
# next NW programs chunks of the window ring (the window does not depend on the selection, so it is
# read here, beside the compressed pass). A compressed chunk keeps no logits: each BT-token tile folds
# its unnormalised probabilities (relative to the tile's running max) into per-head block partials
# with the overlap weights of Eq. 9 (A: to the token's own selection block, C: to the next one), so the
# row's last chunk program scores every block from HP x NB partials instead of HP x ccap logits, and
# picks the top-n. Kernel 2, grid (NSP + NVS, B*G): NSP programs attend SPB selected blocks each, NVS
# programs merge the compressed chunks (one slice of value columns each); the row's last program merges
# the selected and window partials, adds the merged compressed output and applies the gates (Eq. 5).

@triton.jit
def _attend_range(q0, q1, KB, VB, row0, lo, hi, last, qk_scale, oh, ov, mh, mv, ABUF, CBUF, TMX, bg64, NB, NTILE,
                  LOGITS, LSTRIDE, DK: tl.constexpr, DV: tl.constexpr, HP: tl.constexpr, DK0: tl.constexpr,
                  BK1: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, A: tl.constexpr, BQ: tl.constexpr,
                  BLOCKS: tl.constexpr, DO_O: tl.constexpr, DO_LOGITS: tl.constexpr, IEEE: tl.constexpr):
    """Online softmax of the group's heads over key rows row0 + lo .. row0 + hi - 1 of KB / VB, keys with
    index > last masked -> (m, l, acc); acc only with DO_O (else zeros, V not read). DO_LOGITS: the logits
    (log2 domain) -> LOGITS[(bg * HP + h) * LSTRIDE + index]. BLOCKS: per BT-tile (lo a multiple of BT) the
    block partials A[h, j] = sum_i ws(i % a) p[h, i], C[h, j] = sum_i wn(i % a) p[h, i] over the tile's
    tokens i of block j (p relative to the running max after the tile, stored in TMX[bg, tile, h])."""
    ot = tl.arange(0, BT)
    m_i = tl.full([HP], NEG, dtype=tl.float32)
    l_i = tl.zeros([HP], dtype=tl.float32)
    acc = tl.zeros([HP, BV], dtype=tl.float32)
    for t0 in range(lo, hi, BT):
        n_off = t0 + ot
        mn = (n_off < hi) & (n_off <= last)
        rows = row0 + n_off
        sc = _qk(q0, q1, KB, rows, mn, DK, DK0, BK1, IEEE)
        sc = tl.where(mn[None, :], sc * qk_scale, float("-inf"))
        if DO_LOGITS:
            tl.store(LOGITS + (bg64 * HP + oh[:, None]) * LSTRIDE + n_off[None, :], sc, mask=mh[:, None] & mn[None, :])
        m_new = tl.maximum(m_i, tl.max(sc, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(sc - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if DO_O:
            vb = tl.load(VB + rows[:, None] * DV + ov[None, :], mask=mn[:, None] & mv[None, :], other=0.0)
            acc = acc * alpha[:, None] + _dot(p, vb, IEEE)
        m_i = m_new
        if BLOCKS:
            p3 = tl.reshape(p, [HP, BT // A, A])
            mm = tl.arange(0, A)
            ws = tl.minimum(A - mm, BQ).to(tl.float32)  # the weight of token i to its own block: #n<b with i%a+n<a
            wn = tl.maximum(mm + BQ - A, 0).to(tl.float32)  # ... and to the next block
            a_blk = tl.sum(p3 * ws[None, None, :], 2)
            c_blk = tl.sum(p3 * wn[None, None, :], 2)
            jj = t0 // A + tl.arange(0, BT // A)
            at = (bg64 * HP + oh[:, None]) * NB + jj[None, :]
            mj = mh[:, None] & (jj < NB)[None, :]
            tl.store(ABUF + at, a_blk, mask=mj)
            tl.store(CBUF + at, c_blk, mask=mj)
            tl.store(TMX + (bg64 * NTILE + t0 // BT) * HP + oh, m_new)
    return m_i, l_i, acc


@triton.jit
def _store_partial(M_X, L_X, ACC_X, row, m, l, acc, oh, HP: tl.constexpr, BV: tl.constexpr, DO_ACC: tl.constexpr):
    """Partial (m, l[, acc]) of the h heads -> row ``row`` of M_X / L_X [*, HP] (and ACC_X [*, HP, BV])."""
    ov = tl.arange(0, BV)
    tl.store(M_X + row * HP + oh, m)
    tl.store(L_X + row * HP + oh, l)
    if DO_ACC:
        tl.store(ACC_X + (row * HP + oh[:, None]) * BV + ov[None, :], acc)


@triton.jit
def _pick_topn(sc, oj, cur, BLK, bg64, NSEL: tl.constexpr, BNB: tl.constexpr):
    """Top-n (Eq. 11) of the block scores sc [BNB] (block ids oj): block 0 and the two local blocks forced,
    candidates j <= cur, ties to the lower id -> BLK[bg, :] (-1 = unused)."""
    cand = oj <= cur
    forced = cand & ((oj == 0) | (oj == cur) | (oj == cur - 1))
    sc = tl.where(forced, float("inf"), sc)
    sc = tl.where(cand, sc, float("-inf"))
    bits = sc.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    key = (ordered.to(tl.int64) << 32) | (BNB - 1 - oj).to(tl.int64)
    for k in tl.static_range(NSEL):
        best = tl.max(key, 0)
        j = BNB - 1 - (best & 0xFFFFFFFF)
        valid = (best >> 32) > NEG_INF_ORDERED
        tl.store(BLK + bg64 * NSEL + k, tl.where(valid, j, -1).to(tl.int64))
        key = tl.where(oj == j, KEY_MIN, key)


@triton.jit
def _block_scores_slice(j0, cur, nvis, Mh, invZ, ABUF, CBUF, TMX, SC, bg64, NB, NTILE, H: tl.constexpr,
                        HP: tl.constexpr, A: tl.constexpr, BT: tl.constexpr, BJ: tl.constexpr):
    """Scores (Eqs. 9-10) of blocks j0 .. j0+BJ-1 (those <= cur) of row bg from the tiles' block partials and
    the merged stats (Mh, invZ): score[j] = sum_h (A[h, j] w[h, tile(j a)] + C[h, j-1] w[h, tile((j-1) a)]),
    w = 2^(m_tile - M_h) / Z_h -> SC[bg, j] (_bs_load, then _bs_math)."""
    tm, tmp, vt, vp, av, cv, j, mj = _bs_load(j0, cur, nvis, ABUF, CBUF, TMX, bg64, NB, NTILE, H, HP, A, BT, BJ)
    _bs_math(tm, tmp, vt, vp, av, cv, j, mj, Mh, invZ, SC, bg64, NB, HP, A, BT, BJ)


@triton.jit
def _bs_load(j0, cur, nvis, ABUF, CBUF, TMX, bg64, NB, NTILE, H: tl.constexpr, HP: tl.constexpr, A: tl.constexpr,
             BT: tl.constexpr, BJ: tl.constexpr):
    """_block_scores_slice's loads: [HP, BJ] of A and of C (two loads) and the [HP, BJ / (BT / a)] tile maxima
    of each block's tile and of the tile before (reads other programs' results, .cg), with their masks."""
    oh = tl.arange(0, HP)
    mh = oh < H
    BPT: tl.constexpr = BT // A  # blocks per tile
    TPI: tl.constexpr = BJ // BPT  # tiles per slice (BJ is a multiple of BPT)
    ot = j0 // BPT + tl.arange(0, TPI)
    vt = mh[:, None] & (ot * BT < nvis)[None, :]  # the tile ran (it holds visible tokens)
    vp = mh[:, None] & ((ot >= 1) & ((ot - 1) * BT < nvis))[None, :]
    tm = tl.load(TMX + (bg64 * NTILE + ot[None, :]) * HP + oh[:, None], mask=vt, other=0.0, cache_modifier=".cg")
    tmp = tl.load(TMX + (bg64 * NTILE + ot[None, :] - 1) * HP + oh[:, None], mask=vp, other=0.0,
                  cache_modifier=".cg")
    j = j0 + tl.arange(0, BJ)
    mj = (j <= cur) & (j < NB)
    ran = ((j // BPT) * BT < nvis)
    av = tl.load(ABUF + (bg64 * HP + oh[:, None]) * NB + j[None, :], mask=mh[:, None] & (mj & ran)[None, :],
                 other=0.0, cache_modifier=".cg")
    jc = j - 1  # C[j-1]: the previous block's tokens that overlap block j
    ranc = (jc >= 0) & ((jc // BPT) * BT < nvis)
    cv = tl.load(CBUF + (bg64 * HP + oh[:, None]) * NB + jc[None, :], mask=mh[:, None] & (mj & ranc)[None, :],
                 other=0.0, cache_modifier=".cg")
    return tm, tmp, vt, vp, av, cv, j, mj


@triton.jit
def _bs_math(tm, tmp, vt, vp, av, cv, j, mj, Mh, invZ, SC, bg64, NB, HP: tl.constexpr, A: tl.constexpr,
             BT: tl.constexpr, BJ: tl.constexpr):
    """_block_scores_slice's arithmetic on _bs_load's values: the tile weights w = 2^(m_tile - M_h) / Z_h
    broadcast over each tile's blocks by a reshape (no gather), summed over the heads -> SC[bg, j]."""
    BPT: tl.constexpr = BT // A
    TPI: tl.constexpr = BJ // BPT
    ob = tl.arange(0, BPT)
    w = tl.where(vt, tl.exp2(tm - Mh[:, None]) * invZ[:, None], 0.0)
    wp = tl.where(vp, tl.exp2(tmp - Mh[:, None]) * invZ[:, None], 0.0)  # of the previous tile
    a3 = tl.reshape(av, [HP, TPI, BPT])
    c3 = tl.reshape(cv, [HP, TPI, BPT])
    wc = tl.where((ob == 0)[None, None, :], wp[:, :, None], w[:, :, None])  # block 0 of a tile: C from before
    s = tl.reshape(tl.sum(a3 * w[:, :, None] + c3 * wc, 0), [BJ])
    tl.store(SC + bg64 * NB + j, s, mask=mj)


@triton.jit
def _block_scores_topn(pos, nvis, M_P, L_P, ABUF, CBUF, TMX, SC, BLK, bg64, NB, NTILE, NCH,
                       H: tl.constexpr, HP: tl.constexpr, LSEL: tl.constexpr, NSEL: tl.constexpr, A: tl.constexpr,
                       BT: tl.constexpr, BC: tl.constexpr, BJ: tl.constexpr, BNB: tl.constexpr):
    """Scores of blocks 0..t // l' (_block_scores_slice, BJ at a time) -> SC[bg, :], then the top-n -> BLK."""
    Mh, invZ = _merged_stats(M_P, L_P, bg64, NCH, H, HP, BC)
    cur = pos // LSEL
    for j0 in range(0, cur + 1, BJ):
        _block_scores_slice(j0, cur, nvis, Mh, invZ, ABUF, CBUF, TMX, SC, bg64, NB, NTILE, H, HP, A, BT, BJ)
    tl.debug_barrier()  # this program's score stores precede its loads below
    oj = tl.arange(0, BNB)
    sc = tl.load(SC + bg64 * NB + oj, mask=(oj <= cur) & (oj < NB), other=0.0, cache_modifier=".cg")
    _pick_topn(sc, oj, cur, BLK, bg64, NSEL, BNB)


@triton.jit
def _split_cmp_win_kernel(POS, Q, s_qb, KC, VC, KS, VS, KW, VW, s_kc, s_vc, s_ks, s_vs, s_kw, s_vw,
                          K_SEL, V_SEL, K_WIN, V_WIN, K_RAW, V_RAW, K_CMP, V_CMP, CAP, CCAP, TBL, s_tbl, PS,
                          M_P, L_P, ACC_P, ABUF, CBUF, TMX, SC, BLK, M_T, L_T, ACC_T, COUNT,
                          NB, NTILE, qk_scale, CH, NCH, WCH, NT, T_WIN,
                          G: tl.constexpr, H: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, W: tl.constexpr,
                          L: tl.constexpr, STRIDE: tl.constexpr, LSEL: tl.constexpr, NSEL: tl.constexpr,
                          A: tl.constexpr, BQ: tl.constexpr, BNB: tl.constexpr, HP: tl.constexpr, DK0: tl.constexpr,
                          BK1: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BL: tl.constexpr, BT: tl.constexpr,
                          BC: tl.constexpr, BJ: tl.constexpr, APPEND: tl.constexpr, AVG: tl.constexpr,
                          IEEE: tl.constexpr, PAGED: tl.constexpr):
    p = tl.program_id(0)  # a row's programs are adjacent in launch order: rows finish (and run their
    bg = tl.program_id(1)  # last-arriver tails) one after another, overlapping the other rows' reads
    b = bg // G
    g = bg % G
    bg64 = bg.to(tl.int64)
    pos = tl.load(POS).to(tl.int64)
    nvis = _num_cmp(pos, L, STRIDE)
    oh = tl.arange(0, HP)
    ov = tl.arange(0, BV)
    mh = oh < H
    mv = ov < DV
    if p < NCH:  # a chunk of the compressed cache
        lo = p.to(tl.int64) * CH
        hi = tl.minimum(lo + CH, nvis)
        if APPEND:
            if p == 0:  # the selection row / page and the raw ring (the window slot: its window program)
                row = _sel_rows(TBL, s_tbl, b, g, bg64, pos, CAP, PS, G, PAGED)
                _put(KS, s_ks, b, g, K_SEL, row, DK, BK)
                _put(VS, s_vs, b, g, V_SEL, row, DV, BV)
                _put(KC, s_kc, b, g, K_RAW, bg64 * L + pos % L, DK, BK)
                _put(VC, s_vc, b, g, V_RAW, bg64 * L + pos % L, DV, BV)
            if AVG:
                emit, ci = _emits(pos, L, STRIDE)
                if emit & (ci >= lo) & (ci < hi):  # the one program that reads row ci writes it
                    _store_cmp_token(K_CMP, V_CMP, K_RAW, V_RAW, KC, VC, s_kc, s_vc, b, g, pos, bg64, ci, CCAP, DK,
                                     DV, L, BK, BV, BL)
                    tl.debug_barrier()
        q0, q1 = _load_q(Q, s_qb, b, g, oh, mh, H, DK, DK0, BK1)
        m_i, l_i, acc = _attend_range(q0, q1, K_CMP, V_CMP, bg64 * CCAP, lo, hi, hi, qk_scale, oh, ov, mh, mv,
                                      ABUF, CBUF, TMX, bg64, NB, NTILE, ABUF, 0, DK, DV, HP, DK0, BK1, BV, BT, A, BQ,
                                      True, True, False, IEEE)
        _store_partial(M_P, L_P, ACC_P, bg64 * NCH + p, m_i, l_i, acc, oh, HP, BV, True)
        if _last_of_row(COUNT, bg64, NCH):
            _block_scores_topn(pos, nvis, M_P, L_P, ABUF, CBUF, TMX, SC, BLK, bg64, NB, NTILE, NCH, H, HP, LSEL, NSEL,
                               A, BT, BC, BJ, BNB)
    else:  # a chunk of the window ring: slots lo .. hi-1 that are <= t
        w = p - NCH
        lo = w.to(tl.int64) * WCH
        hi = tl.minimum(lo + WCH, W)
        if APPEND:
            slot = pos % W
            if (slot >= lo) & (slot < hi):  # the program that reads the new token's slot writes it
                _put(KW, s_kw, b, g, K_WIN, bg64 * W + slot, DK, BK)
                _put(VW, s_vw, b, g, V_WIN, bg64 * W + slot, DV, BV)
                tl.debug_barrier()
        q0, q1 = _load_q(Q, s_qb, b, g, oh, mh, H, DK, DK0, BK1)
        m_i, l_i, acc = _attend_range(q0, q1, K_WIN, V_WIN, bg64 * W, lo, hi, pos, qk_scale, oh, ov, mh, mv,
                                      ABUF, CBUF, TMX, bg64, NB, NTILE, ABUF, 0, DK, DV, HP, DK0, BK1, BV, BT, A, BQ,
                                      False, True, False, IEEE)
        _store_partial(M_T, L_T, ACC_T, bg64 * NT + T_WIN + w, m_i, l_i, acc, oh, HP, BV, True)


@triton.jit
def _split_sel_kernel(POS, Q, s_qb, BLK, K_SEL, V_SEL, CAP, qk_scale, TBL, s_tbl, PS, M_P, L_P, ACC_P, OC,
                      M_T, L_T, ACC_T, GATES, s_gb, O, NCH, NT, NSP, COUNT, NW, NVS,
                      G: tl.constexpr, H: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, LSEL: tl.constexpr,
                      NSEL: tl.constexpr, SPB: tl.constexpr, HP: tl.constexpr,
                      DK0: tl.constexpr, BK1: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr, BC: tl.constexpr,
                      BVC: tl.constexpr, BTT: tl.constexpr, BVF: tl.constexpr, IEEE: tl.constexpr,
                      PAGED: tl.constexpr):
    p = tl.program_id(0)  # a row's programs are adjacent in launch order: rows finish (and run their
    bg = tl.program_id(1)  # last-arriver tails) one after another, overlapping the other rows' reads
    b = bg // G
    g = bg % G
    bg64 = bg.to(tl.int64)
    oh = tl.arange(0, HP)
    mh = oh < H
    if p < NSP:  # selected blocks p*SPB .. p*SPB + SPB - 1 (raw tokens <= t), one online softmax
        pos = tl.load(POS).to(tl.int64)
        ov = tl.arange(0, BV)
        mv = ov < DV
        q0, q1 = _load_q(Q, s_qb, b, g, oh, mh, H, DK, DK0, BK1)
        os_ = tl.arange(0, BS)
        m_i = tl.full([HP], NEG, dtype=tl.float32)
        l_i = tl.zeros([HP], dtype=tl.float32)
        acc = tl.zeros([HP, BV], dtype=tl.float32)
        for k in tl.static_range(SPB):
            slot = p * SPB + k
            j = tl.load(BLK + bg64 * NSEL + slot, mask=slot < NSEL, other=-1)
            kpos = (j * LSEL + os_).to(tl.int64)
            m_s = (os_ < LSEL) & (kpos >= 0) & (kpos <= pos)
            rows = _sel_rows(TBL, s_tbl, b, g, bg64, kpos, CAP, PS, G, PAGED)
            sc = _qk(q0, q1, K_SEL, rows, m_s, DK, DK0, BK1, IEEE)
            sc = tl.where(m_s[None, :], sc * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(sc, 1))
            alpha = tl.exp2(m_i - m_new)
            pr = tl.exp2(sc - m_new[:, None])
            l_i = l_i * alpha + tl.sum(pr, 1)
            vb = tl.load(V_SEL + rows[:, None] * DV + ov[None, :], mask=m_s[:, None] & mv[None, :], other=0.0)
            acc = acc * alpha[:, None] + _dot(pr, vb, IEEE)
            m_i = m_new
        _store_partial(M_T, L_T, ACC_T, bg64 * NT + p, m_i, l_i, acc, oh, HP, BV, True)
    else:  # value columns (p - NSP) * BVC .. of the compressed chunks, merged -> OC
        ovc = (p - NSP) * BVC + tl.arange(0, BVC)
        oc = _merge_rows(M_P, L_P, ACC_P, bg64 * NCH, NCH, ovc, BC, HP, BV, BVC)
        tl.store(OC + (bg64 * HP + oh[:, None]) * BV + ovc[None, :], oc)
    if _last_of_row(COUNT, bg64, NSP + NVS):
        # the selected partials (rows 0..NSP-1) and the window's (NSP..NSP+NW-1), each normalised with its
        # own branch's stats and weighted by its gate: ONE weight per (partial, head), one acc load per slice
        gate = GATES + b * s_gb + (g * H + oh) * 3
        g0 = tl.load(gate + 0, mask=mh, other=0.0).to(tl.float32)
        g1 = tl.load(gate + 1, mask=mh, other=0.0).to(tl.float32)
        g2 = tl.load(gate + 2, mask=mh, other=0.0).to(tl.float32)
        orr = tl.arange(0, BTT)
        is_sel = orr < NSP
        is_win = (orr >= NSP) & (orr < NSP + NW)
        rows = bg64 * NT + orr
        mr = is_sel | is_win
        Mt = tl.load(M_T + rows[:, None] * HP + oh[None, :], mask=mr[:, None], other=NEG, cache_modifier=".cg")
        Lt = tl.load(L_T + rows[:, None] * HP + oh[None, :], mask=mr[:, None], other=0.0, cache_modifier=".cg")
        Ms = tl.max(tl.where(is_sel[:, None], Mt, NEG), 0)
        Mw = tl.max(tl.where(is_win[:, None], Mt, NEG), 0)
        es = tl.where(is_sel[:, None], tl.exp2(Mt - Ms[None, :]), 0.0)
        ew = tl.where(is_win[:, None], tl.exp2(Mt - Mw[None, :]), 0.0)
        Zs = tl.sum(Lt * es, 0)
        Zw = tl.sum(Lt * ew, 0)
        wt = (es * (g1 / tl.where(Zs > 0.0, Zs, 1.0))[None, :]
              + ew * (g2 / tl.where(Zw > 0.0, Zw, 1.0))[None, :])
        out_rows = b.to(tl.int64) * G * H + g * H + oh
        for vs in tl.static_range(BV // BVF):
            ovf = vs * BVF + tl.arange(0, BVF)
            acc = tl.load(ACC_T + (rows[:, None, None] * HP + oh[None, :, None]) * BV + ovf[None, None, :],
                          mask=mr[:, None, None], other=0.0, cache_modifier=".cg")
            o_cmp = tl.load(OC + (bg64 * HP + oh[:, None]) * BV + ovf[None, :], cache_modifier=".cg")
            o = g0[:, None] * o_cmp + tl.sum(acc * wt[:, :, None], 0)
            tl.store(O + out_rows[:, None] * DV + ovf[None, :], o.to(O.dtype.element_ty),
                     mask=mh[:, None] & (ovf < DV)[None, :])

# ---- host side --------------------------------------------------------------------------------

def _p2(n: int, lo: int = 1) -> int:
    return max(lo, triton.next_power_of_2(max(1, n)))


def split_dk(dk: int) -> tuple[int, int]:
    """Key dim of the fused kernels' dots as two power-of-two parts (DK0, BK1): dk = 192 -> (128, 64),
    no padding to 256; a power of two (or dk <= 16) -> (p2(dk, 16), 0), one part."""
    if dk <= 16 or dk & (dk - 1) == 0:
        return _p2(dk, 16), 0
    hi = 1 << (dk.bit_length() - 1)
    return hi, _p2(dk - hi, 16)


def pdl_default(device: torch.device) -> bool:
    """Programmatic dependent launch where the device has it (CUDA, sm_90+); never in the interpreter."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def chunking(n_tokens: int, BG: int, BK: int, device, chunk: int | None = None,
             max_chunks: int | None = None, programs_per_sm: int | None = None,
             min_chunk: int = 0, max_bt: int = 64) -> tuple[int, int, int]:
    """Split-K geometry over n_tokens keys for BG (batch*group) rows -> (BT, CH, NCH).

    Default: about ``programs_per_sm`` (PROGRAMS_PER_SM) programs per SM in all, at most ``max_chunks``
    (MAX_CHUNKS) chunks per row, at least ``min_chunk`` keys per chunk; tiles of at most ``max_bt`` keys."""
    if chunk is None:
        per_sm = programs_per_sm or PROGRAMS_PER_SM
        want = min(max_chunks or MAX_CHUNKS, -(-per_sm * _num_sms(device) // BG))
        chunk = max(min_chunk, -(-n_tokens // max(1, want)))
    BT = min(max_bt if BK <= 256 else max_bt // 2, _p2(chunk, 16))  # keys per tile
    CH = -(-chunk // BT) * BT
    return BT, CH, -(-n_tokens // CH)


# Split-K defaults of chunking() (the split-K full-attention baseline keeps them); the NSA step's own
# compressed pass uses Workspace.TUNE: 4 programs per SM and chunks of at least 128 compressed tokens,
# from the H100 chunk sweep of 2026-11-26 (docs/benchmarks.md, "stop 28": 64K/B16 133.6 us at 512-token
# chunks vs 152.5 us at the old 832; B=1 unchanged at 256 / 64 / 32-token chunks within noise).
PROGRAMS_PER_SM = 2
MAX_CHUNKS = 16
STEP_PROGRAMS_PER_SM = 4
STEP_MIN_CHUNK = 128


# Split step (impl="split") defaults: programs per SM of kernel 1 (compressed + window chunks) and of
# kernel 2's selected-block programs; the window in at most SPLIT_MAX_WIN programs, the final merge
# loads at most SPLIT_MERGE_ELEMS fp32 partial values per slice.
SPLIT_PROGRAMS_PER_SM = 8
SPLIT_SEL_PROGRAMS_PER_SM = 2
SPLIT_MAX_WIN = 4
SPLIT_MERGE_ELEMS = 8192
SPLIT_BT = 64  # keys per tile (at most)
SPLIT_SCORE_ELEMS = 2048  # the block-score pass loads [HP, BJ] of A and of C at once (4096 spills: 64 B stack)
SPLIT_MIN_CHUNK = 64  # default chunks: at least this many keys per program


def _p2_floor(n: int) -> int:
    return 1 << (max(1, int(n)).bit_length() - 1)


def split_plan(ccap: int, w: int, n_sel: int, BG: int, HP: int, BV: int, a: int, sms: int,
               chunk: int | None = None) -> dict:
    """Geometry of the split step (``Workspace.split``) for BG (batch*group) rows on ``sms`` SMs.

    Kernel 1: compressed chunks of CH tokens (BT-token tiles; CH a multiple of BT) and window chunks of
    WCH slots, about SPLIT_PROGRAMS_PER_SM programs per SM in all (``chunk`` overrides the tokens per
    chunk). Kernel 2: NSP programs of SPB selected blocks per row (about SPLIT_SEL_PROGRAMS_PER_SM per
    SM) and NVS programs merging the compressed chunks, BVC value columns each.
    Needs a = l_sel / d a power of two (the block partials reshape a tile into [.., BT/a, a])."""
    if a <= 0 or a & (a - 1):
        raise ValueError(f"impl='split' needs l_sel / d a power of two, got {a}")
    if chunk is None:
        per_row = max(1, -(-SPLIT_PROGRAMS_PER_SM * sms // BG))
        chunk = max(SPLIT_MIN_CHUNK, -(-(ccap + w) // per_row))
    BT = max(min(SPLIT_BT, _p2(chunk, 16)), _p2(a))
    CH = -(-max(chunk, 1) // BT) * BT
    NCH = -(-ccap // CH)
    w_full = -(-w // BT) * BT
    WCH = min(w_full, -(-max(CH, -(-w // SPLIT_MAX_WIN)) // BT) * BT)
    NW = -(-w // WCH)
    nsp_want = max(1, -(-SPLIT_SEL_PROGRAMS_PER_SM * sms // BG))
    SPB = max(1, -(-n_sel // nsp_want))
    NSP = -(-n_sel // SPB)
    BC = _p2(NCH)
    BVC = max(1, min(BV, _p2_floor(SPLIT_MERGE_ELEMS // (BC * HP))))
    BTT = _p2(NSP + NW)
    BVF = max(1, min(BV, _p2_floor(SPLIT_MERGE_ELEMS // (BTT * HP))))
    BJ = max(16, _p2_floor(SPLIT_SCORE_ELEMS // HP), BT // a)  # a multiple of the blocks per tile
    return dict(BT=BT, CH=CH, NCH=NCH, WCH=WCH, NW=NW, SPB=SPB, NSP=NSP, BVC=BVC, NVS=BV // BVC, BVF=BVF, BJ=BJ)


class Workspace:
    """Scratch buffers and launch geometry of the Triton decode step for one StaticDecoder.

    chunk: compressed tokens per program of the split-K compressed pass (default: ``chunking``).
    warps: num_warps per kernel, overriding CONFIG for this workspace (measurement).
    tune: the six-launch step's other knobs, overriding TUNE (measurement): "pdl" (programmatic
    dependent launch between the step's kernels: None = where the device has it, sm_90+),
    "fuse_append" (the append inside the compressed pass: 5 launches instead of 6, phi avg), "selection"
    (with it: "logits" = logits, probabilities, top-n; "blocks" = per-tile block partials of Eq. 9 instead of
    logits (4x fewer values at a = 4), block scores in parallel, top-n; "blocks-row" = the same partials,
    scores and top-n in one program per row: 4 launches; None = "blocks-row" where NB <= BJ, else "blocks":
    row_select), "tiles" ("separate" = the sel/win tile kernel,
    then the combine; "merged" = both in one launch, each row's last tile program merging), "cmp_bt" (keys
    per tile of the compressed pass),
    "programs_per_sm", "max_chunks" and "min_chunk" (the compressed pass's split-K, ``chunking``),
    "early_loads" (block scores, top-n, sel/win tiles and combine issue their loads before their first
    reduction: one memory round each instead of two to six; the same arithmetic in the same order; more
    registers. None = in the kernels whose grid fits in one wave, where latency rules: H100, -1.1 us at
    8K/B1 and 64K/B1, +2.7..4.2 us at B=16 if used there; True / False = everywhere / nowhere).
    """

    CONFIG = {"append": 4, "cmp": 4, "probs": 4, "select": 4, "selwin": 4, "combine": 4,  # num_warps
              "fused_cmp": 4, "fused_tiles": 4, "split_cmp": 4, "split_sel": 4, "split_stages": 2,
              "cmp_stages": 0}  # num_stages of the six-launch compressed pass (0: Triton's default)
    TUNE = {"pdl": None, "fuse_append": True, "selection": None, "tiles": "separate",
            "programs_per_sm": STEP_PROGRAMS_PER_SM, "max_chunks": MAX_CHUNKS, "min_chunk": STEP_MIN_CHUNK,
            "cmp_bt": 64, "early_loads": None}
    # a kernel whose grid fits in one wave (programs <= SMs) is latency-bound: these warps there (measured,
    # H100 sweep-tune 2026-11-26: combine -1.0 us at 64K/B1; tiles -0.2..-0.6 us at B=1); top-n over at most
    # TOPN_ONE_WARP_BLOCKS blocks in one warp (no cross-warp reduction: -0.6 us at 8K/B1, +9 us at 64K/B1)
    WAVE_WARPS = {"combine": 8, "selwin": 8}
    TOPN_ONE_WARP_BLOCKS = 128
    SELECTIONS = (None, "logits", "blocks", "blocks-row")
    TILES = ("separate", "merged")

    def __init__(self, dec, chunk: int | None = None, warps: dict | None = None, split_chunk: int | None = None,
                 tune: dict | None = None):
        cfg = dec.cfg
        self.dec = dec
        dev = dec.device
        self.CONFIG = {**self.CONFIG, **(warps or {})}
        self._warps_given = set(warps or {})
        unknown = set(tune or {}) - set(self.TUNE)
        if unknown:
            raise ValueError(f"Workspace: unknown tune keys {sorted(unknown)}; known: {sorted(self.TUNE)}")
        self.tune = {**self.TUNE, **(tune or {})}
        if self.tune["tiles"] not in self.TILES:
            raise ValueError(f"Workspace: tune tiles must be one of {self.TILES}, got {self.tune['tiles']!r}")
        if self.tune["selection"] not in self.SELECTIONS:
            raise ValueError(f"Workspace: tune selection must be one of {self.SELECTIONS}, "
                             f"got {self.tune['selection']!r}")
        if self.tune["early_loads"] is not None and not isinstance(self.tune["early_loads"], bool):
            raise ValueError(f"Workspace: tune early_loads must be None, True or False, got "
                             f"{self.tune['early_loads']!r}")
        self.SMS = _num_sms(dev)
        self.PDL = pdl_default(dev) if self.tune["pdl"] is None else bool(self.tune["pdl"])
        self._pdl = {"launch_pdl": True} if self.PDL else {}  # launch option (not passed at all without PDL)
        self.BG = dec.B * dec.G
        self.HP = _p2(dec.h, 16)
        self.BK = _p2(dec.dk, 16)
        self.BV = _p2(dec.dv, 16)
        self.BVS = min(self.BV, 32)  # value columns per combine program
        ccap = dec.ccap
        self.BT, self.CH, self.NCH = chunking(ccap, self.BG, self.BK, dev, chunk, self.tune["max_chunks"],
                                              self.tune["programs_per_sm"], self.tune["min_chunk"],
                                              self.tune["cmp_bt"])
        self.BS = _p2(cfg.l_sel, 16)
        self.NS_WIN = -(-cfg.w // self.BS)
        self.IEEE = dec.dtype == torch.float32
        if dec.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"impl='triton' supports fp32/fp16/bf16 caches, got {dec.dtype}")
        f32 = dict(dtype=torch.float32, device=dev)
        self.m_p = torch.empty(self.BG, self.NCH, self.HP, **f32)
        self.l_p = torch.empty(self.BG, self.NCH, self.HP, **f32)
        self.acc_p = torch.empty(self.BG, self.NCH, self.HP, self.BV, **f32)
        self.logits = torch.empty(self.BG, self.HP, ccap, **f32)
        self.psum = torch.empty(self.BG, ccap, **f32)
        self.NT = cfg.n_sel + self.NS_WIN  # row stride of the sel/win tile buffers
        self.m_t = torch.empty(self.BG, self.NT, self.HP, **f32)
        self.l_t = torch.empty(self.BG, self.NT, self.HP, **f32)
        self.acc_t = torch.empty(self.BG, self.NT, self.HP, self.BV, **f32)
        self.qk_scale = dec.scale * LOG2E
        self.DK0, self.BK1 = split_dk(dec.dk)
        self.count = torch.zeros(2, self.BG, dtype=torch.int32, device=dev)  # fused: programs done per row
        self._split = None  # impl="split": geometry + buffers (split_geometry)
        self._blk = None  # tune "blocks": buffers (_blocks)
        self._split_chunk = split_chunk

    # ---- launches ------------------------------------------------------------------------------
    def paging(self) -> tuple:
        """(page table, its row stride, page size) of the raw selection cache (dense: one page each)."""
        c = self.dec.cache
        t = c.page_table()
        return t, t.stride(0), c.page_size

    def append(self, kc, vc, ks, vs, kw, vw) -> None:
        d, c, cfg = self.dec, self.dec.cache, self.dec.cfg
        self._check_new("append", kc, vc, ks, vs, kw, vw)
        avg = d.m.phi_k is None
        _append_kernel[(self.BG,)](
            d.pos, kc, vc, ks, vs, kw, vw, kc.stride(0), vc.stride(0), ks.stride(0), vs.stride(0), kw.stride(0),
            vw.stride(0), c.K_sel, c.V_sel, c.K_win, c.V_win, c.K_raw, c.V_raw, c.K_cmp, c.V_cmp, d.cap, d.ccap,
            *self.paging(), G=d.G, DK=d.dk, DV=d.dv, W=cfg.w, L=cfg.l, STRIDE=cfg.d, BK=self.BK, BV=self.BV,
            BL=_p2(cfg.l), AVG=avg, PAGED=c.paged, PDL=self.PDL, num_warps=self.CONFIG["append"], **self._pdl)
        if not avg:
            d._compress()

    def _cmp_launch(self) -> dict:
        """Launch options of the compressed pass: PDL, and num_stages when CONFIG["cmp_stages"] sets it."""
        st = self.CONFIG["cmp_stages"]
        return {**self._pdl, **({"num_stages": st} if st else {})}

    @staticmethod
    def _check_new(what: str, *tensors) -> None:
        for t in tensors:
            if t.stride(2) != 1 or t.stride(1) != t.shape[2]:
                raise ValueError(f"{what}: new-token tensors must be [B, G, D] with contiguous [G, D], got strides "
                                 f"{t.stride()}")

    def _check_q(self, q):
        if q.stride(2) != 1 or q.stride(1) != q.shape[2]:
            raise ValueError(f"q must be [B, HQ, dk] with contiguous [HQ, dk], got strides {q.stride()}")

    def cmp_partial(self, q, do_o: bool, do_logits: bool) -> None:
        d, cfg = self.dec, self.dec.cfg
        self._check_q(q)
        _cmp_partial_kernel[(self.BG, self.NCH)](
            d.pos, q, q.stride(0), d.cache.K_cmp, d.cache.V_cmp, self.logits, self.m_p, self.l_p, self.acc_p, d.ccap,
            self.qk_scale, G=d.G, H=d.h, DK=d.dk, DV=d.dv, L=cfg.l, STRIDE=cfg.d, HP=self.HP, DK0=self.DK0,
            BK1=self.BK1, BV=self.BV, BT=self.BT, CH=self.CH, NCH=self.NCH, DO_O=do_o, DO_LOGITS=do_logits,
            IEEE=self.IEEE, PDL=self.PDL, num_warps=self.CONFIG["cmp"], **self._cmp_launch())

    def select(self) -> None:
        """Scores and top-n from the logits of the last cmp_partial(do_logits=True) -> dec.blk."""
        d, cfg = self.dec, self.dec.cfg
        _cmp_probs_kernel[(self.BG, self.NCH)](
            d.pos, self.m_p, self.l_p, self.logits, self.psum, d.ccap, self.CH, self.NCH, H=d.h, L=cfg.l,
            STRIDE=cfg.d, HP=self.HP, BT=self.BT, BC=_p2(self.NCH), PDL=self.PDL, num_warps=self.CONFIG["probs"],
            **self._pdl)
        _select_kernel[(self.BG,)](
            d.pos, self.psum, d.blk, d.ccap, d.NB, L=cfg.l, STRIDE=cfg.d, LSEL=cfg.l_sel, NSEL=cfg.n_sel,
            A=cfg.l_sel // cfg.d, BQ=cfg.l // cfg.d, BNB=_p2(d.NB), PDL=self.PDL, num_warps=self.CONFIG["select"],
            **self._pdl)

    def selwin(self, q, do_sel: bool, do_win: bool) -> tuple[int, int]:
        d, c, cfg = self.dec, self.dec.cache, self.dec.cfg
        self._check_q(q)
        ns_sel = cfg.n_sel if do_sel else 0
        ns_win = self.NS_WIN if do_win else 0
        if ns_sel + ns_win:
            _selwin_kernel[(self.BG, ns_sel + ns_win)](
                d.pos, q, q.stride(0), d.blk, c.K_sel, c.V_sel, c.K_win, c.V_win, self.m_t, self.l_t, self.acc_t,
                d.cap, self.qk_scale, *self.paging(), G=d.G, H=d.h, DK=d.dk, DV=d.dv, W=cfg.w, LSEL=cfg.l_sel,
                NSEL=cfg.n_sel, NS_SEL=ns_sel, NT=self.NT, HP=self.HP, DK0=self.DK0, BK1=self.BK1, BV=self.BV,
                BS=self.BS, IEEE=self.IEEE, PAGED=c.paged, EARLY=self.early(self.BG * (ns_sel + ns_win)),
                PDL=self.PDL, num_warps=self.warps("selwin", self.BG * (ns_sel + ns_win)), **self._pdl)
        return ns_sel, ns_win

    def combine(self, gates, out, do_cmp: bool, ns_sel: int, ns_win: int) -> torch.Tensor:
        """Merge the compressed chunks and the tiles of the last selwin launch (window tiles start
        at tile ns_sel), weight by the gates -> out [B, HQ, dv]."""
        d = self.dec
        if gates.stride(2) != 1 or gates.stride(1) != 3:
            raise ValueError(f"gates must be [B, HQ, 3] with contiguous [HQ, 3], got strides {gates.stride()}")
        _combine_kernel[(self.BG, self.BV // self.BVS)](
            self.m_p, self.l_p, self.acc_p, self.m_t, self.l_t, self.acc_t, gates, gates.stride(0), out, self.NCH,
            self.NT, G=d.G, H=d.h, DV=d.dv, HP=self.HP, BV=self.BV, BVS=self.BVS, BC=_p2(self.NCH), NS_SEL=ns_sel,
            NS_WIN=ns_win, BSEL=_p2(max(ns_sel, 1)), BWIN=_p2(max(ns_win, 1)), DO_CMP=do_cmp, GATED=True,
            EARLY=self.early(self.BG * self.BV // self.BVS) and max(self.NCH, ns_sel, ns_win) <= 16, PDL=self.PDL,
            num_warps=self.warps("combine", self.BG * self.BV // self.BVS), **self._pdl)
        return out

    def fused(self, q, kc, vc, ks, vs, kw, vw, gates, out) -> torch.Tensor:
        """The attention part of a step in two launches (append + compressed pass + top-n; tiles +
        merge + gates) -> out [B, HQ, dv]. With phi="mlp" the append and the torch phi run first."""
        d, c, cfg = self.dec, self.dec.cache, self.dec.cfg
        self._check_q(q)
        self._check_new("fused", kc, vc, ks, vs, kw, vw)
        if gates.stride(2) != 1 or gates.stride(1) != 3:
            raise ValueError(f"gates must be [B, HQ, 3] with contiguous [HQ, 3], got strides {gates.stride()}")
        avg = d.m.phi_k is None
        if not avg:  # a learned phi runs in torch between the append and the compressed pass
            self.append(kc, vc, ks, vs, kw, vw)
        _fused_cmp_kernel[(self.BG, self.NCH)](
            d.pos, q, q.stride(0), kc, vc, ks, vs, kw, vw, kc.stride(0), vc.stride(0), ks.stride(0), vs.stride(0),
            kw.stride(0), vw.stride(0), c.K_sel, c.V_sel, c.K_win, c.V_win, c.K_raw, c.V_raw, c.K_cmp, c.V_cmp, d.cap,
            d.ccap, *self.paging(), self.logits, self.m_p, self.l_p, self.acc_p, self.psum, d.blk, self.count[0],
            d.NB, self.qk_scale, self.CH, self.NCH, G=d.G, H=d.h, DK=d.dk, DV=d.dv, W=cfg.w, L=cfg.l, STRIDE=cfg.d,
            LSEL=cfg.l_sel, NSEL=cfg.n_sel, A=cfg.l_sel // cfg.d, BQ=cfg.l // cfg.d, BNB=_p2(d.NB), HP=self.HP,
            DK0=self.DK0, BK1=self.BK1, BK=self.BK, BV=self.BV, BL=_p2(cfg.l), BT=self.BT, BC=_p2(self.NCH),
            APPEND=avg, AVG=avg, IEEE=self.IEEE, PAGED=c.paged, num_warps=self.CONFIG["fused_cmp"])
        return self._tiles_merged(q, gates, out, pdl=False)

    def _tiles_merged(self, q, gates, out, pdl: bool) -> torch.Tensor:
        """The selected-block and window tiles and, in each row's last tile program, the merge + gates: one
        launch (_fused_tiles_kernel) instead of _selwin_kernel + _combine_kernel."""
        d, c, cfg = self.dec, self.dec.cache, self.dec.cfg
        ns_sel, ns_win = cfg.n_sel, self.NS_WIN
        _fused_tiles_kernel[(self.BG, ns_sel + ns_win)](
            d.pos, q, q.stride(0), d.blk, c.K_sel, c.V_sel, c.K_win, c.V_win, self.m_t, self.l_t, self.acc_t, d.cap,
            self.qk_scale, *self.paging(), self.m_p, self.l_p, self.acc_p, gates, gates.stride(0), out, self.NCH,
            self.count[1], G=d.G, H=d.h, DK=d.dk, DV=d.dv, W=cfg.w, LSEL=cfg.l_sel, NSEL=cfg.n_sel, NS_SEL=ns_sel,
            NS_WIN=ns_win, NT=self.NT, HP=self.HP, DK0=self.DK0, BK1=self.BK1, BV=self.BV, BVS=self.BVS, BS=self.BS,
            BC=_p2(self.NCH), BSEL=_p2(ns_sel), BWIN=_p2(ns_win), IEEE=self.IEEE, PAGED=c.paged, PDL=pdl,
            num_warps=self.CONFIG["fused_tiles"], **(self._pdl if pdl else {}))
        return out

    # ---- the split step (impl="split"): two launches, split-K sized from the SM count ----------------
    def split_geometry(self) -> dict:
        """Launch geometry of the split step, sized from the SM count (``split_plan``), and its buffers
        (allocated on first use)."""
        if self._split is None:
            d, cfg = self.dec, self.dec.cfg
            g = split_plan(d.ccap, cfg.w, cfg.n_sel, self.BG, self.HP, self.BV, cfg.l_sel // cfg.d, _num_sms(d.device),
                           chunk=self._split_chunk)
            f32 = dict(dtype=torch.float32, device=d.device)
            BG, HP, BV, NB = self.BG, self.HP, self.BV, d.NB
            g["NTILE"] = -(-d.ccap // g["BT"])
            g["NT"] = g["NSP"] + g["NW"]
            g.update(m_p=torch.empty(BG, g["NCH"], HP, **f32), l_p=torch.empty(BG, g["NCH"], HP, **f32),
                     acc_p=torch.empty(BG, g["NCH"], HP, BV, **f32), abuf=torch.empty(BG, HP, NB, **f32),
                     cbuf=torch.empty(BG, HP, NB, **f32), tmx=torch.empty(BG, g["NTILE"], HP, **f32),
                     sc=torch.empty(BG, NB, **f32), m_t=torch.empty(BG, g["NT"], HP, **f32),
                     l_t=torch.empty(BG, g["NT"], HP, **f32), acc_t=torch.empty(BG, g["NT"], HP, BV, **f32),
                     oc=torch.empty(BG, HP, BV, **f32),
                     count=torch.zeros(2, BG, dtype=torch.int32, device=d.device))
            self._split = g
        return self._split

    def split(self, q, kc, vc, ks, vs, kw, vw, gates, out) -> torch.Tensor:
        """The attention part of a step in two launches, split-K in both (see the kernels' comment)
        -> out [B, HQ, dv]. With phi="mlp" the append and the torch phi run first."""
        d, c, cfg = self.dec, self.dec.cache, self.dec.cfg
        self._check_q(q)
        self._check_new("split", kc, vc, ks, vs, kw, vw)
        if gates.stride(2) != 1 or gates.stride(1) != 3:
            raise ValueError(f"gates must be [B, HQ, 3] with contiguous [HQ, 3], got strides {gates.stride()}")
        s = self.split_geometry()
        avg = d.m.phi_k is None
        if not avg:  # a learned phi runs in torch between the append and the compressed pass
            self.append(kc, vc, ks, vs, kw, vw)
        _split_cmp_win_kernel[(s["NCH"] + s["NW"], self.BG)](
            d.pos, q, q.stride(0), kc, vc, ks, vs, kw, vw, kc.stride(0), vc.stride(0), ks.stride(0), vs.stride(0),
            kw.stride(0), vw.stride(0), c.K_sel, c.V_sel, c.K_win, c.V_win, c.K_raw, c.V_raw, c.K_cmp, c.V_cmp, d.cap,
            d.ccap, *self.paging(), s["m_p"], s["l_p"], s["acc_p"], s["abuf"], s["cbuf"], s["tmx"], s["sc"], d.blk,
            s["m_t"], s["l_t"], s["acc_t"], s["count"][0], d.NB, s["NTILE"], self.qk_scale, s["CH"], s["NCH"],
            s["WCH"], s["NT"], s["NSP"], G=d.G, H=d.h, DK=d.dk, DV=d.dv, W=cfg.w, L=cfg.l, STRIDE=cfg.d,
            LSEL=cfg.l_sel, NSEL=cfg.n_sel, A=cfg.l_sel // cfg.d, BQ=cfg.l // cfg.d, BNB=_p2(d.NB), HP=self.HP,
            DK0=self.DK0, BK1=self.BK1, BK=self.BK, BV=self.BV, BL=_p2(cfg.l), BT=s["BT"], BC=_p2(s["NCH"]),
            BJ=s["BJ"], APPEND=avg, AVG=avg, IEEE=self.IEEE, PAGED=c.paged, num_warps=self.CONFIG["split_cmp"],
            num_stages=self.CONFIG["split_stages"])
        _split_sel_kernel[(s["NSP"] + s["NVS"], self.BG)](
            d.pos, q, q.stride(0), d.blk, c.K_sel, c.V_sel, d.cap, self.qk_scale, *self.paging(), s["m_p"], s["l_p"],
            s["acc_p"], s["oc"], s["m_t"], s["l_t"], s["acc_t"], gates, gates.stride(0), out, s["NCH"], s["NT"],
            s["NSP"], s["count"][1], s["NW"], s["NVS"], G=d.G, H=d.h, DK=d.dk, DV=d.dv, LSEL=cfg.l_sel,
            NSEL=cfg.n_sel, SPB=s["SPB"], HP=self.HP, DK0=self.DK0, BK1=self.BK1, BV=self.BV, BS=self.BS,
            BC=_p2(s["NCH"]), BVC=s["BVC"], BTT=_p2(s["NT"]), BVF=s["BVF"], IEEE=self.IEEE, PAGED=c.paged,
            num_warps=self.CONFIG["split_sel"])
        return out

    def row_select(self) -> bool:
        """Block scores and top-n in one program per row (_scores_topn_kernel, one launch fewer): tune
        selection "blocks-row", or by default (None) where the block scores would run in one program per
        row anyway (NB <= BJ: -0.5 us at 8K/B1 on the H100; at 64K/B1, 8 slices per row, +7 us)."""
        sel = self.tune["selection"]
        bk = self._blocks()
        return bk is not None and (sel == "blocks-row" or (sel is None and self.dec.NB <= bk["BJ"]))

    def early(self, programs: int) -> bool:
        """Early loads (tune "early_loads") in a kernel of ``programs`` programs: by default where the grid
        fits in one wave."""
        e = self.tune["early_loads"]
        return programs <= self.SMS if e is None else e

    def warps(self, kernel: str, programs: int) -> int:
        """num_warps of ``kernel``: the one given to this workspace, else WAVE_WARPS where its grid fits in
        one wave, else CONFIG."""
        if kernel not in self._warps_given and kernel in self.WAVE_WARPS and programs <= self.SMS:
            return self.WAVE_WARPS[kernel]
        return self.CONFIG[kernel]

    def topn_warps(self) -> int:
        """num_warps of _topn_kernel: the one given ("select"), else one warp for at most
        TOPN_ONE_WARP_BLOCKS blocks, else CONFIG."""
        if "select" not in self._warps_given and _p2(self.dec.NB) <= self.TOPN_ONE_WARP_BLOCKS:
            return 1
        return self.CONFIG["select"]

    def _blocks(self) -> dict | None:
        """Buffers and geometry of the block-partial selection (tune "blocks"), or None where it does not
        apply (a = l_sel / d not a power of two, or tiles shorter than a block)."""
        d, cfg = self.dec, self.dec.cfg
        a = cfg.l_sel // cfg.d
        if self.tune["selection"] == "logits" or cfg.l_sel % cfg.d or a & (a - 1) or self.BT % a:
            return None
        if self._blk is None:
            f32 = dict(dtype=torch.float32, device=d.device)
            ntile = -(-d.ccap // self.BT)
            self._blk = dict(a=a, NTILE=ntile, BJ=max(16, _p2_floor(SPLIT_SCORE_ELEMS // self.HP), self.BT // a),
                             abuf=torch.empty(self.BG, self.HP, d.NB, **f32),
                             cbuf=torch.empty(self.BG, self.HP, d.NB, **f32),
                             tmx=torch.empty(self.BG, ntile, self.HP, **f32), sc=torch.empty(self.BG, d.NB, **f32))
        return self._blk

    def attn(self, q, kc, vc, ks, vs, kw, vw, gates, out) -> torch.Tensor:
        """The attention part of a step (append + three branches + gates) -> out [B, HQ, dv]. With phi avg
        and tune["fuse_append"]: the append inside the compressed pass, and with tune["blocks"] the
        selection from block partials (_scores_topn_kernel): four launches (five with the logits); else
        the append, then ``branches`` (six)."""
        d, c, cfg = self.dec, self.dec.cache, self.dec.cfg
        if not (self.tune["fuse_append"] and d.m.phi_k is None):
            with _scope("shared"):
                self.append(kc, vc, ks, vs, kw, vw)
            return self.branches(q, gates, out)
        self._check_q(q)
        self._check_new("append", kc, vc, ks, vs, kw, vw)
        bk = self._blocks()
        lg = self.logits
        part = (bk["abuf"], bk["cbuf"], bk["tmx"], d.NB, bk["NTILE"]) if bk else (lg, lg, lg, 1, 1)
        with _scope("shared"):
            _append_cmp_kernel[(self.BG, self.NCH)](
                d.pos, q, q.stride(0), kc, vc, ks, vs, kw, vw, kc.stride(0), vc.stride(0), ks.stride(0), vs.stride(0),
                kw.stride(0), vw.stride(0), c.K_sel, c.V_sel, c.K_win, c.V_win, c.K_raw, c.V_raw, c.K_cmp, c.V_cmp,
                d.cap, d.ccap, *self.paging(), lg, self.m_p, self.l_p, self.acc_p, *part, self.qk_scale, self.CH,
                self.NCH, G=d.G, H=d.h, DK=d.dk, DV=d.dv, W=cfg.w, L=cfg.l, STRIDE=cfg.d, HP=self.HP, DK0=self.DK0,
                BK1=self.BK1, BK=self.BK, BV=self.BV, BL=_p2(cfg.l), BT=self.BT, A=bk["a"] if bk else 1,
                BQ=cfg.l // cfg.d, BLOCKS=bk is not None, DO_LOGITS=bk is None, IEEE=self.IEEE, PAGED=c.paged,
                PDL=self.PDL, num_warps=self.CONFIG["cmp"], **self._cmp_launch())
        with _scope("sel"):
            if bk is None:
                self.select()
            elif self.row_select():
                _scores_topn_kernel[(self.BG,)](
                    d.pos, self.m_p, self.l_p, bk["abuf"], bk["cbuf"], bk["tmx"], bk["sc"], d.blk, d.NB, bk["NTILE"],
                    self.NCH, H=d.h, HP=self.HP, L=cfg.l, STRIDE=cfg.d, LSEL=cfg.l_sel, NSEL=cfg.n_sel, A=bk["a"],
                    BT=self.BT, BC=_p2(self.NCH), BJ=bk["BJ"], BNB=_p2(d.NB), PDL=self.PDL,
                    num_warps=self.CONFIG["select"], **self._pdl)
            else:
                _block_scores_kernel[(self.BG, -(-d.NB // bk["BJ"]))](
                    d.pos, self.m_p, self.l_p, bk["abuf"], bk["cbuf"], bk["tmx"], bk["sc"], d.NB, bk["NTILE"],
                    self.NCH, H=d.h, HP=self.HP, L=cfg.l, STRIDE=cfg.d, LSEL=cfg.l_sel, A=bk["a"], BT=self.BT,
                    BC=_p2(self.NCH), BJ=bk["BJ"], EARLY=self.early(self.BG * -(-d.NB // bk["BJ"])), PDL=self.PDL,
                    num_warps=self.CONFIG["probs"], **self._pdl)
                _topn_kernel[(self.BG,)](d.pos, bk["sc"], d.blk, d.NB, LSEL=cfg.l_sel, NSEL=cfg.n_sel,
                                         BNB=_p2(d.NB), EARLY=self.early(self.BG), PDL=self.PDL,
                                         num_warps=self.topn_warps(), **self._pdl)
        with _scope("shared"):
            if self.tune["tiles"] == "merged":
                if gates.stride(2) != 1 or gates.stride(1) != 3:
                    raise ValueError(f"gates must be [B, HQ, 3] with contiguous [HQ, 3], got strides {gates.stride()}")
                return self._tiles_merged(q, gates, out, pdl=self.PDL)
            ns_sel, ns_win = self.selwin(q, True, True)
            return self.combine(gates, out, True, ns_sel, ns_win)

    def branches(self, q, gates, out, cmp: bool = True, slc: bool = True, win: bool = True) -> torch.Tensor:
        """Gated sum of the chosen branches for the query q [B, HQ, dk] -> out [B, HQ, dv]."""
        if cmp or slc:
            with _scope("cmp"):
                self.cmp_partial(q, do_o=cmp, do_logits=slc)
        if slc:
            with _scope("sel"):
                self.select()
        with _scope("shared"):
            ns_sel, ns_win = self.selwin(q, slc, win)
            return self.combine(gates, out, cmp, ns_sel, ns_win)
