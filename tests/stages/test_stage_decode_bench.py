"""Stage decode-bench on CPU, in-process: files, CSV columns, counters = formula, FAIL paths."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

if not torch.cuda.is_available():  # as the executor does: before triton is first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

from nsa_runner.stage import Status  # noqa: E402
from stages import decode_bench  # noqa: E402
from stages.decode_bench import COLUMNS, DecodeBench  # noqa: E402

FILES = {"decode_bench.txt", "decode.csv", "decode_summary.txt", "decode.png"}


def _ctx(tmp_path, **opts):
    options = {o.dest: o.default for o in DecodeBench.options}
    options.update(opts)
    return SimpleNamespace(dir=tmp_path, device="cpu", profile="quick", options=options, run_id="t")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("decode")
    res = DecodeBench().run(_ctx(d))
    return d, res


def test_quick_profile_passes_and_writes_everything(quick_run):
    d, res = quick_run
    assert res.status == Status.PASS, res.reason
    assert set(res.files) == FILES
    for f in FILES:
        assert (d / f).stat().st_size > 0, f
    df = pd.read_csv(d / "decode.csv")
    assert list(df.columns) == COLUMNS
    assert len(df) == 4 and sorted(set(df.S)) == [256, 1024] and sorted(set(df.B)) == [1, 2]
    from nsa_core import NSAConfig
    from nsa_core.decode.cache import formula_reads, paper_bound

    cfg = NSAConfig(**decode_bench.parse_nsa(decode_bench.DEFAULTS["cpu"]["nsa"]))
    for _, r in df.iterrows():
        want = formula_reads(int(r.S), cfg)
        assert (r.reads_cmp, r.reads_sel, r.reads_win) == (want["cmp"], want["sel"], want["win"])
        assert r.reads_total == sum(want.values()) and r.reads_full == r.S
        assert r.reads_bound == pytest.approx(paper_bound(int(r.S), cfg))
        for c in ("ms_step", "ms_attn", "ms_cmp", "ms_sel", "ms_win", "ms_shared", "ms_other", "ms_full",
                  "ms_profiled"):
            assert r[c] > 0 and r[c] < 1e4, (c, r[c])
        assert r.speedup == pytest.approx(r.ms_full / r.ms_attn)
        # the shares partition one profiled pass of the step: they sum to 100% by construction, and
        # the parts' times sum to the pass
        shares = [r[f"share_{k}"] for k in decode_bench.SHARE_PARTS]
        assert r.share_sum == pytest.approx(sum(shares)) and r.share_sum == pytest.approx(100.0, abs=1e-6)
        assert sum(r[f"ms_{k}"] for k in decode_bench.SHARE_PARTS) == pytest.approx(r.ms_profiled, rel=1e-9)
        assert all(x >= 0 for x in shares) and r.share_method.startswith("torch.profiler")
        assert r.parity_rel_err <= r.parity_tol and r.fill == "prefill" and r.kernel == "torch"
        assert r.impl == "nsa_core" and r.status == "PASS"
    # S=1024 with n_sel=8 blocks of 32: top-n really picks 8 of 32 blocks
    assert int(df[df.S == 1024].reads_sel.iloc[0]) == 8 * 32
    text = (d / "decode_bench.txt").read_text()
    assert "prefill of S-1 tokens" in text and "counters == formula" in text
    assert "PASS" in (d / "decode_summary.txt").read_text()


def test_corrupted_counters_fail(tmp_path, monkeypatch):
    """An off-by-one in the counters the stage reads must turn it FAIL, naming the counter."""
    from nsa_core.decode import cache as cache_mod

    real = cache_mod.read_counts

    def off_by_one(*a, **k):
        r = real(*a, **k)
        r["sel"] = r["sel"] + 1
        return r

    monkeypatch.setattr(cache_mod, "read_counts", off_by_one)
    res = DecodeBench().run(_ctx(tmp_path, S_list=[300], batch_list=[1], iters=1, warmup=0))
    assert res.status == Status.FAIL
    assert "reads_sel" in res.reason and "formula" in res.reason
    assert (tmp_path / "decode.csv").exists() and "FAIL" in (tmp_path / "decode_bench.txt").read_text()


def test_non_finite_output_fails(tmp_path, monkeypatch):
    """A step that produces NaN must FAIL (parity and the finiteness check both catch it)."""
    from nsa_core.decode import static as _decode_fast

    real = _decode_fast.StaticDecoder.combine

    def poisoned(self, *a, **k):
        o = real(self, *a, **k)
        return o * float("nan")

    monkeypatch.setattr(_decode_fast.StaticDecoder, "combine", poisoned)
    res = DecodeBench().run(_ctx(tmp_path, S_list=[300], batch_list=[1], iters=1, warmup=0))
    assert res.status == Status.FAIL
    assert "non-finite" in (tmp_path / "decode_bench.txt").read_text()


def test_random_fill_is_reported(tmp_path):
    res = DecodeBench().run(_ctx(tmp_path, S_list=[400], batch_list=[2], iters=1, warmup=0, fill="random"))
    assert res.status == Status.PASS, res.reason
    df = pd.read_csv(tmp_path / "decode.csv")
    assert df.fill.tolist() == ["random"]
    assert "direct cache fill with random data" in (tmp_path / "decode_bench.txt").read_text()


@pytest.mark.parametrize("opts, match", [
    (dict(dk=31), "even"),
    (dict(S_list=[1]), ">= 2"),
    (dict(dtype="fp8"), "dtype"),
])
def test_bad_options_raise_value_error(tmp_path, opts, match):
    with pytest.raises(ValueError, match=match):
        DecodeBench().run(_ctx(tmp_path, **opts))
    assert not (tmp_path / "decode.csv").exists()


def test_option_parsers():
    from nsa_runner.stage import int_list

    opt = {o.flag: o for o in DecodeBench.options}
    assert opt["--S-list"].convert("4k,64K") == [4096, 65536] and opt["--S-list"].parse is int_list
    assert decode_bench.parse_nsa("l=16,d=8,l_sel=32,n_sel=8,w=128")["l_sel"] == 32
    with pytest.raises(ValueError, match="d must divide"):
        decode_bench.parse_nsa("l=16,d=5,l_sel=32,n_sel=8,w=128")
    with pytest.raises(ValueError, match="key=value"):
        decode_bench.parse_nsa("block=3")
    with pytest.raises(ValueError):
        opt["--iters"].convert("0")
    with pytest.raises(ValueError, match="not one of"):
        opt["--kernel"].convert("cuda")
    assert opt["--kernel"].default == "auto" and opt["--impl"].default == "nsa_core"
    with pytest.raises(ValueError, match="unknown implementation"):
        opt["--impl"].convert("torch")  # a kernel name is not an implementation
    assert DecodeBench.name == "decode-bench" and DecodeBench.order == 60


@pytest.mark.parametrize("fill", ["prefill", "random"])
def test_paged_cache_option(tmp_path, fill):
    """--page-size: the step runs over a paged raw KV cache (block table); counters, parity and the
    shares' partition hold as for the dense cache."""
    res = DecodeBench().run(_ctx(tmp_path, S_list=[300], batch_list=[2], iters=1, warmup=0, fill=fill, page_size=16))
    assert res.status == Status.PASS, res.reason
    df = pd.read_csv(tmp_path / "decode.csv")
    assert df.kernel.tolist() == ["torch/paged16"] and df.fill.tolist() == [fill]
    assert df.share_sum.iloc[0] == pytest.approx(100.0, abs=1e-6)
    assert df.parity_rel_err.iloc[0] <= df.parity_tol.iloc[0]


def test_a_partition_with_a_negative_part_fails_the_stage(tmp_path, monkeypatch):
    """Shares that sum to 100% only through a negative remainder (kernels double-counted, as raw PDL kernel
    times were) are a FAIL naming the part, not a PASS."""
    from nsa_runner.measure import timing

    real = timing.profile_partition

    def overlapping(*a, **kw):
        p = real(*a, **kw)
        extra = p.total  # charge the step twice over to one label: the remainder goes negative
        parts = {**p.parts, "other": p.parts.get("other", 0.0) + extra,
                 timing.REMAINDER: p.parts.get(timing.REMAINDER, 0.0) - extra}
        return timing.Partition(parts, p.total, p.items, p.method, p.passes)

    monkeypatch.setattr(timing, "profile_partition", overlapping)
    res = DecodeBench().run(_ctx(tmp_path, S_list=[300], batch_list=[1], iters=1, warmup=0, profile_passes=1))
    assert res.status == Status.FAIL
    log = (tmp_path / "decode_bench.txt").read_text() + res.reason
    assert "negative share" in log and "remainder" in log


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter run is the CPU check")
def test_fused_impl_runs_in_the_interpreter(tmp_path):
    """--kernel fused (two launches) on CPU: parity vs float64, counters, the partition sums to 100%."""
    pytest.importorskip("triton")
    res = DecodeBench().run(_ctx(tmp_path, S_list=[300], batch_list=[1], iters=1, warmup=0, kernel="fused",
                                 profile_passes=1))
    assert res.status == Status.PASS, res.reason
    r = pd.read_csv(tmp_path / "decode.csv").iloc[0]
    assert r.kernel == "fused" and r.parity_rel_err <= r.parity_tol
    assert r.share_sum == pytest.approx(100.0, abs=1e-6) and r.share_shared > 0


def test_fa4_full_decode_baseline_maps_the_group_rows(monkeypatch):
    """decode-bench's FA-4 baseline lays the h query heads of each KV group out as FA-4's GQA
    heads (head g*h + i reads KV head g): on the FAKE flash_attn.cute (float64 math) its output
    equals per-group attention over the same keys, and without the package it says why."""
    from nsa_core.flash import adapters
    from tests import _fake_flash as fake

    g = torch.Generator().manual_seed(3)
    B, G, h, S, dk, dv = 2, 2, 3, 29, 24, 16
    qf = torch.randn(B, G, h, dk, generator=g).half()
    kf, vf = torch.randn(B, G, S, dk, generator=g).half(), torch.randn(B, G, S, dv, generator=g).half()
    scale = dk ** -0.5
    assert isinstance(decode_bench._fa4_full(qf, kf, vf, scale, "cpu"), str)  # no package on CPU: why
    fake.install(monkeypatch)
    fake.present_on_cpu(monkeypatch, paths=("fa4",))
    fn = decode_bench._fa4_full(qf, kf, vf, scale, "cpu")
    assert callable(fn), fn
    ref = torch.softmax((qf.double() @ kf.double().transpose(-1, -2)) * scale, -1) @ vf.double()
    got = fn()
    assert got.shape == (B, G, h, dv)
    assert (got.double() - ref).abs().max().item() < 2e-3
    assert adapters.status("fa4", "cpu")["present"]


def test_quick_profile_on_cuda_measures_two_lengths_with_fewer_replays():
    """--profile quick on a GPU is the smoke check: the paper's shape at 4K and 64K, not the full
    run's five lengths (it measured all ten points under quick before, 33 s on the H100)."""
    st = decode_bench.DecodeBench()
    defaults = {o.dest: o.default for o in st.options}
    ctx = lambda profile, **opts: SimpleNamespace(dir=".", device="cuda", profile=profile,  # noqa: E731
                                                  options={**defaults, **opts}, run_id="t")
    quick, full = st.resolve(ctx("quick")), st.resolve(ctx("full"))
    assert quick["S_list"] == [4096, 65536] and full["S_list"] == [4096, 8192, 16384, 32768, 65536]
    assert quick["batch_list"] == full["batch_list"] == [1, 16] and quick["dk"] == full["dk"] == 192
    assert quick["iters"] < full["iters"] and quick["profile_passes"] < full["profile_passes"]
    assert st.resolve(ctx("quick", S_list=[8192]))["S_list"] == [8192]  # an explicit option wins
