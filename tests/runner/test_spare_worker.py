"""The spare worker (the default; ``NSA_RUN_SPARE_WORKER=0`` turns it off; issue 13): the next
stage's process is started, and imports torch, while the current stage runs; the stage then starts
in it. The stages run as before, in their own processes; a stage that says ``preload = False``
(summary: it imports no torch) gets a fresh process; an unused spare never outlives the runner
(Ctrl-C, kill -9) and leaves no folder."""

from __future__ import annotations

import json
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest
from _bad_days import STAGES_XYZ, alive, cli_cmd, env_with, gone_within, manifest, wait_for

SOURCE = """
import json, os, sys, time
from pathlib import Path
import psutil
from nsa_runner import Stage, StageResult, Status

def _act(ctx, name):
    worker = psutil.Process(os.getppid())  # the stage runs in the worker's forked child
    rec = {"pid": os.getpid(), "worker_pid": worker.pid, "worker_created": worker.create_time(),
           "runner_pid": worker.ppid(), "torch_loaded": "torch" in sys.modules, "start": time.time()}
    wait = os.environ.get("SP_SPARE_PID")
    if wait and name == "x":  # say which process is the next stage's spare, then wait
        runner = psutil.Process(worker.ppid())
        for _ in range(1200):
            spare = [c for c in runner.children() if "--spare" in c.cmdline()]
            if spare:
                Path(wait).write_text(str(spare[0].pid))
                break
            time.sleep(0.05)
    time.sleep(float(os.environ.get("SP_SLEEP_" + name.upper(), "0")))
    rec["end"] = time.time()
    # the runner's children as this stage ends (create_time is no clock to compare with: its boot
    # time is whole seconds): a spare for the next stage is among them, or not
    rec["runner_children_at_end"] = [c.pid for c in psutil.Process(worker.ppid()).children()]
    (ctx.dir / (name + ".json")).write_text(json.dumps(rec))
    print(name, "ran in", os.getpid(), flush=True)
    return StageResult(Status.PASS, name + " ok", files=[name + ".json"])
""" + STAGES_XYZ


def _make(plugins) -> dict[str, str]:
    plugins.make("sp-plugin", "sp_mod", SOURCE, {"x": "sp_mod:X", "y": "sp_mod:Y", "z": "sp_mod:Z"})
    env = plugins.env()
    env.pop("NSA_RUN_SPARE_WORKER", None)
    return env


def _oneshot(env, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cli_cmd("oneshot", "--out", out, "--only", "x,y,z", "--device", "cpu"), env=env,
                          capture_output=True, text=True, timeout=300)


def _spare_dirs(runner_pid: int) -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob(f"nsa-run-spare-{runner_pid}-*"))


def test_by_default_each_stage_starts_in_a_worker_made_while_the_previous_one_ran(plugins, tmp_path):
    env = _make(plugins)  # NSA_RUN_SPARE_WORKER unset: the default
    r = _oneshot(env_with(env, SP_SLEEP_X=2, SP_SLEEP_Y=1), tmp_path / "out")
    assert r.returncode == 0, r.stderr
    run = tmp_path / "out" / "testrun"
    assert [s["status"] for s in manifest(tmp_path / "out")["stages"]] == ["PASS"] * 3
    x, y, z = (json.loads((run / f"{n}.json").read_text()) for n in "xyz")
    # y's and z's workers existed (importing torch) while the stage before them ran
    assert y["worker_pid"] in x["runner_children_at_end"] and z["worker_pid"] in y["runner_children_at_end"]
    assert y["torch_loaded"] and z["torch_loaded"]
    assert len({x["worker_pid"], y["worker_pid"], z["worker_pid"]}) == 3  # a process per stage, as before
    for n in "yz":  # each log is the stage's own: the worker's header, then what the stage printed
        log = (run / "logs" / f"{n}.log").read_text()
        assert log.startswith("# nsa-run stage " + n) and f"{n} ran in" in log and "PASS" in log
    assert not any(alive(s[k]) for s in (x, y, z) for k in ("pid", "worker_pid"))
    assert _spare_dirs(x["runner_pid"]) == []


def test_turned_off_each_worker_starts_after_the_previous_stage(plugins, tmp_path):
    env = _make(plugins)
    r = _oneshot(env_with(env, NSA_RUN_SPARE_WORKER=0, SP_SLEEP_X=1), tmp_path / "out")
    assert r.returncode == 0, r.stderr
    run = tmp_path / "out" / "testrun"
    x, y = (json.loads((run / f"{n}.json").read_text()) for n in "xy")
    assert y["worker_pid"] not in x["runner_children_at_end"]  # started after x ended
    assert x["worker_pid"] in x["runner_children_at_end"]  # (the list is the runner's children)


NO_PRELOAD = SOURCE.replace('name, order, timeout_s = "y", 11, 120.0',
                            'name, order, timeout_s = "y", 11, 120.0\n    preload = PRELOAD_Y')


@pytest.mark.parametrize("value", ["False", "'yes'", "1"])  # only True (the default) asks for a spare
def test_a_stage_that_says_preload_false_or_an_odd_value_gets_a_fresh_worker(plugins, tmp_path, value):
    plugins.make("sp-plugin", "sp_mod", "PRELOAD_Y = " + value + "\n" + NO_PRELOAD,
                 {"x": "sp_mod:X", "y": "sp_mod:Y", "z": "sp_mod:Z"})
    env = plugins.env()
    env.pop("NSA_RUN_SPARE_WORKER", None)
    r = _oneshot(env_with(env, SP_SLEEP_X=1, SP_SLEEP_Y=1), tmp_path / "out")
    assert r.returncode == 0, r.stderr
    run = tmp_path / "out" / "testrun"
    x, y, z = (json.loads((run / f"{n}.json").read_text()) for n in "xyz")
    assert y["worker_pid"] not in x["runner_children_at_end"]  # started after x ended
    assert not y["torch_loaded"]  # a fresh worker: nothing preloaded
    assert z["worker_pid"] in y["runner_children_at_end"] and z["torch_loaded"]  # z's spare, made as y ran
    assert not any(alive(s[k]) for s in (x, y, z) for k in ("pid", "worker_pid"))
    assert _spare_dirs(x["runner_pid"]) == []


def _interrupt_with_a_waiting_spare(plugins, tmp_path, spawn, sig):
    env = _make(plugins)
    spare_file = tmp_path / "spare.pid"
    proc = spawn(cli_cmd("oneshot", "--out", tmp_path / "out", "--only", "x,y,z", "--device", "cpu"),
                 env=env_with(env, SP_SPARE_PID=spare_file, SP_SLEEP_X=600),
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    spare = int(wait_for(spare_file, proc=proc))
    assert alive(spare)
    spawn.snapshot()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    return proc, spare, err, env


def test_ctrl_c_ends_the_unused_spare_and_removes_its_folder(plugins, tmp_path, spawn):
    proc, spare, err, _ = _interrupt_with_a_waiting_spare(plugins, tmp_path, spawn, signal.SIGINT)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert gone_within(spare, 5), f"the spare worker {spare} outlived the interrupted run"
    assert _spare_dirs(proc.pid) == []


def test_kill_9_of_the_runner_ends_the_spare_and_the_next_start_removes_its_folder(plugins, tmp_path, spawn):
    proc, spare, _, env = _interrupt_with_a_waiting_spare(plugins, tmp_path, spawn, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    assert gone_within(spare, 5), f"the spare worker {spare} outlived its runner's kill -9"
    r = _oneshot(env, tmp_path / "out2")  # any next start removes what the killed runner left
    assert r.returncode == 0, r.stderr
    assert _spare_dirs(proc.pid) == []


def test_the_spare_preloads_fa4_only_on_a_cuda_run_where_it_is_installed(monkeypatch):
    from nsa_core.flash import detect as det
    from nsa_runner import _worker

    present = {"fa4": True}
    monkeypatch.setattr(det, "detect", lambda path, do_import=True: {"present": present.get(path, False)})
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert _worker._preloads() == ["torch", "triton", "torch._dynamo", "cutlass"]
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # a CPU run
    assert _worker._preloads() == ["torch", "triton"]
    monkeypatch.delenv("TRITON_INTERPRET")
    present["fa4"] = False
    assert _worker._preloads() == ["torch", "triton"]


def test_the_spare_preloads_fla_s_torch_parts_only_for_a_stage_that_asks_and_where_fla_is_installed(monkeypatch):
    import importlib.util

    from nsa_runner import _worker

    real = importlib.util.find_spec
    installed = {"fla": True}
    def find_spec(name, *a):
        return (object() if installed[name] else None) if name in installed else real(name, *a)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert _worker._preloads(flash=False, fla=True) == ["torch", "triton", "torch._inductor.compile_fx",
                                                        "functorch.compile"]
    assert _worker._preloads(flash=False, fla=False) == ["torch", "triton"]
    installed["fla"] = False
    assert _worker._preloads(flash=False, fla=True) == ["torch", "triton"]
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # a CPU run: torch and triton only
    installed["fla"] = True
    assert _worker._preloads(flash=False, fla=True) == ["torch", "triton"]


def test_a_spare_still_importing_is_not_charged_to_the_stage_s_timeout_or_duration(plugins, tmp_path):
    """Round 13 A-B5: the next stage was handed to its spare while the spare still imported torch
    (~1.5-4 s on CPU), its clock already running: a quick stage ended TIMEOUT with an empty log. The
    clock now starts when the worker begins the stage (the ``started`` file beside its job)."""
    env = _make(plugins)
    r = subprocess.run(cli_cmd("oneshot", "--out", tmp_path / "out", "--only", "x,y,z", "--device", "cpu",
                               "--timeout", "0.8"), env=env, capture_output=True, text=True, timeout=300)
    stages = manifest(tmp_path / "out")["stages"]
    assert [s["status"] for s in stages] == ["PASS"] * 3, (r.stderr, [s["reason"] for s in stages])
    run = tmp_path / "out" / "testrun"
    y, z = (json.loads((run / f"{n}.json").read_text()) for n in "yz")
    assert y["torch_loaded"] and z["torch_loaded"]  # they did run in spares
