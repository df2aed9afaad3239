"""Bad days, red-team round 10 (issue 16): what round 9 noted and left alone, each through the CLI.

Every test here reproduces something that was wrong on the code before these fixes (see
docs/reliability.md, "Red-team round 9", "Noted, not changed", and "Red-team round 10"): a bad
``NSA_RUN_DISCOVERY_TIMEOUT`` fell back to 60 s without a word; a 100 000-character unknown stage
name (``--only``, ``stage NAME``, ``list NAME``, a stage option's value, ``--threshold``) was echoed
whole in its one error line (a 100 kB line); a 2 MB reason was printed whole in the terminal
table; a run folder under ``--out`` that is a symlink to another run was written through (a rerun
moved the other run's files into its history); a stage returning ERROR with an empty (or only
invisible) reason left the reader with nothing.

The tests after the "red-team round 10" marker reproduce what round 10's probes from outside broke:
a stage (or a plugin import) that started a daemon with an empty environment in a session of its
own and then killed its own process (segfault, ``os._exit``) left the daemon running; ``report`` /
``compare`` of a path with a 300-character name ended "OSError: File name too long (unexpected)";
the command-line parser's usage error echoed a 100 000-character unknown option whole; and, probing
the first fix again, a crash where nothing could be written was named "exit code 1".
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN, cli_cmd, env_with, make
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, cli_cmd, env_with, make

# the nsa-run script itself (cli.main: what a terminal or CI job runs), run id pinned

# a stage whose StageResult comes from its environment: R10_STATUS, R10_REASON (a Python literal) or
# R10_REASON_FILE (the reason's text)
SAYS = """
import ast, os
from nsa_runner import Stage, StageResult, Status

class Says(Stage):
    name, order, timeout_s = "says", 10, 120.0
    def run(self, ctx):
        (ctx.dir / "says.txt").write_text("said")
        print("says printed this", flush=True)
        if os.environ.get("R10_REASON_FILE"):
            reason = open(os.environ["R10_REASON_FILE"]).read()
        else:
            reason = ast.literal_eval(os.environ.get("R10_REASON", "''"))
        return StageResult(Status[os.environ.get("R10_STATUS", "PASS")], reason, files=["says.txt"])
"""


def main_cmd(*args) -> list[str]:
    return [sys.executable, "-c", MAIN, *map(str, args)]


@pytest.fixture
def bd(plugins):
    return make(plugins)


@pytest.fixture
def says(plugins):
    plugins.make("says-plugin", "says_mod", SAYS, {"says": "says_mod:Says"})
    return plugins.env()


def _main(env, *args, timeout=90, **kw):
    return subprocess.run(main_cmd(*args), env=env, text=True, timeout=timeout, capture_output=True, **kw)


def _one_error_line(r, *names, longest=400):
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "(unexpected" not in r.stderr, r.stderr[-2000:]
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and all(n in err[0] for n in names), r.stderr[-2000:]
    assert len(err[0]) <= longest, f"an error line of {len(err[0])} characters: {err[0][:300]}"
    assert len(r.stderr) < 5000, f"stderr of {len(r.stderr)} characters"
    return err[0]


@pytest.mark.parametrize("value", ["abc", "nan", "-5", "0", "inf"])
def test_a_bad_discovery_timeout_is_refused_in_one_line(bd, tmp_path, value):
    """NSA_RUN_DISCOVERY_TIMEOUT=abc (or nan, -5, 0, inf) was used as 60 s without a word."""
    env = env_with(bd, NSA_RUN_DISCOVERY_TIMEOUT=value)
    _one_error_line(_main(env, "list"), "NSA_RUN_DISCOVERY_TIMEOUT", value)
    r = _main(env, "oneshot", "--out", tmp_path / "o", "--only", "x", "--device", "cpu")
    _one_error_line(r, "NSA_RUN_DISCOVERY_TIMEOUT")
    assert not (tmp_path / "o" / "testrun").exists()  # refused before anything was made


def test_a_good_discovery_timeout_is_used(bd):
    """Pins the other side: a positive number (spaces around it allowed) is taken."""
    r = _main(env_with(bd, NSA_RUN_DISCOVERY_TIMEOUT=" 30 "), "list")
    assert r.returncode == 0 and "x" in r.stdout, r.stderr


def test_a_huge_unknown_name_or_value_gives_a_short_error_line(bd, tmp_path):
    """A 100 000-character unknown stage name was echoed whole: a 100 kB error line."""
    huge = "q" * 100_000
    out = tmp_path / "o"
    for args in (("oneshot", "--out", out, "--only", huge, "--device", "cpu"),
                 ("oneshot", "--out", out, "--skip", ",".join(f"n{i}" for i in range(5000)), "--device", "cpu"),
                 ("stage", huge, "--out", out, "--device", "cpu"),
                 ("list", huge),
                 ("stage", "x", "--out", out, "--device", "cpu", huge),
                 ("oneshot", "--out", out, "--device", huge),
                 ("oneshot", "--out", out, "--profile", huge)):
        line = _one_error_line(_main(bd, *args), longest=600)
        assert "characters" in line or "more" in line, line[:300]
    assert not out.exists() or not any(out.iterdir())


def test_a_huge_threshold_gives_a_short_error_line(bd, tmp_path):
    r = subprocess.run(cli_cmd("oneshot", "--out", tmp_path / "o", "--only", "x", "--device", "cpu"), env=bd,
                       text=True, timeout=90, capture_output=True)
    assert r.returncode == 0, r.stderr
    folder = tmp_path / "o" / "testrun"
    line = _one_error_line(_main(bd, "compare", folder, folder, "--threshold", "9" * 50_000 + "x"), "--threshold")
    assert "50001 characters" in line


def test_a_huge_reason_is_clipped_in_the_terminal_and_kept_whole_in_the_files(says, tmp_path):
    """A 2 MB FAIL reason was printed whole in the terminal table (and again by `report`)."""
    reason = "why " * 500_000
    (tmp_path / "reason").write_text(reason)
    env = env_with(says, R10_STATUS="FAIL", R10_REASON_FILE=tmp_path / "reason", COLUMNS=200)
    out = tmp_path / "o"
    r = _main(env, "oneshot", "--out", out, "--only", "says", "--device", "cpu", timeout=120)
    assert r.returncode == 1, r.stderr[-2000:]
    assert len(r.stdout) + len(r.stderr) < 60_000, len(r.stdout) + len(r.stderr)
    assert "more characters" in r.stdout + r.stderr
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    # the files keep its start and end, clipped to what nsa-run records (round 13 B-B13: a 280 MB
    # reason kept whole made a manifest.json its own reader refuses)
    kept = m["stages"][0]["reason"]
    assert kept.startswith(reason[:4000]) and kept.endswith(reason[-4000:]) and "clipped" in kept, len(kept)
    assert kept[:4000] in (out / "testrun" / "summary.json").read_text()
    r = _main(says, "report", out / "testrun", timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(r.stdout) + len(r.stderr) < 60_000, len(r.stdout) + len(r.stderr)


def test_a_run_folder_that_is_a_symlink_is_refused_and_the_run_it_leads_to_is_untouched(bd, tmp_path):
    """`$OUT/testrun` a link to another --out's run folder: `stage x` wrote through it and moved
    that run's x.txt into its history."""
    other = tmp_path / "other"
    r = subprocess.run(cli_cmd("oneshot", "--out", other, "--only", "x", "--device", "cpu"), env=bd, text=True,
                       timeout=90, capture_output=True)
    assert r.returncode == 0, r.stderr
    target = other / "testrun"
    before = sorted((str(p.relative_to(target)), p.read_bytes() if p.is_file() else b"") for p in target.rglob("*"))
    out = tmp_path / "o"
    out.mkdir()
    (out / "testrun").symlink_to(target)
    for args in (("stage", "x", "--out", out, "--device", "cpu"),
                 ("oneshot", "--out", out, "--only", "x", "--device", "cpu")):
        _one_error_line(_main(env_with(bd, BD_TEXT="v2"), *args), "symlink", str(out / "testrun"))
    after = sorted((str(p.relative_to(target)), p.read_bytes() if p.is_file() else b"") for p in target.rglob("*"))
    assert after == before
    assert sorted(p.name for p in out.iterdir()) == ["testrun"]


@pytest.mark.parametrize("reason", ["''", "'\\x1b[0m\\u200b  '"])
def test_an_error_without_a_reason_says_so(says, tmp_path, reason):
    """StageResult(Status.ERROR, "") (or only invisible text): the table, manifest and report had
    an ERROR with nothing to read."""
    out = tmp_path / "o"
    r = _main(env_with(says, R10_STATUS="ERROR", R10_REASON=reason), "oneshot", "--out", out, "--only", "says",
              "--device", "cpu")
    assert r.returncode == 1, r.stderr[-2000:]
    st = json.loads((out / "testrun" / "manifest.json").read_text())["stages"][0]
    assert st["status"] == "ERROR"
    assert "without a reason" in st["reason"] and "says printed this" in st.get("log_tail", ""), st
    assert "without a reason" in r.stdout


def test_a_fail_without_a_reason_stays_a_fail(says, tmp_path):
    """Pins DESIGN §5 (held before too): a FAIL is the stage's verdict and needs no reason (only a
    SKIP must say why); it is never turned into an ERROR, and its log tail is kept."""
    out = tmp_path / "o"
    r = _main(env_with(says, R10_STATUS="FAIL", R10_REASON="''"), "oneshot", "--out", out, "--only", "says",
              "--device", "cpu")
    assert r.returncode == 1, r.stderr[-2000:]
    st = json.loads((out / "testrun" / "manifest.json").read_text())["stages"][0]
    assert st["status"] == "FAIL" and st["reason"] == "", st
    assert "says printed this" in st.get("log_tail", ""), st


# ---- red-team round 10: breaks found from outside, each fixed at the root ----------------------

# a stage (and, in another test, a plugin import) that starts a daemon which clears its environment
# and leaves the session, writes its pid to R10_DAEMON_PID, then kills its own process
CRASHER = """
import ctypes, os, subprocess
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

def _daemon():
    p = subprocess.Popen(["sleep", "1000"], env={}, start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
    Path(os.environ["R10_DAEMON_PID"]).write_text(str(p.pid))

class Crash(Stage):
    name, order, timeout_s = "crash", 10, 120.0
    def run(self, ctx):
        _daemon()
        if os.environ.get("R10_NOWRITE"):  # the process above this one can write no byte (as on a full disk)
            import resource
            resource.prlimit(os.getppid(), resource.RLIMIT_FSIZE, (0, 0))
        if os.environ.get("R10_HOW") == "segv":
            ctypes.string_at(0)
        os._exit(0)

if os.environ.get("R10_AT_IMPORT"):
    _daemon()
    if os.environ.get("R10_NOWRITE"):
        import resource
        resource.prlimit(os.getppid(), resource.RLIMIT_FSIZE, (0, 0))
    os._exit(0)
"""


def _gone_or_kill(pid_file) -> bool:
    """Whether the daemon is gone within 5 s; kills it otherwise (nothing outlives the test)."""
    try:
        from _bad_days import alive, gone_within
    except ImportError:  # pragma: no cover
        from tests.runner._bad_days import alive, gone_within
    import os
    import signal

    pid = int(pid_file.read_text())
    if gone_within(pid, 5.0):
        return True
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
    return False


@pytest.fixture
def crasher(plugins):
    plugins.make("crash-plugin", "crash_mod", CRASHER, {"crash": "crash_mod:Crash"})
    return plugins.env()


@pytest.mark.parametrize("how, reason", [("segv", "process died with SIGSEGV"),
                                         ("exit", "process exited with code 0 without a result")])
def test_a_daemon_of_a_stage_that_kills_its_own_process_is_killed(crasher, tmp_path, how, reason):
    """A stage starting `sleep` with env={} in a session of its own, then segfaulting (or calling
    os._exit): the daemon went to init with no cookie and outlived the run (the stage's process was
    the subreaper that should have kept it)."""
    pid_file = tmp_path / "daemon.pid"
    r = _main(env_with(crasher, R10_DAEMON_PID=pid_file, R10_HOW=how), "oneshot", "--out", tmp_path / "o",
              "--only", "crash", "--device", "cpu")
    gone = _gone_or_kill(pid_file)  # first: nothing outlives the test, whatever fails below
    assert r.returncode == 1, r.stderr[-2000:]
    st = json.loads((tmp_path / "o" / "testrun" / "manifest.json").read_text())["stages"][0]
    assert st["status"] == "ERROR" and st["reason"] == reason, st
    assert gone, "the stage's daemon outlived the run"


def test_a_crash_whose_result_cannot_be_written_is_still_named(crasher, tmp_path):
    """Round 10's own fix, probed again: the stage's temp disk is full (here: a file size limit of 0 on
    the process above it) and it segfaults: the process keeping its orphans could not write the
    crash's result and exited 1, so the stage was "process exited with code 1 without a result",
    not SIGSEGV, and the daemon escaped."""
    pid_file = tmp_path / "daemon.pid"
    r = _main(env_with(crasher, R10_DAEMON_PID=pid_file, R10_HOW="segv", R10_NOWRITE=1), "oneshot", "--out",
              tmp_path / "o", "--only", "crash", "--device", "cpu")
    gone = _gone_or_kill(pid_file)
    assert r.returncode == 1, r.stderr[-2000:]
    st = json.loads((tmp_path / "o" / "testrun" / "manifest.json").read_text())["stages"][0]
    assert st["status"] == "ERROR" and st["reason"] == "process died with SIGSEGV", st
    assert gone, "the stage's daemon outlived the run"


@pytest.mark.parametrize("nowrite", ["", "1"])
def test_a_daemon_of_a_plugin_import_that_ends_the_discovery_process_is_killed(crasher, tmp_path, nowrite):
    """The same at import: `nsa-run list` named the plugin broken, and its daemon outlived it (with
    nothing writable, after the first fix: "exit code 1" and the daemon outlived it again)."""
    pid_file = tmp_path / "daemon.pid"
    r = _main(env_with(crasher, R10_DAEMON_PID=pid_file, R10_AT_IMPORT=1, R10_NOWRITE=nowrite), "list", "--json")
    gone = _gone_or_kill(pid_file)
    assert r.returncode == 1, r.stderr[-2000:]
    rows = [s for s in json.loads(r.stdout)["stages"] if s.get("entry_point") == "crash_mod:Crash"]
    assert rows and "exit code 0" in rows[0]["why_not"], rows
    assert gone, "the plugin's daemon outlived `nsa-run list`"


def test_a_path_too_long_for_the_system_is_named_in_one_line(bd, tmp_path):
    """`report` / `compare` of a path with a 300-character name (or such an --out, or
    --save-baseline) ended "error: OSError: [Errno 36] File name too long ... (unexpected ...)":
    Python 3.11's Path.is_dir() / exists() raise for it."""
    r = subprocess.run(cli_cmd("oneshot", "--out", tmp_path / "o", "--only", "x", "--device", "cpu"), env=bd,
                       text=True, timeout=90, capture_output=True)
    assert r.returncode == 0, r.stderr
    folder = tmp_path / "o" / "testrun"
    long = tmp_path / ("L" * 300)
    for args in (("report", long), ("compare", long, folder), ("compare", folder, folder / ("M" * 300)),
                 ("report", "testrun", "--out", long), ("compare", "testrun", "testrun", "--out", long)):
        line = _one_error_line(_main(bd, *args), "File name too long")
        assert "characters" in line, line
    # --save-baseline: refused for what it is (this run has no timings), never an anonymous OSError
    r = _main(bd, "compare", folder, "--save-baseline", long)
    _one_error_line(r)


def test_a_usage_error_echoing_a_huge_argument_is_clipped(bd):
    """`nsa-run list --x<100 000 characters>` (an unknown option, or extra arguments): the command-line
    parser's error box echoed all of it (107 kB)."""
    huge = "9" * 100_000
    for args in (("list", f"--x{huge}"), ("list", "a", f"b{huge}")):
        r = _main(bd, *args)
        assert r.returncode == 2, r.stderr[-2000:]
        assert "Traceback" not in r.stderr and len(r.stderr) < 5000, len(r.stderr)
        assert "… (997" in r.stderr and "more" in r.stderr, r.stderr  # the clip's marker (the box wraps it)
