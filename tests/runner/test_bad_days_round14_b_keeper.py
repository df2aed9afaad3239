"""Bad days, red-team round 14 (part A) BR-4, through the CLI: a stage (or a plugin's import during
discovery) detaches a daemon that clears its environment (``env -i setsid``: no cookie, a session of
its own) and then SIGKILLs its own process group (``kill -9 0`` / ``os.killpg(0, 9)``).

Before the fix the stage's work shared the worker's process group, so that kill took the keeper (the
worker, a child subreaper) with it: the daemon, re-parented to init, outlived nsa-run (ppid 1).
Expected: the stage is an ERROR ("process died with SIGKILL"), the run goes on, and nothing the
stage started outlives nsa-run. The daemon writes its pid only once it has left the stage's
session, and the stage kills only after that: no timing decides the outcome.

(Not covered: a stage that SIGKILLs the keeper itself, ``kill -9`` of its parent's parent. The
stage's work dies with its keeper (its parent-death signal) and a daemon then goes to init; only a
subreaper in the runner, or a cgroup, could keep it.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN, alive, env_with, gone_within
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, alive, env_with, gone_within


# a daemon: env cleared, a session of its own; it writes its pid (atomically) once it is detached
DAEMON = ("(env -i setsid bash -c 'echo $$ > \"$0.tmp\"; mv \"$0.tmp\" \"$0\"; exec sleep 1000' {pidfile} "
          "</dev/null >/dev/null 2>&1 &); while [ ! -s {pidfile} ]; do sleep 0.01; done; ")

STAGES = """
import os, subprocess
from nsa_runner import Stage, StageResult, Status

def _act(ctx, name):
    (ctx.dir / f"{name}.txt").write_text(name)
    if os.environ.get("R14B_STAGE") == name:
        subprocess.run(["bash", "-c", os.environ["R14B_CMD"]], cwd=ctx.dir)
    return StageResult(Status.PASS, name, files=[f"{name}.txt"])

class A(Stage):
    name, order, timeout_s = "a", 10, 120.0
    def run(self, ctx):
        return _act(ctx, "a")

class B(Stage):
    name, order, timeout_s = "b", 20, 120.0
    def run(self, ctx):
        return _act(ctx, "b")
"""

# a plugin whose import detaches such a daemon, then kills its own process group
IMPORT_KILLS = """
import os, subprocess
from nsa_runner import Stage, StageResult, Status

if os.environ.get("R14B_PIDFILE"):
    f = os.environ["R14B_PIDFILE"] + "." + str(os.getpid())
    subprocess.run(["bash", "-c", os.environ["R14B_DAEMON"].replace("{pidfile}", f)])
    os.killpg(0, 9)

class D(Stage):
    name, order, timeout_s = "d", 30, 120.0
    def run(self, ctx):
        return StageResult(Status.PASS, "d")
"""


def _cmd(*args) -> list[str]:
    return [sys.executable, "-c", MAIN, *map(str, args)]


def _daemons(folder) -> list[int]:
    return [int(p.read_text()) for p in folder.glob("daemon*") if not p.name.endswith(".tmp") and p.read_text().strip()]


@pytest.fixture
def survivors(tmp_path):
    """The daemons' pid files' folder; any daemon still alive at the end is killed (never left behind)."""
    folder = tmp_path / "pids"
    folder.mkdir()
    yield folder
    for pid in _daemons(folder):
        if alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _assert_none_left(folder) -> None:
    pids = _daemons(folder)
    assert pids, "the daemon never started (the test did not exercise anything)"
    left = [pid for pid in pids if not gone_within(pid, 5.0)]
    assert not left, f"daemon(s) {left} outlived nsa-run"


@pytest.mark.parametrize(("spare", "stage"), [("0", "a"), ("1", "b")], ids=["fresh-worker", "spare-worker"])
@pytest.mark.parametrize("kill", ["kill -9 0", "python3 -c 'import os; os.killpg(0, 9)'"], ids=["kill-0", "killpg-0"])
def test_stage_killing_its_group_leaves_no_daemon(plugins, tmp_path, survivors, spare, stage, kill):
    plugins.make("r14b-plugin", "r14b_mod", STAGES, {"a": "r14b_mod:A", "b": "r14b_mod:B"})
    out = tmp_path / "out"
    cmd = DAEMON.format(pidfile=survivors / "daemon") + kill + "; sleep 5"
    env = env_with(plugins.env(), R14B_CMD=cmd, R14B_STAGE=stage, NSA_RUN_SPARE_WORKER=spare)
    r = subprocess.run(_cmd("oneshot", "--only", "a,b", "--out", out, "--device", "cpu"),
                       env=env, capture_output=True, text=True, timeout=300)
    _assert_none_left(survivors)
    assert r.returncode == 1, r.stdout + r.stderr
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    got = {s["name"]: (s["status"], s["reason"]) for s in m["stages"]}
    other = "b" if stage == "a" else "a"
    assert got[stage] == ("ERROR", "process died with SIGKILL"), got
    assert got[other][0] == "PASS", got


def test_plugin_import_killing_its_group_leaves_no_daemon(plugins, tmp_path, survivors):
    plugins.make("r14b-good", "r14b_mod", STAGES, {"a": "r14b_mod:A", "b": "r14b_mod:B"})
    plugins.make("r14b-bad", "r14b_bad", IMPORT_KILLS, {"d": "r14b_bad:D"})
    env = env_with(plugins.env(), R14B_PIDFILE=survivors / "daemon", R14B_DAEMON=DAEMON)
    r = subprocess.run(_cmd("list"), env=env, capture_output=True, text=True, timeout=300)
    _assert_none_left(survivors)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "r14b_bad" in r.stdout + r.stderr  # the plugin is named broken
    assert "a" in r.stdout  # the other plugin's stages are listed
