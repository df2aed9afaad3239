"""Bad days, red-team round 20 (part A) A20-R1 variants b / c, through the CLI: SIGTERM, SIGINT and SIGHUP sent at
once while a stage runs (a CI cancel plus a user's Ctrl-C plus a closed terminal). The first signal's interrupt
reached ``_run_one``'s ``except KeyboardInterrupt``; its first statement called into Python code (``ended = ...
folder.exists(...)``), where the next pending signal's handler raised again, before the stop loop that absorbs a
second interrupt: a bare KeyboardInterrupt escaped. The stage was not stopped by nsa-run (its watchdog killed it
seconds after nsa-run exited), not recorded, and a rerun's earlier result was not put back: the killed attempt's
file stood under the earlier record ("runner died" said report).

Expected: the stage stopped and recorded "interrupted", the earlier result put back, nothing left running, exit 130.
The stage sends the three signals to its runner itself (the user's three, at a moment the runner is waiting on it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil

try:
    from _bad_days import MAIN
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN

SOURCE = """
import os, signal, time
from nsa_runner import Stage, StageResult, Status

class Y(Stage):
    name, order, timeout_s = "y20m", 10, 120.0
    def run(self, ctx):
        text = os.environ.get("BD20M_TEXT", "v1")
        (ctx.dir / "y20m.txt").write_text(text)
        if os.environ.get("BD20M_SIGNALS"):
            runner = int(os.environ["NSA_RUN_PARENT_PID"])
            for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                os.kill(runner, s)
            time.sleep(60)
        return StageResult(Status.PASS, "y20m " + text, files=["y20m.txt"])
"""


def _cookie_holders(cookie_var: str, value: str) -> list[int]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(cookie_var) == value:
                found.append(p.pid)
        except psutil.Error:
            continue
    return found


# (stop 40's parallel CI: the attempt's history record missing once under load; the cause, a late third signal at
# the record's deferral, is fixed and pinned by test_bad_days_signal_windows.py)
def test_three_signals_at_once_stop_record_and_put_back_the_rerun(plugins, tmp_path):
    plugins.make("bd20m-plugin", "bd20m_mod", SOURCE, {"y20m": "bd20m_mod:Y"})
    env = plugins.env()
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-c", MAIN, "oneshot", "--only", "y20m", "--device", "cpu", "--out", str(out)],
                       env=env, text=True, capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    for attempt_no in range(3):  # (before the fix the second signal escaped in about a third of the tries)
        _rerun_interrupted(env, out, tmp_path, attempt_no)


def _rerun_interrupted(env, out, tmp_path, attempt_no: int) -> None:
    mark = f"bd20m-{os.getpid()}-{tmp_path.name}-{attempt_no}"  # (unique across concurrent test processes)
    env2 = {**env, "BD20M_TEXT": "NEW", "BD20M_SIGNALS": "1", "BD20M_TEST_MARK": mark}
    r = subprocess.run([sys.executable, "-c", MAIN, "stage", "y20m", "--device", "cpu", "--out", str(out)],
                       env=env2, text=True, capture_output=True, timeout=600)
    left = _cookie_holders("BD20M_TEST_MARK", mark)  # right at exit: the stage's worker / watchdog carry it
    for pid in left:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass
    run = out / "testrun"
    m = json.loads((run / "manifest.json").read_text())
    (rec,) = m["stages"]
    assert r.returncode == 130, (r.returncode, r.stderr[-3000:])
    # before: the record kept "y20m v1" (PASS) while y20m.txt held NEW, pending left, the stage alive after exit
    assert (run / "y20m.txt").read_text() == "v1", r.stderr[-3000:]
    assert not m.get("pending"), m.get("pending")
    assert rec["status"] == "PASS" and rec["reason"] == "y20m v1", rec  # the earlier result, put back
    attempts = [h for h in m.get("history", []) if h["name"] == "y20m"]  # each attempt: recorded, kept
    assert len(attempts) == attempt_no + 1, attempts
    attempt = attempts[-1]
    assert attempt["status"] == "ERROR" and "interrupted" in attempt["reason"], attempt
    assert (run / attempt["moved_to"] / "y20m.txt").read_text() == "NEW"
    assert left == [], f"still running after nsa-run exited: {left}"
    assert "Traceback" not in r.stderr
