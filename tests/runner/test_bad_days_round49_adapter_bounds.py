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
    if NAME == "r49a" and HOW == "flood":
        block = b"flood " * 20000 + b"\\n"
        for _ in range(int(os.environ["R49_MIB"]) * 9):
            os.write(1, block)
    elif NAME == "r49a" and HOW in ("daemon", "orphan"):
        mark = os.environ["R49_MARK"]
        if os.fork() == 0:  # the daemon: leaves the session, waits, then "rewrites" a file
            os.setsid()
            if HOW == "orphan" and os.fork() != 0:  # its parent ends: the daemon is an orphan
                os._exit(0)
            code = ("import sys, time; time.sleep(2.0); open(sys.argv[1], 'w').write('rewritten')")
            env = {} if HOW == "orphan" else dict(os.environ)  # (orphan: no cookie of any kind)
            os.execve(sys.executable, [sys.executable, "-c", code, mark], env)
    elif NAME == "r49a" and HOW == "hello":
        print("r49a: hello from its own process", flush=True)
        print("r49a: and from its stderr", file=sys.stderr, flush=True)
    elif NAME == "r49b":
        time.sleep(float(os.environ.get("R49_SLOW_S", "0")))


def make_a():
    return Impl(name="r49a", parts=dict(_base.make().parts), description="a flooding / daemon-leaving adapter")


def make_b():
    return Impl(name="r49b", parts=dict(_base.make().parts), description="a slow adapter after it")
"""


def _run(plugins, tmp_path, how, impls, **extra):
    plugins.make("r49-bounds", "r49_bounds", ADAPTERS, {"r49a": "r49_bounds:make_a", "r49b": "r49_bounds:make_b"},
                 version="1.0", group="nsa_runner.impls")
    out = tmp_path / "o"
    env = {**plugins.env(), "R49_HOW": how, "TRITON_INTERPRET": "1", **extra}
    r = subprocess.run(cli_cmd("stage", "triton-fwd", "--impl", impls, "--cases", "T50", "--device", "cpu",
                               "--out", out), env=env, capture_output=True, text=True, timeout=900)
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


@pytest.mark.parametrize("how", ["daemon", "orphan"])
def test_what_an_adapters_process_left_running_ends_with_it(plugins, tmp_path, how):
    """A daemon from r49a's process writes a file 2 s later; the stage then runs r49b's process for 8 s. Before,
    the daemon wrote it (killed only at the stage's end); now it is killed as r49a's process ends."""
    mark = tmp_path / "mark"
    t0 = time.monotonic()
    r, rec, rows, _ = _run(plugins, tmp_path, how, "nsa_core,r49a,r49b", R49_MARK=str(mark), R49_SLOW_S="8")
    assert time.monotonic() - t0 > 8  # (the stage did run on past the daemon's moment)
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:])
    assert [x["status"] for x in rows] == ["PASS", "PASS", "PASS"], rows
    time.sleep(2.5)
    assert not mark.exists(), "the adapter's daemon ran on after its process ended"
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


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
