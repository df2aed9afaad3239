"""Bad days (round 17 U-2), through the CLI: a stage that returned FAIL (or any status) with a NaN or
infinite metric was recorded as ERROR "stage result is not JSON-serialisable (... nan); it was FAIL: ...",
and its declared files (present) were dropped from the record: the stage's verdict and its evidence lost
for one number JSON has no spelling for.

Expected: the stage's status, reason and declared files kept; each NaN / inf / -inf metric recorded as the
text "nan" / "inf" / "-inf" and named in one clause of the reason (in the hint when the stage gave no
reason); a metric with no JSON form at all (an object) is still the stage's ERROR, its declared files kept.
"""

from __future__ import annotations

import json
import subprocess

try:
    from _bad_days import cli_cmd, env_with, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, env_with, manifest

STAGES = """
import math
from nsa_runner import Stage, StageResult, Status

class Fails(Stage):
    name, order, timeout_s, preload = "nanfail", 10, 120.0, False
    def run(self, ctx):
        (ctx.dir / "a.txt").write_text("evidence")
        return StageResult(Status.FAIL, "values differ", files=["a.txt"],
                           metrics={"rel_err": float("nan"), "n": 3, "stats": {"max": math.inf, "min": -math.inf},
                                    "rows": [1.5, float("nan")], "ok": "text"})

class Passes(Stage):
    name, order, timeout_s, preload = "nanpass", 11, 120.0, False
    def run(self, ctx):
        (ctx.dir / "p.txt").write_text("evidence")
        return StageResult(Status.PASS, files=["p.txt"], metrics={"ratio": float("inf")})

class Odd(Stage):
    name, order, timeout_s, preload = "objfail", 12, 120.0, False
    def run(self, ctx):
        (ctx.dir / "b.txt").write_text("evidence")
        return StageResult(Status.FAIL, "bad", files=["b.txt"], metrics={"thing": object()})
"""


def test_a_nan_metric_keeps_the_stages_verdict_and_files(plugins, tmp_path):
    plugins.make("b17-nan", "b17_nan_mod", STAGES,
                 {"nanfail": "b17_nan_mod:Fails", "nanpass": "b17_nan_mod:Passes", "objfail": "b17_nan_mod:Odd"})
    out = tmp_path / "o"
    proc = subprocess.run(cli_cmd("oneshot", "--only", "nanfail,nanpass,objfail", "--out", out, "--device", "cpu"),
                          env=env_with(plugins.env(), NSA_RUN_SPARE_WORKER="0"), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    stages = {s["name"]: s for s in manifest(out)["stages"]}
    fail = stages["nanfail"]
    assert fail["status"] == "FAIL", fail
    assert fail["files"] == ["a.txt"], fail
    assert fail["metrics"] == {"rel_err": "nan", "n": 3, "stats": {"max": "inf", "min": "-inf"},
                               "rows": [1.5, "nan"], "ok": "text"}, fail
    assert fail["reason"].startswith("values differ; "), fail["reason"]
    for name in ("rel_err", "stats.max", "stats.min", "rows[1]"):
        assert name in fail["reason"], fail["reason"]
    passed = stages["nanpass"]
    assert passed["status"] == "PASS" and passed["files"] == ["p.txt"], passed
    assert passed["metrics"] == {"ratio": "inf"}, passed
    assert passed["reason"] == "" and "ratio" in passed["hint"], passed
    odd = stages["objfail"]
    assert odd["status"] == "ERROR" and "not JSON-serialisable" in odd["reason"], odd
    assert "it was FAIL: bad" in odd["reason"] and odd["files"] == ["b.txt"], odd
    # the readers of a run's records take the text values as they are
    summary = json.loads((out / "testrun" / "summary.json").read_text())
    assert {s["name"]: s["metrics"] for s in summary["stages"]}["nanfail"]["rel_err"] == "nan"
    rep = subprocess.run(cli_cmd("report", out / "testrun", "--json"), env=plugins.env(), capture_output=True,
                         text=True, timeout=300)
    assert rep.returncode in (0, 1) and "Traceback" not in rep.stdout + rep.stderr, rep.stdout[-2000:] + rep.stderr
