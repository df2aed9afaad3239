"""bench/time_ledger.py: a run folder's wall time split into parts that add up (issue 13)."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _ledger_module():
    spec = importlib.util.spec_from_file_location("time_ledger", ROOT / "bench" / "time_ledger.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    stage = lambda name, s: {"name": name, "status": "PASS", "duration_s": s}  # noqa: E731
    (run / "manifest.json").write_text(json.dumps({
        "started": "2026-11-25T10:00:00+00:00", "finished": "2026-11-25T10:02:00+00:00",
        "stages": [stage("env-pairing", 7.5), stage("fa2-probe", 60.0), stage("prefill-bench", 40.0)]}))
    (run / "fa2_probe.json").write_text(json.dumps({"wall_s": {"probe": 5.0, "parity": 20.0, "bench": 30.0,
                                                               "total": 55.5}}))
    _csv(run / "fa2_varlen.csv", [{"path": "sdpa-cudnn", "wall_s": 12.0}, {"path": "sdpa-cudnn", "wall_s": 4.0},
                                  {"path": "fa4", "wall_s": 1.5}, {"path": "fa4", "wall_s": "nan"}])
    _csv(run / "fa2_bench.csv", [{"branch": "cmp", "path": "sdpa", "S": 1024, "bench_s": 2.0},
                                 {"branch": "cmp", "path": "fa4", "S": 65536, "bench_s": 7.0},
                                 {"branch": "win", "path": "fa4", "S": 65536, "bench_s": 3.0}])
    (run / "logs" / "prefill-bench.log").write_text(
        "# header without a stamp\n[   0.0 s] seed 0\n[  12.5 s] parity T=2085 ok\nnoise\n"
        "[  30.0 s] T=65536: 19 rows\n")
    return run


def test_each_section_adds_up_to_its_figure(tmp_path):
    led = _ledger_module()
    run = _run(tmp_path)
    lines = led.ledger(run)
    got = {w: s for w, s, _ in lines}
    stages = ["env-pairing", "fa2-probe", "prefill-bench"]
    assert got["WHOLE ONESHOT"] == 120.0
    assert sum(got[s] for s in stages) + got["(runner: discovery, locks, closing report)"] == 120.0
    fa2 = [s for w, s, _ in lines if w.startswith("fa2-probe ")]
    assert abs(sum(fa2) - 60.0) < 1e-9  # probe + parity + bench + rest + process start = the stage
    parity = [s for w, s, _ in lines if w.startswith("  parity ")]
    assert abs(sum(parity) - 20.0) < 1e-9 and got["  parity sdpa-cudnn"] == 16.0 and got["  parity fa4"] == 1.5
    assert not any(w.startswith("    beside") for w, _, _ in lines)  # no children: nothing beside
    by_path = [s for w, s, _ in lines if w.startswith("  bench path ")]
    by_s = [s for w, s, _ in lines if w.startswith("  bench S ")]
    assert sum(by_path) == sum(by_s) == 12.0 and got["  bench S 65536"] == 10.0
    prefill = [s for w, s, _ in lines if w.startswith("  prefill ")]
    assert abs(sum(prefill) - 40.0) < 1e-9 and got["  prefill parity T=2085 ok"] == 12.5


def test_parity_rows_of_child_processes_are_shown_beside_not_added(tmp_path):
    """fa2-probe's cuDNN rows run in child processes beside the others (flash_bench.parity_apart):
    their row times overlap this process's, so they are listed at 0 s and the parity still adds up."""
    led = _ledger_module()
    run = _run(tmp_path)
    doc = json.loads((run / "fa2_probe.json").read_text())
    doc["parity_children"] = {"children": 4, "apart": ["sdpa-cudnn"], "fallback": []}
    (run / "fa2_probe.json").write_text(json.dumps(doc))
    lines = led.ledger(run)
    got = {w: (s, note) for w, s, note in lines}
    parity = [s for w, s, _ in lines if w.startswith("  parity ")]
    assert abs(sum(parity) - 20.0) < 1e-9 and "  parity sdpa-cudnn" not in got
    assert got["  parity (references, comparisons, children)"][0] == 18.5  # 20 - fa4's 1.5
    s, note = got["    beside: parity sdpa-cudnn"]
    assert s == 0.0 and "2 rows in 4 child processes, 16.0 s of row time" in note


def test_env_pairing_parts_add_up_to_the_stage(tmp_path):
    led = _ledger_module()
    run = _run(tmp_path)
    (run / "env.json").write_text(json.dumps({"wall_s": {"torch": 3.5, "gpu": 0.5, "flash child": 1.0}}))
    lines = led.ledger(run)
    got = {w: s for w, s, _ in lines}
    env = [s for w, s, _ in lines if w.startswith("env-pairing ")]
    assert abs(sum(env) - 7.5) < 1e-9 and got["env-pairing (process start, imports, result)"] == 2.5


def test_cli_names_a_folder_without_a_manifest(tmp_path, capsys):
    led = _ledger_module()
    assert led.main([str(tmp_path)]) == 2
    assert "no manifest.json" in capsys.readouterr().err
    assert led.main([str(_run(tmp_path)), "--md"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| where | s | note |") and "| WHOLE ONESHOT | 120.0 |" in out
