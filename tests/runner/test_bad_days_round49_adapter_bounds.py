"""Bad days, round 48's open adapter roots (stop 42), through the CLI: a plugin adapter's own process is kept in
bounds by the stage's process (``nsa_runner._contained``).

- B48b-5: an adapter's process that printed past the stage log's limit had the whole stage stopped, ERROR, naming no
  adapter (nsa_core's rows lost). Its output now reaches the log up to 1/8 of that limit; past it the adapter is
  stopped and its rows fail naming it, nsa_core's rows stand.
- B48b-4: a daemon an adapter's process left (``setsid``, its environment kept; or double-forked with its
  environment cleared) ran on while the stage ran its next adapter, and could rewrite the stage's files then. It is
  now killed as the adapter's process ends.
"""

from __future__ import annotations

import csv
import os
import subprocess
import time

import pytest

try:
    from _bad_days import cli_cmd, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, manifest

ADAPTERS = """
import json, os, sys, time

from nsa_runner.impls import Impl
from nsa_runner.impls import nsa_core as _base

# only in an adapter's own process (argv: its job file, then where its results go)
if len(sys.argv) == 3 and sys.argv[1].endswith("job.json"):
    with open(sys.argv[1]) as f:
        NAME = json.load(f)["name"]
    HOW = os.environ.get("R49_HOW", "")
    if (NAME == "r49a" or NAME.startswith("r49f")) and HOW == "flood":
        block = b"flood " * 20000 + b"\\n"
        for _ in range(int(os.environ["R49_MIB"]) * 9):
            os.write(1, block)
    elif NAME == "r49a" and HOW in ("daemon", "orphan"):
        mark, host = os.environ["R49_MARK"], str(os.getpid())
        if os.fork() == 0:  # the daemon: leaves the session, waits for its adapter's process to end (and to be
            os.setsid()  # reaped), then a second more, then "rewrites" a file (the next adapter runs meanwhile)
            if HOW == "orphan" and os.fork() != 0:  # its parent ends: the daemon is an orphan
                os._exit(0)
            code = ("import os, sys, time\\n"
                    "while os.path.exists('/proc/' + sys.argv[2]): time.sleep(0.05)\\n"
                    "time.sleep(1.0); open(sys.argv[1], 'w').write('rewritten')")
            env = {} if HOW == "orphan" else dict(os.environ)  # (orphan: no cookie of any kind)
            os.execve(sys.executable, [sys.executable, "-c", code, mark, host], env)
    elif NAME == "r49a" and HOW == "trickle":  # a daemon that keeps the output and prints every 50 ms, forever
        if os.fork() == 0:
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            i = 0
            while True:
                os.write(1, b"tick %d\\n" % i)
                i += 1
                time.sleep(0.05)
    elif NAME == "r49a" and HOW in ("hang", "stop", "closehang"):  # never ends by itself
        if HOW == "stop":
            import signal
            os.kill(os.getpid(), signal.SIGSTOP)
        if HOW == "closehang":  # every descriptor of its output closed first: the pipe's end is not its end
            pipe = os.readlink("/proc/self/fd/1")
            for n in os.listdir("/proc/self/fd"):
                try:
                    if os.readlink(f"/proc/self/fd/{n}") == pipe:
                        os.close(int(n))
                except OSError:
                    pass
        time.sleep(10000)
    elif NAME == "r49a" and HOW == "hello":
        print("r49a: hello from its own process", flush=True)
        print("r49a: and from its stderr", file=sys.stderr, flush=True)
    elif NAME == "r49b":
        time.sleep(float(os.environ.get("R49_SLOW_S", "0")))


def make_a():
    return Impl(name="r49a", parts=dict(_base.make().parts), description="a flooding / daemon-leaving adapter")


def make_b():
    return Impl(name="r49b", parts=dict(_base.make().parts), description="a slow adapter after it")


def _flooder(i):
    return lambda: Impl(name=f"r49f{i}", parts=dict(_base.make().parts), description="one flood of many")


for _i in range(1, 10):
    globals()[f"make_f{_i}"] = _flooder(_i)
"""


def _run(plugins, tmp_path, how, impls, *args, **extra):
    entries = {"r49a": "r49_bounds:make_a", "r49b": "r49_bounds:make_b",
               **{f"r49f{i}": f"r49_bounds:make_f{i}" for i in range(1, 10)}}
    plugins.make("r49-bounds", "r49_bounds", ADAPTERS, entries, version="1.0", group="nsa_runner.impls")
    out = tmp_path / "o"
    env = {**plugins.env(), "R49_HOW": how, "TRITON_INTERPRET": "1", **extra}
    r = subprocess.run(cli_cmd("stage", "triton-fwd", "--impl", impls, "--cases", "T50", "--device", "cpu",
                               "--out", out, *args), env=env, capture_output=True, text=True, timeout=900)
    (rec,) = manifest(out)["stages"]
    with open(out / "testrun" / "triton_fwd.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return r, rec, rows, out / "testrun"


def test_an_adapters_output_flood_stops_that_adapter_not_the_stage(plugins, tmp_path):
    """12 MiB from the adapter's process under an 8 MiB log limit: before, the stage was stopped ERROR ("printed
    more than 8 MiB"), naming no adapter, nsa_core's rows lost."""
    r, rec, rows, run = _run(plugins, tmp_path, "flood", "nsa_core,r49a,r49b",
                             NSA_RUN_LOG_LIMIT_MIB="8", R49_MIB="12")
    assert rec["status"] == "FAIL", (rec, r.stderr[-2000:])
    assert "r49a" in rec["reason"] and "printed more than 1 MiB" in rec["reason"], rec
    assert "nsa_core:" not in rec["reason"] and "r49b:" not in rec["reason"], rec
    status = {x["impl"]: x["status"] for x in rows}
    assert status == {"nsa_core": "PASS", "r49a": "ERROR", "r49b": "PASS"}, rows
    log = next(run.glob("logs/triton-fwd*.log"))
    size = log.stat().st_size
    assert (1 << 20) < size < (2 << 20), size  # its first MiB is there, the rest was never written
    assert b"this adapter's output was cut here" in log.read_bytes()


def test_many_flooding_adapters_together_stay_under_the_stage_logs_limit(plugins, tmp_path):
    """Round 49 B49a-2: nine adapters each flooding to its own cap (1/8 of a 1 MiB limit) passed the stage log's
    limit together: the stage ERROR, no CSV, nsa_core's rows lost. Each one's share is now at most half of the room
    the log has left."""
    flooders = ",".join(f"r49f{i}" for i in range(1, 10))
    r, rec, rows, run = _run(plugins, tmp_path, "flood", f"nsa_core,{flooders},r49b",
                             NSA_RUN_LOG_LIMIT_MIB="1", R49_MIB="2")
    assert rec["status"] == "FAIL", (rec, r.stderr[-2000:])
    status = {x["impl"]: x["status"] for x in rows}
    assert status == {"nsa_core": "PASS", "r49b": "PASS", **{f"r49f{i}": "ERROR" for i in range(1, 10)}}, rows
    assert all("printed more than" in x["note"] for x in rows if x["impl"].startswith("r49f")), rows
    assert next(run.glob("logs/triton-fwd*.log")).stat().st_size < (1 << 20)


@pytest.mark.parametrize("how", ["daemon", "orphan"])
def test_what_an_adapters_process_left_running_ends_with_it(plugins, tmp_path, how):
    """A daemon from r49a's process writes a file 1 s after that process has ended, while the stage runs r49b's
    process for 8 s. Before, the daemon wrote it (killed only at the stage's end); now it is killed as r49a's process
    ends."""
    mark = tmp_path / "mark"
    t0 = time.monotonic()
    r, rec, rows, _ = _run(plugins, tmp_path, how, "nsa_core,r49a,r49b", R49_MARK=str(mark), R49_SLOW_S="8")
    assert time.monotonic() - t0 > 8  # (the stage did run on past the daemon's moment)
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:])
    assert [x["status"] for x in rows] == ["PASS", "PASS", "PASS"], rows
    time.sleep(2.5)
    assert not mark.exists(), "the adapter's daemon ran on after its process ended"
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


def test_a_daemon_that_keeps_printing_ends_with_its_adapters_process(plugins, tmp_path):
    """Round 49 B49b-2: a daemon of the adapter's that kept its output and printed every 50 ms hid the end of the
    adapter's process from the stage (looked at only when the pipe was quiet): the stage ran to its timeout, no
    CSV, nsa_core's rows lost. Now its end is seen, the daemon killed, the next adapter runs."""
    t0 = time.monotonic()
    r, rec, rows, run = _run(plugins, tmp_path, "trickle", "nsa_core,r49a,r49b", "--timeout", "120")
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:])  # before: TIMEOUT after 120 s, "the last line: tick N"
    assert [x["status"] for x in rows] == ["PASS", "PASS", "PASS"], rows
    assert time.monotonic() - t0 < 110
    log = next(run.glob("logs/triton-fwd*.log")).read_text()
    assert "tick 0" in log and log.index("tick 0") < log.index("# r49b: runs in a process of its own"), log[-2000:]


@pytest.mark.parametrize("how", ["hang", "stop", "closehang"])
def test_an_adapter_that_never_ends_is_stopped_before_the_stages_timeout(plugins, tmp_path, how):
    """Round 49 U49a-1 / U49b-1: an adapter's process that hung (or stopped itself) took the whole stage to its
    TIMEOUT, nsa_core's rows lost, the adapter named only through the log's last progress line. It is now stopped a
    tenth of the timeout (5 s at least) before the stage's, and its rows are its ERROR, named."""
    t0 = time.monotonic()
    r, rec, rows, _ = _run(plugins, tmp_path, how, "nsa_core,r49a,r49b", "--timeout", "40")
    assert rec["status"] == "FAIL", (rec, r.stderr[-2000:])  # before: TIMEOUT, no CSV
    status = {x["impl"]: x["status"] for x in rows}
    assert status == {"nsa_core": "PASS", "r49a": "ERROR", "r49b": "ERROR"}, rows
    (theirs,) = [x for x in rows if x["impl"] == "r49a"]
    assert "had not ended" in theirs["note"] and "timeout is 40 s" in theirs["note"], theirs
    # the one after it is not blamed for the time the hung one used (round 50 B50a-4 / B50b-2: "had not ended 0 s
    # after it began"): it was never started, and says so
    (after,) = [x for x in rows if x["impl"] == "r49b"]
    assert "was not started" in after["note"] and "had not ended" not in after["note"], after
    assert time.monotonic() - t0 < 60


def test_a_quiet_adapter_is_untouched(plugins, tmp_path):
    """The bounds change nothing for an adapter that prints a little and starts nothing: its rows PASS, its output
    reaches the log whole, in order."""
    r, rec, rows, run = _run(plugins, tmp_path, "hello", "nsa_core,r49a")
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:])
    log = next(run.glob("logs/triton-fwd*.log")).read_text()
    said = log.index("# r49a: runs in a process of its own")
    assert said < log.index("r49a: hello from its own process") < log.index("r49a: and from its stderr"), log[-3000:]
    assert [x["status"] for x in rows] == ["PASS", "PASS"], rows
    assert os.path.getsize(run / "triton_fwd.csv") > 0
