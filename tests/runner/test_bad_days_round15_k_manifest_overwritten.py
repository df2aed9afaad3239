"""Bad days, red-team round 14 (part A) U5, through the CLI: a stage that overwrote manifest.json with
garbage mid-oneshot ended the run "incomplete: manifest.json: not valid JSON" (exit 2), later stages never
ran, and from then on every command into that --out exited 2 "earlier run folder is unusable", though the
runner, the manifest's owner, held the valid records.

Expected: the runner, finding its manifest unreadable under its lock, keeps what is there aside as
``manifest.json.corrupt-<n>``, writes the manifest again from its records, records the stage that was
running as ERROR saying so; the run goes on and ends (exit 1), and later commands into the --out work.
"""

from __future__ import annotations

import json
import subprocess
import sys

try:
    from _bad_days import MAIN, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with

STAGES = """
import os
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

def _act(ctx, name):
    (ctx.dir / f"{name}.txt").write_text(name)
    if os.environ.get("R15KM_GARBAGE") == name:
        (ctx.dir / "manifest.json").write_text("{garbage")
    return StageResult(Status.PASS, name, files=[f"{name}.txt"])

class A(Stage):
    name, order, timeout_s = "a", 10, 120.0
    def run(self, ctx): return _act(ctx, "a")

class B(Stage):
    name, order, timeout_s = "b", 20, 120.0
    def run(self, ctx): return _act(ctx, "b")

class C(Stage):
    name, order, timeout_s = "c", 30, 120.0
    def run(self, ctx): return _act(ctx, "c")
"""


def _cli(env, *args):
    return subprocess.run([sys.executable, "-c", MAIN, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_stage_overwriting_the_manifest_is_its_error_and_the_run_goes_on(plugins, tmp_path):
    plugins.make("r15k-mo", "r15k_mo_mod", STAGES, {"a": "r15k_mo_mod:A", "b": "r15k_mo_mod:B", "c": "r15k_mo_mod:C"})
    env = plugins.env()
    out, run = tmp_path / "out", tmp_path / "out" / "testrun"
    r = _cli(env_with(env, R15KM_GARBAGE="b"), "oneshot", "--only", "a,b,c", "--out", out, "--json")
    assert "Traceback" not in r.stderr
    assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
    m = json.loads((run / "manifest.json").read_text())
    got = {s["name"]: s for s in m["stages"]}
    assert [got[n]["status"] for n in "abc"] == ["PASS", "ERROR", "PASS"], {n: (s["status"], s["reason"])
                                                                            for n, s in got.items()}
    assert "manifest.json was overwritten during this stage" in got["b"]["reason"]
    assert "manifest.json.corrupt-1" in got["b"]["reason"]
    assert (run / "manifest.json.corrupt-1").read_text() == "{garbage"
    assert m["finished"] and not m.get("incomplete") and not m.get("pending")
    shown = {s["name"]: s["status"] for s in json.loads(r.stdout)["stages"]}  # the terminal agrees
    assert shown == {"a": "PASS", "b": "ERROR", "c": "PASS"}, shown
    # later commands into that --out work
    r2 = _cli(env, "stage", "a", "--out", out)
    assert r2.returncode == 0, r2.stderr[-3000:]
    r3 = _cli(env, "oneshot", "--only", "c", "--out", out)
    assert r3.returncode == 0, r3.stderr[-3000:]
    assert "unusable" not in r2.stderr + r3.stderr
    r4 = _cli(env, "report", run)
    assert r4.returncode in (0, 1) and "Traceback" not in r4.stderr, r4.stderr[-3000:]
