"""Triton kernels of the selection branch (layer 1 of nsa_core.triton_sel; no host logic here).

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
