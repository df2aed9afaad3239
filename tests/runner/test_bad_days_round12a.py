"""Bad days, red-team round 12, part A (reruns, process hygiene, closing records): what the probes
from outside broke (/tmp/rt12a_report.md), each through the real CLI (``cli.main``, run id pinned).
The red-teamer widened the windows with strace fault injection; here the runner process itself
sends the signal at the same point (its own ``_move_entry`` / ``RunManifest.finish`` wrapped).

- B1: a signal (SIGINT, SIGTERM) or kill -9 while a rerun set the earlier result aside lost it: the
  manifest kept ``a PASS [a.txt]`` and ``pending: []`` while a.txt lay unrecorded in history/;
- B2: SIGTERM or SIGHUP to the stage's watchdog killed it; a kill -9 of the runner afterwards left
  the stage's children (a plain ``sleep``, setsid daemons) running;
- B3: a SIGTERM while a rerun wrote its closing manifest exited 130 without a word, left the earlier
  run's summary.md / junit.xml (PASS for a stage now recorded FAIL), exit_code and interrupted as
  they were; ``nsa-run report`` then kept the stale summary.md.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

try:
    from _bad_days import MAIN, env_with, wait_for
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with, wait_for


# in the runner process: a signal to itself at the point the red-teamer held open with strace
INJECT = '''
import os, signal
from nsa_runner import manifest as _m

_real_move = _m._move_entry

def _move(src, target):
    sig, victim = os.environ.get("RT12_SIG_AT_MOVE"), os.environ.get("RT12_VICTIM", "a.txt")
    hit = bool(sig) and src.name == victim and "history" in target.parts
    if hit and os.environ.get("RT12_BEFORE"):
        os.kill(os.getpid(), getattr(signal, sig))
    _real_move(src, target)
    if hit and not os.environ.get("RT12_BEFORE"):
        os.kill(os.getpid(), getattr(signal, sig))

_m._move_entry = _move

_real_finish = _m.RunManifest.finish

def _finish(self, interrupted=False):
    _real_finish(self, interrupted)
    if os.environ.get("RT12_TERM_AT_FINISH") and not interrupted:
        os.kill(os.getpid(), signal.SIGTERM)
    if os.environ.get("RT12_KILL_AT_FINISH") and not interrupted:
        os.kill(os.getpid(), signal.SIGKILL)

_m.RunManifest.finish = _finish
'''

RT = """
import os, subprocess, time
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

class A(Stage):
    name, order, timeout_s = "a", 10, 120.0
    def run(self, ctx):
        text = os.environ.get("RT_A_TEXT", "v1")
        (ctx.dir / "a.txt").write_text(text)
        if os.environ.get("RT_A_CMD"):
            subprocess.run(os.environ["RT_A_CMD"], shell=True, cwd=ctx.dir)
        print(f"a wrote {text}", flush=True)
        if os.environ.get("RT_A_MARK"):
            Path(os.environ["RT_A_MARK"]).write_text(str(os.getpid()))
        time.sleep(float(os.environ.get("RT_A_SLEEP", "0")))
        return StageResult(Status(os.environ.get("RT_A_STATUS", "PASS")), f"a {text}", files=["a.txt"])

class B(Stage):
    name, order, timeout_s = "b", 20, 120.0
    def run(self, ctx):
        (ctx.dir / "b.txt").write_text("b")
        return StageResult(Status.PASS, "b", files=["b.txt"])
"""


@pytest.fixture
def rt(plugins):
    plugins.make("rt12-plugin", "rt12_mod", RT, {"a": "rt12_mod:A", "b": "rt12_mod:B"})
    env = plugins.env()
    for k in [k for k in env if k.startswith(("RT_A_", "RT12_"))]:
        env.pop(k)
    return env


def main_cmd(*args) -> list[str]:
    return [sys.executable, "-c", INJECT + MAIN, *map(str, args)]


def _main(env, *args, timeout=120):
    return subprocess.run(main_cmd(*args), env=env, text=True, timeout=timeout, capture_output=True)


def _manifest(run) -> dict:
    return json.loads((run / "manifest.json").read_text())


def _stage(env, out, name="a", rc=0, **kw):
    r = _main(env_with(env, **kw), "stage", name, "--out", out, "--device", "cpu")
    assert r.returncode == rc, (r.returncode, r.stderr[-2000:])
    return r


def _back(run, text="v1"):
    """The earlier result is back in place and recorded, nothing left pending, nothing of it in history/."""
    m = _manifest(run)
    (a,) = [s for s in m["stages"] if s["name"] == "a"]
    assert a["status"] == "PASS" and a["reason"] == f"a {text}" and a["files"] == ["a.txt"], a
    assert (run / "a.txt").is_file() and (run / "a.txt").read_text() == text
    assert "a wrote v1" in (run / "logs" / "a.log").read_text()
    assert not m.get("pending"), m.get("pending")
    lost = [str(q.relative_to(run)) for q in (run / "history").rglob("*")
            if q.is_file() and q.name in ("a.txt", "a.log")]
    assert not lost, f"the earlier result lies in history/ unrecorded: {lost}"
    return m


# ---- B1: set-aside is write-ahead, its undo signal-safe ---------------------------------------------

@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("victim", ["a.txt", "a.log"])
def test_b1_signal_right_after_a_set_aside_move_puts_the_earlier_result_back(rt, tmp_path, sig, victim):
    """B1: the handler ran the moment os.rename returned, before the move was counted: the undo put
    nothing back and the manifest kept ``a PASS [a.txt]`` with a.txt in history/."""
    out = tmp_path / "out"
    _stage(rt, out)
    run = out / "testrun"
    r = _stage(rt, out, rc=130, RT_A_TEXT="v2", RT12_SIG_AT_MOVE=sig, RT12_VICTIM=victim)
    assert "interrupted" in r.stderr, r.stderr[-2000:]
    _back(run)
    _stage(rt, out, "b")  # a later command finds nothing to repair
    _back(run)


@pytest.mark.parametrize("before", [False, True])
@pytest.mark.parametrize("victim", ["a.txt", "a.log"])
def test_b1_kill9_during_set_aside_is_repaired_by_the_next_run(rt, tmp_path, victim, before):
    """B1: kill -9 while the earlier files moved: nothing on disk recorded the move (pending was
    written after the moves), so no later nsa-run could put a.txt back."""
    out = tmp_path / "out"
    _stage(rt, out)
    run = out / "testrun"
    r = _main(env_with(rt, RT_A_TEXT="v2", RT12_SIG_AT_MOVE="SIGKILL", RT12_VICTIM=victim,
                       **({"RT12_BEFORE": 1} if before else {})), "stage", "a", "--out", out, "--device", "cpu")
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr[-2000:])
    m = _manifest(run)
    if not before or victim == "a.log":  # something moved: the write-ahead note says where
        assert [p["stage"] for p in m.get("pending") or []] == ["a"], m.get("pending")
        assert m["pending"][0].get("moved_to"), m["pending"]
    _stage(rt, out, "b")
    _back(run)
    _stage(rt, out, "a", RT_A_TEXT="v3")  # and a rerun afterwards records the v1 entry where v1 is
    m = _manifest(run)
    (h,) = [e for e in m["history"] if e["name"] == "a"]
    assert (run / h["moved_to"] / "a.txt").read_text() == "v1", h


# ---- B2: the watchdog ignores TERM / HUP; a dead one is replaced ----------------------------------

def _watchdog_of(runner_pid: int) -> psutil.Process:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info["cmdline"] or []
            if "--watchdog" in cmd and any(f"nsa-run-a-{runner_pid}-" in a for a in cmd):
                return p
        time.sleep(0.1)
    raise AssertionError("no watchdog found")


def _sleepers(*secs: int) -> list[psutil.Process]:
    want = {str(s) for s in secs}
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if len(cmd) == 2 and os.path.basename(cmd[0]) == "sleep" and cmd[1] in want:
            found.append(p)
    return found


@pytest.mark.parametrize("how", ["TERM+HUP", "KILL"])
def test_b2_runner_kill9_after_its_watchdog_got_term_hup_or_kill_leaves_nothing(rt, tmp_path, spawn, how):
    """B2: SIGTERM or SIGHUP killed the watchdog; a kill -9 of the runner then left the stage's
    children running (ppid 1). A watchdog killed outright (SIGKILL) is replaced by the runner."""
    if shutil.which("setsid") is None:
        pytest.skip("no setsid here")
    base = 31000 + os.getpid() % 5000 * 3
    s1, s2, s3 = base, base + 1, base + 2
    mark = tmp_path / "a.started"
    cmd = f"sleep {s1} & setsid -f sleep {s2}; env -i setsid -f sleep {s3}"
    proc = spawn(main_cmd("stage", "a", "--out", tmp_path / "out", "--device", "cpu"),
                 env=env_with(rt, RT_A_CMD=cmd, RT_A_MARK=mark, RT_A_SLEEP=60),
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(mark, proc=proc)
        time.sleep(1.2)  # the watchdog has seen the stage's tree
        assert len(_sleepers(s1, s2, s3)) == 3, "the stage's children did not start"
        dog = _watchdog_of(proc.pid)
        if how == "KILL":
            dog.send_signal(signal.SIGKILL)
        else:
            dog.send_signal(signal.SIGTERM)
            dog.send_signal(signal.SIGHUP)
        time.sleep(1.5)  # a killed one is replaced, and the new one has seen the tree
        if how != "KILL":
            assert dog.is_running() and dog.status() != psutil.STATUS_ZOMBIE, "TERM / HUP ended the watchdog"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _sleepers(s1, s2, s3) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _sleepers(s1, s2, s3)
        assert not left, f"left running after the runner's kill -9: {[p.pid for p in left]}"
    finally:
        for p in _sleepers(s1, s2, s3):
            try:
                p.kill()
            except psutil.Error:
                pass


# ---- B3: the closing records are written whatever signal comes; report repairs stale ones ----------

@pytest.mark.parametrize("status", ["FAIL", "PASS"])
def test_b3_sigterm_while_the_closing_manifest_is_written_still_writes_the_closing_records(rt, tmp_path, status):
    """B3: a SIGTERM while a rerun finished its manifest (after the record) exited 130 without a
    word; summary.md / junit.xml kept the earlier run's PASS, exit_code 0, interrupted false."""
    out = tmp_path / "out"
    _stage(rt, out)
    run = out / "testrun"
    r = _stage(rt, out, rc=130, RT_A_TEXT="v2", RT_A_STATUS=status, RT12_TERM_AT_FINISH=1)
    assert "interrupted" in r.stderr, r.stderr[-2000:]
    m = _manifest(run)
    (a,) = m["stages"]
    assert (a["status"], a["reason"]) == (status, "a v2"), a
    assert m["interrupted"] is True and m["exit_code"] == 130, (m["interrupted"], m["exit_code"])
    summary = (run / "summary.md").read_text()
    assert "a v2" in summary and "a v1" not in summary, summary
    junit = (run / "junit.xml").read_text()
    assert ("<failure" in junit) == (status == "FAIL"), junit
    assert json.loads((run / "summary.json").read_text())
    r = _main(rt, "report", run)
    assert r.returncode == 0 and "rewritten" not in r.stdout, r.stdout + r.stderr


def test_b3_report_rewrites_a_summary_and_junit_that_disagree_with_the_manifest(rt, tmp_path):
    """B3: ``report`` kept a summary.md older than the manifest's last record ("kept (written when
    the run ended)"): PASS on the page, FAIL in the manifest and in its own counts. Here the rerun
    is killed (-9) after its record, before its closing reports."""
    out = tmp_path / "out"
    _stage(rt, out)
    run = out / "testrun"
    r = _main(rt, "report", run)  # a run that ended as usual: its summary agrees, kept
    assert r.returncode == 0 and "kept" in r.stdout and "rewritten" not in r.stdout, r.stdout + r.stderr
    _stage(rt, out, rc=-signal.SIGKILL, RT_A_TEXT="v2", RT_A_STATUS="FAIL", RT12_KILL_AT_FINISH=1)
    assert "a v1" in (run / "summary.md").read_text()  # the earlier run's, left as it was
    (a,) = _manifest(run)["stages"]
    assert (a["status"], a["reason"]) == ("FAIL", "a v2"), a
    r = _main(rt, "report", run)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "rewritten" in r.stdout and "kept" not in r.stdout, r.stdout
    summary = (run / "summary.md").read_text()
    assert "a v2" in summary and "a v1" not in summary, summary
    assert "<failure" in (run / "junit.xml").read_text()
    r = _main(rt, "report", run)  # now they agree
    assert r.returncode == 0 and "kept" in r.stdout, r.stdout
