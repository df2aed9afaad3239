"""Fused selection scoring + top-n (nsa_core.selection.scoring) vs the float64 reference choice.

DESIGN §7: the kernel's block_idx must equal the reference's choice; a differing (t, group) row
is accepted only as a near-tie (the float64 reference scores of the two chosen sets differ by
< 1e-5 relative, bf16: 1e-2), and differing rows stay under 0.1 %. On CPU the kernels run in
the Triton interpreter (fp32, tiny shapes); on a GPU the same tests run compiled, plus bf16 at
paper shapes. The reference: ``functional.block_scores`` in float64 + ``reference.topn_blocks``.
"""

from __future__ import annotations

import importlib
import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton import
triton = pytest.importorskip("triton", reason="needs triton: pip install triton")

from nsa_core import NSAConfig  # noqa: E402
from nsa_core import functional as F  # noqa: E402
from nsa_core.selection import reference as slc_ref  # noqa: E402
from nsa_core.selection import scoring  # noqa: E402

DEV = "cuda" if CUDA else "cpu"


@pytest.fixture(autouse=True, scope="module")
def _interpreted_kernels():
    """If triton was imported before TRITON_INTERPRET was set, re-decorate the kernels."""
    if not CUDA:
        os.environ["TRITON_INTERPRET"] = "1"
        if type(scoring._score_kernel).__name__ != "InterpretedFunction":
            importlib.reload(scoring)
    yield


def _inputs(B, T, HQ, G, dk, seed, dtype=torch.float32, S=None, scale=1.0):
    S = S or T
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(B, T, HQ, dk, generator=gen) * scale).to(DEV, dtype)
    k = (torch.randn(B, S, G, dk, generator=gen) * scale).to(DEV, dtype)
    return q, k


def _forced(t: int, cfg: NSAConfig) -> set[int]:
    cur = t // cfg.l_sel
    return {0, cur} | ({cur - 1} if cur >= 1 else set())


def check_choice(idx, cnt, q, kc, S, cfg, rel_tol=1e-5, scale=None, max_frac=1e-3):
    """Assert the DESIGN §7 rule for a kernel's (idx, cnt); -> (rows, differing rows).

    Invariants (ascending live ids, -1 padding, forced blocks present, causal candidates) hold
    on every row; rows that differ from the float64 reference choice must be near-ties.
    """
    s64 = F.block_scores(q.double(), kc.double(), S, cfg, scale).cpu()
    T = q.shape[1]
    t_pos = torch.arange(S - T, S)
    ridx, rcnt = slc_ref.topn_blocks(s64, t_pos, cfg)
    idx, cnt = idx.cpu(), cnt.cpu()
    assert idx.dtype == torch.int32 and cnt.dtype == torch.int32
    assert idx.shape == ridx.shape and cnt.shape == rcnt.shape
    assert torch.equal(cnt, rcnt), "block_count differs from the reference"
    n = cfg.n_sel
    live = torch.arange(n) < cnt[..., None]
    assert torch.all(idx[~live] == -1), "padding must be -1"
    if n > 1:
        assert torch.all((idx[..., 1:] > idx[..., :-1]) | ~live[..., 1:]), "live ids must ascend"
    cur = (t_pos // cfg.l_sel)[None, :, None, None]
    assert torch.all((idx <= cur) | ~live), "a chosen block lies after the query's block"
    diff = (idx != ridx).any(-1)
    for b, t, g in diff.nonzero().tolist():
        got = set(idx[b, t, g].tolist()) - {-1}
        ref = set(ridx[b, t, g].tolist()) - {-1}
        assert _forced(S - T + t, cfg) <= got, (b, t, g, "forced block missing", sorted(got))
        s = s64[b, t, g]
        a = float(sum(s[j] for j in ref - got))
        c = float(sum(s[j] for j in got - ref))
        assert abs(a - c) < rel_tol * max(abs(a), 1e-300), (
            f"row (b={b}, t={t}, g={g}) is not a near-tie: kernel {sorted(got)} vs reference {sorted(ref)}, "
            f"scores of the differing blocks {c:.9g} vs {a:.9g}")
    rows, n_diff = diff.numel(), int(diff.sum())
    assert n_diff <= max_frac * rows, f"{n_diff} of {rows} rows differ (near-ties, but more than {max_frac:.1%})"
    return rows, n_diff


# (B, T, HQ, G, dk, (l, d, l_sel, n), S or None): T not a multiple of l, d, l'; T < l; h in {1, 2, 4, 16};
# l = l' = d; b = l/d > 2; a = l'/d not a power of 2; decode-like (queries the last T of S)
CASES = [
    (2, 77, 4, 2, 16, (4, 2, 8, 4), None),        # h=2, B=2
    (1, 93, 16, 1, 16, (8, 4, 16, 5), None),      # h=16
    (1, 61, 4, 1, 8, (8, 8, 8, 4), None),         # l = l' = d, h=4
    (1, 100, 1, 1, 16, (6, 2, 12, 5), None),      # h=1, a=6, b=3
    (1, 5, 4, 2, 8, (8, 4, 16, 4), None),         # T < l: nothing visible
    (1, 141, 8, 2, 32, (32, 16, 64, 3), None),    # paper geometry, n = 3 (only forced), h=4
    (1, 300, 2, 1, 16, (32, 16, 64, 5), None),    # paper geometry, h=2
    (1, 70, 4, 4, 16, (4, 4, 16, 6), None),       # b = 1, a = 4, h=1
    (2, 9, 4, 2, 16, (4, 2, 8, 4), 83),           # last 9 queries of 83 positions
]


def _case_id(c):
    B, T, HQ, G, dk, (l, d, ls, n), S = c
    return f"B{B}-T{T}-HQ{HQ}-G{G}-dk{dk}-l{l}-d{d}-ls{ls}-n{n}" + (f"-S{S}" if S else "")


@pytest.mark.parametrize("case", [pytest.param(c, id=_case_id(c)) for c in CASES])
def test_fused_choice_equals_reference(case):
    B, T, HQ, G, dk, (l, d, ls, n), S = case
    cfg = NSAConfig(l=l, d=d, l_sel=ls, n_sel=n)
    S = S or T
    q, k = _inputs(B, T, HQ, G, dk, seed=T * 7 + HQ, S=S, scale=1.5)
    kc = F.compress(k, cfg)
    idx, cnt = scoring.fused_select_blocks(q, kc, S, cfg)
    rows, n_diff = check_choice(idx, cnt, q, kc, S, cfg)
    assert rows == B * T * G


@pytest.mark.parametrize("BM,BC", [(32, 16), (64, 32), (512, 128)])
def test_launch_configs_same_choice(BM, BC):
    """Tiles of 2 .. 32 tokens (overlap map by broadcast-sum and by dot), 16 .. 128 compressed tokens
    per step, and a chunked score buffer: the same rule holds for each."""
    cfg = NSAConfig(l=8, d=4, l_sel=16, n_sel=5)
    q, k = _inputs(1, 150, 16, 2, 16, seed=BM + BC, scale=1.5)
    kc = F.compress(k, cfg)
    launch = {"score": {"BM": BM, "BM_fp32": BM, "BC": BC}}
    idx, cnt = scoring.fused_select_blocks_launch(q, kc, 150, cfg, config=launch, chunk=37)
    check_choice(idx, cnt, q, kc, 150, cfg)


def test_wide_rows_get_a_launch_that_fits_shared_memory():
    """fp32 with dk=192 (BK=256) asked Triton for 328 KiB of shared memory on the H100 (limit 227 KiB):
    the launch shrinks BM (then BC) until its estimate fits; the paper bf16 launch is unchanged. The
    smaller launch chooses as the reference does (interpreter, fp32, dk=192)."""
    cfg = NSAConfig(l=8, d=4, l_sel=16, n_sel=4)
    # fp32 starts at BM_fp32 = 64 rows (a 256-row IEEE tile compiled for ~100 s on the H100, then was refused)
    for dtype, dk, want_bm in ((torch.bfloat16, 128, 256), (torch.float32, 128, 64), (torch.float32, 192, 64),
                               (torch.bfloat16, 256, 256), (torch.float32, 256, 64)):
        q = torch.empty(1, 64, 64, dk, dtype=dtype)
        kc = torch.empty(1, 15, 4, dk, dtype=dtype)
        geo = scoring._geometry(q, kc, 64, cfg, scoring.CONFIG["score"])
        est = (geo["BT"] * geo["HP"] * geo["BK"] + geo["BC"] * geo["BK"] * 2) * q.element_size()
        assert est <= scoring.SMEM_BUDGET_BYTES and geo["BT"] * geo["HP"] == want_bm, (dtype, dk, geo)
    q, k = _inputs(1, 70, 8, 2, 192, seed=3, scale=1.5)
    kc = F.compress(k, cfg)
    idx, cnt = scoring.fused_select_blocks(q, kc, 70, cfg)
    check_choice(idx, cnt, q, kc, 70, cfg)


class _PickyKernel:
    """Stands in for _score_kernel: refuses (OutOfResources, as Triton does before a launch) any
    launch with more than ``max_rows`` query rows, else runs the real kernel (interpreter)."""

    def __init__(self, real, max_rows):
        self.real, self.max_rows, self.seen = real, max_rows, []

    def __getitem__(self, grid):
        def call(*args, **meta):
            rows = meta["BT"] * meta["HP"]
            self.seen.append((rows, meta["BC"]))
            if rows > self.max_rows:
                raise scoring.OutOfResources(rows * 1000, self.max_rows * 1000, "shared memory")
            return self.real[grid](*args, **meta)
        return call


def test_a_launch_refused_for_shared_memory_is_retried_smaller_and_remembered(monkeypatch):
    """On the H100, fp32 dk=128 with one head per group asked for 228 KiB (> 227 KiB) where the estimate
    said 192 KiB fits (triton-fwd/bwd ERROR, OutOfResources). The launcher halves BM until Triton
    accepts, the choice is still the reference's, and the next call starts at the launch that fit."""
    cfg = NSAConfig(l=8, d=4, l_sel=16, n_sel=4)
    picky = _PickyKernel(scoring._score_kernel, max_rows=32)
    monkeypatch.setattr(scoring, "_score_kernel", picky)
    monkeypatch.setattr(scoring, "_FITTED", {})
    q, k = _inputs(1, 80, 4, 4, 32, seed=5, scale=1.5)
    kc = F.compress(k, cfg)
    idx, cnt = scoring.fused_select_blocks(q, kc, 80, cfg)
    check_choice(idx, cnt, q, kc, 80, cfg)
    first = picky.seen[0][0]
    assert first > 32 and picky.seen[-1][0] <= 32, picky.seen  # refused, then smaller
    assert [r for r, _ in picky.seen] == sorted({r for r, _ in picky.seen}, reverse=True)  # each try halves
    picky.seen.clear()
    idx2, _ = scoring.fused_select_blocks(q, kc, 80, cfg)
    assert all(r <= 32 for r, _ in picky.seen) and torch.equal(idx2, idx)  # remembered: no refused launch


def test_a_launch_that_cannot_shrink_further_raises(monkeypatch):
    cfg = NSAConfig(l=8, d=4, l_sel=16, n_sel=4)
    monkeypatch.setattr(scoring, "_score_kernel", _PickyKernel(scoring._score_kernel, max_rows=0))
    monkeypatch.setattr(scoring, "_FITTED", {})
    q, k = _inputs(1, 40, 4, 4, 32, seed=6, scale=1.5)
    with pytest.raises(scoring.OutOfResources):
        scoring.fused_select_blocks(q, F.compress(k, cfg), 40, cfg)


def test_select_blocks_backends_agree_and_scale():
    cfg = NSAConfig(l=4, d=2, l_sel=8, n_sel=4)
    q, k = _inputs(1, 50, 4, 2, 8, seed=5)
    a = F.select_blocks(q, k, cfg, backend="triton", scale=0.3)
    b = F.select_blocks(q, k, cfg, backend="reference", scale=0.3)
    check_choice(*a, q, F.compress(k, cfg), 50, cfg, scale=0.3)
    assert torch.equal(a[1], b[1])
    # the scale matters (else the test above could not tell): another scale changes some rows
    c = F.select_blocks(q, k, cfg, backend="triton", scale=8.0)
    assert not torch.equal(a[0], c[0])
    with pytest.raises(ValueError, match="unknown backend"):
        F.select_blocks(q, k, cfg, backend="fast")


def test_auto_is_reference_off_cuda():
    cfg = NSAConfig(l=4, d=2, l_sel=8, n_sel=4)
    q, k = _inputs(1, 20, 2, 1, 8, seed=1)
    be, why = F.select_backend("auto", q, F.compress(k, cfg), 20, cfg)
    assert (be == "triton") == CUDA, why
    assert F.select_backend({"cmp": "flash"}, q, k, 20, cfg)[0] == be  # dict without "score": auto
    assert F.select_backend("sdpa", q, k, 20, cfg)[0] == "reference"
    from nsa_core import routing  # routing.json records the same choice

    rec = routing.decide(DEV).to_json()["selection_scoring"]
    assert rec["backend"] == be and rec["reason"]


def test_topn_kernel_alone_exact_with_ties():
    """Integer scores (many exact ties): the top-n kernel equals reference.topn_blocks exactly."""
    cfg = NSAConfig(l=4, d=2, l_sel=8, n_sel=5)
    B, T, G = 2, 90, 3
    NB = cfg.num_sel_blocks(T)
    gen = torch.Generator().manual_seed(0)
    sc = torch.randint(0, 4, (B, T, G, NB), generator=gen).float()
    idx, cnt = scoring.topn_from_scores(sc.to(DEV), T, cfg)
    ridx, rcnt = slc_ref.topn_blocks(sc, torch.arange(T), cfg)
    assert torch.equal(idx.cpu(), ridx) and torch.equal(cnt.cpu(), rcnt)
    # ties really occur among the chosen and the rejected blocks
    chosen = torch.zeros(B, T, G, NB + 1, dtype=torch.bool).scatter_(-1, ridx.long().clamp(min=-1) % (NB + 1), True)
    assert ((sc[..., :NB] == 2) & ~chosen[..., :NB]).any() and ((sc == 2) & chosen[..., :NB]).any()


def test_planted_bugs_are_caught():
    """The check fails on an off-by-one visibility kernel and on a missing forced block."""
    cfg = NSAConfig(l=4, d=2, l_sel=8, n_sel=4)
    q, k = _inputs(1, 64, 4, 2, 8, seed=9, scale=1.5)
    kc = F.compress(k, cfg)
    # off by one: the kernel believes every query sits one position later (sees one more token)
    idx, cnt = scoring.fused_select_blocks(q, kc, 65, cfg)
    with pytest.raises(AssertionError):
        check_choice(idx, cnt, q, kc, 64, cfg)
    # a wrong forced block: drop block t//l' - 1, take the best other block instead
    idx, cnt = scoring.fused_select_blocks(q, kc, 64, cfg)
    check_choice(idx, cnt, q, kc, 64, cfg)  # the real output passes
    s = F.block_scores(q, kc, 64, cfg).cpu()
    bad = idx.cpu().clone()
    for t in range(40, 64):  # cur >= n: some candidates stay unchosen
        cur = t // cfg.l_sel
        row = bad[0, t, 0]
        rest = [j for j in range(cur + 1) if j not in row.tolist()]
        assert rest
        new = set(row.tolist()) - {-1, cur - 1} | {max(rest, key=lambda j: float(s[0, t, 0, j]))}
        bad[0, t, 0] = torch.tensor(sorted(new) + [-1] * (cfg.n_sel - len(new)), dtype=torch.int32)
    with pytest.raises(AssertionError, match="forced"):
        check_choice(bad, cnt, q, kc, 64, cfg)


def test_input_checks():
    cfg = NSAConfig(l=4, d=2, l_sel=8, n_sel=4)
    q, k = _inputs(1, 20, 4, 2, 8, seed=2)
    kc = F.compress(k, cfg)
    with pytest.raises(ValueError, match="multiple of KV groups"):
        scoring.fused_select_blocks(q[:, :, :3], kc, 20, cfg)
    with pytest.raises(ValueError, match="S="):
        scoring.fused_select_blocks(q, kc, 10, cfg)
    with pytest.raises(ValueError, match="float32, float16, bfloat16"):
        scoring.fused_select_blocks(q.double(), kc.double(), 20, cfg)
    with pytest.raises(ValueError, match="disagree"):
        scoring.fused_select_blocks(q, kc[..., :4], 20, cfg)


def _lse64(q, kc, S, cfg, scale=None):
    """float64 log-sum-exp of each (query, head) over its visible compressed tokens (-inf: none)."""
    from nsa_core.compression import reference as cmp_ref

    B, T, HQ, dk = q.shape
    G = kc.shape[2]
    scale = dk ** -0.5 if scale is None else scale
    kx = kc.double().repeat_interleave(HQ // G, dim=2)
    s = torch.einsum("bthd,bchd->bthc", q.double(), kx) * scale
    vis = cmp_ref.cmp_visibility_mask(torch.arange(S - T, S, device=q.device), kc.shape[1], cfg)  # [T, Tc]
    return torch.logsumexp(s.masked_fill(~vis[None, :, None, :], float("-inf")), dim=-1)


# (B, T, HQ, G, dk, (l, d, l_sel, n), S, Tc kept): prefill; decode-like (chunk m0 > 0, queries
# the last T of S); fewer compressed tokens given than exist at S (the fold's "full" part)
LSE_CASES = [
    (2, 77, 4, 2, 16, (4, 2, 8, 4), None, None),
    (1, 93, 16, 1, 16, (8, 4, 16, 5), None, None),
    (1, 21, 4, 2, 8, (8, 4, 16, 4), 90, None),
    (1, 40, 8, 2, 16, (4, 2, 8, 4), 100, 30),
]


@pytest.mark.parametrize("case", LSE_CASES, ids=lambda c: f"T{c[1]}-S{c[6]}-Tc{c[7]}")
def test_lse_from_compressed_branch(case):
    """compressed_attention(return_lse=True) gives each query's log-sum-exp (the float64 one), and
    the fused scoring fed with it chooses as the reference does; a wrong lse changes the choice."""
    from nsa_core.compression import fast as cmp_fast

    B, T, HQ, G, dk, (l, d, ls, n), S, keep = case
    cfg = NSAConfig(l=l, d=d, l_sel=ls, n_sel=n)
    S = S or T
    q, k = _inputs(B, T, HQ, G, dk, seed=T + 3, S=S, scale=1.5)
    kc = F.compress(k, cfg)
    vc = torch.randn_like(kc)
    if keep:
        kc, vc = kc[:, :keep].contiguous(), vc[:, :keep].contiguous()
    o, lse = cmp_fast.compressed_attention(q, kc, vc, S, cfg, path="sdpa-math", return_lse=True)
    assert torch.allclose(o, cmp_fast.compressed_attention(q, kc, vc, S, cfg, path="sdpa-math"), atol=1e-5)
    ref = _lse64(q, kc, S, cfg).to(lse.device)
    assert lse.shape == (B, T, HQ) and lse.dtype == torch.float32
    assert torch.equal(torch.isinf(lse), torch.isinf(ref)) and bool(torch.isinf(ref).any() or S > T)
    fin = torch.isfinite(ref)
    assert torch.allclose(lse[fin].double(), ref[fin], atol=1e-5, rtol=1e-6)
    idx, cnt = scoring.fused_select_blocks(q, kc, S, cfg, lse=lse)
    check_choice(idx, cnt, q, kc, S, cfg)
    two_pass = scoring.fused_select_blocks(q, kc, S, cfg)
    assert torch.equal(idx, two_pass[0]) and torch.equal(cnt, two_pass[1])
    if HQ // G > 1:  # planted bug: head 0's lse 30 too small -> head 0 dominates its group's sum
        bad = lse.clone()
        bad[:, :, 0] -= 30.0
        assert not torch.equal(scoring.fused_select_blocks(q, kc, S, cfg, lse=bad)[0], idx)


def test_lse_from_compressed_branch_on_fa4_fake(monkeypatch):
    """The FA-4 path's return_lse (through a FAKE flash_attn.cute with the real signature, fp16) is
    unfolded like o: the float64 lse, and the scoring fed with it chooses as the reference does."""
    from nsa_core.compression import fast as cmp_fast
    from tests import _fake_flash as fake

    if CUDA:
        pytest.skip("the FAKE flash_attn.cute is a CPU stand-in (on a GPU the real path is test_gpu_cmp_lse_paths)")
    fake.install(monkeypatch)
    fake.present_on_cpu(monkeypatch)
    cfg = NSAConfig(l=8, d=4, l_sel=16, n_sel=4)
    for B, T, HQ, G, S in ((2, 70, 4, 2, None), (1, 13, 8, 2, 61)):
        S = S or T
        q, k = _inputs(B, T, HQ, G, 16, seed=S, S=S, dtype=torch.float16)
        kc = F.compress(k, cfg)
        o, lse = cmp_fast.compressed_attention(q, kc, torch.randn_like(kc), S, cfg, path="fa4", return_lse=True)
        ref = _lse64(q, kc, S, cfg).to(lse.device)
        fin = torch.isfinite(ref)
        assert torch.equal(torch.isinf(lse), torch.isinf(ref))
        assert torch.allclose(lse[fin].double(), ref[fin], atol=1e-5)
        idx, cnt = scoring.fused_select_blocks(q.float(), kc.float(), S, cfg, lse=lse)
        check_choice(idx, cnt, q.float(), kc.float(), S, cfg)


def test_lse_input_checks():
    cfg = NSAConfig(l=4, d=2, l_sel=8, n_sel=4)
    q, k = _inputs(1, 20, 4, 2, 8, seed=2)
    kc = F.compress(k, cfg)
    good = torch.zeros(1, 20, 4, device=DEV)
    for bad in (good[:, :19], good.double(), good[..., :3], "x"):
        with pytest.raises(ValueError, match="lse must be a float32 tensor"):
            scoring.fused_select_blocks(q, kc, 20, cfg, lse=bad)


def test_nsa_attention_feeds_cmp_lse_to_scoring(monkeypatch):
    """With the compressed branch on a flash path that returns lse and the fused scoring, nsa_attention
    hands the branch's lse to the scoring kernel; output and choice equal the all-reference run.
    (On CPU the flash path is the sdpa-math twin, routed in by hand.)"""
    from nsa_core.flash import pick as flash_pick

    monkeypatch.setattr(flash_pick, "_routed", lambda branch, device, S=None: "sdpa-math")
    seen = []
    real = scoring.fused_select_blocks
    monkeypatch.setattr(scoring, "fused_select_blocks", lambda *a, **kw: seen.append(kw.get("lse")) or real(*a, **kw))
    cfg = NSAConfig(l=4, d=2, l_sel=8, n_sel=4, w=8)
    B, T, HQ, G, dk = 1, 45, 4, 2, 8
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(B, T, HQ, dk, generator=gen).to(DEV)
    kv = [torch.randn(B, T, G, dk, generator=gen).to(DEV) for _ in range(6)]
    gates = torch.rand(B, T, HQ, 3, generator=gen).to(DEV)
    be = {"cmp": "flash", "slc": "reference", "win": "reference", "score": "triton"}
    o, (idx, cnt) = F.nsa_attention(q, *kv, gates, cfg, be, return_selection=True)
    assert len(seen) == 1 and seen[0] is not None and seen[0].shape == (B, T, HQ)
    o_ref, (ridx, rcnt) = F.nsa_attention(q, *kv, gates, cfg, "reference", return_selection=True)
    assert torch.equal(idx, ridx) and torch.equal(cnt, rcnt)
    assert torch.allclose(o, o_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device (the flash kernels' own lse)")
def test_gpu_cmp_lse_paths():
    """On the GPU: each SDPA path that returns lse gives the float64 one (bf16 tolerance), its output
    equals the public path's, and "auto" nsa_attention selects as the reference does."""
    from nsa_core.compression import fast as cmp_fast
    from nsa_core.flash import adapters

    cfg = NSAConfig()
    T = 4096
    q, k = _inputs(1, T, 64, 4, 128, seed=12, dtype=torch.bfloat16)
    kc = F.compress(k, cfg)
    vc = torch.randn_like(kc)
    ref = _lse64(q, kc, T, cfg)
    fin = torch.isfinite(ref)
    for path in ("sdpa-cudnn", "sdpa-flash"):
        if not adapters.status(path, "cuda")["present"]:
            continue
        o, lse = cmp_fast.compressed_attention(q, kc, vc, T, cfg, path=path, return_lse=True)
        assert lse is not None and torch.equal(torch.isinf(lse), torch.isinf(ref)), path
        assert (lse[fin].double() - ref[fin]).abs().max() < 2e-2, path
        o_pub = cmp_fast.compressed_attention(q, kc, vc, T, cfg, path=path)
        assert (o.float() - o_pub.float()).abs().max() < 2e-2, path
        idx, cnt = scoring.fused_select_blocks(q, kc, T, cfg, lse=lse)
        check_choice(idx, cnt, q, kc, T, cfg, rel_tol=1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device (bf16 at paper shapes)")
@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 1e-2), (torch.float32, 1e-5)])
def test_gpu_paper_shapes(dtype, tol):
    cfg = NSAConfig()  # l=32, d=16, l'=64, n=16
    T = 4096 if dtype == torch.bfloat16 else 2048
    q, k = _inputs(1, T, 64, 4, 128, seed=11, dtype=dtype)
    kc = F.compress(k, cfg)
    idx, cnt = scoring.fused_select_blocks(q, kc, T, cfg)
    rows, n_diff = check_choice(idx, cnt, q, kc, T, cfg, rel_tol=tol)
    a = F.select_blocks(q, k, cfg)  # "auto" on CUDA is the fused kernel
    assert torch.equal(a[0], idx) and torch.equal(a[1], cnt)
