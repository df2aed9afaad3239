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
  _bwd_atomic_kernel  the atomics alternative: one program per (token, group) computes dq and
                    adds its dk/dv contributions to fp32 buffers with atomics.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


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
    bg = tl.program_id(1)
    b = bg // G
    g = bg % G
    HQ: tl.constexpr = G * H
    pos = Q_OFF + t

    offs_h = tl.arange(0, HP)
    offs_k = tl.arange(0, BK)
    offs_v = tl.arange(0, BV)
    offs_s = tl.arange(0, BS)
    m_h = offs_h < H
    m_k = offs_k < DK
    m_v = offs_v < DV

    t64 = t.to(tl.int64)
    b64 = b.to(tl.int64)
    q_ptrs = Q + b64 * sqb + t64 * sqt + (g * H + offs_h)[:, None] * sqh + offs_k[None, :]
    q = tl.load(q_ptrs, mask=m_h[:, None] & m_k[None, :], other=0.0)

    row = (b64 * Tq + t64) * G + g
    cnt = tl.load(CNT + row)
    k_base = K + b64 * skb + g * skg
    v_base = V + b64 * svb + g * svg

    m_i = tl.full([HP], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([HP], dtype=tl.float32)
    acc = tl.zeros([HP, BV], dtype=tl.float32)
    if PRELOAD:  # the whole index row up front: no load in the loop's address chain
        offs_n = tl.arange(0, NP)
        idx_row = tl.load(IDX + row * N + offs_n, mask=offs_n < cnt, other=0)
    for i in range(0, cnt):
        if PRELOAD:
            j = tl.sum(tl.where(offs_n == i, idx_row, 0)).to(tl.int64)
        else:
            j = tl.load(IDX + row * N + i).to(tl.int64)
        kpos = j * BLOCK_SIZE + offs_s
        # keys past the query (and past the block) are neither loaded nor attended
        m_s = (offs_s < BLOCK_SIZE) & (kpos <= pos)
        kb = tl.load(k_base + kpos[:, None] * skt + offs_k[None, :], mask=m_s[:, None] & m_k[None, :], other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(kb), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(kb))
        s = tl.where(m_s[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        vb = tl.load(v_base + kpos[:, None] * svt + offs_v[None, :], mask=m_s[:, None] & m_v[None, :], other=0.0)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, vb, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb)
        m_i = m_new

    has = l_i > 0.0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, (m_i + tl.log2(tl.where(has, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
    o_rows = (b64 * Tq + t64) * HQ + g * H + offs_h
    tl.store(O + o_rows[:, None] * DV + offs_v[None, :], o.to(O.dtype.element_ty), mask=m_h[:, None] & m_v[None, :])
    tl.store(LSE + o_rows, lse, mask=m_h)


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
    Q, K, V, DO, LSE, DELTA, DQ, IDX, CNT,
    sqb, sqt, sqh, skb, skt, skg, svb, svt, svg, sdb, sdt, sdh,
    Tq, S, Q_OFF, qk_scale, scale,
    G: tl.constexpr, H: tl.constexpr, N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    DK: tl.constexpr, DV: tl.constexpr,
    HP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr,
    IEEE: tl.constexpr, PRELOAD: tl.constexpr, NP: tl.constexpr,
):
    t = tl.program_id(0)
    bg = tl.program_id(1)
    b = bg // G
    g = bg % G
    HQ: tl.constexpr = G * H
    pos = Q_OFF + t

    offs_h = tl.arange(0, HP)
    offs_k = tl.arange(0, BK)
    offs_v = tl.arange(0, BV)
    offs_s = tl.arange(0, BS)
    m_h = offs_h < H
    m_k = offs_k < DK
    m_v = offs_v < DV

    t64 = t.to(tl.int64)
    b64 = b.to(tl.int64)
    heads = g * H + offs_h
    q = tl.load(Q + b64 * sqb + t64 * sqt + heads[:, None] * sqh + offs_k[None, :],
                mask=m_h[:, None] & m_k[None, :], other=0.0)
    do = tl.load(DO + b64 * sdb + t64 * sdt + heads[:, None] * sdh + offs_v[None, :],
                 mask=m_h[:, None] & m_v[None, :], other=0.0)
    stat_rows = (b64 * Tq + t64) * HQ + heads
    lse2 = tl.load(LSE + stat_rows, mask=m_h, other=0.0) * 1.4426950408889634
    delta = tl.load(DELTA + stat_rows, mask=m_h, other=0.0)

    row = (b64 * Tq + t64) * G + g
    cnt = tl.load(CNT + row)
    k_base = K + b64 * skb + g * skg
    v_base = V + b64 * svb + g * svg

    dq = tl.zeros([HP, BK], dtype=tl.float32)
    if PRELOAD:  # the whole index row up front: no load in the loop's address chain
        offs_n = tl.arange(0, NP)
        idx_row = tl.load(IDX + row * N + offs_n, mask=offs_n < cnt, other=0)
    for i in range(0, cnt):
        if PRELOAD:
            j = tl.sum(tl.where(offs_n == i, idx_row, 0)).to(tl.int64)
        else:
            j = tl.load(IDX + row * N + i).to(tl.int64)
        kpos = j * BLOCK_SIZE + offs_s
        m_s = (offs_s < BLOCK_SIZE) & (kpos <= pos)
        kb = tl.load(k_base + kpos[:, None] * skt + offs_k[None, :], mask=m_s[:, None] & m_k[None, :], other=0.0)
        vb = tl.load(v_base + kpos[:, None] * svt + offs_v[None, :], mask=m_s[:, None] & m_v[None, :], other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(kb), input_precision="ieee")
            dp = tl.dot(do, tl.trans(vb), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(kb))
            dp = tl.dot(do, tl.trans(vb))
        p = tl.where(m_s[None, :] & m_h[:, None], tl.exp2(s * qk_scale - lse2[:, None]), 0.0)
        ds = p * (dp - delta[:, None])
        if IEEE:
            dq += tl.dot(ds, kb, input_precision="ieee")
        else:
            dq += tl.dot(ds.to(kb.dtype), kb)

    dq = dq * scale
    tl.store(DQ + stat_rows[:, None] * DK + offs_k[None, :], dq.to(DQ.dtype.element_ty),
             mask=m_h[:, None] & m_k[None, :])


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

    offs_k = tl.arange(0, BK)
    offs_v = tl.arange(0, BV)
    offs_s = tl.arange(0, BS)
    offs_r = tl.arange(0, R)
    m_k = offs_k < DK
    m_v = offs_v < DV
    r_slot = offs_r // HP
    r_head = offs_r % HP
    m_head = r_head < H
    heads = g * H + r_head

    kpos = j * BLOCK_SIZE + offs_s
    m_s = (offs_s < BLOCK_SIZE) & (kpos < S)
    kb = tl.load(K + b * skb + g * skg + kpos[:, None] * skt + offs_k[None, :],
                 mask=m_s[:, None] & m_k[None, :], other=0.0)
    vb = tl.load(V + b * svb + g * svg + kpos[:, None] * svt + offs_v[None, :],
                 mask=m_s[:, None] & m_v[None, :], other=0.0)

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
        if IEEE:
            sT = tl.dot(kb, tl.trans(q), input_precision="ieee")
            dpT = tl.dot(vb, tl.trans(do), input_precision="ieee")
        else:
            sT = tl.dot(kb, tl.trans(q))
            dpT = tl.dot(vb, tl.trans(do))
        live = m_s[:, None] & m_r[None, :] & (kpos[:, None] <= (Q_OFF + t)[None, :])
        pT = tl.where(live, tl.exp2(sT * qk_scale - lse2[None, :]), 0.0)
        dsT = pT * (dpT - delta[None, :])
        if IEEE:
            dv += tl.dot(pT, do, input_precision="ieee")
            dk += tl.dot(dsT, q, input_precision="ieee")
        else:
            dv += tl.dot(pT.to(do.dtype), do)
            dk += tl.dot(dsT.to(q.dtype), q)
        if ATOMIC_DQ:
            if IEEE:
                dqp = tl.dot(tl.trans(dsT), kb, input_precision="ieee")
            else:
                dqp = tl.dot(tl.trans(dsT.to(kb.dtype)), kb)
            tl.atomic_add(DQ32 + stat[:, None] * DK + offs_k[None, :], dqp * scale,
                          mask=m_r[:, None] & m_k[None, :], sem="relaxed")

    dk = dk * scale
    if out < 0:
        # the only segment of this block: write the final gradient rows directly
        rows = (b * S + kpos) * G + g
        tl.store(DK_OUT + rows[:, None] * DK + offs_k[None, :], dk.to(DK_OUT.dtype.element_ty),
                 mask=m_s[:, None] & m_k[None, :])
        tl.store(DV_OUT + rows[:, None] * DV + offs_v[None, :], dv.to(DV_OUT.dtype.element_ty),
                 mask=m_s[:, None] & m_v[None, :])
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
    rows = (b * S + kpos) * G + g
    tl.store(DK_OUT + rows[:, None] * DK + offs_k[None, :], dk.to(DK_OUT.dtype.element_ty),
             mask=m_s[:, None] & (offs_k < DK)[None, :])
    tl.store(DV_OUT + rows[:, None] * DV + offs_v[None, :], dv.to(DV_OUT.dtype.element_ty),
             mask=m_s[:, None] & (offs_v < DV)[None, :])


@triton.jit
def _bwd_atomic_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, DK32, DV32, IDX, CNT,
    sqb, sqt, sqh, skb, skt, skg, svb, svt, svg, sdb, sdt, sdh,
    Tq, S, Q_OFF, qk_scale, scale,
    G: tl.constexpr, H: tl.constexpr, N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    DK: tl.constexpr, DV: tl.constexpr,
    HP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr,
    IEEE: tl.constexpr, PRELOAD: tl.constexpr, NP: tl.constexpr,
):
    """The atomics design, kept for measurement: dq as in _bwd_dq_kernel, and each (token, group)
    adds its [BS, dk] / [BS, dv] contributions of every selected block to fp32 dk/dv buffers."""
    t = tl.program_id(0)
    bg = tl.program_id(1)
    b = bg // G
    g = bg % G
    HQ: tl.constexpr = G * H
    pos = Q_OFF + t

    offs_h = tl.arange(0, HP)
    offs_k = tl.arange(0, BK)
    offs_v = tl.arange(0, BV)
    offs_s = tl.arange(0, BS)
    m_h = offs_h < H
    m_k = offs_k < DK
    m_v = offs_v < DV

    t64 = t.to(tl.int64)
    b64 = b.to(tl.int64)
    heads = g * H + offs_h
    q = tl.load(Q + b64 * sqb + t64 * sqt + heads[:, None] * sqh + offs_k[None, :],
                mask=m_h[:, None] & m_k[None, :], other=0.0)
    do = tl.load(DO + b64 * sdb + t64 * sdt + heads[:, None] * sdh + offs_v[None, :],
                 mask=m_h[:, None] & m_v[None, :], other=0.0)
    stat_rows = (b64 * Tq + t64) * HQ + heads
    lse2 = tl.load(LSE + stat_rows, mask=m_h, other=0.0) * 1.4426950408889634
    delta = tl.load(DELTA + stat_rows, mask=m_h, other=0.0)

    row = (b64 * Tq + t64) * G + g
    cnt = tl.load(CNT + row)
    k_base = K + b64 * skb + g * skg
    v_base = V + b64 * svb + g * svg

    dq = tl.zeros([HP, BK], dtype=tl.float32)
    if PRELOAD:  # the whole index row up front: no load in the loop's address chain
        offs_n = tl.arange(0, NP)
        idx_row = tl.load(IDX + row * N + offs_n, mask=offs_n < cnt, other=0)
    for i in range(0, cnt):
        if PRELOAD:
            j = tl.sum(tl.where(offs_n == i, idx_row, 0)).to(tl.int64)
        else:
            j = tl.load(IDX + row * N + i).to(tl.int64)
        kpos = j * BLOCK_SIZE + offs_s
        m_s = (offs_s < BLOCK_SIZE) & (kpos <= pos)
        kb = tl.load(k_base + kpos[:, None] * skt + offs_k[None, :], mask=m_s[:, None] & m_k[None, :], other=0.0)
        vb = tl.load(v_base + kpos[:, None] * svt + offs_v[None, :], mask=m_s[:, None] & m_v[None, :], other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(kb), input_precision="ieee")
            dp = tl.dot(do, tl.trans(vb), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(kb))
            dp = tl.dot(do, tl.trans(vb))
        p = tl.where(m_s[None, :] & m_h[:, None], tl.exp2(s * qk_scale - lse2[:, None]), 0.0)
        ds = p * (dp - delta[:, None])
        if IEEE:
            dq += tl.dot(ds, kb, input_precision="ieee")
            dkp = tl.dot(tl.trans(ds), q, input_precision="ieee")
            dvp = tl.dot(tl.trans(p), do, input_precision="ieee")
        else:
            dq += tl.dot(ds.to(kb.dtype), kb)
            dkp = tl.dot(tl.trans(ds.to(q.dtype)), q)
            dvp = tl.dot(tl.trans(p.to(do.dtype)), do)
        rows = (b64 * S + kpos) * G + g
        tl.atomic_add(DK32 + rows[:, None] * DK + offs_k[None, :], dkp * scale,
                      mask=m_s[:, None] & m_k[None, :], sem="relaxed")
        tl.atomic_add(DV32 + rows[:, None] * DV + offs_v[None, :], dvp,
                      mask=m_s[:, None] & m_v[None, :], sem="relaxed")

    dq = dq * scale
    tl.store(DQ + stat_rows[:, None] * DK + offs_k[None, :], dq.to(DQ.dtype.element_ty),
             mask=m_h[:, None] & m_k[None, :])


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
def _tok_load(X, b64, t, Tq, g, sxb, sxt, sxh, H: tl.constexpr, offs_h, offs_d, m_h, m_d):
    """The group's h rows of token t ([HP, BD]); zeros when t >= Tq."""
    tt = tl.minimum(t, Tq - 1).to(tl.int64)
    ptr = X + b64 * sxb + tt * sxt + (g * H + offs_h)[:, None] * sxh + offs_d[None, :]
    ok = m_h & ((offs_h * 0 + t) < Tq)  # vector compare: the interpreter rejects scalar-bool masks
    return tl.load(ptr, mask=ok[:, None] & m_d[None, :], other=0.0)


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
def _fwd_attend(q, kb, vb, m_i, l_i, acc, keep, qk_scale, IEEE: tl.constexpr):
    if IEEE:
        s = tl.dot(q, tl.trans(kb), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(kb))
    s = tl.where(keep[None, :], s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p, vb, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb)
    return m_new, l_i, acc


@triton.jit
def _fwd_private(q, m_i, l_i, acc, idx, cnt, pos, k_base, v_base, skt, svt, offs_n, offs_s, offs_k, offs_v,
                 m_k, m_v, qk_scale, BLOCK_SIZE: tl.constexpr, IEEE: tl.constexpr):
    c = pos // BLOCK_SIZE
    for i in range(0, cnt):
        j = tl.sum(tl.where(offs_n == i, idx, 0)).to(tl.int64)
        kpos = j * BLOCK_SIZE + offs_s
        jv = kpos // BLOCK_SIZE  # j as a vector (the interpreter rejects scalar-bool masks)
        keep = (offs_s < BLOCK_SIZE) & (kpos <= pos) & (jv != 0) & (jv != c) & (jv != c - 1)
        kb = tl.load(k_base + kpos[:, None] * skt + offs_k[None, :], mask=keep[:, None] & m_k[None, :], other=0.0)
        vb = tl.load(v_base + kpos[:, None] * svt + offs_v[None, :], mask=keep[:, None] & m_v[None, :], other=0.0)
        m_i, l_i, acc = _fwd_attend(q, kb, vb, m_i, l_i, acc, keep, qk_scale, IEEE)
    return m_i, l_i, acc


@triton.jit
def _fwd_store(O, LSE, b64, t, Tq, g, m_i, l_i, acc, HQ: tl.constexpr, H: tl.constexpr, DV: tl.constexpr,
               offs_h, offs_v, m_h, m_v):
    has = l_i > 0.0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(has, (m_i + tl.log2(tl.where(has, l_i, 1.0))) * 0.6931471805599453, float("-inf"))
    tt = tl.minimum(t, Tq - 1).to(tl.int64)
    rows = (b64 * Tq + tt) * HQ + g * H + offs_h
    ok = m_h & ((offs_h * 0 + t) < Tq)
    tl.store(O + rows[:, None] * DV + offs_v[None, :], o.to(O.dtype.element_ty), mask=ok[:, None] & m_v[None, :])
    tl.store(LSE + rows, lse, mask=ok)


@triton.jit
def _fwd_qt_kernel(
    Q, K, V, O, LSE, IDX, CNT,
    sqb, sqt, sqh, skb, skt, skg, svb, svt, svg,
    Tq, S, Q_OFF, qk_scale,
    G: tl.constexpr, H: tl.constexpr, N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    DK: tl.constexpr, DV: tl.constexpr,
    HP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr,
    IEEE: tl.constexpr, NP: tl.constexpr, QT: tl.constexpr,
):
    t0 = tl.program_id(0) * QT
    bg = tl.program_id(1)
    b64 = (bg // G).to(tl.int64)
    g = bg % G
    HQ: tl.constexpr = G * H
    offs_h = tl.arange(0, HP)
    offs_k = tl.arange(0, BK)
    offs_v = tl.arange(0, BV)
    offs_s = tl.arange(0, BS)
    offs_n = tl.arange(0, NP)
    m_h = offs_h < H
    m_k = offs_k < DK
    m_v = offs_v < DV
    k_base = K + b64 * skb + g * skg
    v_base = V + b64 * svb + g * svg
    t_last = tl.minimum(t0 + QT - 1, Tq - 1)
    cA = (Q_OFF + t0) // BLOCK_SIZE
    cB = (Q_OFF + t_last) // BLOCK_SIZE
    p_max = Q_OFF + t_last

    q0 = _tok_load(Q, b64, t0, Tq, g, sqb, sqt, sqh, H, offs_h, offs_k, m_h, m_k)
    n0, i0 = _tok_sel(IDX, CNT, b64, t0, Tq, g, G, N, offs_n)
    m0 = tl.full([HP], -1.0e30, dtype=tl.float32)
    l0 = tl.zeros([HP], dtype=tl.float32)
    a0 = tl.zeros([HP, BV], dtype=tl.float32)
    if QT >= 2:
        q1 = _tok_load(Q, b64, t0 + 1, Tq, g, sqb, sqt, sqh, H, offs_h, offs_k, m_h, m_k)
        n1, i1 = _tok_sel(IDX, CNT, b64, t0 + 1, Tq, g, G, N, offs_n)
        m1 = tl.full([HP], -1.0e30, dtype=tl.float32)
        l1 = tl.zeros([HP], dtype=tl.float32)
        a1 = tl.zeros([HP, BV], dtype=tl.float32)
    if QT >= 4:
        q2 = _tok_load(Q, b64, t0 + 2, Tq, g, sqb, sqt, sqh, H, offs_h, offs_k, m_h, m_k)
        n2, i2 = _tok_sel(IDX, CNT, b64, t0 + 2, Tq, g, G, N, offs_n)
        m2 = tl.full([HP], -1.0e30, dtype=tl.float32)
        l2 = tl.zeros([HP], dtype=tl.float32)
        a2 = tl.zeros([HP, BV], dtype=tl.float32)
        q3 = _tok_load(Q, b64, t0 + 3, Tq, g, sqb, sqt, sqh, H, offs_h, offs_k, m_h, m_k)
        n3, i3 = _tok_sel(IDX, CNT, b64, t0 + 3, Tq, g, G, N, offs_n)
        m3 = tl.full([HP], -1.0e30, dtype=tl.float32)
        l3 = tl.zeros([HP], dtype=tl.float32)
        a3 = tl.zeros([HP, BV], dtype=tl.float32)

    # shared phase: candidates 0, cA - 1, cA, cB (each at most once)
    for ci in tl.static_range(4):
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
        u0 = _uses(i0, n0, Q_OFF + t0, j, ok, BLOCK_SIZE)
        any_use = u0
        if QT >= 2:
            u1 = _uses(i1, n1, Q_OFF + t0 + 1, j, ok, BLOCK_SIZE)
            any_use = any_use | u1
        if QT >= 4:
            u2 = _uses(i2, n2, Q_OFF + t0 + 2, j, ok, BLOCK_SIZE)
            u3 = _uses(i3, n3, Q_OFF + t0 + 3, j, ok, BLOCK_SIZE)
            any_use = any_use | u2 | u3
        if any_use:
            kpos = j.to(tl.int64) * BLOCK_SIZE + offs_s
            kin = (offs_s < BLOCK_SIZE) & (kpos <= p_max)
            kb = tl.load(k_base + kpos[:, None] * skt + offs_k[None, :], mask=kin[:, None] & m_k[None, :], other=0.0)
            vb = tl.load(v_base + kpos[:, None] * svt + offs_v[None, :], mask=kin[:, None] & m_v[None, :], other=0.0)
            if u0:
                m0, l0, a0 = _fwd_attend(q0, kb, vb, m0, l0, a0, kin & (kpos <= Q_OFF + t0), qk_scale, IEEE)
            if QT >= 2:
                if u1:
                    m1, l1, a1 = _fwd_attend(q1, kb, vb, m1, l1, a1, kin & (kpos <= Q_OFF + t0 + 1), qk_scale, IEEE)
            if QT >= 4:
                if u2:
                    m2, l2, a2 = _fwd_attend(q2, kb, vb, m2, l2, a2, kin & (kpos <= Q_OFF + t0 + 2), qk_scale, IEEE)
                if u3:
                    m3, l3, a3 = _fwd_attend(q3, kb, vb, m3, l3, a3, kin & (kpos <= Q_OFF + t0 + 3), qk_scale, IEEE)

    # private phase, token by token; then store
    m0, l0, a0 = _fwd_private(q0, m0, l0, a0, i0, n0, Q_OFF + t0, k_base, v_base, skt, svt, offs_n, offs_s, offs_k,
                              offs_v, m_k, m_v, qk_scale, BLOCK_SIZE, IEEE)
    _fwd_store(O, LSE, b64, t0, Tq, g, m0, l0, a0, HQ, H, DV, offs_h, offs_v, m_h, m_v)
    if QT >= 2:
        m1, l1, a1 = _fwd_private(q1, m1, l1, a1, i1, n1, Q_OFF + t0 + 1, k_base, v_base, skt, svt, offs_n, offs_s,
                                  offs_k, offs_v, m_k, m_v, qk_scale, BLOCK_SIZE, IEEE)
        _fwd_store(O, LSE, b64, t0 + 1, Tq, g, m1, l1, a1, HQ, H, DV, offs_h, offs_v, m_h, m_v)
    if QT >= 4:
        m2, l2, a2 = _fwd_private(q2, m2, l2, a2, i2, n2, Q_OFF + t0 + 2, k_base, v_base, skt, svt, offs_n, offs_s,
                                  offs_k, offs_v, m_k, m_v, qk_scale, BLOCK_SIZE, IEEE)
        _fwd_store(O, LSE, b64, t0 + 2, Tq, g, m2, l2, a2, HQ, H, DV, offs_h, offs_v, m_h, m_v)
        m3, l3, a3 = _fwd_private(q3, m3, l3, a3, i3, n3, Q_OFF + t0 + 3, k_base, v_base, skt, svt, offs_n, offs_s,
                                  offs_k, offs_v, m_k, m_v, qk_scale, BLOCK_SIZE, IEEE)
        _fwd_store(O, LSE, b64, t0 + 3, Tq, g, m3, l3, a3, HQ, H, DV, offs_h, offs_v, m_h, m_v)


@triton.jit
def _tok_stats(LSE, DELTA, b64, t, Tq, g, HQ: tl.constexpr, H: tl.constexpr, offs_h, m_h):
    tt = tl.minimum(t, Tq - 1).to(tl.int64)
    rows = (b64 * Tq + tt) * HQ + g * H + offs_h
    ok = m_h & ((offs_h * 0 + t) < Tq)
    lse2 = tl.load(LSE + rows, mask=ok, other=0.0) * 1.4426950408889634
    delta = tl.load(DELTA + rows, mask=ok, other=0.0)
    return lse2, delta


@triton.jit
def _dq_attend(q, do, lse2, delta, kb, vb, dq, keep, qk_scale, IEEE: tl.constexpr):
    if IEEE:
        s = tl.dot(q, tl.trans(kb), input_precision="ieee")
        dp = tl.dot(do, tl.trans(vb), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(kb))
        dp = tl.dot(do, tl.trans(vb))
    p = tl.where(keep[None, :], tl.exp2(s * qk_scale - lse2[:, None]), 0.0)
    ds = p * (dp - delta[:, None])
    if IEEE:
        dq += tl.dot(ds, kb, input_precision="ieee")
    else:
        dq += tl.dot(ds.to(kb.dtype), kb)
    return dq


@triton.jit
def _dq_private(q, do, lse2, delta, dq, idx, cnt, pos, k_base, v_base, skt, svt, offs_n, offs_s, offs_k, offs_v,
                m_k, m_v, qk_scale, BLOCK_SIZE: tl.constexpr, IEEE: tl.constexpr):
    c = pos // BLOCK_SIZE
    for i in range(0, cnt):
        j = tl.sum(tl.where(offs_n == i, idx, 0)).to(tl.int64)
        kpos = j * BLOCK_SIZE + offs_s
        jv = kpos // BLOCK_SIZE
        keep = (offs_s < BLOCK_SIZE) & (kpos <= pos) & (jv != 0) & (jv != c) & (jv != c - 1)
        kb = tl.load(k_base + kpos[:, None] * skt + offs_k[None, :], mask=keep[:, None] & m_k[None, :], other=0.0)
        vb = tl.load(v_base + kpos[:, None] * svt + offs_v[None, :], mask=keep[:, None] & m_v[None, :], other=0.0)
        dq = _dq_attend(q, do, lse2, delta, kb, vb, dq, keep, qk_scale, IEEE)
    return dq


@triton.jit
def _dq_store(DQ, b64, t, Tq, g, dq, scale, HQ: tl.constexpr, H: tl.constexpr, DK: tl.constexpr, offs_h, offs_k,
              m_h, m_k):
    tt = tl.minimum(t, Tq - 1).to(tl.int64)
    rows = (b64 * Tq + tt) * HQ + g * H + offs_h
    ok = m_h & ((offs_h * 0 + t) < Tq)
    tl.store(DQ + rows[:, None] * DK + offs_k[None, :], (dq * scale).to(DQ.dtype.element_ty),
             mask=ok[:, None] & m_k[None, :])


@triton.jit
def _bwd_dq_qt_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, IDX, CNT,
    sqb, sqt, sqh, skb, skt, skg, svb, svt, svg, sdb, sdt, sdh,
    Tq, S, Q_OFF, qk_scale, scale,
    G: tl.constexpr, H: tl.constexpr, N: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    DK: tl.constexpr, DV: tl.constexpr,
    HP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr,
    IEEE: tl.constexpr, NP: tl.constexpr, QT: tl.constexpr,
):
    t0 = tl.program_id(0) * QT
    bg = tl.program_id(1)
    b64 = (bg // G).to(tl.int64)
    g = bg % G
    HQ: tl.constexpr = G * H
    offs_h = tl.arange(0, HP)
    offs_k = tl.arange(0, BK)
    offs_v = tl.arange(0, BV)
    offs_s = tl.arange(0, BS)
    offs_n = tl.arange(0, NP)
    m_h = offs_h < H
    m_k = offs_k < DK
    m_v = offs_v < DV
    k_base = K + b64 * skb + g * skg
    v_base = V + b64 * svb + g * svg
    t_last = tl.minimum(t0 + QT - 1, Tq - 1)
    cA = (Q_OFF + t0) // BLOCK_SIZE
    cB = (Q_OFF + t_last) // BLOCK_SIZE
    p_max = Q_OFF + t_last

    q0 = _tok_load(Q, b64, t0, Tq, g, sqb, sqt, sqh, H, offs_h, offs_k, m_h, m_k)
    o0 = _tok_load(DO, b64, t0, Tq, g, sdb, sdt, sdh, H, offs_h, offs_v, m_h, m_v)
    s0, d0 = _tok_stats(LSE, DELTA, b64, t0, Tq, g, HQ, H, offs_h, m_h)
    n0, i0 = _tok_sel(IDX, CNT, b64, t0, Tq, g, G, N, offs_n)
    a0 = tl.zeros([HP, BK], dtype=tl.float32)
    if QT >= 2:
        q1 = _tok_load(Q, b64, t0 + 1, Tq, g, sqb, sqt, sqh, H, offs_h, offs_k, m_h, m_k)
        o1 = _tok_load(DO, b64, t0 + 1, Tq, g, sdb, sdt, sdh, H, offs_h, offs_v, m_h, m_v)
        s1, d1 = _tok_stats(LSE, DELTA, b64, t0 + 1, Tq, g, HQ, H, offs_h, m_h)
        n1, i1 = _tok_sel(IDX, CNT, b64, t0 + 1, Tq, g, G, N, offs_n)
        a1 = tl.zeros([HP, BK], dtype=tl.float32)
    if QT >= 4:
        q2 = _tok_load(Q, b64, t0 + 2, Tq, g, sqb, sqt, sqh, H, offs_h, offs_k, m_h, m_k)
        o2 = _tok_load(DO, b64, t0 + 2, Tq, g, sdb, sdt, sdh, H, offs_h, offs_v, m_h, m_v)
        s2, d2 = _tok_stats(LSE, DELTA, b64, t0 + 2, Tq, g, HQ, H, offs_h, m_h)
        n2, i2 = _tok_sel(IDX, CNT, b64, t0 + 2, Tq, g, G, N, offs_n)
        a2 = tl.zeros([HP, BK], dtype=tl.float32)
        q3 = _tok_load(Q, b64, t0 + 3, Tq, g, sqb, sqt, sqh, H, offs_h, offs_k, m_h, m_k)
        o3 = _tok_load(DO, b64, t0 + 3, Tq, g, sdb, sdt, sdh, H, offs_h, offs_v, m_h, m_v)
        s3, d3 = _tok_stats(LSE, DELTA, b64, t0 + 3, Tq, g, HQ, H, offs_h, m_h)
        n3, i3 = _tok_sel(IDX, CNT, b64, t0 + 3, Tq, g, G, N, offs_n)
        a3 = tl.zeros([HP, BK], dtype=tl.float32)

    for ci in tl.static_range(4):
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
        u0 = _uses(i0, n0, Q_OFF + t0, j, ok, BLOCK_SIZE)
        any_use = u0
        if QT >= 2:
            u1 = _uses(i1, n1, Q_OFF + t0 + 1, j, ok, BLOCK_SIZE)
            any_use = any_use | u1
        if QT >= 4:
            u2 = _uses(i2, n2, Q_OFF + t0 + 2, j, ok, BLOCK_SIZE)
            u3 = _uses(i3, n3, Q_OFF + t0 + 3, j, ok, BLOCK_SIZE)
            any_use = any_use | u2 | u3
        if any_use:
            kpos = j.to(tl.int64) * BLOCK_SIZE + offs_s
            kin = (offs_s < BLOCK_SIZE) & (kpos <= p_max)
            kb = tl.load(k_base + kpos[:, None] * skt + offs_k[None, :], mask=kin[:, None] & m_k[None, :], other=0.0)
            vb = tl.load(v_base + kpos[:, None] * svt + offs_v[None, :], mask=kin[:, None] & m_v[None, :], other=0.0)
            if u0:
                a0 = _dq_attend(q0, o0, s0, d0, kb, vb, a0, kin & (kpos <= Q_OFF + t0), qk_scale, IEEE)
            if QT >= 2:
                if u1:
                    a1 = _dq_attend(q1, o1, s1, d1, kb, vb, a1, kin & (kpos <= Q_OFF + t0 + 1), qk_scale, IEEE)
            if QT >= 4:
                if u2:
                    a2 = _dq_attend(q2, o2, s2, d2, kb, vb, a2, kin & (kpos <= Q_OFF + t0 + 2), qk_scale, IEEE)
                if u3:
                    a3 = _dq_attend(q3, o3, s3, d3, kb, vb, a3, kin & (kpos <= Q_OFF + t0 + 3), qk_scale, IEEE)

    a0 = _dq_private(q0, o0, s0, d0, a0, i0, n0, Q_OFF + t0, k_base, v_base, skt, svt, offs_n, offs_s, offs_k, offs_v,
                     m_k, m_v, qk_scale, BLOCK_SIZE, IEEE)
    _dq_store(DQ, b64, t0, Tq, g, a0, scale, HQ, H, DK, offs_h, offs_k, m_h, m_k)
    if QT >= 2:
        a1 = _dq_private(q1, o1, s1, d1, a1, i1, n1, Q_OFF + t0 + 1, k_base, v_base, skt, svt, offs_n, offs_s, offs_k,
                         offs_v, m_k, m_v, qk_scale, BLOCK_SIZE, IEEE)
        _dq_store(DQ, b64, t0 + 1, Tq, g, a1, scale, HQ, H, DK, offs_h, offs_k, m_h, m_k)
    if QT >= 4:
        a2 = _dq_private(q2, o2, s2, d2, a2, i2, n2, Q_OFF + t0 + 2, k_base, v_base, skt, svt, offs_n, offs_s, offs_k,
                         offs_v, m_k, m_v, qk_scale, BLOCK_SIZE, IEEE)
        _dq_store(DQ, b64, t0 + 2, Tq, g, a2, scale, HQ, H, DK, offs_h, offs_k, m_h, m_k)
        a3 = _dq_private(q3, o3, s3, d3, a3, i3, n3, Q_OFF + t0 + 3, k_base, v_base, skt, svt, offs_n, offs_s, offs_k,
                         offs_v, m_k, m_v, qk_scale, BLOCK_SIZE, IEEE)
        _dq_store(DQ, b64, t0 + 3, Tq, g, a3, scale, HQ, H, DK, offs_h, offs_k, m_h, m_k)
