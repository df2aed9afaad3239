"""Bad days, red-team round 4 (issue 16): the runner's own breaks, each through the CLI as a
separate process (``nsa_runner.cli.main``, the ``nsa-run`` script's entry point, with a pinned
run id): closed stdin / stdout / stderr, a progress stream whose reader went away
(``2>&1 | head -1``), a daemon that clears its environment and ignores SIGTERM, and ``COLUMNS=0``.
See docs/reliability.md, "Red-team round 4".
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

# y1 / y2: R4_<NAME>_MK (a shell command run in the run folder), then R4_SLEEP_<NAME> seconds
SOURCE = """
import os, subprocess, time
from nsa_runner import Stage, StageResult, Status

def _act(ctx, name):
    up = name.upper()
    (ctx.dir / f"{name}.txt").write_text("v1")
    if os.environ.get(f"R4_{up}_MK"):
        subprocess.run(os.environ[f"R4_{up}_MK"], shell=True, cwd=ctx.dir, check=True)
    time.sleep(float(os.environ.get(f"R4_SLEEP_{up}", "0")))
    return StageResult(Status.PASS, f"{name} ok", files=[f"{name}.txt"])

class Y1(Stage):
    name, order, timeout_s = "y1", 1, 120.0
    def run(self, ctx):
        return _act(ctx, "y1")

class Y2(Stage):
    name, order, timeout_s = "y2", 2, 120.0
    def run(self, ctx):
        return _act(ctx, "y2")
"""

# the nsa-run script itself (cli.main: the closed-fd repair and the last net live there)
MAIN = ("import sys; from nsa_runner.commands import _common as c; c.current_run_id = lambda: 'testrun'; "
        "sys.argv[0] = 'nsa-run'; from nsa_runner.cli import main; main()")


def cli(*args) -> list[str]:
    return [sys.executable, "-c", MAIN, *map(str, args)]


@pytest.fixture
def r4(plugins):
    plugins.make("r4-plugin", "r4_mod", SOURCE, {"y1": "r4_mod:Y1", "y2": "r4_mod:Y2"})
    env = plugins.env()
    for k in [k for k in env if k.startswith("R4_") or k == "COLUMNS"]:
        env.pop(k)
    return env


def _manifest(out: Path) -> dict:
    return json.loads((out / "testrun" / "manifest.json").read_text())


def _statuses(out: Path) -> dict[str, str]:
    return {s["name"]: s["status"] for s in _manifest(out)["stages"]}


@pytest.mark.parametrize("redirect", ["<&-", ">&-", "2>&-", "</dev/null >&- 2>&-"])
def test_closed_std_fds_still_run_every_stage(r4, tmp_path, redirect):
    """i1-i3, i7: with fd 0, 1 or 2 closed, the watchdog's pipe landed on it, the watchdog got
    /dev/null in its place, read EOF at once and killed the plugin discovery (exit 2, "--only:
    unknown stage 'summary'") and every stage."""
    out = tmp_path / "o"
    cmd = shlex.join(map(str, cli("oneshot", "--device", "cpu", "--only", "y1,summary", "--out", out)))
    p = subprocess.run(["bash", "-c", f"exec {cmd} {redirect}"], env=r4, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    assert _statuses(out) == {"y1": "PASS", "summary": "PASS"}
    assert _manifest(out)["exit_code"] == 0


def test_watchdog_pipe_never_lands_on_a_closed_std_fd(tmp_path):
    """The root of i1: ``Watchdog`` with fd 0 closed must not kill a live stage."""
    code = (
        "import os, subprocess, sys, time\n"
        "from nsa_runner._worker import Watchdog\n"
        "os.close(0)\n"
        "victim = subprocess.Popen(['sleep', '30'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        f"guard = Watchdog('r4-cookie', victim.pid, {str(tmp_path / 'tmp')!r}, dict(os.environ))\n"
        "time.sleep(2.0)\n"
        "alive = victim.poll() is None\n"
        "guard.done(); victim.kill(); victim.wait()\n"
        "print('alive' if alive else 'killed')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "alive"


@pytest.mark.parametrize("pipe", ["2>&1 | head -1", "2>&1 >/dev/null | head -1"])
def test_progress_reader_gone_the_run_is_still_recorded(r4, tmp_path, pipe):
    """g6 / g6b: ``oneshot 2>&1 | head -1``: the second progress line hit EPIPE, the last net
    printed to the same pipe, exit 1, and the manifest kept no stage, no finish, no exit code."""
    out = tmp_path / "o"
    cmd = shlex.join(map(str, cli("oneshot", "--device", "cpu", "--only", "y1,y2,summary", "--out", out)))
    env = dict(r4, R4_SLEEP_Y1="1.5")  # head has read its line and gone before y1 ends
    p = subprocess.run(["bash", "-c", f"{cmd} {pipe}; exit ${{PIPESTATUS[0]}}"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    assert len(p.stdout.splitlines()) == 1  # head's one line
    m = _manifest(out)
    assert _statuses(out) == {"y1": "PASS", "y2": "PASS", "summary": "PASS"}
    assert m["finished"] and m["exit_code"] == 0 and not m.get("interrupted")
    assert (out / "testrun" / "report.html").is_file()


DAEMON = "(env -i setsid sh -c 'trap \"\" TERM HUP INT; exec sleep {n}' &)"


def _sleepers(n: int) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if p.info["cmdline"] == ["sleep", str(n)]:
            found.append(p)
    return found


def _gone(n: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not [p for p in _sleepers(n) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("how", ["pass", "timeout"])
def test_term_ignoring_daemon_without_cookie_dies_with_its_stage(r4, tmp_path, how):
    """pr3 / pr4: a stage starts a daemon that clears its environment and ignores SIGTERM. SIGTERM
    ended the worker (the subreaper) first, the daemon was re-parented to init with no cookie, and
    the SIGKILL pass, looking again, never found it: it outlived the PASS and the TIMEOUT."""
    n = 3107 + os.getpid() % 500 * 2 + (how == "timeout")  # this test's own sleeper
    env = dict(r4, R4_Y1_MK=DAEMON.format(n=n))
    args = ["oneshot", "--device", "cpu", "--only", "y1", "--out", tmp_path / "o"]
    if how == "timeout":
        env["R4_SLEEP_Y1"] = "60"
        args += ["--timeout", "4"]
    try:
        p = subprocess.run(cli(*args), env=env, capture_output=True, text=True, timeout=300)
        want = "PASS" if how == "pass" else "TIMEOUT"
        assert _statuses(tmp_path / "o") == {"y1": want}, p.stderr[-2000:]
        assert _gone(n, 10.0), f"sleep {n} outlived the stage's {want}"
    finally:
        for q in _sleepers(n):
            try:
                q.kill()
            except psutil.Error:
                pass


def test_columns_zero_still_prints_the_verdict(r4, tmp_path):
    """o6: ``COLUMNS=0`` gave rich a width of 0: the oneshot table, ``list`` and ``compare`` printed
    nothing at all, exit 0."""
    out = tmp_path / "o"
    env = dict(r4, COLUMNS="0")
    p = subprocess.run(cli("oneshot", "--device", "cpu", "--only", "y1,summary", "--out", out), env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "y1" in p.stdout and "2 passed, 0 failed" in p.stdout
    p = subprocess.run(cli("list"), env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "y1" in p.stdout and "summary" in p.stdout, p.stderr[-2000:]
    run = out / "testrun"
    p = subprocess.run(cli("compare", run, run, "--all"), env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "no regression" in p.stdout + p.stderr
