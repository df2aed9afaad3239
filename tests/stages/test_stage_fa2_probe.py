"""The fa2-probe stage on CPU: SKIP with the reason and the install hint (never PASS); the parity
part of the stage driven with the CPU math twin (PASS), and with a broken packing (FAIL)."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from nsa_runner.stage import Status
from stages.fa2_probe import Fa2Probe

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = None


def _ctx(tmp_path, **opts):
    base = {"S_list": None, "thresholds": "none", "bench": "no", "seed": 0}
    return SimpleNamespace(dir=tmp_path, device="cpu", profile="quick", options={**base, **opts}, run_id="t")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU skip")
def test_cpu_run_is_a_skip_with_reason_and_install_hint(tmp_path):
    r = Fa2Probe().run(_ctx(tmp_path))
    assert r.status == Status.SKIP
    assert "cpu" in r.reason and "CUDA" in r.reason
    assert "pip install flash-attn" in r.hint
    assert sorted(r.files) == ["fa2_probe.json", "fa2_probe.txt"]
    doc = json.loads((tmp_path / "fa2_probe.json").read_text())
    assert doc["schema_version"] == 1 and doc["status"] == "SKIP"
    assert {row["name"] for row in doc["probe"]} >= {"flash_attn (FA-2)", "torch varlen_attn", "SDPA flash"}
    assert not any(row["works"] for row in doc["probe"])  # nothing claimed to work on CPU
    txt = (tmp_path / "fa2_probe.txt").read_text()
    assert "SKIP:" in txt and "PASS" not in txt and "flash_attn (FA-2)" in txt
    assert not (tmp_path / "fa2_varlen.csv").exists()


def test_stage_is_registered_at_order_50():
    from pathlib import Path

    st = Fa2Probe()
    assert (st.name, st.order, st.requires) == ("fa2-probe", 50, ())
    assert {o.flag for o in st.options} >= {"--S-list", "--thresholds"}
    if tomllib is not None:
        py = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
        assert py["project"]["entry-points"]["nsa_runner.stages"]["fa2-probe"] == "nsa_run_stages.fa2_probe:Fa2Probe"


def _measure(tmp_path, paths):
    st = Fa2Probe()
    doc, txt, files = {"probe": [{"name": "flash_attn (FA-2)", "present": False}]}, [], []
    ctx = _ctx(tmp_path)
    r = st._measure(ctx, tmp_path, ctx.options, "cpu", paths, doc, txt, files)
    return r, doc, files


def test_parity_part_passes_with_the_math_twin_and_writes_the_csv(tmp_path, monkeypatch):
    from nsa_runner.measure import flash_bench as _flash_bench

    small = [_flash_bench.Case(1, 20, 4, 1, 16, why="T < l"), _flash_bench.Case(2, 70, 4, 2, 16, why="h=2, B=2"),
             _flash_bench.Case(1, 90, 4, 4, 16, Tq=5, why="Tq < T")]
    monkeypatch.setattr(_flash_bench, "parity_cases", lambda profile: small)
    r, doc, files = _measure(tmp_path, {"cmp": ["sdpa-math"], "win": ["sdpa-math"]})
    assert r.status == Status.PASS, r.reason
    assert "flash_attn (FA-2) NOT installed" in r.reason  # never listed as passed
    df = pd.read_csv(tmp_path / "fa2_varlen.csv")
    assert len(df) == 3 * 2 * 2  # cases x branches x dtypes
    assert set(df["status"]) == {"PASS"}
    assert df[["rel_o", "rel_dq", "rel_dk", "rel_dv"]].notna().all().all()
    assert "fa2_varlen.csv" in files and doc["parity"]["fail"] == 0


def test_parity_part_fails_on_a_broken_packing(tmp_path, monkeypatch):
    from nsa_core.flash import adapters as K
    from nsa_runner.measure import flash_bench as _flash_bench

    monkeypatch.setattr(_flash_bench, "parity_cases", lambda profile: [_flash_bench.Case(1, 96, 4, 2, 16)])
    monkeypatch.setattr(K, "causal", lambda q, k, v, scale, path: K.full(q, k, v, scale, path))  # no mask: wrong
    r, doc, _ = _measure(tmp_path, {"cmp": ["sdpa-math"], "win": []})
    assert r.status == Status.FAIL
    assert "FAILED" in r.reason and "cmp/sdpa-math" in r.reason
    df = pd.read_csv(tmp_path / "fa2_varlen.csv")
    assert set(df["status"]) == {"FAIL"}


def test_parity_part_runs_the_fa4_path_on_a_fake_module(tmp_path, monkeypatch):
    """The FA-4 path's parity rows through the stage, on CPU, with the FAKE flash_attn.cute
    (tests/_fake_flash.py: the 4.0.0b36 signature, float64 math): fp16 and bf16, both branches,
    every row PASS with its wall time. Not GPU evidence (bench/gpu_fa4_run.sh is)."""
    from nsa_runner.measure import flash_bench as _flash_bench
    from tests import _fake_flash as fake

    fake.install(monkeypatch)
    fake.present_on_cpu(monkeypatch)
    small = [_flash_bench.Case(2, 70, 4, 2, 16, why="h=2, B=2"), _flash_bench.Case(1, 90, 4, 1, 16, Tq=5, why="Tq < T")]
    monkeypatch.setattr(_flash_bench, "parity_cases", lambda profile: small)
    st = Fa2Probe()
    doc = {"probe": [{"name": "flash_attn (FA-2)", "present": False},
                     {"name": "flash_attn.cute (FA-4)", "present": True}]}
    ctx = _ctx(tmp_path)
    r = st._measure(ctx, tmp_path, ctx.options, "cpu", {"cmp": ["fa4"], "win": ["fa4"]}, doc, [], [])
    assert r.status == Status.PASS, r.reason
    assert "flash-attn packages tested: flash_attn.cute (FA-4)" in r.reason and "FA-2) NOT installed" in r.reason
    df = pd.read_csv(tmp_path / "fa2_varlen.csv")
    assert len(df) == 2 * 2 * 2 and set(df["path"]) == {"fa4"} and set(df["status"]) == {"PASS"}
    assert (df["wall_s"] > 0).all() and doc["wall_s"]["parity"] > 0


def test_description_lists_exactly_the_adapters_not_gpu_verified():
    """`nsa-run list fa2-probe` shows the description: its "not GPU-verified" list must match
    nsa_core.flash.adapters.GPU_VERIFIED (update both when a GPU run verifies an adapter)."""
    import re

    from nsa_core.flash import adapters

    clause = Fa2Probe.description.split("not GPU-verified:")[1].split("(")[0]
    assert set(re.findall(r"FA-\d", clause)) == {f"FA-{p[2]}" for p, v in adapters.GPU_VERIFIED.items() if not v}


def _bench_rows(S_list):
    rows = []
    for S in S_list:
        for b in ("cmp", "win"):
            for path, kind, x in (("sdpa", "baseline", 1.0), ("sdpa-math", "flash", 1.5 if S >= 4096 else 0.9)):
                rows.append({"branch": b, "kind": kind, "path": path, "S": S, "B": 1, "HQ": 32, "G": 2, "D": 128,
                             "dtype": "bf16", "fwd_ms": 1.0 / x, "fwdbwd_ms": 3.0 / x, "speedup_fwd": x,
                             "speedup_fwdbwd": x, "note": ""})
    return rows


def _bench_into(tmp_path, monkeypatch, S_list, target):
    """fa2-probe's bench part with synthetic timings (the merge rule is what is tested), on a fake GPU."""
    from nsa_core.config import NSAConfig
    from nsa_runner.measure import flash_bench as _flash_bench

    monkeypatch.setattr(_flash_bench, "bench", lambda device, good, S, cfg, **kw: (_bench_rows(S), "fake timer"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake H100")
    run = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"
    run.mkdir()
    ctx = SimpleNamespace(dir=run, device="cpu", profile="quick", options={"thresholds": str(target)}, run_id="r")
    txt, files, metrics = [], [], {}
    note = Fa2Probe()._bench(ctx, run, "cpu", {"cmp": ["sdpa-math"], "win": ["sdpa-math"]}, S_list, {}, txt, files,
                             metrics, ctx.options, NSAConfig())
    return note, json.loads((run / "fa2_thresholds.json").read_text())


def test_a_shorter_measurement_never_replaces_a_longer_one_in_the_thresholds_file(tmp_path, monkeypatch):
    """A quick fa2-probe (S up to 4K) after a full one (up to 64K) on the same GPU and torch kept
    replacing the full entry: routing then routed 64K by what won at 4K. It now keeps the longer
    entry and says so; a measurement of the same or a longer range still replaces it."""
    target = tmp_path / "thresholds.json"
    note, full = _bench_into(tmp_path, monkeypatch, [1024, 4096, 16384, 65536], target)
    assert note.startswith("thresholds merged") and json.loads(target.read_text()) == full
    before = target.read_bytes()
    note, quick = _bench_into(tmp_path, monkeypatch, [1024, 4096], target)
    assert "NOT merged" in note and "S=65536" in note and "4096" in note, note
    assert target.read_bytes() == before  # the full entry is untouched
    assert quick["entries"][0]["S_measured"] == [1024, 4096]  # this run's own copy is still written
    note, again = _bench_into(tmp_path, monkeypatch, [2048, 65536], target)
    assert note.startswith("thresholds merged")
    doc = json.loads(target.read_text())
    assert len(doc["entries"]) == 1 and doc["entries"][0]["S_measured"] == [2048, 65536]


def test_quick_bench_leaves_out_the_graph_building_paths_and_says_so(tmp_path, monkeypatch):
    """The quick profile (a smoke check) times no path whose first call per shape builds a graph
    (cuDNN on the GPU; sdpa-math stands in for it here): its parity rows still run; the text names it."""
    from nsa_runner.measure import flash_bench as _flash_bench

    small = [_flash_bench.Case(1, 70, 4, 2, 16), _flash_bench.Case(1, 90, 4, 1, 16, Tq=5)]
    monkeypatch.setattr(_flash_bench, "parity_cases", lambda profile: small)
    monkeypatch.setattr(_flash_bench, "BUILDS_PER_PROCESS", ("sdpa-math",))
    timed = []
    monkeypatch.setattr(Fa2Probe, "_bench", lambda self, ctx, d, device, good, *a: timed.append(good) or "bench ok")
    st, doc, txt = Fa2Probe(), {"probe": [{"name": "flash_attn (FA-2)", "present": False}]}, []
    ctx = _ctx(tmp_path, bench="yes")
    r = st._measure(ctx, tmp_path, ctx.options, "cpu", {"cmp": ["sdpa-math", "varlen"], "win": ["sdpa-math"]},
                    doc, txt, [])
    assert set(pd.read_csv(tmp_path / "fa2_varlen.csv")["path"]) == {"sdpa-math", "varlen"}  # parity: every path
    assert timed == [{"cmp": ["varlen"], "win": []}], timed
    assert any("sdpa-math not timed" in line for line in txt), txt
    ctx.profile = "full"
    timed.clear()
    st._measure(ctx, tmp_path, ctx.options, "cpu", {"cmp": ["sdpa-math"], "win": ["sdpa-math"]}, doc, [], [])
    assert timed == [{"cmp": ["sdpa-math"], "win": ["sdpa-math"]}]
    assert "bench ok" in r.reason
