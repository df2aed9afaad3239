"""Bad days, red-team round 16 (part A) A10, through the CLI: a stage plants an ``nsa_runner/`` package
in the run folder. Workers were started as ``python -m nsa_runner._worker`` with cwd = the run folder,
so ``sys.path[0]`` was the run folder and every later worker (of this run: b in a fresh worker; of a
later ``stage`` command into that folder) imported the planted package: b's FAIL recorded as the
planted worker's forged PASS, rc 0.

Expected: no process nsa-run starts (worker, spare, watchdog, plugin discovery) ever has the run
folder or its own working directory on ``sys.path``: the planted package is never imported (its
``__init__`` notes every import in a file outside), b and c keep their own FAILs.
"""

from __future__ import annotations

import subprocess
import sys

try:
    from _bad_days import MAIN, env_with, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with, manifest

SHADOW_INIT = """
import os, sys
with open(os.environ["K16_SHADOW_LOG"], "a") as f:
    f.write(" ".join(sys.argv) + "\\n")
"""

SHADOW_WORKER = """
import json, os, sys
if "--spare" not in sys.argv and "--watchdog" not in sys.argv and len(sys.argv) > 2:
    result = sys.argv[2]
    with open(result + ".t", "w") as f:
        json.dump({"result": {"status": "PASS", "reason": "forged by the planted package", "files": [],
                   "metrics": {}, "hint": ""}, "traceback": None}, f)
    os.rename(result + ".t", result)
"""

STAGES = f"""
from nsa_runner import Stage, StageResult, Status

class A(Stage):
    name, order, timeout_s = "a", 10, 120.0
    def run(self, ctx):
        d = ctx.dir / "nsa_runner"
        d.mkdir()
        (d / "__init__.py").write_text({SHADOW_INIT!r})
        (d / "_worker.py").write_text({SHADOW_WORKER!r})
        (d / "_discover.py").write_text({SHADOW_WORKER!r})
        return StageResult(Status.PASS, "a planted")

class B(Stage):
    name, order, timeout_s = "b", 11, 120.0
    def run(self, ctx):
        return StageResult(Status.FAIL, "b real fail")

class C(Stage):
    name, order, timeout_s = "c", 12, 120.0
    def run(self, ctx):
        return StageResult(Status.FAIL, "c real fail")
"""


def test_a10_a_planted_nsa_runner_package_is_never_imported(plugins, tmp_path):
    plugins.make("k16-plant", "k16_plant_mod", STAGES,
                 {"a": "k16_plant_mod:A", "b": "k16_plant_mod:B", "c": "k16_plant_mod:C"})
    out = tmp_path / "o"
    log = tmp_path / "shadow.log"
    env = env_with(plugins.env(), K16_SHADOW_LOG=log)
    # b in a fresh worker (no spare): started with the run folder as its working directory
    p = subprocess.run([sys.executable, "-c", MAIN, "oneshot", "--only", "a,b", "--out", str(out), "--device", "cpu"],
                       env=env_with(env, NSA_RUN_SPARE_WORKER="0"), capture_output=True, text=True, timeout=300)
    run = out / "testrun"
    assert (run / "nsa_runner" / "_worker.py").is_file(), p.stdout + p.stderr  # the plant is there
    statuses = {s["name"]: (s["status"], s["reason"]) for s in manifest(out)["stages"]}
    assert statuses["b"] == ("FAIL", "b real fail"), (statuses, p.stdout, p.stderr)
    assert p.returncode == 1, p.stdout + p.stderr
    # a later `stage c` into that folder, from inside it (discovery, the watchdog and c's worker all start
    # with the run folder as their working directory); -P: the CLI itself as the console script starts
    p = subprocess.run([sys.executable, "-P", "-c", MAIN, "stage", "c", "--out", str(out), "--device", "cpu"],
                       env=env, cwd=run, capture_output=True, text=True, timeout=300)
    statuses = {s["name"]: (s["status"], s["reason"]) for s in manifest(out)["stages"]}
    assert statuses["c"] == ("FAIL", "c real fail"), (statuses, p.stdout, p.stderr)
    assert p.returncode == 1, p.stdout + p.stderr
    assert not log.exists(), log.read_text()  # nothing nsa-run started imported the planted package


PROBE_STAGES = f"""
from nsa_runner import Stage, StageResult, Status

class A(Stage):
    name, order, timeout_s = "a", 10, 120.0
    def run(self, ctx):
        (ctx.dir / "json.py").write_text({SHADOW_INIT!r} + "raise SystemExit(3)\\n")
        return StageResult(Status.PASS, "a planted json.py")

class B(Stage):
    name, order, timeout_s = "b", 11, 300.0
    def run(self, ctx):
        from nsa_runner.envinfo import probe_flash
        recs = probe_flash(timeout_s=240)
        return StageResult(Status.PASS, "b probed " + str(len(recs)))
"""


def test_a10_a_probe_a_stage_starts_never_imports_from_the_run_folder(plugins, tmp_path):
    """(``envinfo.probe_flash``'s ``python -c`` child, started by a stage: cwd = the run folder.)"""
    plugins.make("k16-probe", "k16_probe_mod", PROBE_STAGES, {"a": "k16_probe_mod:A", "b": "k16_probe_mod:B"})
    out = tmp_path / "o"
    log = tmp_path / "shadow.log"
    p = subprocess.run([sys.executable, "-c", MAIN, "oneshot", "--only", "a,b", "--out", str(out), "--device", "cpu"],
                       env=env_with(plugins.env(), K16_SHADOW_LOG=log), capture_output=True, text=True, timeout=300)
    statuses = {s["name"]: s["status"] for s in manifest(out)["stages"]}
    assert statuses == {"a": "PASS", "b": "PASS"}, (statuses, p.stdout, p.stderr)
    assert (out / "testrun" / "json.py").is_file()
    assert not log.exists(), log.read_text()  # the probe did not import the planted json.py
