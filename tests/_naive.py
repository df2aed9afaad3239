"""Independent float64 oracle for the nsa_core tests: naive per-token loops written from DESIGN §2.

Nothing here imports the code under test (nsa_core.functional / _blocks / _reference / module):
every function re-derives the semantics from the equations, one (batch, position, head) at a
time, so a bug shared by the reference and sdpa backends still shows up. The loops are slow by
design; keep shapes tiny. All functions are plain torch ops, so they are differentiable and
their gradients serve as the oracle for the gradient tests too.

Layouts follow the contract: q [B, T, HQ, dk]; per-branch keys/values [B, T, G, dk|dv];
query head hq belongs to group hq // (HQ // G) (group-major).

``DEVICE`` is the ONE place the test device is chosen: ``NSA_TEST_DEVICE=cuda pytest ...``.
Inputs are drawn on the CPU from a seeded generator and then moved, so a case sees the same
numbers on every device.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

DEVICE = torch.device(os.environ.get("NSA_TEST_DEVICE", "cpu"))


@pytest.fixture(autouse=True, scope="module")
def one_cpu_thread():
    """Tiny CPU ops run fastest on one thread, and on a shared 2-core machine a second OpenMP thread
    that spins while others hold the CPU made gradcheck 10-40x slower. Import this name into a test
    module to apply it there; the previous setting is restored after the module."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def randn(*shape, dtype=torch.float64, seed: int = 0, scale: float = 1.0, requires_grad: bool = False):
    """Fresh N(0, scale^2) tensor on DEVICE (drawn on the CPU from ``seed``, so identical on every device)."""
    g = torch.Generator().manual_seed(seed)
    t = (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype=dtype, device=DEVICE)
    return t.requires_grad_(requires_grad)


def rand(*shape, dtype=torch.float64, seed: int = 0, requires_grad: bool = False):
    """Fresh U(0, 1) tensor on DEVICE (drawn on the CPU from ``seed``)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(*shape, generator=g, dtype=torch.float64).to(dtype=dtype, device=DEVICE)
    return t.requires_grad_(requires_grad)


def cpu64(t: torch.Tensor, requires_grad: bool = False) -> torch.Tensor:
    """A detached float64 CPU copy (a leaf for the oracle's own autograd when requires_grad)."""
    return t.detach().to("cpu", torch.float64).clone().requires_grad_(requires_grad)


# ---- geometry, straight from DESIGN §2 -----------------------------------------------------

def n_visible_cmp(t: int, l: int, d: int) -> int:
    """Compressed tokens visible to query t: token i is visible iff i*d + l - 1 <= t."""
    return sum(1 for i in range(t + 1) if i * d + l - 1 <= t)


def n_cmp_tokens(T: int, l: int, d: int) -> int:
    """Compressed tokens that exist once T raw tokens exist (= visible to t = T-1)."""
    return n_visible_cmp(T - 1, l, d) if T > 0 else 0


def _attend(qv: torch.Tensor, K: torch.Tensor, V: torch.Tensor, scale: float):
    """softmax(K qv * scale) V for one query vector; no keys -> zero vector, empty probabilities."""
    if K.shape[0] == 0:
        return V.new_zeros(V.shape[-1]), K.new_zeros(0)
    p = torch.softmax((K @ qv) * scale, dim=0)
    return p @ V, p


def _scale(q: torch.Tensor, scale: float | None) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


# ---- compression (Eq. 7) -------------------------------------------------------------------

def compress_avg(x: torch.Tensor, l: int, d: int) -> torch.Tensor:
    """x [B, T, G, D] -> [B, Tc, G, D]: token i = mean of raw tokens [i*d, i*d + l)."""
    B, T, G, D = x.shape
    Tc = n_cmp_tokens(T, l, d)
    toks = [x[:, i * d: i * d + l].mean(dim=1) for i in range(Tc)]
    return torch.stack(toks, dim=1) if toks else x.new_zeros(B, 0, G, D)


def compress_mlp(x: torch.Tensor, l: int, d: int, pos: torch.Tensor, w1, b1, w2, b2) -> torch.Tensor:
    """mlp phi of DESIGN §2 from raw weights: (block + pos) -> flatten (row-major [l, D]) -> Linear
    -> GELU -> Linear. x [B, T, G, D] -> [B, Tc, G, D]; one compressed token at a time."""
    B, T, G, D = x.shape
    Tc = n_cmp_tokens(T, l, d)
    rows = []
    for b in range(B):
        for i in range(Tc):
            for g in range(G):
                block = x[b, i * d: i * d + l, g] + pos  # [l, D]
                hid = torch.nn.functional.gelu(w1 @ block.reshape(-1) + b1)
                rows.append(((b, i, g), w2 @ hid + b2))
    if not rows:
        return x.new_zeros(B, 0, G, D)
    return torch.stack([r for _, r in rows]).reshape(B, Tc, G, D)


# ---- branches ------------------------------------------------------------------------------

def compressed_attention(q, kc, vc, l: int, d: int, scale=None):
    """q [B, T, HQ, dk] over COMPRESSED kc/vc [B, Tc, G, *] -> (o [B, T, HQ, dv], p_cmp [B, T, HQ, Tc]).

    p_cmp[t, hq, i] is the softmax weight of compressed token i (0 where not visible)."""
    B, T, HQ, _ = q.shape
    G, Tc, dv = kc.shape[2], kc.shape[1], vc.shape[-1]
    h = HQ // G
    sc = _scale(q, scale)
    outs, probs = [], []
    for b in range(B):
        for t in range(T):
            nv = n_visible_cmp(t, l, d)
            for hq in range(HQ):
                g = hq // h
                o, p = _attend(q[b, t, hq], kc[b, :nv, g], vc[b, :nv, g], sc)
                outs.append(o)
                probs.append(torch.cat([p, p.new_zeros(Tc - nv)]) if Tc else p)
    o = torch.stack(outs).reshape(B, T, HQ, dv)
    p = torch.stack(probs).reshape(B, T, HQ, Tc)
    return o, p


def p_slc(p_cmp: torch.Tensor, T: int, l: int, d: int, l_sel: int) -> torch.Tensor:
    """Eq. 9 in the corrected (overlap) form, as the literal double sum of DESIGN §2:
    p_slc[j] = sum_{m<a} sum_{n<b} p_cmp[j*a + m - n], a = l_sel/d, b = l/d, out-of-range terms 0.
    p_cmp [B, T, HQ, Tc] -> [B, T, HQ, NB], NB = ceil(T / l_sel)."""
    a, bb = l_sel // d, l // d
    Tc = p_cmp.shape[-1]
    NB = -(-T // l_sel)
    cols = []
    for j in range(NB):
        acc = p_cmp.new_zeros(p_cmp.shape[:-1])
        for m in range(a):
            for n in range(bb):
                i = j * a + m - n
                if 0 <= i < Tc:
                    acc = acc + p_cmp[..., i]
        cols.append(acc)
    return torch.stack(cols, dim=-1)


def group_scores(p_slc_heads: torch.Tensor, G: int) -> torch.Tensor:
    """Eq. 10: [B, T, HQ, NB] -> [B, T, G, NB], summing the h = HQ/G heads of each group."""
    B, T, HQ, NB = p_slc_heads.shape
    h = HQ // G
    return torch.stack([sum(p_slc_heads[:, :, g * h + r] for r in range(h)) for g in range(G)], dim=2)


def topn(scores: torch.Tensor, l_sel: int, n: int):
    """Eq. 11, one (b, t, g) at a time: forced 0, t//l_sel, t//l_sel - 1; the best other candidates
    (ties -> lower index); ascending ids then -1. scores [B, T, G, NB] -> (block_idx, block_count) int32."""
    B, T, G, _ = scores.shape
    s = scores.detach().cpu().tolist()
    idx = torch.full((B, T, G, n), -1, dtype=torch.int32)
    cnt = torch.zeros(B, T, G, dtype=torch.int32)
    for b in range(B):
        for t in range(T):
            cur = t // l_sel
            cands = list(range(cur + 1))
            forced = {j for j in (0, cur, cur - 1) if j >= 0}
            for g in range(G):
                others = sorted((j for j in cands if j not in forced), key=lambda j, r=s[b][t][g]: (-r[j], j))
                chosen = sorted(forced | set(others[: n - len(forced)]))
                cnt[b, t, g] = len(chosen)
                idx[b, t, g, : len(chosen)] = torch.tensor(chosen, dtype=torch.int32)
    return idx, cnt


def select_blocks(q, k_cmp_raw, l: int, d: int, l_sel: int, n: int, scale=None, kc=None):
    """The whole selection path (Eqs. 7-11) with avg phi (or given compressed keys ``kc``).
    Returns (block_idx, block_count, group scores [B, T, G, NB])."""
    T, G = k_cmp_raw.shape[1], k_cmp_raw.shape[2]
    if kc is None:
        kc = compress_avg(k_cmp_raw, l, d)
    _, p = compressed_attention(q, kc, kc, l, d, scale)
    sc = group_scores(p_slc(p, T, l, d, l_sel), G)
    idx, cnt = topn(sc, l_sel, n)
    return idx, cnt, sc


def selection_attention(q, k, v, block_idx, block_count, l_sel: int, scale=None):
    """Eq. 12: attend over raw tokens s <= t of the chosen blocks (first block_count ids)."""
    B, T, HQ, _ = q.shape
    G, dv = k.shape[2], v.shape[-1]
    h = HQ // G
    sc = _scale(q, scale)
    bi, bc = block_idx.cpu().tolist(), block_count.cpu().tolist()
    outs = []
    for b in range(B):
        for t in range(T):
            for hq in range(HQ):
                g = hq // h
                toks = [s for j in bi[b][t][g][: bc[b][t][g]] for s in range(j * l_sel, (j + 1) * l_sel) if s <= t]
                ix = torch.tensor(toks, dtype=torch.long, device=k.device)
                outs.append(_attend(q[b, t, hq], k[b, ix, g], v[b, ix, g], sc)[0])
    return torch.stack(outs).reshape(B, T, HQ, dv)


def sliding_attention(q, k, v, w: int, scale=None):
    """Keys max(0, t-w+1) .. t."""
    B, T, HQ, _ = q.shape
    G, dv = k.shape[2], v.shape[-1]
    h = HQ // G
    sc = _scale(q, scale)
    outs = []
    for b in range(B):
        for t in range(T):
            lo = max(0, t - w + 1)
            for hq in range(HQ):
                g = hq // h
                outs.append(_attend(q[b, t, hq], k[b, lo: t + 1, g], v[b, lo: t + 1, g], sc)[0])
    return torch.stack(outs).reshape(B, T, HQ, dv)


def causal_attention(q, k, v, scale=None):
    """Full causal GQA attention: keys 0..t (the equivalence anchor)."""
    return sliding_attention(q, k, v, q.shape[1] + k.shape[1] + 1, scale)


def nsa(q, k_cmp, v_cmp, k_sel, v_sel, k_win, v_win, gates, l, d, l_sel, n, w, scale=None, kc=None, vc=None):
    """Eq. 5 without the output projection. Returns (o [B, T, HQ, dv], block_idx, block_count)."""
    if kc is None:
        kc, vc = compress_avg(k_cmp, l, d), compress_avg(v_cmp, l, d)
    o_cmp, p = compressed_attention(q, kc, vc, l, d, scale)
    T, G = q.shape[1], k_cmp.shape[2]
    idx, cnt = topn(group_scores(p_slc(p, T, l, d, l_sel), G), l_sel, n)
    o_slc = selection_attention(q, k_sel, v_sel, idx, cnt, l_sel, scale)
    o_win = sliding_attention(q, k_win, v_win, w, scale)
    o = gates[..., 0:1] * o_cmp + gates[..., 1:2] * o_slc + gates[..., 2:3] * o_win
    return o, idx, cnt


# ---- module pieces -------------------------------------------------------------------------

def rope_half(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary embedding, half-split convention, one position and one frequency at a time:
    pair (x[f], x[f + D/2]) at position p rotates by p * base^(-f / (D/2)). x [B, T, H, D]."""
    B, T, H, D = x.shape
    half = D // 2
    out = torch.empty_like(x)
    for p in range(T):
        for f in range(half):
            ang = p * base ** (-f / half)
            c, s = math.cos(ang), math.sin(ang)
            out[:, p, :, f] = x[:, p, :, f] * c - x[:, p, :, f + half] * s
            out[:, p, :, f + half] = x[:, p, :, f] * s + x[:, p, :, f + half] * c
    return out
