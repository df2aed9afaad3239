"""Bad days, red-team round 14 (part A) BR-2, through the CLI: the owner of a rerun (``pending`` in
manifest.json) was judged alive or dead from ``{hostname, pid, pid_started}``.

- BR-2c: a rerun of ``stage a`` running in another PID namespace (a container sharing the host name and
  the --out) noted owner pid 2 or so; a ``stage b`` from the root namespace took it for dead and
  "recovered" it while it ran: the attempt's a.txt (v2) went to ``history/a-<t>-abandoned``, v1 was put
  back, and the rerun then recorded ``a PASS "a v2"`` over a.txt holding v1, v1's own record lost.
- BR-2: a rerun killed -9, then ``stage a`` under another host name (a restarted container): refused
  for good, "stage a is already running ... wait for it to finish", for a process long gone.

Expected: the owner holds a lock for as long as it lives; a live rerun is never undone, a dead one is
put back whatever the PID namespace or host name. The stage waits for a file the test writes: the
order of events is fixed, no timing decides it. ``unshare`` needs root (the tests skip otherwise).
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
        text = os.environ.get("R14BO_TEXT", "v1")
        (ctx.dir / "a.txt").write_text(text)
        mark, go = os.environ.get("R14BO_MARK"), os.environ.get("R14BO_GO")
        if mark:
            Path(mark).write_text(str(os.getpid()))
        deadline = time.monotonic() + 240
        while go and not Path(go).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return StageResult(Status.PASS, f"a {text}", files=["a.txt"])

class B(Stage):
    name, order, timeout_s = "b", 20, 120.0
    def run(self, ctx):
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
    plugins.make("r14bo-plugin", "r14bo_mod", STAGES, {"a": "r14bo_mod:A", "b": "r14bo_mod:B"})
    return plugins.env()


def _first(env, out) -> None:
    r = subprocess.run(_cmd("stage", "a", "--out", out, "--device", "cpu"), env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def _manifest(run) -> dict:
    return json.loads((run / "manifest.json").read_text())


def test_a_live_rerun_in_another_pid_namespace_is_not_undone(env, tmp_path):
    out, run = tmp_path / "out", tmp_path / "out" / "testrun"
    mark, go = tmp_path / "mark", tmp_path / "go"
    _first(env, out)
    # the rerun, in a PID namespace of its own (its pid there is 1 or 2)
    rerun = subprocess.Popen(["unshare", "-p", "-f", "--mount-proc",
                              *_cmd("stage", "a", "--out", out, "--device", "cpu")],
                             env=env_with(env, R14BO_TEXT="v2", R14BO_MARK=mark, R14BO_GO=go),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(mark, timeout=240, proc=rerun)
        r = subprocess.run(_cmd("stage", "b", "--out", out, "--device", "cpu"), env=env, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        assert (run / "a.txt").read_text() == "v2", "the live rerun's file was taken away"
        go.write_text("go")
        _, err = rerun.communicate(timeout=300)
    finally:
        go.write_text("go")
        if rerun.poll() is None:
            rerun.kill()
            rerun.wait()
    assert rerun.returncode == 0, err[-3000:]
    m = _manifest(run)
    got = {s["name"]: (s["status"], s["reason"]) for s in m["stages"]}
    assert got == {"a": ("PASS", "a v2"), "b": ("PASS", "b")}, got
    assert (run / "a.txt").read_text() == "v2"
    assert [h["reason"] for h in m["history"] if h["name"] == "a"] == ["a v1"], m["history"]
    assert not [p for p in (run / "history").iterdir() if p.name.endswith("-abandoned")]
    assert not m.get("pending")
    assert not list(run.glob(".manifest.lock.*")), "an owner's lock file was left behind"


def test_a_dead_rerun_under_another_host_name_is_put_back(env, tmp_path):
    out, run = tmp_path / "out", tmp_path / "out" / "testrun"
    mark = tmp_path / "mark"
    _first(env, out)
    rerun = subprocess.Popen(_cmd("stage", "a", "--out", out, "--device", "cpu"),
                             env=env_with(env, R14BO_TEXT="v2", R14BO_MARK=mark, R14BO_GO=tmp_path / "never"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(mark, timeout=240, proc=rerun)
    finally:
        rerun.kill()  # kill -9 of the runner (its worker dies with it)
        rerun.communicate()
    assert [p["stage"] for p in _manifest(run)["pending"]] == ["a"]
    # a restarted container: another host name, same --out
    r = subprocess.run(["unshare", "-u", "sh", "-c", 'hostname r14bo-pod-2 && exec "$@"', "sh",
                        *_cmd("stage", "a", "--out", out, "--device", "cpu")],
                       env=env_with(env, R14BO_TEXT="v3"), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "already running" not in r.stderr
    m = _manifest(run)
    assert {s["name"]: s["reason"] for s in m["stages"]} == {"a": "a v3"}
    assert (run / "a.txt").read_text() == "v3"
    assert [h["reason"] for h in m["history"] if h["name"] == "a"] == ["a v1"], m["history"]
    assert not m.get("pending")
    assert not list(run.glob(".manifest.lock.*")), "an owner's lock file was left behind"
