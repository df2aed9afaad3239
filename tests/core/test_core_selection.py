"""Block selection (DESIGN §2, Eqs. 8-11): overlap mapping, head sum, forced blocks, ties, padding.

The hand-worked example is computed on paper in the comments; the random cases compare with the
naive per-token oracle in tests/_naive.py (float64 loops written from the equations).
"""

from __future__ import annotations

import math

import pytest
import torch

from nsa_core import NSAConfig
from nsa_core import functional as F
from nsa_core.selection import reference as _blocks
from nsa_core.testing import case_id

try:  # tests/ is on sys.path under pytest's default (prepend) import mode
    import _naive as N
    from _naive import one_cpu_thread  # noqa: F401  (autouse fixture)
except ImportError:  # pragma: no cover - run as a package (tests/__init__.py or importlib mode)
    from tests import _naive as N
    from tests._naive import one_cpu_thread  # noqa: F401

DEV = N.DEVICE
LN2 = math.log(2.0)

# ================================================================================================
# Hand-worked example: l=32, d=16, l'=64  ->  a = l'/d = 4, b = l/d = 2.
#
# Work in "units" of d = 16 raw tokens: unit u = tokens [16u, 16u+16).
# Compressed token i covers [16i, 16i+32) = units {i, i+1}.  Selection block j = units 4j..4j+3.
# Overlap (in units of d) of compressed i with block j = #{i, i+1} inside 4j..4j+3:
#   i = 4j, 4j+1, 4j+2 -> 2 with block j;   i = 4j+3 -> 1 with block j and 1 with block j+1.
# Literal Eq. 9 check: p_slc[j] = sum_{m<4} sum_{n<2} p_cmp[4j+m-n] hits index
#   4j-1 once (m0,n1), 4j twice (m0n0, m1n1), 4j+1 twice, 4j+2 twice, 4j+3 once (m3n0)  -> same.
#
# T = 272 raw tokens (units 0..16), query t = 271 sees (272-32)//16 + 1 = 16 compressed tokens,
# i = 0..15; blocks j = 0..4 (block 4 holds only unit 16 = tokens 256..271).
# W[i, j] (16 x 5):
W_HAND = [
    [2, 0, 0, 0, 0],  # i=0
    [2, 0, 0, 0, 0],  # i=1
    [2, 0, 0, 0, 0],  # i=2
    [1, 1, 0, 0, 0],  # i=3   units 3,4 straddle blocks 0|1
    [0, 2, 0, 0, 0],  # i=4
    [0, 2, 0, 0, 0],  # i=5
    [0, 2, 0, 0, 0],  # i=6
    [0, 1, 1, 0, 0],  # i=7
    [0, 0, 2, 0, 0],  # i=8
    [0, 0, 2, 0, 0],  # i=9
    [0, 0, 2, 0, 0],  # i=10
    [0, 0, 1, 1, 0],  # i=11
    [0, 0, 0, 2, 0],  # i=12
    [0, 0, 0, 2, 0],  # i=13
    [0, 0, 0, 2, 0],  # i=14
    [0, 0, 0, 1, 1],  # i=15  unit 16 = tokens 256..271 is in block 4
]
# With the paper's printed index j*a - m - n, block 1 would get p_cmp[4-m-n] for m<4, n<2, i.e.
# compressed tokens 0..4 (raw tokens 0..95) -- mostly before block 1. We use the overlap form.
#
# Inputs (B=1, G=2, HQ=4 -> h=2, dk=4, scale=1 so a score is just q.k):
#   group 0, head 0: q = e0;  head 1: q = e1;   group 1 (heads 2, 3): q = 0 (uniform softmax).
#   raw k_cmp of group 0: coordinate 0 = 2 ln2 on unit 7 (tokens 112..127), coordinate 1 = 2 ln2 on
#   unit 10 (tokens 160..175), coordinates 2, 3 random (q is 0 there), 0 elsewhere.
#   avg phi: compressed key i = mean of units {i, i+1}, so coordinate 0 = ln2 for i in {6, 7}
#   (16 of its 32 tokens carry 2 ln2), else 0; coordinate 1 = ln2 for i in {9, 10}.
# At t = 271 (16 visible):
#   head 0: exp(score) = 2 for i = 6, 7, 1 otherwise; sum 18.  p_slc = W^T p:
#     b0 = 2+2+2+1 = 7; b1 = 1 + 2 + 2 + 2*2 + 1*2 = 11; b2 = 1*2 + 2+2+2 + 1 = 9; b3 = 1+2+2+2+1 = 8;
#     b4 = 1                                                    -> [7, 11, 9, 8, 1] / 18
#   head 1: weight 2 for i = 9, 10:
#     b0 = 7; b1 = 1+2+2+2+1 = 8; b2 = 1 + 2 + 2*2 + 2*2 + 1 = 12; b3 = 8; b4 = 1 -> [7, 8, 12, 8, 1] / 18
#   group 0 (Eq. 10, sum of its 2 heads):                       [14, 19, 21, 16, 2] / 18
#   group 1: p_cmp = 1/16 each (exact in binary), per head [7, 8, 8, 8, 1] / 16, summed: [14, 16, 16, 16, 2] / 16
# Top-n with n = 4: cur = 271 // 64 = 4, forced {0, 3, 4}, one free slot among candidates {1, 2}:
#   group 0: 21/18 > 19/18 -> block 2 (head 0 ALONE would pick block 1: 11 > 9 -> proves the head sum);
#            block 1 (19/18) beats the forced blocks 0 (14/18), 3 (16/18), 4 (2/18) and is still dropped.
#   group 1: 16/16 == 16/16, an exact tie -> the lower index, block 1.
# Other query positions (group 0):
#   t = 30: no compressed token visible -> scores all 0 (no NaN); only block 0 is a candidate.
#   t = 31: only i = 0 (score 0) visible -> p_cmp = [1] per head; i=0 lies in block 0 with weight 2
#           -> score [4, 0, 0, 0, 0] (both groups); block_idx [0, -1, -1, -1], count 1.
#   t = 127: 7 visible (i = 0..6); head 0: weight 2 at i = 6, sum 8 -> b0 = 7/8, b1 = (1+2+2+2*2)/8 = 9/8;
#            head 1: all 1, sum 7 -> b0 = 7/7, b1 = (1+2+2+2)/7 = 1 -> group 0 [15/8, 17/8, 0, 0, 0];
#            cur = 1: forced {0, 1} = every candidate -> [0, 1, -1, -1], count 2.
#   t = 128: cur = 2, forced {0, 1, 2}, no other candidate -> [0, 1, 2, -1], count 3.
#   t = 200: cur = 3, forced {0, 2, 3}, free slot -> the only other candidate 1 -> [0, 1, 2, 3], count 4.
# ================================================================================================

HAND_CFG = dict(l=32, d=16, l_sel=64, n_sel=4, w=512)


def _hand_inputs(dtype=torch.float64):
    T, G, HQ, dk = 272, 2, 4, 4
    q = torch.zeros(1, T, HQ, dk, dtype=torch.float64)
    q[0, :, 0, 0] = 1.0
    q[0, :, 1, 1] = 1.0
    k = torch.zeros(1, T, G, dk, dtype=torch.float64)
    k[0, 112:128, 0, 0] = 2 * LN2
    k[0, 160:176, 0, 1] = 2 * LN2
    g = torch.Generator().manual_seed(7)
    k[0, :, 0, 2:] = torch.randn(T, 2, generator=g, dtype=torch.float64)
    k[0, :, 1, :] = torch.randn(T, dk, generator=g, dtype=torch.float64)
    return q.to(DEV, dtype), k.to(DEV, dtype)


def test_hand_overlap_matrix():
    cfg = NSAConfig(**HAND_CFG)
    W = _blocks.overlap_matrix(16, 5, cfg, device=DEV, dtype=torch.float64)
    assert W.tolist() == [[float(x) for x in row] for row in W_HAND]


def test_hand_overlap_equals_literal_double_sum():
    # one-hot p_cmp through the naive literal double sum gives the column weights of each compressed token
    eye = torch.eye(16, dtype=torch.float64)[None, :, None, :]  # [1, T'=16, 1, Tc=16]; rows = one-hot p_cmp
    lit = N.p_slc(eye, 272, 32, 16, 64)[0, :, 0]  # [16, 5]
    assert lit.tolist() == [[float(x) for x in row] for row in W_HAND]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
def test_hand_block_scores(dtype):
    cfg = NSAConfig(**HAND_CFG)
    q, k = _hand_inputs(dtype)
    kc = F.compress(k, cfg)
    assert kc.shape == (1, 16, 2, 4)
    sc = F.block_scores(q, kc, 272, cfg, scale=1.0)  # [1, T, G, NB]
    assert sc.shape == (1, 272, 2, 5)
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    expect = {
        (271, 0): [14 / 18, 19 / 18, 21 / 18, 16 / 18, 2 / 18],
        (271, 1): [14 / 16, 16 / 16, 16 / 16, 16 / 16, 2 / 16],
        (31, 0): [4, 0, 0, 0, 0],
        (31, 1): [4, 0, 0, 0, 0],
        (30, 0): [0, 0, 0, 0, 0],
        (127, 0): [15 / 8, 17 / 8, 0, 0, 0],
    }
    for (t, g), ref in expect.items():
        got = sc[0, t, g].double().cpu()
        assert torch.isfinite(got).all(), (t, g, got)
        assert torch.allclose(got, torch.tensor(ref, dtype=torch.float64), atol=tol, rtol=0), (t, g, got, ref)
    # the tie in group 1 is exact (all p_cmp = 1/16: dyadic sums) -- a real tie, not a near one
    assert sc[0, 271, 1, 1].item() == sc[0, 271, 1, 2].item()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
def test_hand_selected_blocks(dtype):
    cfg = NSAConfig(**HAND_CFG)
    q, k = _hand_inputs(dtype)
    idx, cnt = F.select_blocks(q, k, cfg, scale=1.0)
    assert idx.dtype == torch.int32 and cnt.dtype == torch.int32
    assert idx.shape == (1, 272, 2, 4) and cnt.shape == (1, 272, 2)
    idx, cnt = idx.cpu(), cnt.cpu()
    # group 0 at t=271: head sum picks block 2 over block 1; forced 0, 3, 4 kept despite lower scores
    assert idx[0, 271, 0].tolist() == [0, 2, 3, 4] and cnt[0, 271, 0] == 4
    # group 1 at t=271: exact tie between blocks 1 and 2 -> lower index
    assert idx[0, 271, 1].tolist() == [0, 1, 3, 4] and cnt[0, 271, 1] == 4
    for g in (0, 1):
        assert idx[0, 30, g].tolist() == [0, -1, -1, -1] and cnt[0, 30, g] == 1
        assert idx[0, 31, g].tolist() == [0, -1, -1, -1] and cnt[0, 31, g] == 1
        assert idx[0, 127, g].tolist() == [0, 1, -1, -1] and cnt[0, 127, g] == 2
        assert idx[0, 128, g].tolist() == [0, 1, 2, -1] and cnt[0, 128, g] == 3
        assert idx[0, 200, g].tolist() == [0, 1, 2, 3] and cnt[0, 200, g] == 4
    # head 0 alone (group of one head): would choose block 1 at t = 271 (11/18 > 9/18)
    q1 = q[:, :, [0, 2]].contiguous()  # HQ=2, G=2: head 0 -> group 0 alone, head 2 -> group 1
    idx1, _ = F.select_blocks(q1, k, cfg, scale=1.0)
    assert idx1[0, 271, 0].tolist() == [0, 1, 3, 4]
    # and the oracle agrees everywhere
    nidx, ncnt, _ = N.select_blocks(N.cpu64(q), N.cpu64(k), 32, 16, 64, 4, scale=1.0)
    assert torch.equal(idx, nidx) and torch.equal(cnt, ncnt)


def test_hand_multiway_tie_goes_to_lowest_indices():
    # l=32, d=16, l'=64, n=5, T=528, q = 0: at t = 527, (528-32)//16 + 1 = 32 compressed tokens are
    # visible, p_cmp = 1/32 each (exact). Blocks 0..8: weights [7, 8, 8, 8, 8, 8, 8, 8, 1] / 32
    # (block 0 starts with unit 0 covered once; block 8 = unit 32 covered only by i = 31).
    # cur = 8, forced {0, 7, 8}; free slots 2 among blocks 1..6, all 8/32 -> blocks 1 and 2.
    cfg = NSAConfig(l=32, d=16, l_sel=64, n_sel=5, w=512)
    q = torch.zeros(1, 528, 1, 4, dtype=torch.float64, device=DEV)
    k = N.randn(1, 528, 1, 4, seed=3)
    sc = F.block_scores(q, F.compress(k, cfg), 528, cfg)
    assert sc[0, 527, 0].cpu().tolist() == [7 / 32, 8 / 32, 8 / 32, 8 / 32, 8 / 32, 8 / 32, 8 / 32, 8 / 32, 1 / 32]
    idx, cnt = F.select_blocks(q, k, cfg)
    assert idx[0, 527, 0].tolist() == [0, 1, 2, 7, 8] and int(cnt[0, 527, 0]) == 5
    # t = 383: cur = 5, forced {0, 4, 5}; candidates 1..3 tie (8 each) -> 1, 2
    assert idx[0, 383, 0].tolist() == [0, 1, 2, 4, 5]


def test_overlap_matrix_equals_literal_eq9_for_several_geometries():
    for l, d, l_sel in [(32, 16, 64), (4, 4, 4), (8, 4, 8), (8, 2, 16), (16, 8, 64), (32, 32, 64), (6, 3, 12)]:
        cfg = NSAConfig(l=l, d=d, l_sel=l_sel, n_sel=3)
        T = 5 * l_sel + 3
        Tc = cfg.num_cmp(T)
        NB = cfg.num_sel_blocks(T)
        W = _blocks.overlap_matrix(Tc, NB, cfg, dtype=torch.float64)
        eye = torch.eye(Tc, dtype=torch.float64)[None, :, None, :]
        lit = N.p_slc(eye, T, l, d, l_sel)[0, :, 0]
        assert torch.equal(W, lit), (l, d, l_sel)


# ---- random cases against the oracle -----------------------------------------------------------

def _check_invariants(idx, cnt, cfg, T):
    """Structural rules of Eq. 11 that hold for any scores."""
    B, T_, G, n = idx.shape
    assert T_ == T and n == cfg.n_sel
    idx, cnt = idx.cpu(), cnt.cpu()
    for t in range(T):
        cur = t // cfg.l_sel
        want = min(cur + 1, cfg.n_sel)
        assert (cnt[:, t] == want).all(), (t, cnt[:, t], want)
        for b in range(B):
            for g in range(G):
                row = idx[b, t, g].tolist()
                chosen, pad = row[:want], row[want:]
                assert pad == [-1] * (n - want), (t, row)
                assert chosen == sorted(set(chosen)), (t, row)  # ascending, no duplicates
                assert all(0 <= j <= cur for j in chosen), (t, row)
                for f in (0, cur, cur - 1):
                    if f >= 0:
                        assert f in chosen, (t, row, f)


SEL_CASES = [
    # B, T, HQ, G, dk, (l, d, l_sel, n)
    (1, 77, 1, 1, 8, (4, 2, 8, 4)),
    (2, 61, 2, 1, 8, (4, 2, 8, 5)),
    (1, 70, 4, 2, 6, (8, 4, 8, 3)),
    (1, 53, 16, 1, 4, (4, 4, 4, 6)),    # l = l' = d: the paper's printed form agrees
    (2, 90, 4, 1, 8, (8, 2, 16, 4)),    # a = 8, b = 4
    (1, 45, 8, 2, 4, (6, 3, 12, 3)),
    (1, 7, 2, 1, 4, (8, 4, 16, 3)),     # T < l
]


def _sel_id(c):
    B, T, HQ, G, dk, (l, d, ls, n) = c
    return case_id(B, T, HQ, G, dk, dk, "fp64", l=l, d=d, ls=ls, n=n)


@pytest.mark.parametrize("case", [pytest.param(c, id=_sel_id(c)) for c in SEL_CASES])
def test_select_blocks_matches_oracle(case):
    B, T, HQ, G, dk, (l, d, ls, n) = case
    cfg = NSAConfig(l=l, d=d, l_sel=ls, n_sel=n)
    q = N.randn(B, T, HQ, dk, seed=11, scale=2.0)
    k = N.randn(B, T, G, dk, seed=12, scale=2.0)
    idx, cnt = F.select_blocks(q, k, cfg)
    _check_invariants(idx, cnt, cfg, T)
    nidx, ncnt, nsc = N.select_blocks(N.cpu64(q), N.cpu64(k), l, d, ls, n)
    # the scores themselves (Eqs. 8-10) against the oracle
    sc = F.block_scores(q, F.compress(k, cfg), T, cfg)
    assert torch.allclose(sc.cpu(), nsc, atol=1e-12, rtol=0)
    assert torch.equal(idx.cpu(), nidx), (idx.cpu() != nidx).nonzero()[:5]
    assert torch.equal(cnt.cpu(), ncnt)


def test_select_blocks_fp32_matches_oracle_up_to_near_ties():
    cfg = NSAConfig(l=4, d=2, l_sel=8, n_sel=4)
    B, T, HQ, G, dk = 2, 80, 4, 2, 8
    q = N.randn(B, T, HQ, dk, seed=21, dtype=torch.float32)
    k = N.randn(B, T, G, dk, seed=22, dtype=torch.float32)
    idx, cnt = F.select_blocks(q, k, cfg)
    _check_invariants(idx, cnt, cfg, T)
    nidx, ncnt, nsc = N.select_blocks(N.cpu64(q), N.cpu64(k), 4, 2, 8, 4)
    assert torch.equal(cnt.cpu(), ncnt)
    idx = idx.cpu()
    for b, t, g in (idx != nidx).any(-1).nonzero().tolist():
        got = set(idx[b, t, g].tolist()) - {-1}
        ref = set(nidx[b, t, g].tolist()) - {-1}
        s = nsc[b, t, g]
        # a swap is allowed only between blocks whose float64 scores are within fp32 rounding
        gap = max(s[j] for j in ref - got) - min(s[j] for j in got - ref)
        assert gap <= 1e-5, (b, t, g, sorted(got), sorted(ref), float(gap))


@pytest.mark.parametrize("scale", [0.25, 3.0])
def test_select_blocks_explicit_scale(scale):
    cfg = NSAConfig(l=4, d=2, l_sel=8, n_sel=3)
    q = N.randn(1, 50, 2, 4, seed=31)
    k = N.randn(1, 50, 1, 4, seed=32)
    idx, cnt = F.select_blocks(q, k, cfg, scale=scale)
    nidx, ncnt, _ = N.select_blocks(N.cpu64(q), N.cpu64(k), 4, 2, 8, 3, scale=scale)
    assert torch.equal(idx.cpu(), nidx) and torch.equal(cnt.cpu(), ncnt)


def test_selection_is_causal():
    cfg = NSAConfig(l=4, d=2, l_sel=8, n_sel=4)
    B, T, HQ, G, dk = 1, 64, 4, 2, 8
    q = N.randn(B, T, HQ, dk, seed=41)
    k = N.randn(B, T, G, dk, seed=42)
    idx, cnt = F.select_blocks(q, k, cfg)
    for t in (0, 5, 17, 40, 62):
        q2, k2 = q.clone(), k.clone()
        q2[:, t + 1:] = N.randn(B, T - t - 1, HQ, dk, seed=100 + t, scale=5.0)
        k2[:, t + 1:] = N.randn(B, T - t - 1, G, dk, seed=200 + t, scale=5.0)
        idx2, cnt2 = F.select_blocks(q2, k2, cfg)
        assert torch.equal(idx[:, : t + 1], idx2[:, : t + 1]) and torch.equal(cnt[:, : t + 1], cnt2[:, : t + 1]), t
        # the perturbation is real: the scores of the last query did change
        sc = F.block_scores(q[:, -1:], F.compress(k, cfg), T, cfg)
        sc2 = F.block_scores(q2[:, -1:], F.compress(k2, cfg), T, cfg)
        assert (sc - sc2).abs().max() > 1e-3, t


def test_nsa_attention_returns_the_same_selection():
    cfg = NSAConfig(l=4, d=2, l_sel=8, n_sel=4, w=8)
    B, T, HQ, G, dk, dv = 1, 40, 4, 2, 4, 6
    q = N.randn(B, T, HQ, dk, seed=51)
    kv = [N.randn(B, T, G, dk if i % 2 == 0 else dv, seed=52 + i) for i in range(6)]
    gates = N.rand(B, T, HQ, 3, seed=58)
    _, (idx, cnt) = F.nsa_attention(q, *kv, gates, cfg, return_selection=True)
    idx2, cnt2 = F.select_blocks(q, kv[0], cfg)
    assert torch.equal(idx, idx2) and torch.equal(cnt, cnt2)


def test_select_blocks_rejects_bad_shapes():
    cfg = NSAConfig(l=4, d=2, l_sel=8, n_sel=3)
    q = N.randn(1, 20, 4, 8)
    with pytest.raises(ValueError, match="multiple"):
        F.select_blocks(q, N.randn(1, 20, 3, 8), cfg)  # HQ=4 not a multiple of G=3
    with pytest.raises(ValueError, match="dim"):
        F.select_blocks(q, N.randn(1, 20, 2, 6), cfg)  # dk mismatch
    with pytest.raises(ValueError):
        F.select_blocks(q, N.randn(2, 20, 2, 8), cfg)  # batch mismatch
    with pytest.raises(ValueError):
        F.select_blocks(q[0], N.randn(1, 20, 2, 8), cfg)  # 3-d q
    with pytest.raises(ValueError, match="phi"):
        F.select_blocks(q, N.randn(1, 20, 2, 8), NSAConfig(l=4, d=2, l_sel=8, n_sel=3, phi="mlp"))
