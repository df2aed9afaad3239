"""The split decode step (issue 14, ``StaticDecoder(impl="split")``): two Triton launches, split-K in
both, sized from the SM count. Kernel 1: compressed chunks (per-tile block partials instead of logits;
the row's last chunk scores the blocks and picks the top-n) and window chunks; kernel 2: selected-block
programs, compressed-merge programs and, in the row's last program, the gated merge. In the interpreter
on CPU (fp32 / fp16, tiny shapes, fresh random inputs): decode == prefill, == the float64 reference
decode fed the step's selection, the selection == the float64 reference's own and the 6-launch step's,
counters == formula, the paged cache, exactly two launches, the per-row counters back to 0."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton", reason="triton not installed")

from nsa_core import NSAAttention, NSAConfig  # noqa: E402
from nsa_core.decode import kernels  # noqa: E402
from nsa_core.decode import reference as _decode  # noqa: E402
from nsa_core.decode.cache import formula_reads  # noqa: E402
from nsa_core.testing import compare  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
CFG = dict(l=8, d=4, l_sel=16, n_sel=4, w=16)


def _pair(dk=8, dv=6, phi="avg", seed=5, dim=32, hq=4, g=2, cfg=CFG):
    torch.manual_seed(seed)
    m64 = NSAAttention(dim, hq, g, dk, dv, NSAConfig(**cfg, phi=phi)).double()
    m = NSAAttention(dim, hq, g, dk, dv, NSAConfig(**cfg, phi=phi))
    m.load_state_dict(m64.state_dict())
    return m64, m


def _geometry(dec):
    return {k: v for k, v in dec._tri.split_geometry().items() if isinstance(v, int)}


def test_split_plan_fills_the_machine():
    """At the paper's decode shapes on 132 SMs (H100): kernel 1 has >= 2 programs per SM at B*G = 64 and
    at B*G = 4, chunks are whole tiles, the window is at most SPLIT_MAX_WIN programs, kernel 2's
    selected-block programs cover the n blocks."""
    for S, B in ((8192, 1), (65536, 1), (8192, 16), (65536, 16)):
        ccap, BG = (S - 32) // 16 + 1, 4 * B
        g = kernels.split_plan(ccap, 512, 16, BG, 16, 128, 4, 132)
        assert g["CH"] % g["BT"] == 0 and g["NCH"] * g["CH"] >= ccap and g["NW"] * g["WCH"] >= 512
        assert g["NW"] <= kernels.SPLIT_MAX_WIN and g["SPB"] * g["NSP"] >= 16
        if S == 65536:  # enough work to fill the machine: >= 2 programs per SM in kernel 1
            assert BG * (g["NCH"] + g["NW"]) >= 2 * 132, (S, B, g)
        assert g["NVS"] * g["BVC"] == 128
    with pytest.raises(ValueError, match="power of two"):
        kernels.split_plan(100, 64, 4, 2, 16, 16, 3, 4)


@pytest.mark.parametrize("phi", ["avg", "mlp"])
@pytest.mark.parametrize("dk,chunk", [(8, 16), (24, 16), (24, None)])
def test_split_step_matches_prefill(phi, dk, chunk):
    m64, m = _pair(dk=dk, phi=phi)
    x = torch.randn(2, 84, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    y_full, _ = m64(x)
    m = m.float().to(DEV)
    for T in (7, 30, 75):  # before the first compressed token, a block boundary ahead, past n blocks
        y, cache = m(x[:, :T].float().to(DEV), max_len=96)
        dec = m.decoder(cache, impl="split", chunk=chunk)
        if chunk:
            assert _geometry(dec)["NCH"] >= 2  # the last-arriver's scores span several chunks
        outs = [y] + [dec.step(x[:, k:k + 1].float().to(DEV)).clone() for k in range(T, T + 4)]
        r = compare(torch.cat(outs, 1), y_full[:, :T + 4], torch.float32)
        assert r.ok, f"split {phi} dk={dk} chunk={chunk} T={T}: {r}"
        for key, v in formula_reads(T + 4, m.cfg).items():
            assert (cache.reads[key] == v).all(), key
        assert int(dec._tri.split_geometry()["count"].abs().sum()) == 0  # reset for the next step / replay


def test_split_step_over_a_paged_cache():
    m64, m = _pair(seed=7)
    x = torch.randn(2, 60, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    y_full, _ = m64(x)
    m = m.float().to(DEV)
    y, cache = m(x[:, :41].float().to(DEV), max_len=64, page_size=4)
    dec = m.decoder(cache, impl="split", chunk=8)
    outs = [y] + [dec.step(x[:, k:k + 1].float().to(DEV)).clone() for k in range(41, 47)]
    r = compare(torch.cat(outs, 1), y_full[:, :47], torch.float32)
    assert r.ok, f"split paged: {r}"
    for key, v in formula_reads(47, m.cfg).items():
        assert (cache.reads[key] == v).all(), key


def _ref_step(m64, cache, x, S, blk):
    """The float64 reference decode at position S-1 over a float64 copy of the context (on the CPU),
    fed the selection blk [B, G, n] -> (y, the reference's own block ids [B, G, n] sorted, -1 padded)."""
    ref = cache.to(torch.float64, device="cpu")
    p = m64.project(x, S - 1)
    ref.append_(p.k_cmp[:, 0], p.v_cmp[:, 0], p.k_sel[:, 0], p.v_sel[:, 0], p.k_win[:, 0], p.v_win[:, 0])
    blk = blk.cpu()
    big = torch.iinfo(torch.int64).max
    srt = torch.sort(torch.where(blk >= 0, blk, big), -1).values
    idx = torch.where(srt == big, -1, srt).to(torch.int32)[:, None]
    cnt = (blk >= 0).sum(-1).to(torch.int32)[:, None]
    o, _, _ = _decode.attend(p.q, p.gates, ref, S - 1, m64.cfg, block_idx=idx, block_count=cnt)
    _, ridx, rcnt = _decode.attend(p.q, p.gates, ref, S - 1, m64.cfg)
    live = torch.where(torch.arange(ridx.shape[-1]) < rcnt[..., None], ridx.long(), -1)[:, 0]
    return m64.out(o), torch.sort(live, -1).values


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("S,chunk", [(90, 8), (250, 40), (250, None)])
def test_split_step_vs_reference_decode_and_the_six_launch_step(dtype, S, chunk, monkeypatch):
    """One step at a random-filled context (many blocks at S = 250: top-n among 15 candidates): the split
    step's output == the float64 reference decode fed its selection (dtype tolerance); its selection ==
    the 6-launch step's and (fp32) the float64 reference's own. chunk=40 with 16-key tiles: chunks of 3
    tiles, 2 of them hold the 61 visible compressed tokens (block partials across tile and chunk edges)."""
    monkeypatch.setattr(kernels, "SPLIT_BT", 16)
    m64, m = _pair(dk=24, dv=16, hq=8, g=2, dim=48, seed=11 + S)
    m = m.to(dtype=dtype, device=DEV)
    gen = torch.Generator(device=DEV).manual_seed(S)
    cache = m.new_cache(2, 256, dtype=dtype)
    cache.fill_random_(S - 1, generator=gen)
    other, ctx = cache.clone(), cache.clone()  # ctx: the context before the step, for the reference
    x = torch.randn(2, 1, 48, dtype=torch.float64, generator=torch.Generator().manual_seed(S + 1))
    dec = m.decoder(cache, impl="split", chunk=chunk)
    if chunk == 40:
        assert (_geometry(dec)["CH"], _geometry(dec)["BT"]) == (48, 16)
    y = dec.step(x.to(dtype=dtype, device=DEV)).clone()
    six = m.decoder(other, impl="triton", chunk=8)
    six.step(x.to(dtype=dtype, device=DEV))
    assert torch.equal(torch.sort(dec.blk, -1).values, torch.sort(six.blk, -1).values)
    y_ref, ref_blk = _ref_step(m64, ctx, x, S, dec.blk)
    r = compare(y, y_ref, dtype)
    assert r.ok, f"split {dtype} S={S} vs float64 reference: {r}"
    if dtype == torch.float32:
        assert torch.equal(torch.sort(dec.blk.cpu(), -1).values, ref_blk)
    for key, v in formula_reads(S, m.cfg).items():
        assert (cache.reads[key] == v).all(), key


def test_split_geometry_variants(monkeypatch):
    """Several selected blocks per program (SPB > 1), several window programs, narrow merge slices (the
    final merge and the compressed merge in several slices): still the reference's step."""
    monkeypatch.setattr(kernels, "SPLIT_MERGE_ELEMS", 64)
    monkeypatch.setattr(kernels, "SPLIT_SEL_PROGRAMS_PER_SM", 1)
    cfg = dict(l=8, d=4, l_sel=16, n_sel=6, w=48)
    m64, m = _pair(dk=16, dv=16, hq=4, g=2, dim=32, seed=3, cfg=cfg)
    m = m.float().to(DEV)
    S = 200
    cache = m.new_cache(2, 256)
    cache.fill_random_(S - 1, generator=torch.Generator(device=DEV).manual_seed(9))
    x = torch.randn(2, 1, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    ctx = cache.clone()
    dec = m.decoder(cache, impl="split", chunk=16)
    g = _geometry(dec)
    if DEV == "cpu":  # 4 SMs assumed on the CPU: 1 selected program per SM -> SPB > 1
        assert g["SPB"] > 1 and g["NW"] > 1 and g["NVS"] > 1 and g["BVF"] < 16, g
    y = dec.step(x.float().to(DEV)).clone()
    y_ref, ref_blk = _ref_step(m64, ctx, x, S, dec.blk)
    r = compare(y, y_ref, torch.float32)
    assert r.ok, f"split variants: {r}"
    assert torch.equal(torch.sort(dec.blk.cpu(), -1).values, ref_blk)


def test_split_attn_part_is_two_launches(monkeypatch):
    """The attention part launches exactly the two split kernels (phi avg)."""
    _, m = _pair()
    m = m.float().to(DEV)
    _, cache = m(torch.randn(2, 20, 32).to(DEV), max_len=32)
    dec = m.decoder(cache, impl="split")
    launched = []
    for name in [n for n in vars(kernels) if n.endswith("_kernel")]:
        k = getattr(kernels, name)

        class Spy:
            def __init__(self, k, name):
                self.k, self.name = k, name

            def __getitem__(self, grid):
                launched.append(self.name)
                return self.k[grid]

        monkeypatch.setattr(kernels, name, Spy(k, name))
    proj = dec.project(dec.x)
    dec.pos.fill_(20)
    dec.attn(*proj)
    assert launched == ["_split_cmp_win_kernel", "_split_sel_kernel"]


@pytest.mark.skipif(DEV != "cuda", reason="CUDA graphs")
def test_split_graph_replays_match_reference_bf16():
    """On the GPU: the split step captured in a CUDA graph, replayed at several positions, bf16 against
    the float64 reference fed the same selection (the last-arriver counters under real concurrency)."""
    cfg = dict(l=32, d=16, l_sel=64, n_sel=16, w=512)
    m64, m = _pair(dk=192, dv=128, hq=64, g=4, dim=256, seed=1, cfg=cfg)
    m = m.to(dtype=torch.bfloat16, device=DEV)
    for B, S in ((1, 8192), (4, 20000)):
        cache = m.new_cache(B, S + 8, dtype=torch.bfloat16)
        cache.fill_random_(S - 1, generator=torch.Generator(device=DEV).manual_seed(S))
        dec = m.decoder(cache, impl="split")
        dec.capture()
        for k in range(3):
            x = torch.randn(B, 1, 256, dtype=torch.float64, generator=torch.Generator().manual_seed(k))
            ctx = cache.clone()
            y = dec.step(x.to(dtype=torch.bfloat16, device=DEV)).clone()
            y_ref, _ = _ref_step(m64, ctx, x, S + k, dec.blk)
            r = compare(y, y_ref, torch.bfloat16)
            assert r.ok, f"split bf16 graph B={B} S={S + k}: {r}"
            assert int(dec._tri.split_geometry()["count"].abs().sum()) == 0


@pytest.mark.skipif(DEV != "cpu", reason="the interpreter run is the CPU check")
def test_decode_bench_compares_kernels_in_one_run(tmp_path):
    """decode-bench --kernel split,triton: one row per kernel at each point, both checked (parity vs
    float64 with the kernel's own selection, counters = formula), the same full-attention baseline,
    each kernel's shares summing to 100%; a bad kernel name is refused."""
    import pandas as pd

    from nsa_runner.stage import Status
    from stages.decode_bench import DecodeBench

    opts = {o.dest: o.default for o in DecodeBench.options}
    opts.update(S_list=[300], batch_list=[1], iters=1, warmup=0, kernel="split,triton", profile_passes=1)
    from types import SimpleNamespace

    res = DecodeBench().run(SimpleNamespace(dir=tmp_path, device="cpu", profile="quick", options=opts, run_id="t"))
    assert res.status == Status.PASS, res.reason
    df = pd.read_csv(tmp_path / "decode.csv")
    assert df.kernel.tolist() == ["split", "triton"] and (df.status == "PASS").all()
    assert df.ms_full.nunique() == 1 and (df.parity_rel_err <= df.parity_tol).all()
    assert df.share_sum.tolist() == pytest.approx([100.0, 100.0], abs=1e-6)
    want = formula_reads(300, NSAConfig(l=16, d=8, l_sel=32, n_sel=8, w=128))
    assert (df.reads_total == sum(want.values())).all()
    opt = {o.flag: o for o in DecodeBench.options}["--kernel"]
    assert opt.convert("split, triton") == "split,triton"
    with pytest.raises(ValueError, match="not one of"):
        opt.convert("split,cuda")


@pytest.mark.skipif(DEV != "cpu", reason="the interpreter run is the CPU check")
def test_decode_bench_a_kernel_that_raises_fails_the_stage_but_keeps_the_others(tmp_path, monkeypatch):
    """With several kernels, one whose step raises is a FAIL naming it; the other kernel's row is
    still measured and written."""
    import pandas as pd

    from nsa_core.decode import kernels as K
    from nsa_runner.stage import Status
    from stages.decode_bench import DecodeBench

    def broken(self, *a, **kw):
        raise RuntimeError("split kernel broke")

    monkeypatch.setattr(K.Workspace, "split", broken)
    opts = {o.dest: o.default for o in DecodeBench.options}
    opts.update(S_list=[300], batch_list=[1], iters=1, warmup=0, kernel="split,torch", profile_passes=1)
    from types import SimpleNamespace

    res = DecodeBench().run(SimpleNamespace(dir=tmp_path, device="cpu", profile="quick", options=opts, run_id="t"))
    assert res.status == Status.FAIL and "kernel split" in res.reason and "split kernel broke" in res.reason
    df = pd.read_csv(tmp_path / "decode.csv")
    assert df.kernel.tolist() == ["torch"] and df.status.tolist() == ["PASS"]


def test_split_step_at_the_paper_geometry():
    """The paper's geometry and head dims (l=32, d=16, l'=64, n=16, w=512; h=16, dk=192 = 128 + 64, dv=128),
    fp32, at S=1500 (92 compressed tokens, 24 candidate blocks for 16 slots): 64-key tiles of 16 blocks,
    several chunks and window programs; == the float64 reference fed the step's selection, the selection
    == the reference's own and the 6-launch step's."""
    cfg = dict(l=32, d=16, l_sel=64, n_sel=16, w=512)
    m64, m = _pair(dk=192, dv=128, hq=32, g=2, dim=64, seed=21, cfg=cfg)
    m = m.float().to(DEV)
    S = 1500
    cache = m.new_cache(1, 1536)
    cache.fill_random_(S - 1, generator=torch.Generator(device=DEV).manual_seed(2))
    ctx, other = cache.clone(), cache.clone()
    x = torch.randn(1, 1, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    dec = m.decoder(cache, impl="split")
    g = _geometry(dec)
    assert g["BT"] == 64 and g["NW"] >= 2 and g["NCH"] >= 2, g
    y = dec.step(x.float().to(DEV)).clone()
    six = m.decoder(other, impl="triton")
    six.step(x.float().to(DEV))
    assert torch.equal(torch.sort(dec.blk, -1).values, torch.sort(six.blk, -1).values)
    y_ref, ref_blk = _ref_step(m64, ctx, x, S, dec.blk)
    r = compare(y, y_ref, torch.float32)
    assert r.ok, f"split at the paper geometry: {r}"
    assert torch.equal(torch.sort(dec.blk.cpu(), -1).values, ref_blk)
    for key, v in formula_reads(S, m.cfg).items():
        assert (cache.reads[key] == v).all(), key
