"""Bad days, red-team round 5 (issue 16): new probes of the same families, each through the CLI.

Every test here reproduces an attack that worked on the code before round 5's fixes (see
docs/reliability.md, "Red-team round 5"): a run folder's ``.manifest.lock`` held by an outside
process (``stage`` waited 120 s without a word), an implementation plugin registered as
``nsa_core`` (it broke the built-in in every parity stage), a baseline figure of 0, ``report`` of a
run whose runner died printing a plain "0 passed, 0 failed, 0 skipped", stdout on a full disk or a
closed pipe (an "(unexpected)" OSError; exit 1, a compare "regression", for a reader gone),
stderr on a full disk (the run died unrecorded), a stage's SKIP without a reason, and matplotlib
warnings (with report.py's source lines) on the terminal for a CSV whose legend labels start
with ``_``.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nsa_runner.artifacts import load_manifest

try:
    from _bad_days import cli_cmd, dead_pid, env_with, make, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, dead_pid, env_with, make, manifest

try:
    from test_impls_cli import make_impl
except ImportError:  # pragma: no cover
    from tests.runner.test_impls_cli import make_impl

try:
    from test_compare import copy, out  # noqa: F401 - the compare tests' fabricated run folders
except ImportError:  # pragma: no cover
    from tests.runner.test_compare import copy, out  # noqa: F401


def _run(env, *args, timeout=120, **kw):
    kw.setdefault("capture_output", True)
    return subprocess.run(cli_cmd(*args), env=env, text=True, timeout=timeout, **kw)


# the nsa-run script itself (cli.main: the guarded stdout and the last net live there)
MAIN = "import sys; sys.argv[0] = 'nsa-run'; from nsa_runner.cli import main; main()"


def _main(env, *args, timeout=120, **kw):
    if "stdout" not in kw and "stderr" not in kw:
        kw["capture_output"] = True
    return subprocess.run([sys.executable, "-c", MAIN, *map(str, args)], env=env, text=True, timeout=timeout, **kw)


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))


@pytest.fixture
def bd(plugins):
    return make(plugins)


# ---- concurrency: a lock held by an outside process ---------------------------------------------

HOLD = ("import fcntl, sys, time\nf = open(sys.argv[1], 'a')\nfcntl.flock(f, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\ntime.sleep(120)\n")


def test_lock_held_by_outside_process_is_named_and_times_out(bd, tmp_path, spawn):
    """h10 (open since round 4): `stage x` waited 120 s for a `.manifest.lock` another process held,
    saying nothing. Now one line says which lock and who holds it, and after NSA_RUN_LOCK_TIMEOUT
    the command exits 2 naming both; nothing in the run folder changed."""
    out = tmp_path / "o"
    assert _run(bd, "stage", "x", "--out", out).returncode == 0
    lock = out / "testrun" / ".manifest.lock"
    holder = spawn([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"  # the lock is taken: a deterministic signal
    before = manifest(out)
    p = _run(env_with(bd, NSA_RUN_LOCK_TIMEOUT=3, BD_TEXT="v2"), "stage", "x", "--out", out, timeout=60)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    assert "waiting for the run folder's lock" in p.stderr and str(lock) in p.stderr
    error = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(error) == 1 and f"pid {holder.pid}" in error[0] and "more than 3s" in error[0], p.stderr
    holder.kill()
    holder.wait(10)
    assert manifest(out)["stages"] == before["stages"]
    assert (out / "testrun" / "x.txt").read_text() == "v1"


def test_lock_timeout_variable_is_checked(bd, tmp_path):
    out = tmp_path / "o"
    p = _run(env_with(bd, NSA_RUN_LOCK_TIMEOUT="soon"), "stage", "x", "--out", out)
    assert p.returncode == 2
    assert "NSA_RUN_LOCK_TIMEOUT='soon' is not a positive number of seconds" in p.stderr
    assert not (out / "testrun").exists()


# ---- plugin discovery: an implementation plugin taking the built-in's name ----------------------


def test_impl_plugin_named_like_the_builtin_leaves_the_builtin_alone(plugins, tmp_path):
    """An `nsa_runner.impls` entry point named `nsa_core` made both broken ("duplicate"): every
    parity stage's nsa_core cases failed. Now the built-in stays and the plugin is listed broken
    under its own name."""
    make_impl(plugins, "squatter", "squat_mod",
              "from nsa_runner.impls import Impl\nIMPL = Impl('nsa_core', {})\n", {"nsa_core": "squat_mod:IMPL"})
    env = plugins.env()
    p = _run(env, "list", "--impls", "--json")
    assert p.returncode == 1, p.stderr  # a broken plugin: exit 1, as for stage plugins
    doc = json.loads(p.stdout)
    rows = {r["name"]: r for r in (doc["impls"] if isinstance(doc, dict) else doc)}
    assert rows["nsa_core"]["source"] == "built-in" and not rows["nsa_core"]["broken"]
    assert rows["invalid:squatter.nsa_core"]["broken"]
    assert "taken by the built-in" in rows["invalid:squatter.nsa_core"]["why_not"]
    out = tmp_path / "o"
    p = _run(env, "stage", "sanity", "--out", out, "--device", "cpu", timeout=300)
    assert p.returncode == 0, p.stdout[-3000:]
    assert manifest(out)["stages"][0]["status"] == "PASS"


# ---- CLI options: a baseline figure of 0 -----------------------------------------------------


def _baseline(path: Path, value: float, metric: str = "ms_step") -> Path:
    from _runfolders import GPU

    path.write_text(json.dumps({"schema_version": 1, "kind": "nsa-run-baseline", "tolerance": 0.1,
                                "machines": {GPU: {"profile": "full", "figures": [
                                    {"file": "decode.csv", "key": {"S": 65536, "B": 1}, "metric": metric,
                                     "value": value}]}}}))
    return path


def test_baseline_time_of_zero_is_refused(cli, out, tmp_path):
    """x_blf_zero (open since round 4): a figure of 0 ms was accepted and every row came out worse
    (B/A inf). A time or speedup of 0 is no measurement: exit 2 naming the figure."""
    r = cli("compare", "aaaaaaa", "--out", out, "--baseline", _baseline(tmp_path / "zero.json", 0))
    assert r.exit_code == 2, r.output
    assert "figures[0].value: must be > 0 for 'ms_step'" in r.stderr
    # a read counter of 0 is a count: accepted
    r = cli("compare", "aaaaaaa", "--out", out, "--baseline",
            _baseline(tmp_path / "reads.json", 0, "reads_total"))
    assert r.exit_code in (0, 1) and "must be > 0" not in r.stderr, r.output


def test_save_baseline_never_records_a_time_of_zero(cli, out, tmp_path):
    """--save-baseline wrote what --baseline now refuses (a 0 ms row): the saved file must load."""
    import pandas as pd

    df = pd.read_csv(out / "aaaaaaa" / "decode.csv")
    df.loc[df.index[0], "ms_step"] = 0.0
    df.to_csv(out / "aaaaaaa" / "decode.csv", index=False)
    r = cli("compare", "aaaaaaa", "--out", out, "--save-baseline", tmp_path / "new.json")
    assert r.exit_code == 0, r.output
    figs = json.loads((tmp_path / "new.json").read_text())["machines"]
    assert all(f["value"] > 0 or f["metric"].startswith("reads_") for m in figs.values() for f in m["figures"])
    r = cli("compare", "aaaaaaa", "--out", out, "--baseline", tmp_path / "new.json")
    assert r.exit_code in (0, 1), r.output


# ---- says what went wrong: report of a run whose runner died --------------------------------------


def test_report_of_a_dead_runners_run_says_unfinished(cli, out):
    """`report` printed "0 passed, 0 failed, 0 skipped", rc 0, for a run whose runner was killed
    while a stage ran (only report.html said UNFINISHED)."""
    path = out / "aaaaaaa" / "manifest.json"
    m = json.loads(path.read_text())
    m["stages"] = []
    m["finished"] = None
    m["pending"] = [{"stage": "sanity", "token": "t", "since": "x",
                     "owner": {"pid": dead_pid(), "pid_started": 1.0, "hostname": os.uname().nodename}}]
    path.write_text(json.dumps(m))
    r = cli("report", "aaaaaaa", "--out", out)
    assert r.exit_code == 0, r.output
    lines = r.stdout.strip().splitlines()
    assert lines[-2].startswith("UNFINISHED: runner died") and "stage sanity" in lines[-2], r.stdout
    r = cli("report", "aaaaaaa", "--out", out, "--json")
    assert json.loads(r.stdout)["unfinished"].startswith("runner died")


def test_report_on_a_full_disk_says_the_disk_is_full(cli, out, monkeypatch):
    from nsa_runner import report as report_mod

    def full(folder):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(report_mod, "commit", lambda prepared, written=None: full(None))  # the writing step
    r = cli("report", "aaaaaaa", "--out", out)
    assert r.exit_code == 2
    assert "No space left on device" in r.stderr and "the disk is full" in r.stderr
    assert "permissions" not in r.stderr


# ---- disk: the command's own output on a full disk / a closed pipe ------------------------------


@pytest.mark.parametrize("args", [("list", "--json"),
                                  ("compare", "aaaaaaa", "bbbbbbb", "--markdown", "--all", "--out"),
                                  ("report", "aaaaaaa", "--json", "--out")])
def test_stdout_on_a_full_disk_is_one_line_exit_2(out, args):
    copy(out)
    with open("/dev/full", "w") as full:
        p = _main(_env(), *args, *([out] if args[-1] == "--out" else []), stdout=full, stderr=subprocess.PIPE)
    assert p.returncode == 2
    assert p.stderr.strip() == "error: cannot write the output (stdout): No space left on device", p.stderr


@pytest.mark.parametrize("args", [("list", "--json"),
                                  ("compare", "aaaaaaa", "bbbbbbb", "--json", "--out"),
                                  ("compare", "aaaaaaa", "bbbbbbb", "--markdown", "--all", "--out")])
def test_stdout_reader_gone_keeps_the_commands_exit_code(out, args):
    """`nsa-run compare A B --json | jq -e ...` where the reader ends first: exit 1 (compare's
    "regression") and nothing said. Now stdout goes to /dev/null and the verdict stays 0."""
    copy(out)
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first write
    try:
        p = _main(_env(), *args, *([out] if args[-1] == "--out" else []), stdout=w, stderr=subprocess.PIPE)
    finally:
        os.close(w)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr and "error" not in p.stderr


def test_stderr_on_a_full_disk_still_records_the_run(bd, tmp_path):
    """`oneshot 2>/dev/full` (a CI log on a full disk): the first progress line raised, the run
    died with nothing recorded (manifest without stages, finish or exit code). Diagnostics are
    best effort: the run is recorded and exits with its own code."""
    out = tmp_path / "o"
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-c", MAIN.replace("from nsa_runner.cli", "from nsa_runner.commands "
                            "import _common as c; c.current_run_id = lambda: 'testrun'; from nsa_runner.cli"),
                            "oneshot", "--device", "cpu", "--only", "x,y", "--out", str(out)],
                           env=bd, stdout=subprocess.PIPE, stderr=full, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:]
    m = load_manifest(out / "testrun" / "manifest.json")
    assert [(s["name"], s["status"]) for s in m["stages"]] == [("x", "PASS"), ("y", "PASS")]
    assert m["finished"] and m["exit_code"] == 0


# ---- status vocabulary: a SKIP says why ----------------------------------------------------------

SILENT_SKIP = """
from nsa_runner import Stage, StageResult, Status

class Quiet(Stage):
    name, order = "quiet", 5
    def run(self, ctx):
        return StageResult(Status.SKIP, "  ")
"""


def test_skip_without_a_reason_is_an_error(plugins, tmp_path):
    plugins.make("quiet-plugin", "quiet_mod", SILENT_SKIP, {"quiet": "quiet_mod:Quiet"})
    out = tmp_path / "o"
    p = _run(plugins.env(), "oneshot", "--device", "cpu", "--only", "quiet", "--out", out)
    assert p.returncode == 1, p.stderr[-2000:]
    (entry,) = manifest(out)["stages"]
    assert entry["status"] == "ERROR" and "SKIP without a reason" in entry["reason"]


# ---- text: plots of a CSV whose labels start with "_" ---------------------------------------------

UNDERSCORE = """
from nsa_runner import Stage, StageResult, Status

class Bench(Stage):
    name, order = "bench", 5
    def run(self, ctx):
        (ctx.dir / "t.csv").write_text("_impl,T,ms\\n_a,1,1.0\\n_a,2,2.0\\n_b,1,0.5\\n_b,2,-1\\n")
        return StageResult(Status.PASS, "timed", files=["t.csv"])
"""


def test_report_plots_hostile_labels_without_warnings_on_the_terminal(plugins, tmp_path):
    """Labels starting with `_` were silently left out of the legend, and matplotlib's
    UserWarnings (with report.py's file and line) reached the terminal."""
    plugins.make("bench-plugin", "bench_mod", UNDERSCORE, {"bench": "bench_mod:Bench"})
    out = tmp_path / "o"
    env = plugins.env()
    assert _run(env, "oneshot", "--device", "cpu", "--only", "bench", "--out", out).returncode == 0
    p = _run(env, "report", "testrun", "--out", out)
    assert p.returncode == 0, p.stderr
    assert "Warning" not in p.stderr and "report.py" not in p.stderr, p.stderr
    assert "data:image/png" in (out / "testrun" / "report.html").read_text()
