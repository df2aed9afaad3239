"""Bad days, red-team round 13: signals at the moments the probes from outside found
(/tmp/rt13a/report.md, /tmp/rt13b/report.md), each through the real CLI (``cli.main``, run id
pinned). The red-teamers widened the windows with strace; here the runner process itself sends the
signal at the same point (a step of its own wrapped, see INJECT).

- B-B7: a SIGINT / SIGTERM / SIGHUP while the closing summaries were written was dropped (exit 0,
  ``interrupted: false``): ``finish_run`` set SIG_IGN over the handler that notes it;
- B-B8: ``nsa-run --version`` printed the version a plugin's ``nsa_run`` METADATA claimed;
- A-B6: a SIGTERM (or Ctrl-C) just as the runner took the manifest lock leaked the lock inside the
  runner: it waited for itself, then exited 2 "held by another process ... end that process", the
  stage's result unrecorded;
- A-B7: a Ctrl-C while the runner imported torch (its start) was dropped: the run went on, exit 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

try:
    from _bad_days import MAIN, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with


# in the runner process: a signal to itself at the point the red-teamers held open
INJECT = '''
import os, signal, sys, time
from nsa_runner import manifest as _m
from nsa_runner.commands import _common as _c

def _me(name):
    os.kill(os.getpid(), getattr(signal, name))

# B-B7: while the closing summaries are written (after the run's records): RT13_SIG_AT_SUMMARY
_real_reports = _c.write_run_reports
_fired = set()

def _reports(*a, **k):
    sig = os.environ.get("RT13_SIG_AT_SUMMARY")
    if sig and "summary" not in _fired:
        _fired.add("summary")
        _me(sig)
        time.sleep(0.3)  # the signal is handled while the summaries are being written
    return _real_reports(*a, **k)

_c.write_run_reports = _reports

# A-B6: the moment the lock of the manifest's record is taken (flock done): RT13_SIG_AT_RECORD_LOCK
_in_record = []
_real_record = _m.RunManifest.record

def _record(self, *a, **k):
    _in_record.append(1)
    try:
        return _real_record(self, *a, **k)
    finally:
        _in_record.pop()

_m.RunManifest.record = _record

import filelock._unix as _fu

_real_flock = _fu._lock_fd_nonblocking

def _flock(fd):  # the flock syscall returned (the lock is this process's); filelock has not kept fd yet
    locked = _real_flock(fd)
    sig = os.environ.get("RT13_SIG_AT_RECORD_LOCK")
    if sig and locked and _in_record and "lock" not in _fired:
        _fired.add("lock")
        _me(sig)
    return locked

_fu._lock_fd_nonblocking = _flock

# A-B7: a Ctrl-C while the CLI starts, waiting for torch's import (RT13_SIG_IN_TORCH). In the CLI's own process
# torch's import swallowed it (pybind11 / __set_name__ turned the KeyboardInterrupt into an exception the
# caller's `except Exception` took); since round 21 (B21-1) the import runs in a child and the CLI waits for it:
# the signal comes from a thread while it waits
import threading as _threading
_real_torch_facts = _c.torch_facts

def _torch_facts():
    sig = os.environ.get("RT13_SIG_IN_TORCH")
    if sig and "torch" not in _fired:
        _fired.add("torch")
        _threading.Timer(0.3, _me, [sig]).start()
    return _real_torch_facts()

_c.torch_facts = _torch_facts
'''

RT = """
import os, time
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

class A(Stage):
    name, order, timeout_s = "a", 10, 120.0
    def run(self, ctx):
        text = os.environ.get("RT_A_TEXT", "v1")
        (ctx.dir / "a.txt").write_text(text)
        print(f"a wrote {text}", flush=True)
        return StageResult(Status(os.environ.get("RT_A_STATUS", "PASS")), f"a {text}", files=["a.txt"])

class B(Stage):
    name, order, timeout_s = "b", 20, 120.0
    def run(self, ctx):
        (ctx.dir / "b.txt").write_text("b")
        return StageResult(Status.PASS, "b", files=["b.txt"])
"""


@pytest.fixture
def rt(plugins):
    plugins.make("rt13s-plugin", "rt13s_mod", RT, {"a": "rt13s_mod:A", "b": "rt13s_mod:B"})
    env = plugins.env()
    for k in [k for k in env if k.startswith(("RT_A_", "RT13_"))]:
        env.pop(k)
    env["NSA_RUN_LOCK_TIMEOUT"] = "8"  # a lock the runner leaked to itself: 8 s, not 2 minutes
    return env


def _main(env, *args, timeout=180):
    return subprocess.run([sys.executable, "-c", INJECT + MAIN, *map(str, args)], env=env, text=True,
                          timeout=timeout, capture_output=True)


def _manifest(out) -> dict:
    return json.loads((out / "testrun" / "manifest.json").read_text())


# ---- B-B7: a signal while the closing summaries are written is the run's interrupt ----------------

@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_b_b7_signal_while_the_closing_summaries_are_written_ends_the_run_interrupted(rt, tmp_path, sig):
    out = tmp_path / "out"
    r = _main(env_with(rt, RT13_SIG_AT_SUMMARY=sig), "oneshot", "--only", "a,b", "--out", out, "--device", "cpu")
    assert r.returncode == 130, (r.returncode, r.stderr[-2000:])
    assert "interrupted" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    m = _manifest(out)
    assert [(s["name"], s["status"]) for s in m["stages"]] == [("a", "PASS"), ("b", "PASS")], m["stages"]
    assert m["interrupted"] is True and m["exit_code"] == 130, (m["interrupted"], m["exit_code"])
    assert not m.get("pending"), m.get("pending")
    run = out / "testrun"
    assert json.loads((run / "summary.json").read_text()).get("interrupted") is True
    assert (run / "junit.xml").is_file() and "interrupted" in (run / "summary.md").read_text().lower()


# ---- B-B8: --version is the running nsa_runner's ------------------------------------------------

def test_b_b8_version_is_the_running_package_not_a_plugins_metadata(tmp_path):
    import os

    import nsa_runner

    fake = tmp_path / "site" / "nsa_run-99.0.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: nsa_run\nVersion: 99.0\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(fake.parent), env.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "nsa_runner.cli", "--version"], env=env, text=True,
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == f"nsa-run {nsa_runner.__version__}", r.stdout


# ---- A-B6: an interrupt as the manifest lock is taken never leaks the lock --------------------------

@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_b6_interrupt_as_the_record_lock_is_taken_records_the_stage_and_ends_130(rt, tmp_path, sig):
    """The runner waited for its own leaked lock (NSA_RUN_LOCK_TIMEOUT), then exited 2 "held by
    another process ... end that process"; the rerun's v2 unrecorded, the earlier result pending."""
    out = tmp_path / "out"
    r = _main(rt, "stage", "a", "--out", out, "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    t0 = time.monotonic()
    r = _main(env_with(rt, RT_A_TEXT="v2", RT13_SIG_AT_RECORD_LOCK=sig), "stage", "a", "--out", out,
              "--device", "cpu")
    took = time.monotonic() - t0
    assert r.returncode == 130, (r.returncode, r.stderr[-2000:])
    assert "held by" not in r.stderr and "waiting for the run folder's lock" not in r.stderr, r.stderr[-2000:]
    assert "interrupted" in r.stderr, r.stderr[-2000:]
    assert took < 60, took
    m = _manifest(out)
    (a,) = m["stages"]
    # the stage had finished: the record the signal came in is written whole (or the earlier one kept)
    assert (a["status"], a["reason"]) in (("PASS", "a v2"), ("PASS", "a v1")), a
    assert (out / "testrun" / "a.txt").read_text() == a["reason"][2:]
    assert not m.get("pending"), m.get("pending")
    assert m["interrupted"] is True and m["exit_code"] == 130, (m["interrupted"], m["exit_code"])
    # nothing of the lock is left held: the next command goes straight through
    r = _main(rt, "stage", "b", "--out", out, "--device", "cpu", timeout=120)
    assert r.returncode == 0 and "waiting for" not in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_b6_interrupt_as_a_oneshots_record_lock_is_taken_still_writes_the_closing_records(rt, tmp_path, sig):
    out = tmp_path / "out"
    r = _main(env_with(rt, RT13_SIG_AT_RECORD_LOCK=sig), "oneshot", "--only", "a,b", "--out", out,
              "--device", "cpu")
    assert r.returncode == 130, (r.returncode, r.stderr[-2000:])
    assert "held by" not in r.stderr, r.stderr[-2000:]
    m = _manifest(out)
    assert [(s["name"], s["status"]) for s in m["stages"]] == [("a", "PASS")], m["stages"]
    assert not m.get("pending"), m.get("pending")
    assert m["interrupted"] is True and m["exit_code"] == 130
    assert (out / "testrun" / "summary.md").is_file() and (out / "testrun" / "junit.xml").is_file()


# ---- A-B7: a Ctrl-C while the runner starts (imports torch) stops it ------------------------------

@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_b7_interrupt_while_torch_is_imported_stops_the_command(rt, tmp_path, sig):
    out = tmp_path / "out"
    r = _main(env_with(rt, RT13_SIG_IN_TORCH=sig), "stage", "a", "--out", out, "--device", "cpu")
    assert r.returncode == 130, (r.returncode, r.stderr[-2000:])
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("interrupted ("), r.stderr[-2000:]
    assert "unexpected" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert not (out / "testrun" / "a.txt").exists(), "the stage ran after the Ctrl-C"


# in the interpreter that runs the nsa-run script: a signal to itself while nsa_runner.cli imports
# typer (before main() runs), through a sitecustomize on PYTHONPATH
EARLY = '''
import os, signal, sys, time

class _Early:
    done = False
    def find_spec(self, name, path=None, target=None):
        if name == "typer" and not _Early.done and os.environ.get("RT13_SIG_EARLY"):
            _Early.done = True
            os.kill(os.getpid(), getattr(signal, os.environ["RT13_SIG_EARLY"]))
            time.sleep(0.5)
        return None

sys.meta_path.insert(0, _Early())
'''

SCRIPT = """import re
import sys
from nsa_runner.cli import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_b7_interrupt_while_the_cli_itself_imports_is_one_line_and_130(plugins, tmp_path, sig):
    """Before ``main`` installed its handlers (typer, rich and the commands import for a second or
    more): a Ctrl-C printed a KeyboardInterrupt traceback, a SIGTERM ended the process 143, silent."""
    (plugins.site / "sitecustomize.py").write_text(EARLY)
    script = tmp_path / "bin" / "nsa-run"  # the console script pip writes, as the nsa-run command
    script.parent.mkdir()
    script.write_text(SCRIPT)
    env = env_with(plugins.env(), RT13_SIG_EARLY=sig)
    r = subprocess.run([sys.executable, str(script), "list"], env=env, text=True, capture_output=True,
                       timeout=120)
    assert r.returncode == 130, (r.returncode, r.stderr[-2000:])
    assert r.stderr.strip() == f"interrupted ({'Ctrl-C' if sig == 'SIGINT' else sig}): nsa-run stopped; " \
                               "nothing is left running", r.stderr[-2000:]
    assert r.stdout == "", r.stdout[-2000:]
