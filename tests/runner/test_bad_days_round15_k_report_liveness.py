"""Bad days, red-team round 14 (part A) BR-2b, through the CLI: ``nsa-run report RUN``'s "runner died" /
"still running" lines judged the run's owner by host name + pid (``artifacts.runner_died`` /
``still_running``), while reruns (BR-2) judge it by the lock the owner holds while it lives.

- a ``oneshot --only a,b`` killed -9 during b, then ``report`` under another host name (a restarted
  container): "1 passed", no UNFINISHED / runner-died line, summaries written as for a clean run;
- a live ``oneshot`` in another PID namespace (a container sharing the host name and the --out), seen by
  ``report`` from the root namespace: its pid there is 1, taken for init, so "runner died" while it ran.

Expected: the lock tells: free = died, held = running, whatever the PID namespace or host name. The
stage waits for a file the test writes: the order of events is fixed, no timing decides it. ``unshare``
needs root (the tests skip otherwise).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN, env_with, wait_for
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with, wait_for

STAGES = """
import os, time
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

class A(Stage):
    name, order, timeout_s = "a", 10, 300.0
    def run(self, ctx):
        (ctx.dir / "a.txt").write_text("a")
        return StageResult(Status.PASS, "a", files=["a.txt"])

class B(Stage):
    name, order, timeout_s = "b", 20, 300.0
    def run(self, ctx):
        mark, go = os.environ.get("R15K_MARK"), os.environ.get("R15K_GO")
        if mark:
            Path(mark).write_text(str(os.getpid()))
        deadline = time.monotonic() + 240
        while go and not Path(go).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        (ctx.dir / "b.txt").write_text("b")
        return StageResult(Status.PASS, "b", files=["b.txt"])
"""


def _cmd(*args) -> list[str]:
    return [sys.executable, "-c", MAIN, *map(str, args)]


@pytest.fixture
def env(plugins):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("unshare (PID / UTS namespaces) needs root")
    r = subprocess.run(["unshare", "-p", "-f", "--mount-proc", "-u", "true"], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"unshare does not work here: {r.stderr.decode(errors='replace').strip()}")
    plugins.make("r15k-live", "r15k_live_mod", STAGES, {"a": "r15k_live_mod:A", "b": "r15k_live_mod:B"})
    return env_with(plugins.env(), NSA_RUN_SPARE_WORKER="0")


def test_a_killed_oneshot_is_reported_died_under_another_host_name(env, tmp_path):
    out, run = tmp_path / "out", tmp_path / "out" / "testrun"
    mark = tmp_path / "mark"
    p = subprocess.Popen(_cmd("oneshot", "--only", "a,b", "--out", out, "--device", "cpu"),
                         env=env_with(env, R15K_MARK=mark, R15K_GO=tmp_path / "never"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(mark, timeout=240, proc=p)
    finally:
        p.kill()  # kill -9 of the runner during b (its worker dies with it)
        p.communicate()
    m = json.loads((run / "manifest.json").read_text())
    assert m["finished"] is None and [x["stage"] for x in m["pending"]] == ["b"]
    r = subprocess.run(["unshare", "-u", "sh", "-c", 'hostname r15k-pod-2 && exec "$@"', "sh",
                        *_cmd("report", run)], env=env, capture_output=True, text=True, timeout=300)
    said = r.stdout + r.stderr
    assert "Traceback" not in said
    assert "runner died" in said, said[-3000:]
    assert "runner died" in (run / "summary.md").read_text()


def test_a_live_oneshot_in_another_pid_namespace_is_still_running(env, tmp_path):
    out, run = tmp_path / "out", tmp_path / "out" / "testrun"
    mark, go = tmp_path / "mark", tmp_path / "go"
    p = subprocess.Popen(["unshare", "-p", "-f", "--mount-proc",
                          *_cmd("oneshot", "--only", "a,b", "--out", out, "--device", "cpu")],
                         env=env_with(env, R15K_MARK=mark, R15K_GO=go),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(mark, timeout=240, proc=p)
        r = subprocess.run(_cmd("report", run), env=env, capture_output=True, text=True, timeout=300)
        said = r.stdout + r.stderr
        assert "Traceback" not in said
        assert "runner died" not in said, said[-3000:]
        assert "still running" in said, said[-3000:]
        go.write_text("go")
        _, err = p.communicate(timeout=300)
    finally:
        go.write_text("go")
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err[-3000:]
    m = json.loads((run / "manifest.json").read_text())
    assert {s["name"]: s["status"] for s in m["stages"]} == {"a": "PASS", "b": "PASS"} and m["finished"]
    assert not list(run.glob(".manifest.lock.*")), "the runner's lock file was left behind"
