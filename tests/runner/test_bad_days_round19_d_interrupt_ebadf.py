"""Bad days, red-team round 19 (part A) A19-R1, through the CLI: SIGINT then SIGTERM at the end of a ``stage y``
rerun made the runner print "error: run ... is incomplete: Bad file descriptor" and record
``"incomplete": "the runner stopped: Bad file descriptor"``, ``finished: null`` on a oneshot that had finished.

Root: ``Watchdog.done`` closed its pipe's descriptor, then forgot it (``self.w = None``); the second signal,
landing between the two, sent the interrupt path (which calls ``done`` again after a signal: ``_run_one``'s
stop loop) to close the same number again: EBADF escaped the run, and ``run_broke`` took it for "the runner
itself could not go on". Expected: the user's signals are the run's interrupt (exit 130, "interrupted"), the
earlier result is put back, the finished run stays finished.

The second signal is sent by the runner to itself right after ``done``'s close (the first one by the test once
the stage is running): no timing.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

try:
    from _bad_days import MAIN, cli_cmd, env_with, make, manifest, wait_for
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, cli_cmd, env_with, make, manifest, wait_for

# the runner's own os.close in Watchdog.done: once the run was interrupted, a SIGTERM to itself right after it
_AT_CLOSE = MAIN.replace("from nsa_runner.cli import main", (
    "import os, signal\n"
    "from nsa_runner import _worker as w, executor as ex\n"
    "class _OS:\n"
    "    sent = False\n"
    "    def __getattr__(self, n):\n"
    "        return getattr(os, n)\n"
    "    def close(self, fd):\n"
    "        os.close(fd)\n"
    "        if ex.RECEIVED and not _OS.sent and sys._getframe(1).f_code.co_name == 'done':\n"
    "            _OS.sent = True\n"
    "            os.kill(os.getpid(), signal.SIGTERM)\n"
    "w.os = _OS()\n"
    "from nsa_runner.cli import main"))
assert _AT_CLOSE != MAIN


def test_a_second_signal_in_the_watchdogs_close_is_the_interrupt_not_an_errno(plugins, tmp_path):
    out, env = tmp_path / "out", make(plugins)
    first = subprocess.run(cli_cmd("oneshot", "--only", "x,y,z", "--out", out, "--device", "cpu"),
                           env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    finished = manifest(out)["finished"]
    assert finished
    mark = tmp_path / "mark"
    p = subprocess.Popen([sys.executable, "-c", _AT_CLOSE, "stage", "y", "--out", str(out), "--device", "cpu"],
                         env=env_with(env, BD_TEXT="v2", BD_SLEEP_Y=120, BD_MARK=mark),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(mark, proc=p)
        p.send_signal(signal.SIGINT)
        so, se = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, so + se
    assert "Bad file descriptor" not in so + se and "incomplete" not in se, se
    assert "interrupted" in se, se
    m = manifest(out)
    assert "incomplete" not in m, m.get("incomplete")
    assert m["finished"], m
    y = [s for s in m["stages"] if s["name"] == "y"]
    assert len(y) == 1 and y[0]["status"] == "PASS" and y[0]["reason"] == "y v1", json.dumps(y)
    assert (out / "testrun" / "y.txt").read_text() == "v1"
    rep = subprocess.run(cli_cmd("report", "testrun", "--out", out), env=env, capture_output=True, text=True,
                         timeout=300)
    assert "Bad file descriptor" not in rep.stdout + rep.stderr and "UNFINISHED" not in rep.stdout, rep.stdout


# any errno raised while the run unwinds on the user's interrupt (here: the rerun's put-back): EBADF, as above
_RESTORE_FAILS = MAIN.replace("from nsa_runner.cli import main", (
    "import errno\n"
    "from nsa_runner import manifest as mf\n"
    "def restore(self, name, attempt):\n"
    "    raise OSError(errno.EBADF, 'Bad file descriptor')\n"
    "mf.RunManifest.restore = restore\n"
    "from nsa_runner.cli import main"))
assert _RESTORE_FAILS != MAIN


def test_an_errno_while_the_run_stops_on_an_interrupt_is_recorded_as_the_interrupt(plugins, tmp_path):
    out, env = tmp_path / "out", make(plugins)
    first = subprocess.run(cli_cmd("oneshot", "--only", "x,y,z", "--out", out, "--device", "cpu"),
                           env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    mark = tmp_path / "mark"
    p = subprocess.Popen([sys.executable, "-c", _RESTORE_FAILS, "stage", "y", "--out", str(out), "--device", "cpu"],
                         env=env_with(env, BD_TEXT="v2", BD_SLEEP_Y=120, BD_MARK=mark),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(mark, proc=p)
        p.send_signal(signal.SIGINT)
        so, se = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, so + se
    assert "incomplete" not in se and "interrupted" in se, se
    m = manifest(out)
    assert "incomplete" not in m and m["finished"] and m["interrupted"] is True, m
    assert not m.get("pending"), m.get("pending")
    y = [s for s in m["stages"] if s["name"] == "y"]
    assert len(y) == 1 and y[0]["reason"] == "y v1", json.dumps(y)  # the earlier result put back (abandon)
    assert (out / "testrun" / "y.txt").read_text() == "v1"
