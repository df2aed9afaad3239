"""Bad days, red-team round 16 (part A) A5, through the CLI: stage a SIGSTOPs the spare worker started
ahead for stage b (a process of this user, the runner's child). ``_Spare.hand`` checked only that it had
not exited, handed b's job to the stopped process, and b ended TIMEOUT "did not begin within 123s (its
worker was still starting)" two minutes later: b was blamed for what a did.

Expected: a spare that is not running (stopped, traced, a zombie) is never handed a stage: it is ended
and the stage gets a fresh worker; b runs and PASSes at once, and the stopped spare is gone.
"""

from __future__ import annotations

import subprocess
import sys

try:
    from _bad_days import MAIN, alive, env_with, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, alive, env_with, manifest

STAGES = """
import os, signal, time
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

def _ppid(pid):
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])

def _worker_kind():
    pid = os.getpid()
    while pid > 1:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\\0")
        if b"nsa_runner._worker" in argv:
            return "spare" if b"--spare" in argv else "fresh"
        pid = _ppid(pid)
    return "unknown"

class A(Stage):
    name, order, timeout_s = "a", 10, 120.0
    def run(self, ctx):
        runner = _ppid(os.getppid())  # the stage runs in its worker's child
        for _ in range(1200):
            for p in os.listdir("/proc"):
                if not p.isdigit():
                    continue
                try:
                    argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\\0")
                    if b"--spare" in argv and _ppid(int(p)) == runner:
                        os.kill(int(p), signal.SIGSTOP)
                        Path(os.environ["K16_SPARE"]).write_text(p)
                        return StageResult(Status.PASS, "a stopped the spare " + p)
                except (OSError, ValueError):
                    pass
            time.sleep(0.05)
        return StageResult(Status.ERROR, "no spare found")

class B(Stage):
    name, order, timeout_s = "b", 11, 120.0
    def run(self, ctx):
        (ctx.dir / "b.txt").write_text(_worker_kind())
        return StageResult(Status.PASS, "b ok", files=["b.txt"])
"""


def test_a5_a_stopped_spare_is_not_handed_the_next_stage(plugins, tmp_path):
    plugins.make("k16-spare", "k16_spare_mod", STAGES, {"a": "k16_spare_mod:A", "b": "k16_spare_mod:B"})
    out = tmp_path / "o"
    mark = tmp_path / "spare.pid"
    env = env_with(plugins.env(), K16_SPARE=mark)
    env.pop("NSA_RUN_SPARE_WORKER", None)  # the default: b's worker is started ahead
    p = subprocess.run([sys.executable, "-c", MAIN, "oneshot", "--only", "a,b", "--out", str(out), "--device", "cpu",
                        "--timeout", "3"], env=env, capture_output=True, text=True, timeout=300)
    statuses = {s["name"]: (s["status"], s["reason"]) for s in manifest(out)["stages"]}
    assert statuses["a"][0] == "PASS", (statuses, p.stdout, p.stderr)  # it did stop the spare
    assert statuses["b"] == ("PASS", "b ok"), (statuses, p.stdout, p.stderr)
    assert (out / "testrun" / "b.txt").read_text() == "fresh"  # not the stopped spare
    assert p.returncode == 0, p.stdout + p.stderr
    assert not alive(int(mark.read_text()))  # the stopped spare was ended, not left behind
