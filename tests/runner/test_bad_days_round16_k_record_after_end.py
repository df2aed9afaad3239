"""Bad days, red-team round 16 (part A) A8, through the CLI: the steps from a stage's end to its record
ran outside the runner's signal deferral.

- A second SIGTERM while ``run_one``'s ``finally`` removed the interrupted stage's temp folder (a stage
  that filled it: ``rmtree`` of 30 000 files) raised a bare KeyboardInterrupt there: the stage was not
  recorded at all (manifest ``stages: []``), and ``rmtree``, cut short, had often taken the folder's
  ``.nsa-run-owned`` marker already: the rest stayed in the temp folder for good.
- One SIGTERM while the runner checked a *finished* stage's result (``_apply_result``: a FAIL declaring
  50 000 missing names) lost that FAIL the same way.

Expected: the runner's interrupts wait from the stage's end until its record is written; the record is
there (ERROR "interrupted" / the stage's own FAIL), the run exits 130, the temp folder is gone. The
signals are sent on what the runner is seen doing (files going, the stage's worker gone),
never after a delay.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

try:
    from _bad_days import MAIN, alive, env_with, wait_for
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, alive, env_with, wait_for

STAGES = """
import os, sys, time
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

class X(Stage):
    name, order, timeout_s = "x", 10, 300.0
    def run(self, ctx):
        mark = Path(os.environ["K16_MARK"])
        if os.environ.get("K16_FILL"):  # the stage's own temp folder (the worker's result path is in it)
            folder = os.path.dirname(os.path.realpath(sys.argv[-1]))
            for i in range(int(os.environ["K16_FILL"])):
                open(f"{folder}/f{i:06d}", "w").close()
            mark.write_text(folder)
            time.sleep(300)
        (ctx.dir / "x.txt").write_text("x")
        mark.write_text(str(os.getppid()))  # the worker
        missing = [f"m{i}" for i in range(int(os.environ.get("K16_MISSING", "0")))]
        return StageResult(Status.FAIL, "x real FAIL", files=["x.txt"] + missing)

class Y(Stage):
    name, order, timeout_s = "y", 11, 300.0
    def run(self, ctx):  # runs in the spare started for it: fills that spare's temp folder
        import glob, tempfile
        worker = os.getppid()
        runner = int(Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[1])
        folders = glob.glob(os.path.join(tempfile.gettempdir(), f"nsa-run-spare-{runner}-*"))
        for folder in folders:
            for i in range(int(os.environ["K16_SPARE_FILL"])):
                open(f"{folder}/f{i:06d}", "w").close()
        (ctx.dir / "y.txt").write_text("y")
        Path(os.environ["K16_MARK_Y"]).write_text("\\n".join(folders))
        return StageResult(Status.PASS, "y ok", files=["y.txt"])
"""


def _start(plugins, tmp_path, only="x", spare="0", **kw):
    plugins.make("k16-rec", "k16_rec_mod", STAGES, {"x": "k16_rec_mod:X", "y": "k16_rec_mod:Y"})
    out, mark = tmp_path / "o", tmp_path / "mark"
    env = env_with(plugins.env(), K16_MARK=mark, NSA_RUN_SPARE_WORKER=spare, **kw)
    proc = subprocess.Popen([sys.executable, "-c", MAIN, "oneshot", "--only", only, "--out", str(out),
                             "--device", "cpu"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, out, mark


def _stages(out: Path) -> list[tuple[str, str, str]]:
    d = json.loads((out / "testrun" / "manifest.json").read_text())
    return [(s["name"], s["status"], s["reason"]) for s in d["stages"]]


def _count(folder: str) -> int:
    try:
        return len(os.listdir(folder))
    except OSError:
        return -1


def test_a8_a_second_sigterm_while_the_temp_folder_goes_keeps_the_record(plugins, tmp_path):
    proc, out, mark = _start(plugins, tmp_path, K16_FILL=30000)
    try:
        folder = wait_for(mark, timeout=240, proc=proc)
        full = _count(folder)
        assert full > 30000
        proc.send_signal(signal.SIGTERM)  # the stage is stopped, then its temp folder removed
        deadline = time.monotonic() + 120
        while 0 <= _count(folder) >= full and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # while the removal runs
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stdout + stderr
    stages = _stages(out)
    assert [s[:2] for s in stages] == [("x", "ERROR")], (stages, stdout, stderr)
    assert "interrupted" in stages[0][2]
    assert not os.path.lexists(folder), _count(folder)  # removed whole, not left (without its marker)


def test_a8e_a_sigterm_while_a_finished_stage_is_checked_keeps_its_fail(plugins, tmp_path):
    proc, out, mark = _start(plugins, tmp_path, K16_MISSING=50000)
    try:
        worker = int(wait_for(mark, timeout=240, proc=proc))
        # the stage returned; once its worker is gone (the reaper, started when the runner took the result
        # over, killed it) the runner checks the result
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline and alive(worker):
            time.sleep(0.001)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stdout + stderr
    stages = _stages(out)
    assert [s[:2] for s in stages] == [("x", "FAIL")], (stages, stdout, stderr)
    assert stages[0][2].startswith("x real FAIL; declared file(s) missing")


def test_a8d_a_sigterm_while_the_spare_that_ran_the_stage_is_closed_keeps_its_pass(plugins, tmp_path):
    """(``execute``'s ``finally: this.close()``, between ``run_one``'s return and the record.)"""
    mark = tmp_path / "mark_y"
    proc, out, _ = _start(plugins, tmp_path, only="x,y", spare="1", K16_SPARE_FILL=30000, K16_MARK_Y=mark)
    try:
        folders = wait_for(mark, timeout=240, proc=proc).split("\n")
        assert len(folders) == 1 and folders[0]
        folder = folders[0]
        full = _count(folder)
        assert full > 30000
        deadline = time.monotonic() + 120
        while 0 <= _count(folder) >= full and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.001)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # while the spare's folder is removed
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stdout + stderr
    stages = _stages(out)
    assert [s[:3] for s in stages] == [("x", "FAIL", "x real FAIL"), ("y", "PASS", "y ok")], (stages, stdout, stderr)
    assert not os.path.lexists(folder), _count(folder)


# the runner's poll, told the stage's result is there, is signalled right then (before it acted on it):
# the window of A8e made certain. The SIGTERM goes through the CLI's own handler.
_AT_RESULT = MAIN.replace("from nsa_runner.cli import main", (
    "import os, signal; from nsa_runner import executor as e; real = e._TempFolder.exists; sent = []\n"
    "def exists(self, entry):\n"
    "    there = real(self, entry)\n"
    "    if there and entry == e.RESULT and not sent:\n"
    "        sent.append(1); os.kill(os.getpid(), signal.SIGTERM)\n"
    "    return there\n"
    "e._TempFolder.exists = exists\n"
    "from nsa_runner.cli import main"))
assert _AT_RESULT != MAIN


def test_a8e_a_sigterm_when_the_poll_sees_the_result_keeps_the_stages_fail(plugins, tmp_path):
    """Before: x ERROR "interrupted (SIGTERM): the stage was stopped", its own FAIL lost."""
    plugins.make("k16-rec", "k16_rec_mod", STAGES, {"x": "k16_rec_mod:X", "y": "k16_rec_mod:Y"})
    out = tmp_path / "o"
    env = env_with(plugins.env(), K16_MARK=tmp_path / "mark", NSA_RUN_SPARE_WORKER="0")
    proc = subprocess.run([sys.executable, "-c", _AT_RESULT, "oneshot", "--only", "x", "--out", str(out),
                           "--device", "cpu"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 130, proc.stdout + proc.stderr
    assert [s[:3] for s in _stages(out)] == [("x", "FAIL", "x real FAIL")], (proc.stdout, proc.stderr)
    assert "interrupted" in proc.stdout + proc.stderr
