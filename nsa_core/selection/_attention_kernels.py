"""Triton kernels of the selection branch (layer 1 of nsa_core.selection.attention; no host logic here).

Layout: q [B, Tq, HQ, dk], k [B, S, G, dk], v [B, S, G, dv] (last dim contiguous, other strides
passed in), query row ``t`` sits at key position ``Q_OFF + t`` (Q_OFF = S - Tq). The h heads of
group g are query heads ``g*h .. g*h + h - 1``. Softmax runs in the exp2 domain
(``qk_scale = scale * log2(e)``); ``lse`` is stored in natural-log units.

Kernels
  _fwd_kernel       one program per (token, group): the group's h heads (padded to HP rows) are
                    loaded once and the selected KV blocks are streamed with an online softmax.
  _bwd_pre_kernel   delta = rowsum(do * o) per (token, head), fp32.
  _bwd_dq_kernel    one program per (token, group): dq over the same selected blocks.
  _bwd_dkv_kernel   one program per segment of the inverted index (block -> selecting queries):
                    loads the key block once, gathers BQ queries x HP heads per step; optionally
                    also adds dq with fp32 atomics (non-deterministic variant).
  _bwd_dkv_reduce_kernel  sums the fp32 partial tiles of blocks split over several segments,
                    in segment order (deterministic).
                    With ATOMIC_DKV (dkv_mode="atomic", the atomics alternative) the same
                    program also adds its dk/dv contributions to fp32 buffers with atomics.
  _qt_kernel        QT consecutive tokens per program share the forced blocks (forward, or dq
                    with BWD).

Every kernel is built from the @triton.jit helpers below (offsets, index rows, one block's K/V
load, the online-softmax step, the softmax-backward terms, the per-token loads and stores), so
a step of the math is written once; Triton inlines the helpers (no call at run time).
"""

from __future__ import annotations

from nsa_core._triton import PROBLEM, tl, triton

if triton is None:  # imported only where triton is usable
    raise ImportError(f"nsa_core's Triton kernels need triton: {PROBLEM}")

from nsa_core._kernel_utils import dot as _dot

LOG2E = 1.4426950408889634


# ---- helpers (inlined by Triton) ------------------------------------------------------------

@triton.jit
def _offsets(HP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr, H: tl.constexpr,
             DK: tl.constexpr, DV: tl.constexpr):
    """Row (head), key-dim, value-dim and in-block offsets, with the head / dim masks."""
    offs_h = tl.arange(0, HP)
    offs_k = tl.arange(0, BK)
    offs_v = tl.arange(0, BV)
    offs_s = tl.arange(0, BS)
    return offs_h, offs_k, offs_v, offs_s, offs_h < H, offs_k < DK, offs_v < DV


@triton.jit
def _tile(Q, K, V, t, Tq, sqb, sqt, sqh, skb, skg, svb, svg, G: tl.constexpr, H: tl.constexpr, HP: tl.constexpr,
          BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, NP: tl.constexpr):
    """What a per-token program (grid axis 1 = b*G + g) starts from: b, g, the group's K/V bases,
    the offsets and masks, and the h query rows of token t."""
    bg = tl.program_id(1)
    b64 = (bg // G).to(tl.int64)
    g = bg % G
    offs_h, offs_k, offs_v, offs_s, m_h, m_k, m_v = _offsets(HP, BK, BV, BS, H, DK, DV)
    q = _tok_load(Q, b64, t, Tq, g, sqb, sqt, sqh, H, offs_h, offs_k, m_h, m_k)
    return (b64, g, K + b64 * skb + g * skg, V + b64 * svb + g * svg, offs_h, offs_k, offs_v, offs_s,
            tl.arange(0, NP), m_h, m_k, m_v, q)


@triton.jit
def _tok_index(IDX, CNT, b64, t, Tq, g, G: tl.constexpr, N: tl.constexpr, offs_n, PRELOAD: tl.constexpr):
    """(row, count, preloaded index row) of token t's selection."""
    row = (b64 * Tq + t) * G + g
    cnt = tl.load(CNT + row)
    return row, cnt, _index_row(IDX, row, N, cnt, offs_n, PRELOAD)


@triton.jit
def _index_row(IDX, row, N: tl.constexpr, cnt, offs_n, PRELOAD: tl.constexpr):
    """The token's selected block ids up front (PRELOAD: no load in the loop's address chain)."""
    if PRELOAD:
        r = tl.load(IDX + row * N + offs_n, mask=offs_n < cnt, other=0)
    else:
        r = offs_n * 0  # unused
    return r


@triton.jit
def _nth(idx_row, offs_n, i):
    """Element i of a loaded index row, as an int64 scalar."""
    return tl.sum(tl.where(offs_n == i, idx_row, 0)).to(tl.int64)


@triton.jit
def _block_id(IDX, row, N: tl.constexpr, i, idx_row, offs_n, PRELOAD: tl.constexpr):
    """The i-th selected block of index row ``row``."""
    if PRELOAD:
        j = _nth(idx_row, offs_n, i)
    else:
        j = tl.load(IDX + row * N + i).to(tl.int64)
    return j


@triton.jit
def _kv_block(k_base, v_base, kpos, keep, skt, svt, offs_k, offs_v, m_k, m_v):
    """K [BS, BK] and V [BS, BV] rows at key positions kpos (zeros where not keep)."""
    kb = tl.load(k_base + kpos[:, None] * skt + offs_k[None, :], mask=keep[:, None] & m_k[None, :], other=0.0)
    vb = tl.load(v_base + kpos[:, None] * svt + offs_v[None, :], mask=keep[:, None] & m_v[None, :], other=0.0)
    return kb, vb


@triton.jit
def _fwd_attend(q, kb, vb, m_i, l_i, acc, keep, qk_scale, IEEE: tl.constexpr):
    """One online-softmax step (exp2 domain) over a key block; keys not in keep are not attended."""
    s = _dot(q, tl.trans(kb), IEEE)
    s = tl.where(keep[None, :], s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _dot(p, vb, IEEE)
    return m_new, l_i, acc


@triton.jit
def _bwd_terms(q, do, lse2, delta, kb, vb, keep, qk_scale, IEEE: tl.constexpr):
    """p = softmax probabilities (from the stored lse) and ds = p * (do v^T - delta) of a key block."""
    s = _dot(q, tl.trans(kb), IEEE)
    dp = _dot(do, tl.trans(vb), IEEE)
    p = tl.where(keep[None, :], tl.exp2(s * qk_scale - lse2[:, None]), 0.0)
    return p, p * (dp - delta[:, None])


@triton.jit
def _dq_attend(q, do, lse2, delta, kb, vb, dq, keep, qk_scale, IEEE: tl.constexpr):
    """dq += ds @ k over one key block."""
    p, ds = _bwd_terms(q, do, lse2, delta, kb, vb, keep, qk_scale, IEEE)
    return dq + _dot(ds, kb, IEEE)


@triton.jit
def _tok_rows(b64, t, Tq, g, HQ: tl.constexpr, H: tl.constexpr, offs_h, m_h):
    """Flat [B*Tq*HQ] rows of token t's group heads, and the row mask (false when t >= Tq)."""
    tt = tl.minimum(t, Tq - 1).to(tl.int64)
    rows = (b64 * Tq + tt) * HQ + g * H + offs_h
    return rows, m_h & ((offs_h * 0 + t) < Tq)  # vector compare: the interpreter rejects scalar-bool masks


@triton.jit
def _tok_load(X, b64, t, Tq, g, sxb, sxt, sxh, H: tl.constexpr, offs_h, offs_d, m_h, m_d):
    """The group's h rows of token t ([HP, BD]); zeros when t >= Tq."""
    tt = tl.minimum(t, Tq - 1).to(tl.int64)
    ptr = X + b64 * sxb + tt * sxt + (g * H + offs_h)[:, None] * sxh + offs_d[None, :]
    ok = m_h & ((offs_h * 0 + t) < Tq)  # vector compare: the interpreter rejects scalar-bool masks
    return tl.load(ptr, mask=ok[:, None] & m_d[None, :], other=0.0)


@triton.jit
def _tok_stats(LSE, DELTA, b64, t, Tq, g, HQ: tl.constexpr, H: tl.constexpr, offs_h, m_h):
    """lse (log2 units) and delta of token t's group heads."""
    rows, ok = _tok_rows(b64, t, Tq, g, HQ, H, offs_h, m_h)
    lse2 = tl.load(LSE + rows, mask=ok, other=0.0) * 1.4426950408889634
    delta = tl.load(DELTA + rows, mask=ok, other=0.0)
    return lse2, delta


@triton.jit
def _fwd_store(O, LSE, b64, t, Tq, g, m_i, l_i, acc, HQ: tl.constexpr, H: tl.constexpr, DV: tl.constexpr,
               offs_h, offs_v, m_h, m_v):
    """o = acc / l and lse (natural log; -inf and o = 0 where a row saw no key) of token t."""
    has = l_i > 0.0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, (m_i + tl.log2(tl.where(has, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
    rows, ok = _tok_rows(b64, t, Tq, g, HQ, H, offs_h, m_h)
    tl.store(O + rows[:, None] * DV + offs_v[None, :], o.to(O.dtype.element_ty), mask=ok[:, None] & m_v[None, :])
    tl.store(LSE + rows, lse, mask=ok)


@triton.jit
def _dq_store(DQ, b64, t, Tq, g, dq, scale, HQ: tl.constexpr, H: tl.constexpr, DK: tl.constexpr, offs_h, offs_k,
              m_h, m_k):
    rows, ok = _tok_rows(b64, t, Tq, g, HQ, H, offs_h, m_h)
    tl.store(DQ + rows[:, None] * DK + offs_k[None, :], (dq * scale).to(DQ.dtype.element_ty),
             mask=ok[:, None] & m_k[None, :])


@triton.jit
def _dkv_store(DK_OUT, DV_OUT, b, g, kpos, dk, dv, S, G: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
               offs_k, offs_v, m_s):
    """Final dk / dv rows of one key block (rows past S or the block are not written)."""
    rows = (b * S + kpos) * G + g
    tl.store(DK_OUT + rows[:, None] * DK + offs_k[None, :], dk.to(DK_OUT.dtype.element_ty),
             mask=m_s[:, None] & (offs_k < DK)[None, :])
    tl.store(DV_OUT + rows[:, None] * DV + offs_v[None, :], dv.to(DV_OUT.dtype.element_ty),
             mask=m_s[:, None] & (offs_v < DV)[None, :])


# ---- one token per program ---------------------------------------------------------------------

@triton.jit
def _fwd_kernel(
    Q, K, V, O, LSE, IDX, CNT,
    sqb, sqt, sqh, skb, skt, skg, svb, svt, svg,
    Tq, S, Q_OFF, qk_scale,
    G: tl.constexpr, H: tl.constexpr, N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    DK: tl.constexpr, DV: tl.constexpr,
    HP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr,
    IEEE: tl.constexpr, PRELOAD: tl.constexpr, NP: tl.constexpr,
):
    t = tl.program_id(0)
    b64, g, k_base, v_base, offs_h, offs_k, offs_v, offs_s, offs_n, m_h, m_k, m_v, q = _tile(
        Q, K, V, t, Tq, sqb, sqt, sqh, skb, skg, svb, svg, G, H, HP, BK, BV, BS, DK, DV, NP)
    row, cnt, idx_row = _tok_index(IDX, CNT, b64, t, Tq, g, G, N, offs_n, PRELOAD)
    pos = Q_OFF + t
    m_i = tl.full([HP], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([HP], dtype=tl.float32)
    acc = tl.zeros([HP, BV], dtype=tl.float32)
    for i in range(0, cnt):
        kpos = _block_id(IDX, row, N, i, idx_row, offs_n, PRELOAD) * BLOCK_SIZE + offs_s
        m_s = (offs_s < BLOCK_SIZE) & (kpos <= pos)  # keys past the query are neither loaded nor attended
        kb, vb = _kv_block(k_base, v_base, kpos, m_s, skt, svt, offs_k, offs_v, m_k, m_v)
        m_i, l_i, acc = _fwd_attend(q, kb, vb, m_i, l_i, acc, m_s, qk_scale, IEEE)
    _fwd_store(O, LSE, b64, t, Tq, g, m_i, l_i, acc, G * H, H, DV, offs_h, offs_v, m_h, m_v)


@triton.jit
def _bwd_pre_kernel(O, DO, DELTA, sdb, sdt, sdh, n_rows, Tq, HQ: tl.constexpr, DV: tl.constexpr,
                    BR: tl.constexpr, BV: tl.constexpr):
    """delta[r] = sum_d o[r, d] * do[r, d] over rows r = (b*Tq + t)*HQ + head (o contiguous)."""
    pid = tl.program_id(0)
    r = pid * BR + tl.arange(0, BR)
    offs_v = tl.arange(0, BV)
    m_r = r < n_rows
    m = m_r[:, None] & (offs_v < DV)[None, :]
    r64 = r.to(tl.int64)
    o = tl.load(O + r64[:, None] * DV + offs_v[None, :], mask=m, other=0.0).to(tl.float32)
    bt = r64 // HQ
    hd = r64 % HQ
    do_rows = (bt // Tq) * sdb + (bt % Tq) * sdt + hd * sdh
    do = tl.load(DO + do_rows[:, None] + offs_v[None, :], mask=m, other=0.0).to(tl.float32)
    tl.store(DELTA + r64, tl.sum(o * do, 1), mask=m_r)


@triton.jit
def _bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, DK32, DV32, IDX, CNT,
    sqb, sqt, sqh, skb, skt, skg, svb, svt, svg, sdb, sdt, sdh,
    Tq, S, Q_OFF, qk_scale, scale,
    G: tl.constexpr, H: tl.constexpr, N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    DK: tl.constexpr, DV: tl.constexpr,
    HP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr,
    IEEE: tl.constexpr, PRELOAD: tl.constexpr, NP: tl.constexpr, ATOMIC_DKV: tl.constexpr,
):
    """dq of one (token, group) over its selected blocks. ATOMIC_DKV (dkv_mode="atomic"): also adds
    the [BS, dk] / [BS, dv] contributions of every selected block to fp32 dk/dv buffers (DK32, DV32)."""
    t = tl.program_id(0)
    b64, g, k_base, v_base, offs_h, offs_k, offs_v, offs_s, offs_n, m_h, m_k, m_v, q = _tile(
        Q, K, V, t, Tq, sqb, sqt, sqh, skb, skg, svb, svg, G, H, HP, BK, BV, BS, DK, DV, NP)
    row, cnt, idx_row = _tok_index(IDX, CNT, b64, t, Tq, g, G, N, offs_n, PRELOAD)
    do = _tok_load(DO, b64, t, Tq, g, sdb, sdt, sdh, H, offs_h, offs_v, m_h, m_v)
    lse2, delta = _tok_stats(LSE, DELTA, b64, t, Tq, g, G * H, H, offs_h, m_h)
    pos = Q_OFF + t
    dq = tl.zeros([HP, BK], dtype=tl.float32)
    for i in range(0, cnt):
        kpos = _block_id(IDX, row, N, i, idx_row, offs_n, PRELOAD) * BLOCK_SIZE + offs_s
        m_s = (offs_s < BLOCK_SIZE) & (kpos <= pos)
        kb, vb = _kv_block(k_base, v_base, kpos, m_s, skt, svt, offs_k, offs_v, m_k, m_v)
        p, ds = _bwd_terms(q, do, lse2, delta, kb, vb, m_s, qk_scale, IEEE)
        dq += _dot(ds, kb, IEEE)
        if ATOMIC_DKV:
            rows = (b64 * S + kpos) * G + g
            tl.atomic_add(DK32 + rows[:, None] * DK + offs_k[None, :], _dot(tl.trans(ds), q, IEEE) * scale,
                          mask=m_s[:, None] & m_k[None, :], sem="relaxed")
            tl.atomic_add(DV32 + rows[:, None] * DV + offs_v[None, :], _dot(tl.trans(p), do, IEEE),
                          mask=m_s[:, None] & m_v[None, :], sem="relaxed")
    _dq_store(DQ, b64, t, Tq, g, dq, scale, G * H, H, DK, offs_h, offs_k, m_h, m_k)


@triton.jit
def _bwd_dkv_kernel(
    Q, K, V, DO, LSE, DELTA, DK_OUT, DV_OUT, WSK, WSV, DQ32,
    SEG_KEY, SEG_START, SEG_END, SEG_OUT, CSR_T,
    sqb, sqt, sqh, skb, skt, skg, svb, svt, svg, sdb, sdt, sdh,
    Tq, S, Q_OFF, NB, qk_scale, scale,
    G: tl.constexpr, H: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    DK: tl.constexpr, DV: tl.constexpr,
    HP: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr,
    ATOMIC_DQ: tl.constexpr, IEEE: tl.constexpr,
):
    pid = tl.program_id(0)
    key = tl.load(SEG_KEY + pid).to(tl.int64)  # (b*G + g)*NB + j
    start = tl.load(SEG_START + pid)
    end = tl.load(SEG_END + pid)
    out = tl.load(SEG_OUT + pid)
    j = key % NB
    bg = key // NB
    b = bg // G
    g = bg % G
    HQ: tl.constexpr = G * H
    R: tl.constexpr = BQ * HP

    offs_r = tl.arange(0, R)
    _, offs_k, offs_v, offs_s, _, m_k, m_v = _offsets(HP, BK, BV, BS, H, DK, DV)
    r_slot = offs_r // HP
    r_head = offs_r % HP
    m_head = r_head < H
    heads = g * H + r_head

    kpos = j * BLOCK_SIZE + offs_s
    m_s = (offs_s < BLOCK_SIZE) & (kpos < S)
    kb, vb = _kv_block(K + b * skb + g * skg, V + b * svb + g * svg, kpos, m_s, skt, svt, offs_k, offs_v, m_k, m_v)

    dk = tl.zeros([BS, BK], dtype=tl.float32)
    dv = tl.zeros([BS, BV], dtype=tl.float32)
    for c in range(start, end, BQ):
        qi = c + r_slot
        m_q = qi < end
        t = tl.load(CSR_T + qi, mask=m_q, other=0).to(tl.int64)
        m_r = m_q & m_head
        q = tl.load(Q + b * sqb + t[:, None] * sqt + heads[:, None] * sqh + offs_k[None, :],
                    mask=m_r[:, None] & m_k[None, :], other=0.0)
        do = tl.load(DO + b * sdb + t[:, None] * sdt + heads[:, None] * sdh + offs_v[None, :],
                     mask=m_r[:, None] & m_v[None, :], other=0.0)
        stat = (b * Tq + t) * HQ + heads
        lse2 = tl.load(LSE + stat, mask=m_r, other=0.0) * 1.4426950408889634
        delta = tl.load(DELTA + stat, mask=m_r, other=0.0)
        sT = _dot(kb, tl.trans(q), IEEE)
        dpT = _dot(vb, tl.trans(do), IEEE)
        live = m_s[:, None] & m_r[None, :] & (kpos[:, None] <= (Q_OFF + t)[None, :])
        pT = tl.where(live, tl.exp2(sT * qk_scale - lse2[None, :]), 0.0)
        dsT = pT * (dpT - delta[None, :])
        dv += _dot(pT, do, IEEE)
        dk += _dot(dsT, q, IEEE)
        if ATOMIC_DQ:
            dqp = _dot(tl.trans(dsT), kb, IEEE)
            tl.atomic_add(DQ32 + stat[:, None] * DK + offs_k[None, :], dqp * scale,
                          mask=m_r[:, None] & m_k[None, :], sem="relaxed")

    dk = dk * scale
    if out < 0:
        # the only segment of this block: write the final gradient rows directly
        _dkv_store(DK_OUT, DV_OUT, b, g, kpos, dk, dv, S, G, DK, DV, offs_k, offs_v, m_s)
    else:
        # one of several segments: an fp32 partial tile, summed in order by _bwd_dkv_reduce_kernel
        o64 = out.to(tl.int64)
        tl.store(WSK + (o64 * BS + offs_s)[:, None] * BK + offs_k[None, :], dk)
        tl.store(WSV + (o64 * BS + offs_s)[:, None] * BV + offs_v[None, :], dv)


@triton.jit
def _bwd_dkv_reduce_kernel(WSK, WSV, DK_OUT, DV_OUT, RED_KEY, RED_START, RED_END, S, NB,
                           G: tl.constexpr, BLOCK_SIZE: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                           BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr):
    pid = tl.program_id(0)
    key = tl.load(RED_KEY + pid).to(tl.int64)
    w0 = tl.load(RED_START + pid).to(tl.int64)
    w1 = tl.load(RED_END + pid).to(tl.int64)
    j = key % NB
    bg = key // NB
    b = bg // G
    g = bg % G
    offs_k = tl.arange(0, BK)
    offs_v = tl.arange(0, BV)
    offs_s = tl.arange(0, BS)
    dk = tl.zeros([BS, BK], dtype=tl.float32)
    dv = tl.zeros([BS, BV], dtype=tl.float32)
    for w in range(w0, w1):
        dk += tl.load(WSK + (w * BS + offs_s)[:, None] * BK + offs_k[None, :])
        dv += tl.load(WSV + (w * BS + offs_s)[:, None] * BV + offs_v[None, :])
    kpos = j * BLOCK_SIZE + offs_s
    m_s = (offs_s < BLOCK_SIZE) & (kpos < S)
    _dkv_store(DK_OUT, DV_OUT, b, g, kpos, dk, dv, S, G, DK, DV, offs_k, offs_v, m_s)


# ---- multi-token variants: QT consecutive tokens per program share the forced blocks -----------
#
# Every token t selects (per select_blocks) block 0 and its two local blocks c_t - 1, c_t
# (c_t = pos // BLOCK_SIZE); QT neighbours share them. A program takes QT tokens of one group:
# the candidates {0, cA - 1, cA, cB} (cA, cB: local block of the first / last token) are loaded
# once and applied to each token that selected them and for which they are forced; then each
# token streams its other ("private") blocks with the forced ones masked off (no memory
# traffic). The split is exact for any block_idx: token t handles j in {0, c_t-1, c_t} in the
# shared phase iff it selected j, every other selected j in its private loop.

@triton.jit
def _tok_sel(IDX, CNT, b64, t, Tq, g, G: tl.constexpr, N: tl.constexpr, offs_n):
    """(count, index row [NP] with -1 on dead slots) of token t; count 0 when t >= Tq."""
    tt = tl.minimum(t, Tq - 1).to(tl.int64)
    row = (b64 * Tq + tt) * G + g
    cnt = tl.where(t < Tq, tl.load(CNT + row), 0)
    idx = tl.load(IDX + row * N + offs_n, mask=offs_n < cnt, other=-1)
    return cnt, idx


@triton.jit
def _uses(idx, cnt, pos, j, ok, BLOCK_SIZE: tl.constexpr):
    """Token (idx row, pos) takes block j in the shared phase: j is forced for it and selected."""
    c = pos // BLOCK_SIZE
    forced = (j == 0) | (j == c) | (j == c - 1)
    return ok & forced & (tl.sum((idx == j).to(tl.int32)) > 0) & (cnt > 0)


@triton.jit
def _qt_span(t0, Tq, Q_OFF, QT: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """(cA, cB, p_max): local blocks of the program's first / last token, last token's position."""
    t_last = tl.minimum(t0 + QT - 1, Tq - 1)
    return (Q_OFF + t0) // BLOCK_SIZE, (Q_OFF + t_last) // BLOCK_SIZE, Q_OFF + t_last


@triton.jit
def _shared_uses(i0, n0, i1, n1, i2, n2, i3, n3, p0, j, ok, QT: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """Which of the program's tokens (positions p0 ..) take block j in the shared phase (QT = 2: u2 = u3 = False)."""
    u0 = _uses(i0, n0, p0, j, ok, BLOCK_SIZE)
    u1 = _uses(i1, n1, p0 + 1, j, ok, BLOCK_SIZE)
    u2 = _uses(i2, n2, p0 + 2, j, ok, BLOCK_SIZE) & (QT >= 4)
    u3 = _uses(i3, n3, p0 + 3, j, ok, BLOCK_SIZE) & (QT >= 4)
    return u0, u1, u2, u3


@triton.jit
def _candidate(ci: tl.constexpr, cA, cB):
    """Shared-phase candidate ci (block 0, cA - 1, cA, cB; each taken at most once) and whether it exists."""
    if ci == 0:
        j = cA * 0
        ok = cA >= 0
    elif ci == 1:
        j = cA - 1
        ok = cA >= 2
    elif ci == 2:
        j = cA
        ok = cA >= 1
    else:
        j = cB
        ok = cB > cA
    return j, ok


@triton.jit
def _shared_block(j, p_max, k_base, v_base, skt, svt, offs_s, offs_k, offs_v, m_k, m_v, BLOCK_SIZE: tl.constexpr):
    """Key positions of shared block j, their in-range mask (up to the program's last token), K and V."""
    kpos = j.to(tl.int64) * BLOCK_SIZE + offs_s
    kin = (offs_s < BLOCK_SIZE) & (kpos <= p_max)
    kb, vb = _kv_block(k_base, v_base, kpos, kin, skt, svt, offs_k, offs_v, m_k, m_v)
    return kpos, kin, kb, vb


@triton.jit
def _private_block(idx, offs_n, i, pos, offs_s, BLOCK_SIZE: tl.constexpr):
    """Key positions of the token's i-th block and the keys it attends in the private phase
    (causal; the forced blocks 0, c-1, c were done in the shared phase)."""
    c = pos // BLOCK_SIZE
    kpos = _nth(idx, offs_n, i) * BLOCK_SIZE + offs_s
    jv = kpos // BLOCK_SIZE  # j as a vector (the interpreter rejects scalar-bool masks)
    keep = (offs_s < BLOCK_SIZE) & (kpos <= pos) & (jv != 0) & (jv != c) & (jv != c - 1)
    return kpos, keep


@triton.jit
def _qt_token(Q, DO, LSE, DELTA, IDX, CNT, b64, t, Tq, g, sqb, sqt, sqh, sdb, sdt, sdh, offs_h, offs_k, offs_v, offs_n,
              m_h, m_k, m_v, G: tl.constexpr, H: tl.constexpr, N: tl.constexpr, HP: tl.constexpr, BK: tl.constexpr,
              BV: tl.constexpr, BWD: tl.constexpr):
    """State of token t: q and its selection (count, index row); BWD: do, lse2, delta and dq = 0;
    forward: m = -inf, l = 0, acc = 0. Slots a mode does not use hold placeholders."""
    q = _tok_load(Q, b64, t, Tq, g, sqb, sqt, sqh, H, offs_h, offs_k, m_h, m_k)
    n, idx = _tok_sel(IDX, CNT, b64, t, Tq, g, G, N, offs_n)
    m = tl.full([HP], -1.0e30, dtype=tl.float32)
    l_ = tl.zeros([HP], dtype=tl.float32)
    if BWD:
        do = _tok_load(DO, b64, t, Tq, g, sdb, sdt, sdh, H, offs_h, offs_v, m_h, m_v)
        lse2, delta = _tok_stats(LSE, DELTA, b64, t, Tq, g, G * H, H, offs_h, m_h)
        acc = tl.zeros([HP, BK], dtype=tl.float32)
    else:
        do = q
        lse2 = m
        delta = l_
        acc = tl.zeros([HP, BV], dtype=tl.float32)
    return q, do, lse2, delta, n, idx, m, l_, acc


@triton.jit
def _qt_attend(q, do, lse2, delta, m, l_, acc, kb, vb, keep, qk_scale, IEEE: tl.constexpr, BWD: tl.constexpr):
    """One key block for one token: dq += ds @ k (BWD) or the online-softmax step (forward)."""
    if BWD:
        acc = _dq_attend(q, do, lse2, delta, kb, vb, acc, keep, qk_scale, IEEE)
    else:
        m, l_, acc = _fwd_attend(q, kb, vb, m, l_, acc, keep, qk_scale, IEEE)
    return m, l_, acc


@triton.jit
def _qt_finish(O, LSE, DQ, b64, t, pos, Tq, g, q, do, lse2, delta, m, l_, acc, idx, cnt, k_base, v_base, skt, svt,
               offs_h, offs_n, offs_s, offs_k, offs_v, m_h, m_k, m_v, qk_scale, scale, H: tl.constexpr,
               HQ: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BLOCK_SIZE: tl.constexpr, IEEE: tl.constexpr,
               BWD: tl.constexpr):
    """Token t's private phase (its other selected blocks; the forced ones masked off), then its store."""
    for i in range(0, cnt):
        kpos, keep = _private_block(idx, offs_n, i, pos, offs_s, BLOCK_SIZE)
        kb, vb = _kv_block(k_base, v_base, kpos, keep, skt, svt, offs_k, offs_v, m_k, m_v)
        m, l_, acc = _qt_attend(q, do, lse2, delta, m, l_, acc, kb, vb, keep, qk_scale, IEEE, BWD)
    if BWD:
        _dq_store(DQ, b64, t, Tq, g, acc, scale, HQ, H, DK, offs_h, offs_k, m_h, m_k)
    else:
        _fwd_store(O, LSE, b64, t, Tq, g, m, l_, acc, HQ, H, DV, offs_h, offs_v, m_h, m_v)


@triton.jit
def _qt_kernel(
    Q, K, V, O, LSE, DO, DELTA, DQ, IDX, CNT,
    sqb, sqt, sqh, skb, skt, skg, svb, svt, svg, sdb, sdt, sdh,
    Tq, S, Q_OFF, qk_scale, scale,
    G: tl.constexpr, H: tl.constexpr, N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    DK: tl.constexpr, DV: tl.constexpr,
    HP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr,
    IEEE: tl.constexpr, NP: tl.constexpr, QT: tl.constexpr, BWD: tl.constexpr,
):
    """QT (2 or 4) consecutive tokens of one group per program: the forward (o, lse) or, with BWD,
    dq. Pointers a mode does not use (forward: DO, DELTA, DQ; BWD: O) are never dereferenced."""
    t0 = tl.program_id(0) * QT
    HQ: tl.constexpr = G * H
    b64, g, k_base, v_base, offs_h, offs_k, offs_v, offs_s, offs_n, m_h, m_k, m_v, _ = _tile(
        Q, K, V, t0, Tq, sqb, sqt, sqh, skb, skg, svb, svg, G, H, HP, BK, BV, BS, DK, DV, NP)
    cA, cB, p_max = _qt_span(t0, Tq, Q_OFF, QT, BLOCK_SIZE)
    q0, o0, s0, d0, n0, i0, m0, l0, a0 = _qt_token(Q, DO, LSE, DELTA, IDX, CNT, b64, t0, Tq, g, sqb, sqt, sqh, sdb,
                                                   sdt, sdh, offs_h, offs_k, offs_v, offs_n, m_h, m_k, m_v, G, H, N,
                                                   HP, BK, BV, BWD)
    q1, o1, s1, d1, n1, i1, m1, l1, a1 = _qt_token(Q, DO, LSE, DELTA, IDX, CNT, b64, t0 + 1, Tq, g, sqb, sqt, sqh,
                                                   sdb, sdt, sdh, offs_h, offs_k, offs_v, offs_n, m_h, m_k, m_v, G, H,
                                                   N, HP, BK, BV, BWD)
    if QT >= 4:
        q2, o2, s2, d2, n2, i2, m2, l2, a2 = _qt_token(Q, DO, LSE, DELTA, IDX, CNT, b64, t0 + 2, Tq, g, sqb, sqt,
                                                       sqh, sdb, sdt, sdh, offs_h, offs_k, offs_v, offs_n, m_h, m_k,
                                                       m_v, G, H, N, HP, BK, BV, BWD)
        q3, o3, s3, d3, n3, i3, m3, l3, a3 = _qt_token(Q, DO, LSE, DELTA, IDX, CNT, b64, t0 + 3, Tq, g, sqb, sqt,
                                                       sqh, sdb, sdt, sdh, offs_h, offs_k, offs_v, offs_n, m_h, m_k,
                                                       m_v, G, H, N, HP, BK, BV, BWD)
    else:
        n2, i2, n3, i3 = n1, i1, n1, i1  # never taken: _shared_uses masks tokens >= QT

    # shared phase: each candidate block is loaded once and applied to every token that takes it
    for ci in tl.static_range(4):
        j, ok = _candidate(ci, cA, cB)
        u0, u1, u2, u3 = _shared_uses(i0, n0, i1, n1, i2, n2, i3, n3, Q_OFF + t0, j, ok, QT, BLOCK_SIZE)
        if u0 | u1 | u2 | u3:
            kpos, kin, kb, vb = _shared_block(j, p_max, k_base, v_base, skt, svt, offs_s, offs_k, offs_v, m_k, m_v,
                                              BLOCK_SIZE)
            if u0:
                m0, l0, a0 = _qt_attend(q0, o0, s0, d0, m0, l0, a0, kb, vb, kin & (kpos <= Q_OFF + t0), qk_scale,
                                        IEEE, BWD)
            if u1:
                m1, l1, a1 = _qt_attend(q1, o1, s1, d1, m1, l1, a1, kb, vb, kin & (kpos <= Q_OFF + t0 + 1), qk_scale,
                                        IEEE, BWD)
            if QT >= 4:
                if u2:
                    m2, l2, a2 = _qt_attend(q2, o2, s2, d2, m2, l2, a2, kb, vb, kin & (kpos <= Q_OFF + t0 + 2),
                                            qk_scale, IEEE, BWD)
                if u3:
                    m3, l3, a3 = _qt_attend(q3, o3, s3, d3, m3, l3, a3, kb, vb, kin & (kpos <= Q_OFF + t0 + 3),
                                            qk_scale, IEEE, BWD)

    # private phase and store, token by token
    _qt_finish(O, LSE, DQ, b64, t0, Q_OFF + t0, Tq, g, q0, o0, s0, d0, m0, l0, a0, i0, n0, k_base, v_base, skt, svt,
               offs_h, offs_n, offs_s, offs_k, offs_v, m_h, m_k, m_v, qk_scale, scale, H, HQ, DK, DV, BLOCK_SIZE,
               IEEE, BWD)
    _qt_finish(O, LSE, DQ, b64, t0 + 1, Q_OFF + t0 + 1, Tq, g, q1, o1, s1, d1, m1, l1, a1, i1, n1, k_base, v_base,
               skt, svt, offs_h, offs_n, offs_s, offs_k, offs_v, m_h, m_k, m_v, qk_scale, scale, H, HQ, DK, DV,
               BLOCK_SIZE, IEEE, BWD)
    if QT >= 4:
        _qt_finish(O, LSE, DQ, b64, t0 + 2, Q_OFF + t0 + 2, Tq, g, q2, o2, s2, d2, m2, l2, a2, i2, n2, k_base, v_base,
                   skt, svt, offs_h, offs_n, offs_s, offs_k, offs_v, m_h, m_k, m_v, qk_scale, scale, H, HQ, DK, DV,
                   BLOCK_SIZE, IEEE, BWD)
        _qt_finish(O, LSE, DQ, b64, t0 + 3, Q_OFF + t0 + 3, Tq, g, q3, o3, s3, d3, m3, l3, a3, i3, n3, k_base, v_base,
                   skt, svt, offs_h, offs_n, offs_s, offs_k, offs_v, m_h, m_k, m_v, qk_scale, scale, H, HQ, DK, DV,
                   BLOCK_SIZE, IEEE, BWD)
