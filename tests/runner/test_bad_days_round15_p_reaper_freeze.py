"""Bad days, red-team round 15 (part A) A1, through the CLI: a finished stage's processes acted beside
the next stage. The tree kill of a finished stage (``executor._Reaper``) ran in a thread while the
runner read the stage's result, checked its declared files and began the next stage; a helper the
stage started that ignores SIGTERM lived on for the 3 s grace and:

- forged the next stage's result.json in its temp folder: b, which returned FAIL, was recorded PASS;
- overwrote the next stage's declared file after b wrote it: b's PASS recorded a's bytes;
- turned its own declared file into a folder after the check: a PASS recorded for a folder.

Now the stage's processes are frozen (SIGSTOP, looked at again until nothing new shows) before its
result is read, then killed (SIGKILL) beside the next stage: nothing of a acts once its result is in.
Each helper waits for what it tampers with (no sleep decides the outcome before the fix: 3 s of grace).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with

STAGES = """
import os, signal, subprocess, sys, time
from nsa_runner import Stage, StageResult, Status

def _act(ctx, name):
    (ctx.dir / f"{name}.txt").write_text(f"{name} ok\\n")
    g = {"ctx": ctx, "os": os, "sys": sys, "time": time, "subprocess": subprocess,
         "StageResult": StageResult, "Status": Status}
    g["res"] = StageResult(Status.PASS, f"{name} fine", files=[f"{name}.txt"])
    exec(os.environ.get("P15_" + name.upper(), ""), g)
    return g["res"]

class A(Stage):
    name, order, timeout_s = "a", 10, 120.0
    def run(self, ctx):
        return _act(ctx, "a")

class B(Stage):
    name, order, timeout_s = "b", 11, 120.0
    def run(self, ctx):
        return _act(ctx, "b")
"""

# a's helper: ignores SIGTERM, forges b's result in b's temp folder as soon as that folder exists
FORGE = """
import glob, json, os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
tmp = sys.argv[1]
end = time.time() + 30
while time.time() < end:
    for d in glob.glob(os.path.join(tmp, "nsa-run-b-*")):
        try:
            p = os.path.join(d, "result.tmp")
            with open(p, "w") as f:
                f.write(json.dumps({"result": {"status": "PASS", "reason": "forged by stage a", "files": [],
                                               "metrics": {}, "hint": ""}, "traceback": None}))
            os.rename(p, os.path.join(d, "result.json"))
            raise SystemExit
        except OSError:
            pass
    time.sleep(0.005)
"""

# a's helper: ignores SIGTERM, overwrites b.txt (in the run folder, its cwd) once b wrote it
OVERWRITE = """
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
end = time.time() + 30
while time.time() < end and not os.path.exists("b.txt"):
    time.sleep(0.002)
open("b.txt", "w").write("written by stage a after b\\n")
"""

# a's helper: ignores SIGTERM, turns a.txt into a folder once a's result is written
TO_FOLDER = """
import glob, os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
tmp = sys.argv[1]
end = time.time() + 30
while time.time() < end and not glob.glob(os.path.join(tmp, "nsa-run-a-*", "result.json")):
    time.sleep(0.002)
time.sleep(0.2)  # the runner has read a's result (before the fix: 3 s of grace to act in)
os.remove("a.txt")
os.mkdir("a.txt")
"""


def _run(plugins, tmp_path, helper: str, b_code: str = "", spare: str = "1"):
    plugins.make("p15a-plugin", "p15a_mod", STAGES, {"a": "p15a_mod:A", "b": "p15a_mod:B"})
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = tmp_path / "helper.py"
    script.write_text(helper)
    start = (f"subprocess.Popen([sys.executable, {str(script)!r}, {str(tmp)!r}], cwd=ctx.dir, "
             "stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)")
    out = tmp_path / "out"
    env = env_with(plugins.env(), P15_A=start, P15_B=b_code, TMPDIR=tmp, NSA_RUN_SPARE_WORKER=spare)
    r = subprocess.run([sys.executable, "-c", MAIN, "oneshot", "--only", "a,b", "--out", out, "--device", "cpu"],
                       env=env, capture_output=True, text=True, timeout=300)
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    return r, {s["name"]: s for s in m["stages"]}, out / "testrun"


@pytest.mark.parametrize("spare", ["0", "1"], ids=["fresh-worker", "spare-worker"])
def test_a_finished_stage_cannot_forge_the_next_stages_result(plugins, tmp_path, spare):
    """Before: ``b PASS forged by stage a``, rc 0 (b's own FAIL lost)."""
    r, got, _ = _run(plugins, tmp_path, FORGE, b_code=(
        "time.sleep(1.0); res = StageResult(Status.FAIL, 'b really failed', files=['b.txt'])"), spare=spare)
    assert (got["a"]["status"], got["b"]["status"]) == ("PASS", "FAIL"), (got, r.stderr[-2000:])
    assert got["b"]["reason"] == "b really failed", got["b"]
    assert r.returncode == 1, r.stdout + r.stderr


def test_a_finished_stage_cannot_overwrite_the_next_stages_file(plugins, tmp_path):
    """Before: b's PASS recorded b.txt holding "written by stage a after b"."""
    r, got, run = _run(plugins, tmp_path, OVERWRITE,
                       b_code="(ctx.dir / 'b.txt').write_text('b result\\n'); time.sleep(0.5)")
    assert r.returncode == 0, r.stdout + r.stderr
    assert got["b"]["status"] == "PASS" and got["b"]["files"] == ["b.txt"], got
    assert (run / "b.txt").read_text() == "b result\n"


def test_a_finished_stage_cannot_change_its_files_after_the_check(plugins, tmp_path):
    """Before: a PASS recorded with files ['a.txt'] while a.txt was a folder in the run folder."""
    r, got, run = _run(plugins, tmp_path, TO_FOLDER, b_code="time.sleep(1.0)")
    assert r.returncode == 0, r.stdout + r.stderr
    assert got["a"]["status"] == "PASS" and got["a"]["files"] == ["a.txt"], got
    assert (run / "a.txt").is_file() and not (run / "a.txt").is_dir()
    assert (run / "a.txt").read_text() == "a ok\n"
    assert not os.listdir(tmp_path / "tmp"), os.listdir(tmp_path / "tmp")
