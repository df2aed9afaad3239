"""Round 13 A-B4 (for executor.py): a second Ctrl-C (or the first one at the wrong moment) while a
stage's record is made lost it: stale ``pending``, the terminal said PASS, ``report`` "runner died".
Through the real CLI (``cli.main``, run id pinned); the runner sends itself the (second) SIGINT at
the step the red-teamer's 50 ms hit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

try:
    from _bad_days import PINNED, env_with, wait_for
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import PINNED, env_with, wait_for

MAIN = PINNED.replace("from nsa_runner.cli import app; app(prog_name='nsa-run')",
                      "from nsa_runner.cli import main; sys.argv[0] = 'nsa-run'; main()")

INJECT = '''
import os, signal
from nsa_runner import executor as _x
from nsa_runner import manifest as _m

_fired = set()

def _once(key):
    if os.environ.get("RT13_AT") == key and key not in _fired:
        _fired.add(key)
        os.kill(os.getpid(), signal.SIGINT)

_real_restore = _m.RunManifest.restore
def _restore(self, *a, **k):  # the interrupted stage's record is being made: a second Ctrl-C
    _once("restore")
    return _real_restore(self, *a, **k)
_m.RunManifest.restore = _restore

_real_not = _x._not_anothers
def _not(*a, **k):  # a finished stage's record is being made: a Ctrl-C
    _once("record")
    return _real_not(*a, **k)
_x._not_anothers = _not

_real_tail = _x.tail
def _tail(path, lines=_x.LOG_TAIL_LINES, *a, **k):  # the interrupted stage is being stopped: a second Ctrl-C
    if lines == _x.LOG_TAIL_LINES:
        _once("stop")
    return _real_tail(path, lines, *a, **k)
_x.tail = _tail
'''

RT = """
import os, time
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

class A(Stage):
    name, order, timeout_s = "a", 10, 120.0
    def run(self, ctx):
        (ctx.dir / "a.txt").write_text("v1")
        if os.environ.get("RT_A_MARK"):
            Path(os.environ["RT_A_MARK"]).write_text(str(os.getpid()))
        time.sleep(float(os.environ.get("RT_A_SLEEP", "0")))
        return StageResult(Status.PASS, "a v1", files=["a.txt"])

class B(Stage):
    name, order, timeout_s = "b", 20, 120.0
    def run(self, ctx):
        (ctx.dir / "b.txt").write_text("b")
        return StageResult(Status.PASS, "b", files=["b.txt"])
"""


@pytest.fixture
def rt(plugins, tmp_path):
    plugins.make("rt13c-plugin", "rt13c_mod", RT, {"a": "rt13c_mod:A", "b": "rt13c_mod:B"})
    env = plugins.env()
    for k in [k for k in env if k.startswith(("RT_A_", "RT13_"))]:
        env.pop(k)
    (tmp_path / "tmp").mkdir()
    env["TMPDIR"] = str(tmp_path / "tmp")
    return env


def _manifest(out) -> dict:
    return json.loads((out / "testrun" / "manifest.json").read_text())


def test_a_b4_interrupt_as_a_finished_stage_is_recorded_keeps_its_record(rt, tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-c", INJECT + MAIN, "oneshot", "--only", "a,b", "--out", str(out),
                        "--device", "cpu"], env=env_with(rt, RT13_AT="record"), text=True, capture_output=True,
                       timeout=180)
    assert r.returncode == 130, (r.returncode, r.stderr[-2000:])
    m = _manifest(out)
    assert [(s["name"], s["status"]) for s in m["stages"]] == [("a", "PASS")], m["stages"]
    assert not m.get("pending"), m.get("pending")
    assert m["interrupted"] is True and m["exit_code"] == 130
    summary = (out / "testrun" / "summary.md").read_text()
    assert "| a |" in summary or "a v1" in summary


@pytest.mark.parametrize("at", ["restore", "stop"])
def test_a_b4_second_ctrl_c_while_the_interrupted_stage_stops_keeps_its_record(rt, tmp_path, spawn, at):
    out, mark = tmp_path / "out", tmp_path / "a.started"
    proc = spawn([sys.executable, "-c", INJECT + MAIN, "oneshot", "--only", "a,b", "--out", str(out),
                  "--device", "cpu"], env=env_with(rt, RT13_AT=at, RT_A_MARK=mark, RT_A_SLEEP=60),
                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(mark, proc=proc)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    m = _manifest(out)
    assert [(s["name"], s["status"]) for s in m["stages"]] == [("a", "ERROR")], (m["stages"], err[-2000:])
    assert "interrupted" in m["stages"][0]["reason"], m["stages"][0]
    assert not m.get("pending"), m.get("pending")
    assert m["interrupted"] is True and m["exit_code"] == 130
    left = [p for p in os.listdir(rt["TMPDIR"]) if p.startswith("nsa-run-a-")]
    assert not left, f"the stage's temp folder was left: {left}"
