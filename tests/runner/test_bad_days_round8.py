"""Bad days, red-team round 8 (issue 16): new probes of the same families, each through the CLI.

Every test here reproduces an attack that worked on the code before round 8's fixes (see
docs/reliability.md, "Red-team round 8"): a number Python will not read (an integer of 5000
digits) in manifest.json, env.json or sanity.json ended ``report`` / ``compare`` / ``stage`` with
an anonymous "ValueError ... (unexpected)", and a ``NaN`` hand-written into manifest.json made the
next ``stage`` fail the same way when writing it back; a stage that closed its stdout/stderr
(``os.close(1)``) was recorded as ERROR "exited with code 1 without a result" although it
returned PASS; a dangling link a stage left in ``history/`` under the name the next rerun picks
made that rerun exit 2 "File exists"; a plugin option flag that can never be given (``--x=y``,
``---c``) or two flags filling one ``ctx.options`` key (``--a-b``, ``--a_b``) were accepted; a
``nohup nsa-run oneshot`` (SIGHUP ignored) was interrupted by a SIGHUP all the same; SIGTERM /
SIGHUP to ``list``, or to a ``stage`` waiting for the run folder's lock, ended it silently with the
signal's default action (143 / 129).
"""

from __future__ import annotations

import datetime
import json
import signal
import subprocess
import sys
import time

import pytest

try:
    from _bad_days import MAIN, cli_cmd, env_with, gone_within, make, manifest, wait_for
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, cli_cmd, env_with, gone_within, make, manifest, wait_for

# the nsa-run script itself (cli.main: what a terminal or CI job runs), run id pinned


def main_cmd(*args) -> list[str]:
    return [sys.executable, "-c", MAIN, *map(str, args)]


@pytest.fixture
def bd(plugins):
    return make(plugins)


def _main(env, *args, timeout=90, **kw):
    return subprocess.run(main_cmd(*args), env=env, text=True, timeout=timeout, capture_output=True, **kw)


def _one_error_line(r, *names):
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and "unexpected" not in r.stderr, r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and all(n in err[0] for n in names), r.stderr
    return err[0]


@pytest.fixture
def run_x(bd, tmp_path):
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("oneshot", "--out", out, "--only", "x", "--device", "cpu"), env=bd, text=True,
                       timeout=90, capture_output=True)
    assert r.returncode == 0, r.stderr
    return out


BIG = "9" * 5000  # more digits than Python converts (sys.int_info.default_max_str_digits, 4300)


def test_a_number_python_cannot_read_in_manifest_json_is_named(bd, run_x):
    """int('9' * 5000) raises a bare ValueError: `report` and `stage` ended "ValueError: Exceeds the
    limit (4300 digits) ... (unexpected ...)" naming no file."""
    path = run_x / "testrun" / "manifest.json"
    path.write_text(path.read_text().replace('"duration_s": ', f'"big": {BIG}, "duration_s": ', 1))
    before = path.read_text()
    line = _one_error_line(_main(bd, "report", run_x / "testrun"), "manifest.json")
    assert "digits" in line
    _one_error_line(_main(bd, "stage", "y", "--out", run_x, "--device", "cpu"), "manifest.json")
    assert path.read_text() == before and not (run_x / "testrun" / "y.txt").exists()  # nothing changed


def test_nan_in_manifest_json_is_refused_before_anything_changes(bd, run_x):
    """nsa-run writes manifests without NaN and rewrites them on every update: a hand-written NaN was
    read, then `stage y` failed writing it back ("ValueError: Out of range float values ...
    (unexpected ...)"). It is refused when read, naming the file."""
    path = run_x / "testrun" / "manifest.json"
    data = json.loads(path.read_text())
    data["stages"][0]["duration_s"] = float("nan")
    path.write_text(json.dumps(data))
    before = path.read_text()
    line = _one_error_line(_main(bd, "stage", "y", "--out", run_x, "--device", "cpu"), "manifest.json")
    assert "NaN" in line
    assert path.read_text() == before and not (run_x / "testrun" / "y.txt").exists()
    _one_error_line(_main(bd, "compare", run_x / "testrun", run_x / "testrun"), "manifest.json")


@pytest.mark.parametrize("name, command", [("env.json", "report"), ("sanity.json", "compare")])
def test_a_number_python_cannot_read_in_a_run_json_is_named(bd, run_x, name, command):
    run = run_x / "testrun"
    (run / name).write_text('{"schema_version": 1, "facts": {}, "checks": [], "big": ' + BIG + "}\n")
    data = json.loads((run / "manifest.json").read_text())  # declared, as env-pairing / sanity do
    data["stages"][0]["files"].append(name)
    (run / "manifest.json").write_text(json.dumps(data))
    args = ("report", run) if command == "report" else ("compare", run, run)
    line = _one_error_line(_main(bd, *args), name)
    assert "digits" in line


CLOSES = """
import os
from nsa_runner import Stage, StageResult, Status

class Closer(Stage):
    name, order, timeout_s = "closer", 10, 120.0
    def run(self, ctx):
        print("before closing", flush=True)
        if os.environ.get("CL_HOW") == "fds":
            os.close(1)
            os.close(2)
        else:
            import sys
            sys.stdout.close()
            sys.stderr.close()
        (ctx.dir / "closer.txt").write_text("done")
        if os.environ.get("CL_RAISE"):
            raise RuntimeError("broke after closing")
        return StageResult(Status.PASS, "closed my output", files=["closer.txt"])
"""


@pytest.mark.parametrize("how, fails", [("fds", False), ("streams", False), ("fds", True)])
def test_a_stage_that_closes_its_stdout_keeps_its_result(plugins, tmp_path, how, fails):
    """The worker died writing its closing log line to the closed fd (exit 1 before the result file
    was written): a PASS became ERROR "process exited with code 1 without a result"."""
    plugins.make("closer-plugin", "closer_mod", CLOSES, {"closer": "closer_mod:Closer"})
    env = env_with(plugins.env(), CL_HOW=how, **({"CL_RAISE": 1} if fails else {}))
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("oneshot", "--out", out, "--only", "closer", "--device", "cpu"), env=env,
                       text=True, timeout=90, capture_output=True)
    entry = manifest(out)["stages"][0]
    log = (out / "testrun" / "logs" / "closer.log").read_text()
    if fails:
        assert r.returncode == 1 and entry["status"] == "ERROR", r.stderr
        assert "RuntimeError: broke after closing" in entry["reason"] and "RuntimeError" in log
    else:
        assert r.returncode == 0 and entry["status"] == "PASS" and entry["reason"] == "closed my output", r.stderr
        assert "# stage closer: PASS" in log  # the log is back on fd 1 for the worker's closing line
    assert "before closing" in log


def test_a_dangling_link_in_history_does_not_block_a_rerun(bd, run_x):
    """A stage left dangling links in history/ under the names the next rerun of x would pick
    (history/x-<time>, one per second ahead): `exists()` said free, the rerun exited 2 "cannot
    set the earlier x result aside: File exists"."""
    run = run_x / "testrun"
    hist = run / "history"
    hist.mkdir()
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    for i in range(-2, 120):
        stamp = (now + datetime.timedelta(seconds=i)).isoformat().replace(":", "").replace("+", "p")
        (hist / f"x-{stamp}").symlink_to(run_x / "nowhere")
    r = _main(env_with(bd, BD_TEXT="v2"), "stage", "x", "--out", run_x, "--device", "cpu")
    assert r.returncode == 0, r.stderr
    m = manifest(run_x)
    assert m["stages"][0]["reason"] == "x v2" and len(m["history"]) == 1
    moved = run / m["history"][0]["moved_to"]
    assert not moved.is_symlink() and (moved / "x.txt").read_text() == "v1"
    assert not (run_x / "nowhere").exists()


FLAGS = """
from nsa_runner import Option, Stage, StageResult, Status

class Eq(Stage):
    name, order = "eq", 41
    options = (Option("--x=y", str, default="d"),)
    def run(self, ctx):
        return StageResult(Status.PASS, "eq")

class Dashes(Stage):
    name, order = "dashes", 42
    options = (Option("---c", str, default="c"),)
    def run(self, ctx):
        return StageResult(Status.PASS, "dashes")

class Twice(Stage):
    name, order = "twice", 43
    options = (Option("--a-b", str, default="one"), Option("--a_b", str, default="two"))
    def run(self, ctx):
        return StageResult(Status.PASS, "twice")

class Fine(Stage):
    name, order = "fine", 44
    options = (Option("--S-list", str, default="1"), Option("--x_2", str, default="2"))
    def run(self, ctx):
        return StageResult(Status.PASS, "fine")
"""


def test_option_flags_that_cannot_be_given_are_broken(plugins):
    """`--x=y` could never be given (`--x=y v` splits at '='), nor `---c`; `--a-b` and `--a_b` fill
    one ctx.options key, so one of them was silently lost. All were listed as runnable."""
    plugins.make("flags-plugin", "flags_mod", FLAGS, {n: f"flags_mod:{c}" for n, c in
                                                      (("eq", "Eq"), ("dashes", "Dashes"), ("twice", "Twice"),
                                                       ("fine", "Fine"))})
    r = subprocess.run(cli_cmd("list", "--json"), env=plugins.env(), text=True, timeout=120, capture_output=True)
    assert r.returncode == 1, r.stderr  # a broken plugin
    rows = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    assert "'--x=y'" in rows["eq"]["why_not"] and rows["eq"]["why_not"].startswith("broken:")
    assert "'---c'" in rows["dashes"]["why_not"]
    assert "same ctx.options key" in rows["twice"]["why_not"]
    assert rows["fine"]["runs_here"] is True


def test_nohup_run_is_not_stopped_by_sighup(bd, tmp_path, spawn):
    """`nohup nsa-run oneshot` (SIGHUP ignored, what nohup and a closed ssh session rely on): the
    runner installed its own SIGHUP handler anyway and the HUP stopped the stage (exit 130)."""
    mark = tmp_path / "x.started"
    out = tmp_path / "o"
    proc = spawn(main_cmd("oneshot", "--out", out, "--only", "x", "--device", "cpu"),
                 env=env_with(bd, BD_MARK=mark, BD_SLEEP=2), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                 text=True, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    wait_for(mark, proc=proc)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    m = manifest(out)
    assert m["stages"][0]["status"] == "PASS" and m["exit_code"] == 0 and not m.get("interrupted")


def _default_signals() -> None:
    """(In the child, before exec) Ctrl-C / TERM / HUP as a terminal delivers them, even where the
    test runner was started with one ignored (a background job ignores SIGINT)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


HANG = """
import os, time
from pathlib import Path
Path(os.environ["HANG_MARK"]).write_text(str(os.getpid()))
time.sleep(300)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_to_list_says_so_and_leaves_nothing(plugins, tmp_path, spawn, sig):
    """TERM / HUP to `nsa-run list` while a plugin import hangs: the default action (exit 143 / 129,
    not a word); Ctrl-C: exit 130, not a word. Now: exit 130 and one line naming the signal."""
    plugins.make("hang-plugin", "hang_mod", HANG, {"h": "hang_mod:H"})
    mark = tmp_path / "importing"
    proc = spawn(main_cmd("list"), env=env_with(plugins.env(), HANG_MARK=mark), stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True, preexec_fn=_default_signals)
    child = int(wait_for(mark, proc=proc))
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (proc.returncode, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    name = "Ctrl-C" if sig == signal.SIGINT else sig.name
    assert lines == [f"interrupted ({name}): nsa-run stopped; nothing is left running"], err
    assert gone_within(child, 10)  # the discovery child with its hanging import


HOLD = ("import fcntl, sys, time\nf = open(sys.argv[1], 'a')\nfcntl.flock(f, fcntl.LOCK_EX)\n"
        "open(sys.argv[2], 'w').write('held')\ntime.sleep(120)\n")


def test_sigterm_while_waiting_for_the_lock_says_so(bd, run_x, tmp_path, spawn):
    """A `stage` waiting for a run folder's lock held by another process: SIGTERM was the default
    action (exit 143, silent). Now exit 130 with one line; nothing set aside, nothing changed."""
    run = run_x / "testrun"
    held = tmp_path / "held"
    spawn([sys.executable, "-c", HOLD, str(run / ".manifest.lock"), str(held)])
    wait_for(held)
    before = (run / "manifest.json").read_text()
    err_path = tmp_path / "stderr"
    with open(err_path, "w") as err_file:
        proc = spawn(main_cmd("stage", "x", "--out", run_x, "--device", "cpu"), env=bd, stdout=subprocess.DEVNULL,
                     stderr=err_file, text=True)
    deadline = time.monotonic() + 60  # the "waiting for the run folder's lock" line comes after 2 s
    while "waiting for the run folder's lock" not in err_path.read_text() and time.monotonic() < deadline:
        assert proc.poll() is None, err_path.read_text()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    err = err_path.read_text()
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.splitlines()[-1] == "interrupted (SIGTERM): nsa-run stopped; nothing is left running", err
    assert (run / "manifest.json").read_text() == before and not (run / "history").exists()


def test_a_csv_number_python_cannot_read_is_named_in_a_short_line(bd, run_x):
    """A timing CSV holding a 5000-digit time: one line naming file, column and line, as before, but
    it echoed the whole 5000-digit value (a 5 kB "line")."""
    run = run_x / "testrun"
    (run / "t.csv").write_text(f"case,ms\nx,{BIG}\ny,2.5\n")
    data = json.loads((run / "manifest.json").read_text())
    data["stages"][0]["files"].append("t.csv")
    (run / "manifest.json").write_text(json.dumps(data))
    for args in (("report", run), ("compare", run, run)):
        line = _one_error_line(_main(bd, *args), "t.csv", "'ms' line 2")
        assert len(line) < 400 and "5002 characters" in line, line
