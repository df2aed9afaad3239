"""Bad days, red-team round 13 (executor): what the probes from outside broke (/tmp/rt13a/report.md,
/tmp/rt13b/report.md), each through the real CLI (``cli.main``, run id pinned).

- A-B1: a SIGSTOPped watchdog, then ``kill -9`` of the runner: the stage's children and setsid
  daemons kept running, and the stopped watchdog stayed (state T) for good; a hostile stage did it to
  itself (stop its watchdog, then SIGKILL the runner);
- B-B13: a plugin's huge import error or a stage's huge reason / traceback was recorded whole: a
  280 MB one made a manifest.json the runner's own reader refuses (> 256 MiB), blocking the run and
  every later command into that ``--out``;
- B-B14: recording a stage was quadratic in the files two stages declare (8000 + 8000: 74 s;
  20 000 + 20 000 did not finish in 8 min).

Stage ``a`` runs ``$RT_A_CMD`` (a shell command) in the run folder, writes ``a.txt``, notes its pid in
``$RT_A_MARK``, can stop its own watchdog and SIGKILL the runner (``$RT_A_HOSTILE``), writes and
declares ``$RT_MANY`` files under ``many/``, returns a huge reason (``$RT_A_REASON``) or raises a huge
error (``$RT_A_RAISE``); stage ``b`` writes b.txt and ``$RT_MANY`` files under ``many2/``.
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


RT = """
import os, signal, subprocess, time
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

def _hostile(ctx):
    # a daemon without the cookie, in a session of its own; once the watchdog has seen it, the stage
    # stops its watchdog and kills the runner at once (no poll of the runner can come between)
    import psutil
    p = subprocess.Popen(["sleep", os.environ["RT_A_HOSTILE"]], env={}, start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    Path(os.environ["RT_A_MARK"] + ".daemon").write_text(str(p.pid))
    # RT_A_LOOK_S: how long the watchdog may look at the stage's tree first (every 0.5 s). With 0 the daemon is
    # never seen by it: before stop 42 it ran on (the worker died at once with the runner, the daemon went to
    # init); now the worker, a subreaper the daemon's tree stays in, kills its tree when the runner dies
    time.sleep(float(os.environ.get("RT_A_LOOK_S", "3.0")))
    runner = psutil.Process(os.getppid()).parent()
    dogs = [c for c in runner.children() if "--watchdog" in c.cmdline()]
    for d in dogs:
        d.send_signal(signal.SIGSTOP)
    Path(os.environ["RT_A_MARK"] + ".dog").write_text(" ".join(str(d.pid) for d in dogs))
    os.kill(runner.pid, signal.SIGKILL)
    time.sleep(60)

def _many(ctx, folder, stem):
    n = int(os.environ.get("RT_MANY", "0"))
    d = ctx.dir / folder
    if n:
        d.mkdir()
    for i in range(n):
        (d / f"{stem}{i}.txt").write_text("x")
    return [f"{folder}/{stem}{i}.txt" for i in range(n)]

class A(Stage):
    name, order, timeout_s = "a", 10, 300.0
    def run(self, ctx):
        (ctx.dir / "a.txt").write_text("v1")
        if os.environ.get("RT_A_CMD"):
            subprocess.run(os.environ["RT_A_CMD"], shell=True, cwd=ctx.dir)
        if os.environ.get("RT_A_HOSTILE"):
            _hostile(ctx)
        if os.environ.get("RT_A_MARK"):
            Path(os.environ["RT_A_MARK"]).write_text(str(os.getpid()))
        time.sleep(float(os.environ.get("RT_A_SLEEP", "0")))
        if os.environ.get("RT_A_RAISE"):
            raise ValueError("y" * int(os.environ["RT_A_RAISE"]))
        reason = "r" * int(os.environ.get("RT_A_REASON", "0")) or "a v1"
        return StageResult(Status.FAIL if os.environ.get("RT_A_REASON") else Status.PASS, reason,
                           hint="h" * int(os.environ.get("RT_A_REASON", "0")),
                           files=["a.txt"] + _many(ctx, "many", "f"),
                           metrics={"note": "m" * int(os.environ.get("RT_A_REASON", "0")), "n": 1})

class B(Stage):
    name, order, timeout_s = "b", 20, 300.0
    def run(self, ctx):
        (ctx.dir / "b.txt").write_text("b")
        files = ["b.txt"] + _many(ctx, "many2", "g") + [x for x in os.environ.get("RT_B_ALSO", "").split(",") if x]
        return StageResult(Status.PASS, "b", files=files)
"""

# a plugin whose import raises an error of $RT_HUGE_IMPORT characters
HUGE_IMPORT = """
import os
raise ValueError("y" * int(os.environ.get("RT_HUGE_IMPORT", "10")))
"""


@pytest.fixture
def rt(plugins):
    plugins.make("rt13x-plugin", "rt13x_mod", RT, {"a": "rt13x_mod:A", "b": "rt13x_mod:B"})
    env = plugins.env()
    for k in [k for k in env if k.startswith(("RT_A_", "RT_B_", "RT_MANY", "RT_HUGE"))]:
        env.pop(k)
    return env


def main_cmd(*args) -> list[str]:
    return [sys.executable, "-c", MAIN, *map(str, args)]


def _manifest(out) -> dict:
    return json.loads((out / "testrun" / "manifest.json").read_text())


def _sleepers(*secs: int) -> list[psutil.Process]:
    want = {str(s) for s in secs}
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if len(cmd) == 2 and os.path.basename(cmd[0]) == "sleep" and cmd[1] in want:
            found.append(p)
    return found


def _watchdogs_of(runner_pid: int) -> list[psutil.Process]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = []
        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info["cmdline"] or []
            if "--watchdog" in cmd and any(f"nsa-run-a-{runner_pid}-" in a for a in cmd):
                found.append(p)
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError("no watchdog found")


def _gone(procs, seconds: float) -> list:
    deadline = time.monotonic() + seconds
    left = list(procs)
    while time.monotonic() < deadline:
        left = []
        for p in procs:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(p)
            except psutil.Error:
                pass
        if not left:
            return []
        time.sleep(0.1)
    return left


def _kill(procs) -> None:
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


# ---- A-B1: a stopped watchdog counts as dead: continued while the runner lives, and the kernel ------
# continues it when the runner dies (its process group is orphaned then)

def test_a_b1_runner_kill9_after_its_watchdog_was_stopped_leaves_nothing(rt, tmp_path, spawn):
    """A-B1 by hand: SIGSTOP of the watchdog, a while later kill -9 of the runner: the stage's plain
    child and its setsid daemons ran on (ppid 1), and the watchdog stayed stopped for good."""
    if shutil.which("setsid") is None:
        pytest.skip("no setsid here")
    base = 41000 + os.getpid() % 5000 * 3
    s1, s2, s3 = base, base + 1, base + 2
    mark = tmp_path / "a.started"
    cmd = f"sleep {s1} & setsid -f sleep {s2}; env -i setsid -f sleep {s3}"
    proc = spawn(main_cmd("stage", "a", "--out", tmp_path / "out", "--device", "cpu"),
                 env=env_with(rt, RT_A_CMD=cmd, RT_A_MARK=mark, RT_A_SLEEP=60),
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dogs = []
    try:
        wait_for(mark, proc=proc)
        time.sleep(1.2)  # the watchdog has seen the stage's tree
        assert len(_sleepers(s1, s2, s3)) == 3, "the stage's children did not start"
        dogs = _watchdogs_of(proc.pid)
        for d in dogs:
            d.send_signal(signal.SIGSTOP)
        time.sleep(2.0)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        left = _gone(_sleepers(s1, s2, s3), 15)
        assert not left, f"left running after the runner's kill -9: {[(p.pid, p.cmdline()) for p in left]}"
        left = _gone(dogs, 15)
        assert not left, f"the stopped watchdog stayed: {[(p.pid, p.status()) for p in left]}"
    finally:
        _kill(_sleepers(s1, s2, s3) + dogs)


@pytest.mark.parametrize("look_s", ["3.0", "0"])
def test_a_b1_stage_that_stops_its_watchdog_and_kills_the_runner_leaves_nothing(rt, tmp_path, spawn, look_s):
    """A-B1, hostile: the stage starts a daemon (no cookie, its own session), stops its watchdog and
    SIGKILLs the runner in one go: the daemon and the stopped watchdog stayed. ``look_s`` 0: all at once, before
    the watchdog could have looked (stop 41's open gap: the daemon ran on)."""
    secs = 44000 + os.getpid() % 5000 + (1 if look_s == "0" else 0) * 5000
    mark = tmp_path / "a.mark"
    proc = spawn(main_cmd("stage", "a", "--out", tmp_path / "out", "--device", "cpu"),
                 env=env_with(rt, RT_A_HOSTILE=secs, RT_A_MARK=mark, RT_A_LOOK_S=look_s),
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dogs = []
    try:
        assert proc.wait(timeout=90) == -signal.SIGKILL
        dog_pids = wait_for(tmp_path / "a.mark.dog", timeout=10).split()
        assert dog_pids, "the stage found no watchdog to stop"
        for pid in dog_pids:
            try:
                dogs.append(psutil.Process(int(pid)))
            except psutil.Error:
                pass
        daemon = wait_for(tmp_path / "a.mark.daemon", timeout=10)
        left = _gone(_sleepers(secs), 15)
        assert not left, f"the stage's daemon (pid {daemon}) ran on after the runner's kill -9"
        left = _gone(dogs, 15)
        assert not left, f"the stopped watchdog stayed: {[(p.pid, p.status()) for p in left]}"
    finally:
        _kill(_sleepers(secs) + dogs)


def test_the_workers_runner_gone_signal_is_ignored_while_the_runner_lives(rt, tmp_path):
    """Stop 42: the worker's parent-death signal is now one it handles (``_worker.RUNNER_GONE``: kill its tree, then
    end). Sent by the stage's own code while the runner lives, it is ignored: the stage runs on and PASSes."""
    from nsa_runner._worker import RUNNER_GONE

    out, sent = tmp_path / "out", tmp_path / "sent"
    # the shell's parent is the stage's work; the work's parent (field 4 of its stat) is the keeper
    keeper = f"kill -{int(RUNNER_GONE)} $(cut -d' ' -f4 /proc/$PPID/stat) && touch {sent}"
    r = subprocess.run(main_cmd("stage", "a", "--out", out, "--device", "cpu"), env=env_with(rt, RT_A_CMD=keeper),
                       capture_output=True, text=True, timeout=120)
    (rec,) = _manifest(out)["stages"]
    assert sent.exists(), "the signal was not sent"
    assert r.returncode == 0 and rec["status"] == "PASS", (rec, r.stderr[-2000:])


# ---- B-B13: what a plugin says is clipped before it is recorded ------------------------------------

LIMIT = 1 << 20  # far above what is kept, far below what was given


def test_b_b13_huge_import_error_is_clipped_in_the_manifest(rt, plugins, tmp_path):
    """B-B13: a plugin whose import error is 3 MB: its traceback was recorded whole (280 MB made a
    manifest its reader refuses); what is recorded is clipped, saying so, and the run goes on."""
    plugins.make("rt13huge-plugin", "rt13huge_mod", HUGE_IMPORT, {"huge": "rt13huge_mod:T"})
    env = plugins.env()
    out = tmp_path / "out"
    r = subprocess.run(main_cmd("oneshot", "--only", "huge,b", "--out", out, "--device", "cpu"),
                       env=env_with(env, RT_HUGE_IMPORT=3_000_000), capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    size = (out / "testrun" / "manifest.json").stat().st_size
    m = _manifest(out)
    (huge,) = [s for s in m["stages"] if s["name"] == "huge"]
    (b,) = [s for s in m["stages"] if s["name"] == "b"]
    assert huge["status"] == "ERROR" and b["status"] == "PASS", (huge["status"], b["status"])
    assert size < LIMIT, f"manifest.json is {size} bytes: the import error was recorded whole"
    for key in ("reason", "hint", "traceback", "log_tail"):
        assert len(huge.get(key, "")) < LIMIT // 4, (key, len(huge.get(key, "")))
    assert "ValueError" in huge["traceback"] and "clipped" in huge["traceback"], huge["traceback"][:300]
    assert (out / "testrun" / "summary.md").is_file()
    r = subprocess.run(main_cmd("report", "testrun", "--out", out), env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 or r.returncode == 0, (r.returncode, r.stderr[-2000:])


@pytest.mark.parametrize("how", ["reason", "raise"])
def test_b_b13_huge_reason_hint_metrics_or_traceback_is_clipped(rt, tmp_path, how):
    """B-B13: a stage's 3 MB reason / hint / metrics string, or a 3 MB exception message (in its
    traceback), was recorded whole; what is recorded is clipped, saying so."""
    out = tmp_path / "out"
    kw = {"RT_A_REASON": 3_000_000} if how == "reason" else {"RT_A_RAISE": 3_000_000}
    r = subprocess.run(main_cmd("oneshot", "--only", "a,b", "--out", out, "--device", "cpu"),
                       env=env_with(rt, **kw), capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    size = (out / "testrun" / "manifest.json").stat().st_size
    m = _manifest(out)
    (a,) = [s for s in m["stages"] if s["name"] == "a"]
    assert a["status"] == ("FAIL" if how == "reason" else "ERROR"), a["status"]
    assert size < LIMIT, f"manifest.json is {size} bytes: the stage's text was recorded whole"
    if how == "reason":
        assert a["reason"].startswith("rrrr") and "clipped" in a["reason"], a["reason"][-200:]
        assert a["hint"].startswith("hhhh") and "clipped" in a["hint"], a["hint"][-200:]
        assert a["metrics"]["n"] == 1 and "clipped" in a["metrics"]["note"], a["metrics"]["note"][-200:]
    else:
        assert "ValueError" in a["traceback"] and "clipped" in a["traceback"], a["traceback"][:300]


# ---- B-B14: telling one stage's files from another's is linear ---------------------------------------

def test_b_b14_many_declared_files_of_two_stages_are_recorded_in_linear_time(rt, tmp_path, spawn):
    """B-B14: 12 000 + 12 000 declared files (disjoint): recording b compared every pair (quadratic:
    8000 + 8000 took 74 s); a name of a's that b declares is still b's ERROR."""
    out = tmp_path / "out"
    n = 12_000
    proc = spawn(main_cmd("oneshot", "--only", "a,b", "--out", out, "--device", "cpu"),
                 env=env_with(rt, RT_MANY=n, RT_B_ALSO="many/f7.txt,./many"),
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=100)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{n} + {n} declared files: not recorded within 100 s") from None
    took = time.monotonic() - t0
    assert proc.returncode == 1, (proc.returncode, err[-2000:])
    m = _manifest(out)
    a, b = ([s for s in m["stages"] if s["name"] == x][0] for x in "ab")
    assert a["status"] == "PASS" and len(a["files"]) == n + 1, (a["status"], len(a["files"]))
    assert b["status"] == "ERROR" and len(b["files"]) == n + 1, (b["status"], len(b["files"]))
    assert "many/f7.txt (stage a)" in b["reason"] and "./many (stage a: many/f0.txt)" in b["reason"], b["reason"]
    assert took < 60, f"{took:.0f} s"
