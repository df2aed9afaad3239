"""Executor: one process per stage; hang -> TIMEOUT (tree killed), raise -> ERROR + traceback,
death by signal -> ERROR + signal + log tail, and the next stage still runs. Ctrl-C -> 130."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

from nsa_runner.artifacts import load_manifest

BAD_STAGES = """
import ctypes, os, subprocess, sys, time
from nsa_runner import Stage, StageResult, Status

class Hang(Stage):
    name, order, timeout_s = "hang", 1, 2.0
    def run(self, ctx):
        # a grandchild in the same process group: it must die with the stage
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        (ctx.dir / "grandchild.pid").write_text(str(p.pid))
        print("hanging now", flush=True)
        time.sleep(600)

class Raise(Stage):
    name, order = "raise", 2
    def run(self, ctx):
        print("about to fail", flush=True)
        raise ValueError("the check exploded")

class Abort(Stage):
    name, order = "abort", 3
    def run(self, ctx):
        print("last words before abort", flush=True)
        os.abort()

class Segv(Stage):
    name, order = "segv", 4
    def run(self, ctx):
        print("reading address 0", flush=True)
        ctypes.string_at(0)

class Liar(Stage):
    name, order = "liar", 5
    def run(self, ctx):
        return StageResult(Status.PASS, "all good", files=["never_written.txt"])

class Good(Stage):
    name, order = "good", 6
    def run(self, ctx):
        (ctx.dir / "good.txt").write_text(os.environ.get("TRITON_INTERPRET", "unset") + " "
                                          + os.environ.get("PYTHONUNBUFFERED", "unset") + " " + os.getcwd())
        return StageResult(Status.PASS, "fine", files=["good.txt"], metrics={"x": 1})

class NotAResult(Stage):
    name, order = "notresult", 7
    def run(self, ctx):
        return "PASS"
"""

NAMES = ["hang", "raise", "abort", "segv", "liar", "good", "notresult"]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it is dead for our purpose
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


@pytest.fixture
def bad(plugins):
    plugins.make("bad-stages", "bad_stages_mod", BAD_STAGES, {n: f"bad_stages_mod:{c}" for n, c in zip(
        NAMES, ["Hang", "Raise", "Abort", "Segv", "Liar", "Good", "NotAResult"], strict=True)})
    return plugins


def test_each_failure_mode_is_recorded_and_the_next_stage_runs(bad, cli, tmp_path):
    out = tmp_path / "out"
    r = cli("oneshot", "--out", out, "--only", ",".join(NAMES), "--device", "cpu", "--json")
    assert r.exit_code == 1, r.stderr
    payload = json.loads(r.stdout)  # --json: stdout is JSON only
    run_dir = out / "testrun"
    m = load_manifest(run_dir)
    by = {s["name"]: s for s in m["stages"]}
    assert [s["name"] for s in m["stages"]] == NAMES  # run order = declared order
    assert [s["name"] for s in payload["stages"]] == NAMES

    assert by["hang"]["status"] == "TIMEOUT"
    assert "2s" in by["hang"]["reason"] and "hanging now" in by["hang"]["log_tail"]
    gpid = int((run_dir / "grandchild.pid").read_text())
    deadline = time.monotonic() + 5
    while _pid_alive(gpid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _pid_alive(gpid), "the hung stage's grandchild survived the timeout"

    assert by["raise"]["status"] == "ERROR"
    assert by["raise"]["reason"] == "ValueError: the check exploded"
    assert "Traceback" in by["raise"]["traceback"] and "raise ValueError" in by["raise"]["traceback"]

    assert by["abort"]["status"] == "ERROR"
    assert "SIGABRT" in by["abort"]["reason"]
    assert "last words before abort" in by["abort"]["log_tail"]

    assert by["segv"]["status"] == "ERROR"
    assert "SIGSEGV" in by["segv"]["reason"]
    assert "reading address 0" in by["segv"]["log_tail"]
    assert "Fatal Python error" in by["segv"]["log_tail"]  # faulthandler stack in the log

    assert by["liar"]["status"] == "ERROR"
    assert "never_written.txt" in by["liar"]["reason"]

    assert by["good"]["status"] == "PASS" and by["good"]["files"] == ["good.txt"]
    interp, unbuf, cwd = (run_dir / "good.txt").read_text().split(" ", 2)
    assert (interp, unbuf) == ("1", "1")  # --device cpu: TRITON_INTERPRET=1 for the child
    assert os.path.samefile(cwd, run_dir)
    assert by["good"]["metrics"] == {"x": 1}

    assert by["notresult"]["status"] == "ERROR" and "expected a StageResult" in by["notresult"]["reason"]

    for name in NAMES:
        assert (run_dir / "logs" / f"{name}.log").exists()
    assert payload["counts"] == {"passed": 1, "failed": 6, "skipped": 0}
    assert r.stderr.strip().splitlines()[-1] == "1 passed, 6 failed, 0 skipped"
    assert m["finished"] and m["interrupted"] is False


def test_timeout_option_overrides_the_stage_timeout(bad, cli, tmp_path):
    t0 = time.monotonic()
    r = cli("oneshot", "--out", tmp_path / "o", "--only", "hang", "--device", "cpu", "--timeout", "0.5")
    assert r.exit_code == 1
    m = load_manifest(tmp_path / "o" / "testrun")
    assert m["stages"][0]["status"] == "TIMEOUT" and "0.5s" in m["stages"][0]["reason"]
    assert time.monotonic() - t0 < 15
    assert r.stdout.strip().splitlines()[-1] == "0 passed, 1 failed, 0 skipped"


# Ctrl-C tests run the real CLI in a subprocess. On a loaded 2-core machine its start (imports)
# and its wind-down (manifest, reports) each take many seconds, so the waits are generous (well
# inside the 300 s per-test limit); output goes to files, never to a pipe nobody reads while
# waiting; and the `spawn` fixture (tests/runner/conftest.py) kills the CLI, its stage worker
# (own session) and the worker's children if anything here fails.
START_S, WIND_DOWN_S = 150.0, 120.0


def _interrupt_when_started(spawn, cmd, env, marker: str, tmp_path):
    """Run ``cmd``; once a file matching ``marker`` exists and is non-empty, SIGINT the CLI.

    Returns (returncode, stdout, stderr, marker path).
    """
    out_f, err_f = tmp_path / "cli.stdout", tmp_path / "cli.stderr"
    with open(out_f, "w") as so, open(err_f, "w") as se:
        proc = spawn(cmd, env=env, stdout=so, stderr=se, text=True)
    deadline = time.monotonic() + START_S
    found = None
    while found is None and time.monotonic() < deadline and proc.poll() is None:
        hits = [p for p in tmp_path.glob(marker) if p.stat().st_size]
        found = hits[0] if hits else None
        time.sleep(0.1)
    assert found is not None, f"the stage never started (rc={proc.poll()}): {err_f.read_text()[-2000:]}"
    spawn.snapshot()  # CLI, stage worker, its children: killed at teardown if they outlive the test
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=WIND_DOWN_S)
    return proc.returncode, out_f.read_text(), err_f.read_text(), found


def test_ctrl_c_stops_the_stage_keeps_finished_results_and_exits_130(bad, tmp_path, spawn):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "nsa_runner.cli", "oneshot", "--out", str(out), "--only", "hang,good",
           "--device", "cpu", "--timeout", "600"]
    # hang (order 1) runs before good (order 6): the interrupt arrives while hang runs, and good never starts
    rc, stdout, stderr, pidfile = _interrupt_when_started(spawn, cmd, bad.env(), "out/*/grandchild.pid", tmp_path)
    assert rc == 130, stderr
    run_dir = pidfile.parent
    m = load_manifest(run_dir)  # still valid JSON with the schema
    assert m["interrupted"] is True and m["finished"]
    assert [s["name"] for s in m["stages"]] == ["hang"]
    assert m["stages"][0]["status"] == "ERROR" and "interrupted" in m["stages"][0]["reason"]
    gpid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _pid_alive(gpid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _pid_alive(gpid)
    assert stdout.strip().splitlines()[-1] == "0 passed, 1 failed, 0 skipped"


def test_ctrl_c_after_a_finished_stage_keeps_its_artifacts(plugins, tmp_path, spawn):
    plugins.make("seq-stages", "seq_stages_mod", """
        import time
        from nsa_runner import Stage, StageResult, Status
        class First(Stage):
            name, order = "first", 1
            def run(self, ctx):
                (ctx.dir / "first.txt").write_text("done")
                return StageResult(Status.PASS, "ok", files=["first.txt"])
        class Slow(Stage):
            name, order = "slow", 2
            def run(self, ctx):
                (ctx.dir / "slow.started").write_text("x")
                time.sleep(600)
    """, {"first": "seq_stages_mod:First", "slow": "seq_stages_mod:Slow"})
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "nsa_runner.cli", "oneshot", "--out", str(out), "--only", "first,slow",
           "--device", "cpu", "--json"]
    rc, stdout, stderr, _ = _interrupt_when_started(spawn, cmd, plugins.env(), "out/*/slow.started", tmp_path)
    assert rc == 130, stderr
    payload = json.loads(stdout)
    assert payload["interrupted"] is True and payload["exit_code"] == 130
    run_dir = next(out.iterdir())
    m = load_manifest(run_dir)
    assert [(s["name"], s["status"]) for s in m["stages"]] == [("first", "PASS"), ("slow", "ERROR")]
    assert (run_dir / "first.txt").read_text() == "done"
