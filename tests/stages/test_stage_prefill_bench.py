"""Stage prefill-bench on CPU: a quick run through the CLI (executor, entry point) writes the three
files with the right columns; the parity gate FAILs a planted wrong output or selection with no
timing rows; the parts-add-up check and the selection check can fail; bad options are refused."""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (the default backend uses it)

from nsa_runner.stage import Status
from stages import prefill_bench as pb
from stages.prefill_bench import COLUMNS, PrefillBench

FILES = {"prefill.csv", "prefill.txt", "prefill.png"}


def _ctx(tmp_path, device="cpu", profile="quick", **opts):
    options = {o.dest: o.default for o in PrefillBench.options}
    options.update(opts)
    return SimpleNamespace(dir=tmp_path, device=device, profile=profile, options=options, run_id="t")


# ---- a quick CPU run through the CLI ---------------------------------------------------------

@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    from typer.testing import CliRunner

    from nsa_runner.cli import app
    from nsa_runner.commands import _common

    mp = pytest.MonkeyPatch()
    mp.setattr(_common, "current_run_id", lambda: "prefillrun")
    out = tmp_path_factory.mktemp("out")
    try:
        r = CliRunner().invoke(app, ["stage", "prefill-bench", "--out", str(out), "--device", "cpu",
                                     "--rep-ms", "60", "--seed", "3"], catch_exceptions=False)
    finally:
        mp.undo()
    return r, out / "prefillrun"


def test_quick_cpu_run_passes_and_writes_the_three_files(cli_run):
    r, run = cli_run
    assert r.exit_code == 0, r.stdout
    from nsa_runner.artifacts import load_manifest

    (st,) = load_manifest(run)["stages"]
    assert (st["name"], st["status"]) == ("prefill-bench", "PASS"), st
    assert set(st["files"]) == FILES and st["reason"].startswith("T=256: NSA fwd")
    for f in FILES:
        assert (run / f).stat().st_size > 0, f
    df = pd.read_csv(run / "prefill.csv")
    assert list(df.columns) == COLUMNS
    assert sorted(set(df["T"])) == [128, 256] and set(df["pass"]) == {"fwd", "fwd+bwd"}
    assert set(df["device"]) == {"cpu"} and set(df["dtype"]) == {"fp32"}
    assert set(df["path"]) == {"nsa", "sdpa-default", "full-fastest"}
    assert not df.duplicated(subset=["T", "path", "part", "pass"]).any()
    for T in (128, 256):
        for pas in ("fwd", "fwd+bwd"):
            g = df[(df["T"] == T) & (df["pass"] == pas)]
            whole = g[(g.path == "nsa") & (g.part == "whole")].iloc[0]
            parts = g[(g.path == "nsa") & (g.part != "whole")]
            assert {"compress", "select", "cmp", "slc", "win", "gate"} <= set(parts.part)
            assert (parts.ms >= 0).all() and whole.ms > 0 and (g.p20 <= g.p80 + 1e-12).all()
            assert whole.parts_sum_ms == pytest.approx(parts.ms.sum(), rel=1e-9)
            assert whole.parts_ratio == pytest.approx(whole.parts_sum_ms / whole.ms)
            full = g[g.path == "sdpa-default"].iloc[0]
            fastest = g[g.path == "full-fastest"].iloc[0]
            assert fastest.ms == full.ms and fastest.note == "= sdpa-default"
            assert whole.speedup_vs_fastest_full == pytest.approx(full.ms / whole.ms)
            assert math.isnan(whole.speedup_vs_sdpa_flash)  # no SDPA flash backend on CPU: not made up
    assert (df[(df.part == "select") & (df["pass"] == "fwd")].ms > 0).all()


def test_txt_says_how_it_was_measured_and_how_to_replay(cli_run):
    _, run = cli_run
    text = (run / "prefill.txt").read_text()
    assert "parity gate (float64 reference" in text and "selection: 0 of 400 rows differ" in text
    assert "0 differ from the all-float64 reference" in text
    assert "consecutive regions of ONE instrumented nsa_attention pass" in text
    assert "seed 3; replay: nsa-run stage prefill-bench --seed 3 --device cpu --profile quick --T-list 128,256" in text
    assert "fla: fla's kernels run on CUDA only" in text and "NO sliding window" in text
    assert "fwd: NSA parts" in text and "sum/whole" in text and "headline: T=256" in text
    for what in pb.GRAD_NAMES:
        assert f" {what} " in text


# ---- the parity gate -------------------------------------------------------------------------

SMALL = dict(T_list=[96], parity_T=[200], iters=2, warmup_ms=1.0)  # T=200: 7 blocks, n=4


def test_planted_wrong_branch_fails_the_gate_with_no_timing_rows(tmp_path, monkeypatch):
    """A sliding branch 1% off in the fast path (the float64 reference untouched) must FAIL the
    stage before anything is timed."""
    from nsa_core import functional as F

    real = F.sliding_attention

    def wrong(q, k, v, cfg, backend="reference", **kw):
        o = real(q, k, v, cfg, backend, **kw)
        return o if backend == "reference" or q.dtype == torch.float64 else o * 1.01

    monkeypatch.setattr(F, "sliding_attention", wrong)
    timed = []
    monkeypatch.setattr(pb, "measure_T", lambda *a, **k: timed.append(a) or ([], [], []))
    res = PrefillBench().run(_ctx(tmp_path, **SMALL, backend="auto"))
    assert res.status == Status.FAIL and "parity gate failed" in res.reason and "[auto] o:" in res.reason
    assert timed == []  # nothing was timed
    df = pd.read_csv(tmp_path / "prefill.csv")
    assert list(df.columns) == COLUMNS and len(df) == 0
    assert "prefill.png" not in res.files and not (tmp_path / "prefill.png").exists()
    text = (tmp_path / "prefill.txt").read_text()
    assert "PARITY FAILED: no timings" in text and "FAIL" in text


def test_planted_wrong_selection_fails_the_gate(tmp_path, monkeypatch):
    """Top-n on perturbed scores in the fast (fp32) path only: other blocks, not near-ties -> FAIL."""
    from nsa_core.selection import reference as sref

    real = sref.topn_blocks

    def wrong(scores, t_pos, cfg):
        if scores.dtype != torch.float64:
            scores = scores + torch.rand(scores.shape, generator=torch.Generator().manual_seed(0)).to(scores)
        return real(scores, t_pos, cfg)

    monkeypatch.setattr(sref, "topn_blocks", wrong)
    res = PrefillBench().run(_ctx(tmp_path, **SMALL, backend="auto"))  # auto on CPU: the torch top-n
    assert res.status == Status.FAIL and "selection" in res.reason and "not near-ties" in res.reason
    assert len(pd.read_csv(tmp_path / "prefill.csv")) == 0


def _sel(idx_rows, n=4):
    """block_idx [1, T, 1, n] / count from python lists of ids per t."""
    T = len(idx_rows)
    idx = torch.full((1, T, 1, n), -1, dtype=torch.int32)
    cnt = torch.zeros(1, T, 1, dtype=torch.int32)
    for t, ids in enumerate(idx_rows):
        idx[0, t, 0, :len(ids)] = torch.tensor(ids, dtype=torch.int32)
        cnt[0, t, 0] = len(ids)
    return idx, cnt


def test_selection_check_accepts_near_ties_only():
    from nsa_core import NSAConfig

    cfg = NSAConfig(l=16, d=8, l_sel=16, n_sel=4, w=64)
    T = 5 * 16  # rows t >= 64: 5 candidates, forced {0, 3, 4}, one free slot between blocks 1 and 2
    ref_rows = [list(range(t // 16 + 1)) if t < 64 else [0, 2, 3, 4] for t in range(T)]
    ref_idx, ref_cnt = _sel(ref_rows)
    scores = torch.tensor([0.5, 0.2, 0.2 + 1e-9, 0.1, 0.1], dtype=torch.float64).expand(1, T, 1, 5).clone()
    check = lambda rows, sc=scores: pb.check_selection(*_sel(rows), ref_idx, ref_cnt, sc, cfg, 1e-5)  # noqa: E731

    def edit(t, ids, rows=ref_rows):
        out = [list(r) for r in rows]
        out[t] = ids
        return out

    assert check(ref_rows)["problems"] == [] and check(ref_rows)["differ"] == 0
    r = check(edit(70, [0, 1, 3, 4]))  # block 1 instead of 2: scores 0.2 vs 0.2 + 1e-9, a near-tie
    assert r["differ"] == 1 and r["near_ties"] == 1 and r["problems"] == []
    far = scores.clone()
    far[..., 1] = 0.05  # now block 1 is clearly worse: not a tie
    assert "not near-ties" in check(edit(70, [0, 1, 3, 4]), far)["problems"][0]
    many = ref_rows[:64] + [[0, 1, 3, 4]] * 16  # 16 near-ties of 80 rows > max(1, 0.1%)
    assert "too many" in check(many)["problems"][0]
    assert "forced the current block" in check(edit(70, [0, 1, 2, 3]))["problems"][0]
    assert "forced the previous block" in check(edit(70, [0, 1, 2, 4]))["problems"][0]
    assert "forced block 0" in check(edit(70, [1, 2, 3, 4]))["problems"][0]
    assert "outside 0..t//l'" in check(edit(5, [1]))["problems"][0]
    assert "block_count differs" in check(edit(70, [0, 3, 4]))["problems"][0]
    assert "ascending" in check(edit(70, [0, 3, 2, 4]))["problems"][0]


def test_fed_reference_equals_the_reference_on_its_own_selection():
    """The oracle used after near-ties (float64 Eq. 5 with given block ids) is nsa_attention's reference."""
    from nsa_core import NSAConfig
    from nsa_core import functional as F

    o = PrefillBench().resolve(_ctx("."))
    cfg = NSAConfig(**o["nsa"])
    ins, _ = pb.make_inputs(150, o, "cpu", torch.float64, 5)
    ref, (idx, cnt) = F.nsa_attention(*ins, cfg, backend="reference", return_selection=True)
    assert int(cnt.max()) == cfg.n_sel and int(cnt.max()) < 150 // cfg.l_sel + 1  # a real choice was made
    fed = pb._reference_fed(ins, idx, cnt, cfg)
    assert torch.allclose(fed, ref, rtol=0, atol=1e-12)
    other = idx.clone()
    other[0, -1, 0, 1] = (int(other[0, -1, 0, 1]) + 1) % (149 // cfg.l_sel)  # another block for the last row
    assert not torch.allclose(pb._reference_fed(ins, other, cnt, cfg), ref, rtol=0, atol=1e-6)


# ---- the parts-add-up check --------------------------------------------------------------------

def test_parts_check_bounds():
    assert pb.parts_check(1.0, 0.1) and pb.parts_check(1.09, 0.1) and pb.parts_check(0.91, 0.1)
    assert not pb.parts_check(1.2, 0.1) and not pb.parts_check(0.8, 0.1)
    assert not pb.parts_check(float("nan"), 0.1) and not pb.parts_check(float("inf"), 0.1)


def test_instrumentation_that_perturbs_the_pass_fails_the_parts_check(tmp_path, monkeypatch):
    """Instrumentation that slows the pass (here: 30 ms per wrapped call) makes the parts add up to
    much more than the whole: with --parts-check fail the stage FAILs naming it."""
    import time

    real_wrap = pb.Instrument._wrap

    def slow_wrap(self, fn, part):
        w = real_wrap(self, fn, part)

        def slowed(*a, **k):
            if self.regions is not None:
                time.sleep(0.03)
            return w(*a, **k)
        return slowed

    monkeypatch.setattr(pb.Instrument, "_wrap", slow_wrap)
    res = PrefillBench().run(_ctx(tmp_path, passes=["fwd"], baselines=["sdpa-default"], parts_check="fail",
                                  **SMALL))
    assert res.status == Status.FAIL and "parts add up to" in res.reason and "x the whole" in res.reason
    assert "measured twice" in res.reason  # a method that does not add up fails the retake too
    df = pd.read_csv(tmp_path / "prefill.csv")
    w = df[(df.path == "nsa") & (df.part == "whole")].iloc[0]
    assert w.parts_ratio > 1.1  # the rows are still written: parity passed, the figures are real
    # the same run with the CPU default (warn) passes and says so
    res = PrefillBench().run(_ctx(tmp_path / "warn", passes=["fwd"], baselines=["sdpa-default"], **SMALL))
    assert res.status == Status.PASS and "warning" in res.reason and "parts add up to" in res.reason


def test_a_disturbed_first_measurement_is_taken_again_and_said(tmp_path, monkeypatch):
    """A moment of contention during one measurement (the H100, 2026-11-26: one quick run's fwd+bwd at 4K
    had p20..p80 7.8..12.6 ms and its parts 1.58x the whole) is measured once more; the retake counts and
    the row's note keeps the first figure."""
    import time

    from nsa_runner.measure import timing

    calls = []
    real_rr, real_wrap = timing.bench_round_robin, pb.Instrument._wrap

    def counted(*a, **k):
        calls.append(1)
        return real_rr(*a, **k)

    def slow_first(self, fn, part):
        w = real_wrap(self, fn, part)

        def slowed(*a, **k):
            if self.regions is not None and len(calls) == 1:
                time.sleep(0.03)
            return w(*a, **k)
        return slowed

    monkeypatch.setattr(timing, "bench_round_robin", counted)
    monkeypatch.setattr(pb.Instrument, "_wrap", slow_first)
    res = PrefillBench().run(_ctx(tmp_path, passes=["fwd"], baselines=["sdpa-default"], parts_check="fail",
                                  parts_tol=0.5, **SMALL))  # CPU timings of a tiny shape: a wide tolerance
    assert res.status == Status.PASS, res.reason
    assert len(calls) == 2 * len(SMALL.get("T_list", [0]))
    df = pd.read_csv(tmp_path / "prefill.csv")
    w = df[(df.path == "nsa") & (df.part == "whole")].iloc[0]
    assert abs(w.parts_ratio - 1) <= 0.5 and "measured twice: the first sum/whole" in w.note


# ---- options ----------------------------------------------------------------------------------

def test_bad_options_are_refused():
    st = PrefillBench()
    with pytest.raises(ValueError, match="bf16 on CPU"):
        st.resolve(_ctx(".", dtype="bf16"))
    with pytest.raises(ValueError, match="multiple of --groups"):
        st.resolve(_ctx(".", heads=6, groups=4))
    with pytest.raises(ValueError, match="--backend"):
        pb.parse_backend("cmp=triton")
    with pytest.raises(ValueError, match="--backend"):
        pb.parse_backend("sel=triton")
    assert pb.parse_backend("slc=triton")["slc"] == "triton" and pb.parse_backend("slc=triton")["cmp"] == "auto"
    with pytest.raises(ValueError):
        pb._list_of(pb.PASSES)("fwd,bwd")
    o = st.resolve(_ctx(".", profile="full"))
    assert o["T_list"] == [256, 512] and o["parts_check"] == "warn" and o["dtype"] == "fp32"


def test_gpu_full_profile_defaults_are_the_issue_shape():
    o = PrefillBench().resolve(_ctx(".", device="cuda", profile="full"))
    assert o["T_list"] == [8192, 16384, 32768, 65536]
    assert (o["batch"], o["heads"], o["groups"], o["dk"], o["dv"], o["dtype"]) == (1, 64, 4, 128, 128, "bf16")
    assert o["nsa"] == {"l": 32, "d": 16, "l_sel": 64, "n_sel": 16, "w": 512}
    assert o["parts_check"] == "fail" and max(o["parity_T"]) < 4096  # the float64 gate stays small


@pytest.mark.gpu
def test_gpu_quick_profile(tmp_path):
    """On CUDA: the quick profile (paper heads, bf16, T = 2K, 4K) passes its gate and times NSA
    against SDPA flash / cuDNN (speedups are reported, never asserted)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    res = PrefillBench().run(_ctx(tmp_path, device="cuda", profile="quick"))
    assert res.status == Status.PASS, res.reason
    df = pd.read_csv(tmp_path / "prefill.csv")
    assert {"nsa", "sdpa-flash", "full-fastest"} <= set(df.path) and set(df.dtype) == {"bf16"}
    nsa = df[(df.path == "nsa") & (df.part == "whole")]
    assert nsa.speedup_vs_sdpa_flash.notna().all() and (nsa.parts_ratio.sub(1).abs() <= 0.1).all()


def test_cpu_default_runs_the_fused_scoring_kernel_and_its_bugs_fail(tmp_path, monkeypatch):
    """On CPU under the interpreter the default backend scores with the fused Triton kernel (so CI
    runs it through the stage); an off-by-one planted in that kernel's call FAILs the gate."""
    import importlib

    from nsa_core.selection import scoring

    if torch.cuda.is_available():
        pytest.skip("CPU behaviour (the interpreter)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if type(scoring._score_kernel).__name__ != "InterpretedFunction":  # triton imported before the env var
        importlib.reload(scoring)
    assert PrefillBench().resolve(_ctx(tmp_path, **SMALL))["backend"]["score"] == "triton"
    assert PrefillBench().resolve(_ctx(tmp_path, **SMALL, backend="auto"))["backend"] == "auto"
    real = scoring.fused_select_blocks
    calls = []

    def off_by_one(q, kc, S, cfg, *a, **kw):  # the kernel believes every query sits one position later
        calls.append(S)
        return real(q, kc, S + 1, cfg, *a, **kw)

    monkeypatch.setattr(scoring, "fused_select_blocks", off_by_one)
    monkeypatch.setattr(pb, "measure_T", lambda *a, **k: ([], [], []))
    res = PrefillBench().run(_ctx(tmp_path, **SMALL))
    assert calls, "the fused scoring kernel did not run"
    assert res.status == Status.FAIL and "selection" in res.reason, res.reason


def test_fa4_full_attention_baseline_on_a_fake_module(monkeypatch):
    """prefill-bench's FA-4 full-attention baseline goes through nsa_core's adapter with
    bottom-right causal and native GQA: on the FAKE flash_attn.cute (tests/_fake_flash.py,
    float64 math, the 4.0.0b36 signature) its output equals SDPA causal attention with the K/V
    heads expanded, and its forward+backward runs. Not GPU evidence (fa2-probe on a GPU is)."""
    from tests import _fake_flash as fake

    fake.install(monkeypatch)
    g = torch.Generator().manual_seed(5)
    B, T, HQ, G, D = 1, 37, 4, 2, 16
    q, do = (torch.randn(B, T, HQ, D, generator=g).half() for _ in range(2))
    k, v = (torch.randn(B, T, G, D, generator=g).half() for _ in range(2))
    fwd, fwdbwd, out_fn, note = pb.full_attention_fns("fa4", q, k, v, do)
    got = out_fn()
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.double().transpose(1, 2), k.double().repeat_interleave(HQ // G, 2).transpose(1, 2),
        v.double().repeat_interleave(HQ // G, 2).transpose(1, 2), is_causal=True).transpose(1, 2)
    assert got.shape == (B, T, HQ, D) and note == ""
    assert (got.double() - ref).abs().max().item() < 2e-3
    fwd()
    fwdbwd()
    assert "fa4" in pb.FULL_PATHS and dict(pb.full_paths("cpu", ["fa4"]))["fa4"] == "CUDA only"


def test_headline_never_rounds_a_real_ratio_to_zero():
    """The CPU oneshot read 'NSA fwd 439 ms, 0.00x vs fastest full': the interpreted NSA is ~1e-4x of
    SDPA there, a real figure that two decimals printed as zero (looks broken). Small ratios keep two
    significant digits; from ~0.1x two decimals as before."""
    from stages.prefill_bench import headline

    def rows(ratio):
        return [{"T": 256, "path": "nsa", "part": "whole", "pass": "fwd", "ms": 439.0,
                 "speedup_vs_sdpa_flash": float("nan"), "speedup_vs_fastest_full": ratio},
                {"T": 256, "path": "full-fastest", "part": "whole", "pass": "fwd", "ms": 0.08,
                 "note": "= sdpa-default"}]

    want = "T=256: NSA fwd 439 ms, 0.00018x vs fastest full (sdpa-default)"
    assert headline(rows(0.000182), {"passes": ["fwd"]}) == want
    assert "4.63x vs fastest full" in headline(rows(4.634), {"passes": ["fwd"]})
    assert "0.10x vs fastest full" in headline(rows(0.1), {"passes": ["fwd"]})
