"""nsa_runner.measure: the flash probe and the flash bench's parity and threshold logic, on CPU."""

from __future__ import annotations

import sys

import pytest
import torch

from nsa_core import NSAConfig
from nsa_runner.measure import flash_bench as _flash_bench
from nsa_runner.measure import flash_probe as _flash_probe


def test_probe_on_cpu_lists_every_family_and_never_claims_it_works():
    rows = _flash_probe.probe("cpu")
    names = [r["name"] for r in rows]
    assert names[:3] == ["flash_attn (FA-2)", "flash_attn_interface (FA-3)", "flash_attn.cute (FA-4)"]
    assert {"torch varlen_attn", "SDPA flash", "SDPA cudnn", "SDPA efficient"} <= set(names)
    assert all(r["works"] is None for r in rows)
    fa2 = rows[0]
    if not fa2["present"]:
        assert "not installed" in fa2["reason"] and "pip install flash-attn" in fa2["reason"]


def _row(branch, path, S, f, fb):
    return {"branch": branch, "kind": "flash", "path": path, "S": S, "speedup_fwd": f, "speedup_fwdbwd": fb}


def test_threshold_is_the_smallest_length_from_which_the_path_stays_faster():
    rows = [_row("win", "varlen", 1024, 2.0, 1.3),   # wins here ...
            _row("win", "varlen", 2048, 1.5, 1.1),   # ... but not here (fwd+bwd)
            _row("win", "varlen", 4096, 3.0, 2.0), _row("win", "varlen", 8192, 9.0, 5.0),
            _row("cmp", "varlen", 1024, 0.7, 0.9), _row("cmp", "varlen", 4096, 1.1, 1.3),
            _row("cmp", "sdpa-flash", 1024, 1.3, 1.25), _row("cmp", "sdpa-flash", 4096, 2.0, 2.0),
            {"branch": "cmp", "kind": "baseline", "path": "sdpa", "S": 1024, "speedup_fwd": 1.0, "speedup_fwdbwd": 1.0},
            {"branch": "cmp", "kind": "scores", "path": "block_scores (recompute p_cmp)", "S": 1024}]
    t = _flash_bench.thresholds(rows)
    assert t["win"]["varlen"] == {"min_len": 4096, "max_measured": 8192, "speedup_at_max": 5.0,
                                  # per measured S: the smaller of fwd / fwd+bwd (routing's ladder reads it)
                                  "speedups": {"1024": 1.3, "2048": 1.1, "4096": 2.0, "8192": 5.0}}
    assert t["cmp"]["varlen"]["min_len"] is None  # never (fwd 1.1 < 1.2 at the longest S)
    assert t["cmp"]["sdpa-flash"]["min_len"] == 1024
    assert set(t["cmp"]) == {"varlen", "sdpa-flash"}
    assert _flash_bench.thresholds([_row("win", "varlen", 1024, float("nan"), 2.0)])["win"]["varlen"]["min_len"] is None


def test_parity_helper_runs_the_math_twin_and_reports_each_gradient():
    cases = [_flash_bench.Case(1, 40, 4, 2, 8), _flash_bench.Case(2, 50, 4, 1, 8, Tq=3)]
    rows = _flash_bench.parity("cpu", {"cmp": ["sdpa-math"], "win": ["sdpa-math", "varlen"]}, [torch.float32], cases,
                               NSAConfig(w=16))
    done = [r for r in rows if r["status"] != "N/A"]
    assert len(done) == 4 and all(r["status"] == "PASS" for r in done)
    assert all(r["rel_dq"] <= 1e-5 and r["rel_dk"] <= 1e-5 and r["rel_dv"] <= 1e-5 for r in done)
    na = [r for r in rows if r["status"] == "N/A"]
    assert len(na) == 2 and all("CUDA" in r["note"] for r in na)


def test_probe_exercises_the_fa4_adapter_and_its_lse_on_fake_modules(monkeypatch):
    """The probe's FA-4 checks (window through the adapter, folded compressed call, return_lse)
    driven on CPU through the FAKE flash_attn.cute (tests/_fake_flash.py, the real signature):
    they pass on a correct kernel and fail on a wrong lse. Not GPU evidence."""
    from nsa_core.flash import adapters as K
    from tests import _fake_flash as fake

    fake.install(monkeypatch)
    fake.present_on_cpu(monkeypatch)
    ok, why = _flash_probe._exercise(_flash_probe._path_fn("fa4"), "cpu")
    assert ok, why
    ok, why = _flash_probe._exercise_fa4_extras("cpu")
    assert ok and "return_lse" in why, why
    real = K._fa4

    def off_by_one(q, k, v, scale, window, return_lse=False):
        r = real(q, k, v, scale, window, return_lse)
        return (r[0], r[1] + 0.5) if return_lse else r

    monkeypatch.setattr(K, "_fa4", off_by_one)
    ok, why = _flash_probe._exercise_fa4_extras("cpu")
    assert not ok and "WRONG" in why
    rows = {r["name"]: r for r in _flash_probe.probe("cpu")}
    fa4 = rows["flash_attn.cute (FA-4)"]
    assert fa4["present"] and fa4["works"] is None and "not CUDA" in fa4["reason"]
    assert fa4["gpu_verified"] == K.verified_label("fa4")


def test_bench_times_each_path_against_sdpa_and_records_what_it_cost():
    """bench() on CPU with the math twin: every (branch, path, S) row has median / p20 / p80 for
    fwd and fwd+bwd, the speedup vs the sdpa baseline of the same S, and bench_s (time spent)."""
    cfg = NSAConfig(w=32)
    rows, tname = _flash_bench.bench("cpu", {"cmp": ["sdpa-math"], "win": ["sdpa-math"]}, [96, 160], cfg,
                                     B=1, HQ=4, G=2, D=16, dtype=torch.float32, score_rows=True)
    assert tname == "nsa_runner.measure.timing.bench"
    timed = [r for r in rows if r["kind"] in ("flash", "baseline")]
    assert {(r["branch"], r["path"], r["S"]) for r in timed} == {
        (b, p, S) for b in ("cmp", "win") for p in ("sdpa", "sdpa-math") for S in (96, 160)}
    for r in timed:
        assert 0 < r["fwd_p20"] <= r["fwd_ms"] <= r["fwd_p80"]
        assert 0 < r["fwdbwd_p20"] <= r["fwdbwd_ms"] <= r["fwdbwd_p80"]
        assert r["bench_s"] > 0 and r["speedup_fwd"] > 0
    assert sum(r["kind"] == "scores" for r in rows) == 2 * 2  # block_scores + q.k^T floor, per S
    assert set(_flash_bench.thresholds(rows)) == {"cmp", "win"}
    # by default (the stage's default) the score rows are not timed: the timed rows are the same
    plain, _ = _flash_bench.bench("cpu", {"cmp": ["sdpa-math"], "win": ["sdpa-math"]}, [96], cfg,
                                  B=1, HQ=4, G=2, D=16, dtype=torch.float32)
    assert not any(r["kind"] == "scores" for r in plain)
    assert {(r["branch"], r["path"]) for r in plain} == {(b, p) for b in ("cmp", "win") for p in ("sdpa", "sdpa-math")}


def _strip_wall(rows):
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


def test_parity_apart_gives_the_same_rows_in_the_same_order_as_parity():
    """The rows of the paths set apart (here the CPU twin sdpa-math) come from child processes:
    same inputs (seed per case), same values, same order as the in-process parity."""
    cases = [_flash_bench.Case(1, 40, 4, 2, 8), _flash_bench.Case(2, 50, 4, 1, 8, Tq=3),
             _flash_bench.Case(1, 70, 8, 2, 16)]
    paths = {"cmp": ["sdpa-math"], "win": ["varlen", "sdpa-math"]}
    cfg = NSAConfig(w=16)
    serial = _flash_bench.parity("cpu", paths, [torch.float32], cases, cfg, seed=5)
    said = []
    rows, info = _flash_bench.parity_apart("cpu", paths, [torch.float32], cases, cfg, seed=5,
                                           apart=("sdpa-math",), jobs=2, log=said.append)
    assert info["children"] == 2 and info["apart"] == ["sdpa-math"] and info["fallback"] == []
    assert _strip_wall(rows) == _strip_wall(serial)
    assert sum(r["status"] == "PASS" for r in rows) == 6  # sdpa-math on both branches, 3 cases
    assert any("2 child processes" in m for m in said)


def test_parity_apart_on_some_cases_runs_the_apart_paths_there_only_with_the_same_values():
    """The quick profile: the set-apart path (cuDNN on the GPU; sdpa-math here) on one case, in this
    process; the other paths on every case. Each row equals the in-process parity's row of that case."""
    cases = [_flash_bench.Case(1, 40, 4, 2, 8), _flash_bench.Case(2, 50, 4, 1, 8, Tq=3),
             _flash_bench.Case(1, 70, 8, 2, 16)]
    paths = {"cmp": ["sdpa-math"], "win": ["varlen", "sdpa-math"]}
    cfg = NSAConfig(w=16)
    serial = _strip_wall(_flash_bench.parity("cpu", paths, [torch.float32], cases, cfg, seed=5))
    for jobs in (1, 4):  # one apart case: never a child
        rows, info = _flash_bench.parity_apart("cpu", paths, [torch.float32], cases, cfg, seed=5,
                                               apart=("sdpa-math",), jobs=jobs, apart_cases=[1])
        assert info["children"] == 0 and info["apart_cases"] == [1]
        want = [r for r in serial if r["path"] != "sdpa-math" or r["case"] == serial_case(serial, cases, 1)]
        assert _strip_wall(rows) == want
        assert [r["status"] for r in rows if r["path"] == "sdpa-math"] == ["PASS", "PASS"]
    rows, info = _flash_bench.parity_apart("cpu", paths, [torch.float32], cases, cfg, seed=5,
                                           apart=("sdpa-math",), jobs=2, apart_cases=[0, 2])
    assert info["children"] == 2
    want = [r for r in serial if r["path"] != "sdpa-math" or r["case"] != serial_case(serial, cases, 1)]
    assert _strip_wall(rows) == want
    # and one dtype of two (the quick profile: bf16 only)
    rows, info = _flash_bench.parity_apart("cpu", paths, [torch.float32, torch.float64], cases, cfg, seed=5,
                                           apart=("sdpa-math",), jobs=4, apart_cases=[1], apart_dtypes=[torch.float64])
    both = _strip_wall(_flash_bench.parity("cpu", paths, [torch.float32, torch.float64], cases, cfg, seed=5))
    one = cases[1].id(torch.float64, cfg.w)
    assert info["apart_dtypes"] == ["fp64"] and info["children"] == 0
    assert _strip_wall(rows) == [r for r in both if r["path"] != "sdpa-math" or r["case"] == one]
    with pytest.raises(ValueError, match="apart_dtypes"):
        _flash_bench.parity_apart("cpu", paths, [torch.float32], cases, cfg, apart=("sdpa-math",),
                                  apart_dtypes=[torch.float16])
    with pytest.raises(ValueError, match="apart_cases"):
        _flash_bench.parity_apart("cpu", paths, [torch.float32], cases, cfg, apart=("sdpa-math",), apart_cases=[3])


def serial_case(rows, cases, n):
    """The case id of ``cases[n]`` as the rows name it (rows come case by case)."""
    return list(dict.fromkeys(r["case"] for r in rows))[n]


def test_parity_apart_computes_a_failed_childs_rows_itself_and_says_so():
    cases = [_flash_bench.Case(1, 40, 4, 2, 8), _flash_bench.Case(2, 50, 4, 1, 8, Tq=3)]
    paths = {"cmp": ["sdpa-math"], "win": ["sdpa-math"]}
    cfg = NSAConfig(w=16)
    serial = _flash_bench.parity("cpu", paths, [torch.float32], cases, cfg)
    crash = [sys.executable, "-c", "import sys; print('boom: no CUDA driver'); sys.exit(3)"]
    rows, info = _flash_bench.parity_apart("cpu", paths, [torch.float32], cases, cfg, apart=("sdpa-math",),
                                           jobs=2, child_cmd=crash)
    assert _strip_wall(rows) == _strip_wall(serial)  # nothing lost
    assert len(info["fallback"]) == 2 and all("exit 3" in w and "boom" in w for w in info["fallback"])
    rows, info = _flash_bench.parity_apart("cpu", paths, [torch.float32], cases, cfg, apart=("sdpa-math",),
                                           jobs=2, child_cmd=["/nonexistent/python"])
    assert _strip_wall(rows) == _strip_wall(serial)
    assert info["children"] == 0 and all("did not start" in w for w in info["fallback"])
