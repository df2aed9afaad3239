"""Bad days: an interrupt that lands at the edge of a guarded step, through the CLI.

Stop 40's parallel CI failed once on round 20's three-signals test: SIGTERM, SIGINT and SIGHUP during a rerun, exit
130, the earlier result put back, but the interrupted attempt had no history record. The cause: ``run_one`` stopped
the stage inside a retry loop (a further signal there only hurries the kill), then began the record's signal
deferral (``until.begin()``) outside it. A signal that came as the stop ended (the third of three, late under load)
raised at that call: a bare KeyboardInterrupt left ``run_one``, the run's generic interrupt path put the earlier
result back (``abandon``) and recorded nothing of the attempt.

The window is microseconds wide, so these tests put the signal into it on purpose: the CLI runs with
``_UntilRecorded.begin`` wrapped to raise a real SIGHUP (the runner's own handler) at its first call, as a signal
arriving at that instant would. The same for ``_Deferred.start`` / ``end`` half-way through swapping the handlers,
where a pending signal used to leave one of them on the hold handler for good.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN

SOURCE = """
import os, signal, time
from nsa_runner import Stage, StageResult, Status

class Y(Stage):
    name, order, timeout_s = "ysw", 10, 120.0
    def run(self, ctx):
        text = os.environ.get("BDSW_TEXT", "v1")
        (ctx.dir / "ysw.txt").write_text(text)
        if os.environ.get("BDSW_SIGNAL"):
            os.kill(int(os.environ["NSA_RUN_PARENT_PID"]), signal.SIGTERM)
            time.sleep(60)
        time.sleep(float(os.environ.get("BDSW_SLEEP", "0")))
        return StageResult(Status.PASS, "ysw " + text, files=["ysw.txt"])
"""

# a signal at the first call of ``until.begin()`` that follows an interrupt (the stage's SIGTERM): raised for real,
# through the runner's handler, as one arriving at that instant
AT_BEGIN = """
import signal
from nsa_runner import executor as _ex
_orig = _ex._UntilRecorded.begin
_fired = []
def _begin(self):
    if not _fired:
        _fired.append(1)
        signal.raise_signal(signal.SIGHUP)
    return _orig(self)
_ex._UntilRecorded.begin = _begin
"""


def _first_run(plugins, tmp_path, **more):
    """The plugin made and its stage run once (PASS "ysw v1"), to be rerun: (the environment, ``--out``)."""
    plugins.make("bdsw-plugin", "bdsw_mod", SOURCE, {"ysw": "bdsw_mod:Y"})
    env = {**plugins.env(), **more}
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-c", MAIN, "oneshot", "--only", "ysw", "--device", "cpu", "--out", str(out)],
                       env=env, text=True, capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return env, out


def _rerun(env, out, prelude: str) -> subprocess.CompletedProcess:
    env2 = {**env, "BDSW_TEXT": "NEW", "BDSW_SIGNAL": "1"}
    return subprocess.run([sys.executable, "-c", prelude + MAIN, "stage", "ysw", "--device", "cpu", "--out", str(out)],
                          env=env2, text=True, capture_output=True, timeout=600)


def test_a_signal_as_the_interrupted_stage_stop_ends_still_records_the_attempt(plugins, tmp_path):
    env, out = _first_run(plugins, tmp_path)
    r = _rerun(env, out, AT_BEGIN)
    run = out / "testrun"
    m = json.loads((run / "manifest.json").read_text())
    assert r.returncode == 130, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    (rec,) = m["stages"]
    assert rec["status"] == "PASS" and rec["reason"] == "ysw v1", rec  # the earlier result, put back
    assert (run / "ysw.txt").read_text() == "v1"
    assert not m.get("pending"), m.get("pending")
    # before: attempts == [] (the generic interrupt path put the earlier result back and recorded nothing)
    attempts = [h for h in m.get("history", []) if h["name"] == "ysw"]
    assert len(attempts) == 1, attempts
    assert attempts[0]["status"] == "ERROR" and "interrupted" in attempts[0]["reason"], attempts[0]
    assert (run / attempts[0]["moved_to"] / "ysw.txt").read_text() == "NEW"


@pytest.mark.parametrize("where", ["start", "end"])
def test_a_signal_while_the_deferral_swaps_handlers_leaves_no_handler_on_hold(where):
    """``_Deferred.start`` / ``end`` swap three handlers one by one; ``signal.signal`` runs pending handlers. A signal
    that came as the swap began (its Python handler not yet run) raised out of the swap half done: before the fix, a
    KeyboardInterrupt out of ``start`` left SIGINT on the hold handler for good (the _Deferred lost, never ended), and
    one out of ``end`` left the later signals on hold. Either way a later Ctrl-C was swallowed."""
    code = f"""
import signal, sys
from nsa_runner.manifest import _Deferred, INTERRUPTS
def runner_handler(signum, frame):
    raise KeyboardInterrupt
for s in INTERRUPTS:
    signal.signal(s, runner_handler)
real_signal = signal.signal
armed = []
late = INTERRUPTS[-1] if {where!r} == "start" else INTERRUPTS[0]
def signal_then_pending(sig, handler):  # a signal arrives as the first handler is swapped: start, one not yet
    prev = real_signal(sig, handler)    # swapped (its handler raises); end, the one just put back
    if armed:
        armed.clear()
        signal.raise_signal(late)  # runs the handler that signal has now
    return prev
signal.signal = signal_then_pending
d = _Deferred()
if {where!r} == "end":
    d.start()
    armed.append(1)
    try:
        d.end(deliver=False)
    except KeyboardInterrupt:
        print("raised out of end")
else:
    armed.append(1)
    try:
        d.start()
    except KeyboardInterrupt:
        print("raised out of start")
    else:
        d.end(deliver=False)
signal.signal = real_signal
on_hold = [signal.Signals(s).name for s in INTERRUPTS if signal.getsignal(s) is not runner_handler]
print("on hold:", on_hold)
sys.exit(1 if on_hold else 0)
"""
    r = subprocess.run([sys.executable, "-c", code], text=True, capture_output=True, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr[-2000:])


def test_a_signal_as_a_finished_stage_record_begins_records_the_new_result(plugins, tmp_path):
    """The same window on the way a stage ends by itself: the record's deferral began outside any ``try``, so a
    signal right then escaped bare and the finished rerun's result was dropped for the earlier one (the signal is
    the run's interrupt after the record, as one a moment later is)."""
    env, out = _first_run(plugins, tmp_path)
    r = subprocess.run([sys.executable, "-c", AT_BEGIN + MAIN, "stage", "ysw", "--device", "cpu", "--out", str(out)],
                       env={**env, "BDSW_TEXT": "NEW"}, text=True, capture_output=True, timeout=600)
    run = out / "testrun"
    m = json.loads((run / "manifest.json").read_text())
    assert r.returncode == 130, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    (rec,) = m["stages"]
    assert rec["status"] == "PASS" and rec["reason"] == "ysw NEW", rec  # before: "ysw v1", the new result dropped
    assert (run / "ysw.txt").read_text() == "NEW"
    assert not m.get("pending"), m.get("pending")
    (earlier,) = [h for h in m.get("history", []) if h["name"] == "ysw"]
    assert earlier["reason"] == "ysw v1" and (run / earlier["moved_to"] / "ysw.txt").read_text() == "v1", earlier


# a signal right after the stage's worker started, before the runner's wait knew it (``hold_pid`` returns the new
# worker), or right after its temp folder was made, before its marker (round 47 U47a-5): raised as the call returns
AT_START = """
import signal
from nsa_runner import executor as _ex
_orig = _ex.hold_pid
def _hold(proc):
    proc = _orig(proc)
    signal.raise_signal(signal.SIGHUP)
    return proc
_ex.hold_pid = _hold
"""
AT_FOLDER = """
import signal
from nsa_runner import executor as _ex
_orig = _ex._TempFolder.__init__
def _init(self, *a, **k):
    _orig(self, *a, **k)
    signal.raise_signal(signal.SIGHUP)
_ex._TempFolder.__init__ = _init
"""


@pytest.mark.parametrize("where", ["worker", "folder"])
def test_a_signal_as_the_stage_starts_stops_and_records_the_attempt(plugins, tmp_path, where):
    """Stop 41's stress of the three-signals test (three loops beside two busy CPUs) found a second window: the
    stage's own signals reached a runner still between the worker's start and its wait (descheduled under load). The
    interrupt escaped bare: "interrupted: no stage was running", the earlier result put back, no attempt record.
    Round 47 (U47a-5) saw the same a step earlier, with the stage's temp folder left behind unmarked."""
    temp = tmp_path / "temp"
    temp.mkdir()
    env, out = _first_run(plugins, tmp_path, NSA_RUN_SPARE_WORKER="0", TMPDIR=str(temp))  # (a first stage: no spare)
    prelude = AT_START if where == "worker" else AT_FOLDER
    r = subprocess.run([sys.executable, "-c", prelude + MAIN, "stage", "ysw", "--device", "cpu", "--out", str(out)],
                       env={**env, "BDSW_TEXT": "NEW", "BDSW_SLEEP": "60"}, text=True, capture_output=True,
                       timeout=600)
    run = out / "testrun"
    m = json.loads((run / "manifest.json").read_text())
    assert r.returncode == 130, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr and "no stage was running" not in r.stderr, r.stderr[-3000:]
    (rec,) = m["stages"]
    assert rec["status"] == "PASS" and rec["reason"] == "ysw v1", rec  # the earlier result, put back
    assert not m.get("pending"), m.get("pending")
    (attempt,) = [h for h in m.get("history", []) if h["name"] == "ysw"]  # before: none
    assert attempt["status"] == "ERROR" and "interrupted" in attempt["reason"], attempt
    assert not [p.name for p in temp.iterdir() if p.name.startswith("nsa-run-ysw-")]  # (before, "folder": one left)
