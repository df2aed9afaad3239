"""report.html and ``compare`` read what each stage declared (issue 12 / 17): a plugin stage's
timing CSV, case table and PNG show up beside the built-ins', and derived ratios of a rerun are
shown, never flagged."""

from __future__ import annotations

import json

STAGES = r'''
import base64, os
from nsa_runner import Stage, StageResult, Status
from nsa_runner.artifacts import write_bytes, write_csv

PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9aw"
                       "AAAABJRU5ErkJggg==")

class Bench(Stage):
    name, order = "plug-bench", 1
    def run(self, ctx):
        noise = float(os.environ.get("PLUG_NOISE", "1.0"))
        rows = []
        for T in (64, 128):
            for path in ("nsa", "full"):
                ms = (0.5 if path == "nsa" else 1.0) * T / 64
                rows.append({"case": f"T{T}-{path}", "T": T, "path": path, "ms": ms, "p20": ms * 0.8,
                             "p80": ms * 1.25, "parts_sum_ms": ms * noise, "speedup_vs_full": 2.0 * noise,
                             "note": ""})
        write_csv(ctx.dir / "plug_bench.csv", rows)
        write_bytes(ctx.dir / "plug.png", PNG)
        return StageResult(Status.PASS, "timed", files=["plug_bench.csv", "plug.png"])

class Parity(Stage):
    name, order = "plug-parity", 2
    def run(self, ctx):
        rows = [{"case": f"c{i}", "B": 1, "T": 8, "HQ": 2, "G": 1, "dk": 8, "dv": 8, "dtype": "fp32",
                 "max_abs": 1e-7, "rel_err": 1e-7, "tol": 1e-5, "status": "PASS"} for i in range(3)]
        write_csv(ctx.dir / "plug_parity.csv", rows)
        return StageResult(Status.PASS, "3 cases", files=["plug_parity.csv"])
'''


def test_plugin_tables_reach_report_and_compare(plugins, cli, tmp_path, monkeypatch):
    plugins.make("plug-stages", "plug_stages_mod", STAGES,
                 {"plug-bench": "plug_stages_mod:Bench", "plug-parity": "plug_stages_mod:Parity"})
    out = tmp_path / "out"
    assert cli("oneshot", "--out", out, "--only", "plug-bench,plug-parity", "--device", "cpu").exit_code == 0
    monkeypatch.setenv("PLUG_NOISE", "1.4")  # a rerun whose derived columns moved by 40%
    assert cli("oneshot", "--out", out, "--only", "plug-bench,plug-parity", "--device", "cpu").exit_code == 0
    html = (out / "testrun" / "report.html").read_text()
    assert "plug_bench.csv (plug-bench)" in html and "plug_parity.csv" in html
    assert "plug.png (plug-bench stage)" in html and "T64-nsa" in html

    r = cli("compare", "testrun", "testrun.2", "--out", out, "--json")
    doc = json.loads(r.stdout)
    timing = [x for x in doc["rows"] if x["source"] == "plug_bench.csv"]
    assert {x["metric"] for x in timing} >= {"ms", "parts_sum_ms", "speedup_vs_full"}
    derived = [x for x in timing if x["metric"] in ("parts_sum_ms", "speedup_vs_full")]
    assert all(x["mark"] == "" and "derived" in x["note"] and abs(x["ratio"] - 1.4) < 1e-6 for x in derived)
    assert {x["key"] for x in doc["rows"] if x["source"] == "plug_parity.csv"} == {"c0", "c1", "c2"}
    assert r.exit_code == 0 and doc["regressions"] == 0
