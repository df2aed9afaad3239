"""Bad days, disk family, through the CLI: a stage whose log has no end (a plugin printing in a loop, a
helper it started in a session of its own printing to the same log) wrote until its timeout, filling the
disk under the run folder (a stage's log had no cap; left open since round 19). Expected: past
``NSA_RUN_LOG_LIMIT_MIB`` the stage is stopped with its processes, recorded ERROR naming the limit and the
log, the log cut there with a last line saying so; the run goes on with the next stage; a bad value of
the variable is one line, exit 2, before anything runs."""

from __future__ import annotations

import subprocess
import time

try:
    from _bad_days import alive, cli_cmd, env_with, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import alive, cli_cmd, env_with, manifest

STAGES = """
import os, subprocess, sys
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

class Flood(Stage):
    name, order, timeout_s = "flood", 70, 40.0
    def run(self, ctx):
        # a helper in a session of its own, printing to the stage's log too (inherited stdout)
        p = subprocess.Popen(["setsid", "sh", "-c", "while :; do echo helper-line-of-some-length; done"],
                             stdin=subprocess.DEVNULL)
        Path(os.environ["LL_PID"]).write_text(str(p.pid))
        line = "x" * 199
        while True:
            print(line, flush=True)

class Chatty(Stage):
    name, order, timeout_s = "chatty", 71, 40.0
    def run(self, ctx):
        for _ in range(2000):  # 400 kB: under a limit of 1 MiB
            print("y" * 199)
        return StageResult(Status.PASS, "printed 400 kB")
"""

LIMIT = 2**20


def test_a_stage_printing_without_end_is_stopped_at_the_log_limit_and_the_run_goes_on(plugins, tmp_path):
    plugins.make("ll-stages", "ll_mod", STAGES, {"flood": "ll_mod:Flood", "chatty": "ll_mod:Chatty"})
    out, pid_file = tmp_path / "o", tmp_path / "helper.pid"
    r = subprocess.run(cli_cmd("oneshot", "--only", "flood,chatty", "--out", out, "--device", "cpu"),
                       env=env_with(plugins.env(), NSA_RUN_LOG_LIMIT_MIB="1", LL_PID=str(pid_file)),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 1 and "Traceback" not in r.stderr, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    recs = {s["name"]: s for s in manifest(out)["stages"]}
    assert recs["flood"]["status"] == "ERROR", recs["flood"]
    assert "its log passed 1 MiB (logs/flood.log)" in recs["flood"]["reason"], recs["flood"]["reason"]
    assert "NSA_RUN_LOG_LIMIT_MIB" in recs["flood"]["hint"], recs["flood"]["hint"]
    assert recs["chatty"]["status"] == "PASS", recs["chatty"]  # under the limit: untouched
    log = out / "testrun" / "logs" / "flood.log"
    size = log.stat().st_size
    assert LIMIT < size < LIMIT + 200, size  # the limit, then the note
    assert log.read_bytes().rstrip().endswith(b"the stage was stopped]"), log.read_bytes()[-200:]
    assert "the stage was stopped]" in recs["flood"]["log_tail"]
    helper = int(pid_file.read_text())
    assert not alive(helper)  # the helper of its own session went with the stage
    time.sleep(0.5)
    assert log.stat().st_size == size  # nothing writes to it any more
    assert (out / "testrun" / "logs" / "chatty.log").stat().st_size >= 2000 * 200


def test_a_bad_log_limit_is_refused_before_anything_runs(plugins, tmp_path):
    plugins.make("ll-stages", "ll_mod", STAGES, {"flood": "ll_mod:Flood", "chatty": "ll_mod:Chatty"})
    for value in ("abc", "0", "-1", "nan", "inf"):
        out = tmp_path / f"o{len(value)}{value.isalpha()}"
        r = subprocess.run(cli_cmd("stage", "chatty", "--out", out, "--device", "cpu"),
                           env=env_with(plugins.env(), NSA_RUN_LOG_LIMIT_MIB=value), capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 2, (value, r.returncode, r.stderr[-2000:])
        assert f"NSA_RUN_LOG_LIMIT_MIB={value!r} is not a positive number of MiB" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and not (out / "testrun").exists(), value


def test_a_huge_log_limit_is_refused_and_the_largest_taken(plugins, tmp_path):
    """Round 24 B24-1: 1e308 (positive, finite) overflowed to inf in bytes: 'OverflowError ... (unexpected)', exit 2;
    round 32 U32-3: from then on it was taken as 1 TiB without a word. Above 1 TiB it is refused in one line, before
    anything runs; 1 TiB itself is taken."""
    plugins.make("ll-stages", "ll_mod", STAGES, {"flood": "ll_mod:Flood", "chatty": "ll_mod:Chatty"})
    for value in ("1e308", "1048577"):
        out = tmp_path / f"o{len(value)}"
        r = subprocess.run(cli_cmd("stage", "chatty", "--out", out, "--device", "cpu"),
                           env=env_with(plugins.env(), NSA_RUN_LOG_LIMIT_MIB=value), capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 2, (value, r.returncode, r.stderr[-2000:])
        assert f"NSA_RUN_LOG_LIMIT_MIB={value!r} is above 1048576 MiB" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and "Overflow" not in r.stderr and not (out / "testrun").exists()
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("stage", "chatty", "--out", out, "--device", "cpu"),
                       env=env_with(plugins.env(), NSA_RUN_LOG_LIMIT_MIB="1048576"), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert manifest(out)["stages"][0]["status"] == "PASS"


STOPPED = """
import os, signal, time
from nsa_runner import Stage, StageResult, Status

class Late(Stage):
    name, order, timeout_s = "late", 72, 1.0
    def run(self, ctx):
        told = []
        signal.signal(signal.SIGTERM, lambda *a: told.append(1))  # it finishes its batch before it stops
        while not told:
            time.sleep(0.01)
        line = b"z" * 65535 + b"\\n"
        while True:  # ... printing without end, through the stop's grace
            os.write(1, line)
"""


def test_a_stage_printing_through_the_stops_grace_is_cut_at_the_log_limit(plugins, tmp_path):
    """Round 24 B24-3: the limit was watched only until nsa-run began stopping the stage; a stage ignoring SIGTERM
    and printing through the grace wrote 2.4 GB past a 20 MiB limit, the log never cut."""
    plugins.make("ls-stages", "ls_mod", STOPPED, {"late": "ls_mod:Late"})
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("oneshot", "--only", "late", "--out", out, "--device", "cpu"),
                       env=env_with(plugins.env(), NSA_RUN_LOG_LIMIT_MIB="1"), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-2000:])
    (rec,) = manifest(out)["stages"]
    assert rec["status"] == "TIMEOUT" and "its log passed 1 MiB (logs/late.log)" in rec["reason"], rec
    assert "[nsa-run: this log was cut" not in rec["reason"], rec  # round 25 U25-5: not quoted as the stage's line
    log = out / "testrun" / "logs" / "late.log"
    assert LIMIT < log.stat().st_size < LIMIT + 200, log.stat().st_size
    assert log.read_bytes().rstrip().endswith(b"the stage was stopped]")
