"""Executor paths that survived the first ``make mutate`` run (docs/testing.md): how a stage
result is applied to its record (unreadable result, declared files partly missing, a stage's
own SKIP under --strict, the log tail of a failed stage), how a worker that ends without a
result is described, and how a timed-out stage is stopped: SIGTERM first with a grace period a
stage can use, then SIGKILL for one that ignores SIGTERM, its children included.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from nsa_runner import executor
from nsa_runner.artifacts import load_manifest
from nsa_runner.executor import StageRecord
from nsa_runner.registry import Machine
from nsa_runner.stage import Status

CPU = Machine(cuda=False, triton=True, device="cpu")
GPU = Machine(cuda=True, triton=True, device="cuda")


def _rec() -> StageRecord:
    return StageRecord("x", 1, "test", Status.ERROR)


def _result(tmp_path, status="PASS", reason="all good", files=(), traceback=None) -> tuple:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    log = run / "x.log"
    log.write_text("line one\nthe last words of the stage\n")
    payload = {"result": {"status": status, "reason": reason, "files": list(files), "metrics": {}, "hint": ""}}
    if traceback is not None:
        payload["traceback"] = traceback
    res = tmp_path / "result.json"
    res.write_text(json.dumps(payload))
    return res, run, log


def test_unreadable_result_is_an_error_with_the_log_tail(tmp_path):
    res, run, log = _result(tmp_path)
    res.write_text("{not json")
    rec = _rec()
    executor._apply_result(rec, res, run, CPU, log)
    assert rec.status == Status.ERROR and rec.reason.startswith("unreadable stage result: ")
    assert rec.log_tail.endswith("the last words of the stage")


def test_pass_has_no_traceback_and_no_log_tail(tmp_path):
    res, run, log = _result(tmp_path)
    rec = _rec()
    executor._apply_result(rec, res, run, CPU, log)
    assert (rec.status, rec.reason, rec.traceback, rec.log_tail) == (Status.PASS, "all good", "", "")


def test_failed_stage_gets_the_log_tail(tmp_path):
    res, run, log = _result(tmp_path, status="FAIL", reason="2 cases over tolerance", traceback="")
    rec = _rec()
    executor._apply_result(rec, res, run, CPU, log)
    assert rec.status == Status.FAIL and rec.log_tail.endswith("the last words of the stage")


@pytest.mark.parametrize("machine,counts", [(CPU, False), (GPU, True)], ids=["cpu-excused", "cuda-counts"])
def test_own_skip_counts_under_strict_only_on_a_cuda_machine(tmp_path, machine, counts):
    res, run, log = _result(tmp_path, status="SKIP", reason="no flash backend")
    rec = _rec()
    executor._apply_result(rec, res, run, machine, log)
    assert rec.status == Status.SKIP and rec.strict_fail is counts


@pytest.mark.parametrize("reason", ["all good", ""], ids=["with-reason", "no-reason"])
def test_declared_files_partly_missing(tmp_path, reason):
    res, run, log = _result(tmp_path, reason=reason, files=["here.csv", "gone.csv", "../outside.txt"])
    (run / "here.csv").write_text("a\n1\n")
    (tmp_path / "outside.txt").write_text("x")
    rec = _rec()
    executor._apply_result(rec, res, run, CPU, log)
    assert rec.status == Status.ERROR
    assert rec.files == ["here.csv"]  # the files that exist inside the run folder are kept
    note = ("declared file(s) missing: gone.csv; declared name(s) refused: ../outside.txt holds '..' (a declared name "
            "never climbs, even back inside)")
    assert rec.reason == (f"{reason}; {note}" if reason else note)


def test_a_declared_name_with_dots_inside_the_folder_is_refused_for_what_it_is(tmp_path):
    """Round 27 U27-7: ``sub/../here.csv`` (inside the folder, the file there) was ERROR "declared file(s) missing or
    outside the run folder", neither true. Expected: refused (never normalised: a rerun moves declared names), saying
    why."""
    res, run, log = _result(tmp_path, reason="ok", files=["here.csv", "sub/../here.csv"])
    (run / "here.csv").write_text("a\n1\n")
    (run / "sub").mkdir()
    rec = _rec()
    executor._apply_result(rec, res, run, CPU, log)
    assert rec.status == Status.ERROR and rec.files == ["here.csv"]
    assert rec.reason == ("ok; declared name(s) refused: sub/../here.csv holds '..' (a declared name never climbs, "
                          "even back inside)"), rec.reason


@pytest.mark.parametrize("rc,text", [(0, "process exited with code 0 without a result"),
                                     (3, "process exited with code 3 without a result"),
                                     (-9, "process died with SIGKILL"),
                                     (-200, "process died with signal 200")])
def test_exit_without_result_is_described(rc, text):
    assert executor._describe_exit(rc) == text


STUBBORN = """
import os, signal, subprocess, sys, time
from nsa_runner import Stage, StageResult, Status

class Stubborn(Stage):
    name, order, timeout_s = "stubborn", 1, 1.5
    def run(self, ctx):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL stops it
        p = subprocess.Popen([sys.executable, "-c",
                              "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
        (ctx.dir / "stubborn.pid").write_text(f"{os.getpid()} {p.pid}")
        print("ignoring SIGTERM", flush=True)
        time.sleep(600)

class Graceful(Stage):
    name, order, timeout_s = "graceful", 2, 1.5
    def run(self, ctx):
        def bye(*a):
            print("SIGTERM received: cleaning up", flush=True)
            (ctx.dir / "graceful.cleaned").write_text("yes")
            sys.exit(1)
        signal.signal(signal.SIGTERM, bye)
        print("working", flush=True)
        time.sleep(600)

class Silent(Stage):
    name, order = "silent", 3
    def run(self, ctx):
        print("leaving without a result", flush=True)
        os._exit(0)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def test_timeout_sigterm_grace_then_sigkill_and_exit_without_result(plugins, cli, tmp_path):
    plugins.make("edge-stages", "edge_stages_mod", STUBBORN, {"stubborn": "edge_stages_mod:Stubborn",
                                                              "graceful": "edge_stages_mod:Graceful",
                                                              "silent": "edge_stages_mod:Silent"})
    out = tmp_path / "out"
    t0 = time.monotonic()
    r = cli("oneshot", "--out", out, "--only", "stubborn,graceful,silent", "--device", "cpu", "--json")
    assert r.exit_code == 1, r.stderr
    run = out / "testrun"
    by = {s["name"]: s for s in load_manifest(run)["stages"]}
    # a stage that ignores SIGTERM is SIGKILLed after the grace period, with its child
    assert by["stubborn"]["status"] == "TIMEOUT" and "ignoring SIGTERM" in by["stubborn"]["log_tail"]
    pids = [int(x) for x in (run / "stubborn.pid").read_text().split()]
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), "a SIGTERM-ignoring stage or its child survived the timeout"
    # a stage that handles SIGTERM gets the grace period to clean up
    assert by["graceful"]["status"] == "TIMEOUT"
    assert (run / "graceful.cleaned").exists(), by["graceful"].get("log_tail")
    # a worker that exits 0 without a result is an ERROR that says so
    assert by["silent"]["status"] == "ERROR"
    assert by["silent"]["reason"] == "process exited with code 0 without a result"
    assert "leaving without a result" in by["silent"]["log_tail"]
    assert time.monotonic() - t0 < 120
    assert os.path.isdir(run)
