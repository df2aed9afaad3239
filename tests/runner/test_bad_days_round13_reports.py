"""Bad days, red-team round 13, part B: ``nsa-run report`` keeping / rewriting a run's summary.md,
junit.xml and summary.json from manifest.json (/tmp/rt13b/report.md B1, B2, B3, B9, B12), each
through the real CLI (``cli.main`` in a subprocess, run id pinned).

- B1: summary.json stayed stale (PASS) when summary.md and junit.xml were both gone;
- B2: ``report`` said "nothing was written" after it had rewritten summary.md / junit.xml /
  summary.json / manifest.json (a broken declared CSV failed the report after the rewrite);
- B3: a link / folder at one of the three froze the other (regular, stale) ones, called "kept";
- B9: after a rerun killed -9, summary.md / summary.json were "kept" without the runner-died line;
- B12: report.html a folder: "cannot write the report: Is a directory" named no path.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN, env_with, gone_within, wait_for
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with, gone_within, wait_for


RT = """
import json, os, time
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

class A(Stage):
    name, order, timeout_s = "a", 10, 120.0
    def run(self, ctx):
        (ctx.dir / "a.txt").write_text("a")
        files = ["a.txt"]
        if os.environ.get("RT_A_CSV"):
            (ctx.dir / "a.csv").write_text("case,status,ms\\nc1,PASS,1\\n")
            files.append("a.csv")
        if os.environ.get("RT_A_MARK"):
            Path(os.environ["RT_A_MARK"]).write_text(str(os.getpid()))
        time.sleep(float(os.environ.get("RT_A_SLEEP", "0")))
        return StageResult(Status.PASS, "a v1", files=files)

class B(Stage):
    name, order, timeout_s = "b", 20, 120.0
    def run(self, ctx):
        (ctx.dir / "b.txt").write_text("b")
        return StageResult(Status.PASS, "b", files=["b.txt"])
"""

NAMES = ("summary.md", "junit.xml", "summary.json")


@pytest.fixture
def rt(plugins):
    plugins.make("rt13r-plugin", "rt13r_mod", RT, {"a": "rt13r_mod:A", "b": "rt13r_mod:B"})
    env = plugins.env()
    for k in [k for k in env if k.startswith("RT_A_")]:
        env.pop(k)
    return env


def _cli(env, *args, timeout=180):
    return subprocess.run([sys.executable, "-c", MAIN, *map(str, args)], env=env, text=True,
                          timeout=timeout, capture_output=True)


def _run(env, out, **kw):
    """A finished run of stages a, b (both PASS, closing reports written); returns its folder."""
    r = _cli(env_with(env, **kw), "oneshot", "--device", "cpu", "--only", "a,b", "--out", out)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    return out / "testrun"


def _fail_a(run):
    """Hand-edit the manifest as a rerun killed between its record and its reports would leave it."""
    m = json.loads((run / "manifest.json").read_text())
    for s in m["stages"]:
        if s["name"] == "a":
            s["status"], s["reason"] = "FAIL", "a broke"
    (run / "manifest.json").write_text(json.dumps(m, indent=2))


def _counts(run):
    return json.loads((run / "summary.json").read_text())["counts"]


def _says_fail(run, name):
    text = (run / name).read_text()
    if name == "summary.json":
        return _counts(run)["failed"] == 1
    if name == "junit.xml":
        return "<failure" in text
    return "a broke" in text and "1 failed" in text


# ---- B1 -------------------------------------------------------------------------------------

def test_b1_report_rewrites_summary_json_when_summary_md_and_junit_xml_are_gone(rt, tmp_path):
    run = _run(rt, tmp_path / "out")
    _fail_a(run)
    (run / "summary.md").unlink()
    (run / "junit.xml").unlink()
    r = _cli(rt, "report", run, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "summary.json" in json.loads(r.stdout)["rewritten"], r.stdout
    for name in NAMES:
        assert _says_fail(run, name), (name, (run / name).read_text()[:2000])
    r = _cli(rt, "report", run)  # now they agree with the manifest
    assert r.returncode == 0 and "kept" in r.stdout and "rewritten" not in r.stdout, r.stdout + r.stderr


# ---- B2 -------------------------------------------------------------------------------------

@pytest.mark.parametrize("broken", ["not_utf8", "missing"])
def test_b2_report_that_fails_on_a_broken_declared_file_writes_nothing(rt, tmp_path, broken):
    run = _run(rt, tmp_path / "out", RT_A_CSV=1)
    _fail_a(run)
    if broken == "missing":
        (run / "a.csv").unlink()
    else:
        (run / "a.csv").write_bytes(b"case,status,ms\nc1,PASS,\xff\xfe\n")
    before = {n: (run / n).read_bytes() for n in (*NAMES, "manifest.json", "report.html")}
    r = _cli(rt, "report", run)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr[-2000:])
    assert "a.csv" in r.stderr and "nothing was written" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    after = {n: (run / n).read_bytes() for n in before}
    changed = [n for n in before if before[n] != after[n]]
    assert not changed, f"'nothing was written', yet {changed} changed"


# ---- B3 -------------------------------------------------------------------------------------

@pytest.mark.parametrize("odd,kind", [("summary.json", "link"), ("junit.xml", "folder"),
                                      ("summary.md", "link"), ("summary.json", "fifo")])
def test_b3_an_odd_entry_is_named_and_the_regular_stale_reports_are_rewritten(rt, tmp_path, odd, kind):
    run = _run(rt, tmp_path / "out")
    _fail_a(run)
    target = tmp_path / "elsewhere.txt"
    target.write_text("not the runner's")
    (run / odd).unlink()
    if kind == "link":
        (run / odd).symlink_to(target)
    elif kind == "folder":
        (run / odd).mkdir()
    else:
        os.mkfifo(run / odd)
    r = _cli(rt, "report", run, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    said = r.stdout + r.stderr
    assert "kept (written when the run ended)" not in said, said
    assert f"{odd}" in said and "not a regular file" in said, said
    for name in NAMES:
        if name != odd:
            assert _says_fail(run, name), (name, (run / name).read_text()[:2000])
    assert target.read_text() == "not the runner's"  # the link's target untouched
    assert (run / odd).is_symlink() if kind == "link" else True


# ---- B9 -------------------------------------------------------------------------------------

def test_b9_report_after_a_rerun_killed_minus_9_writes_the_runner_died_line(rt, tmp_path):
    out = tmp_path / "out"
    run = _run(rt, out)
    mark = tmp_path / "mark"
    p = subprocess.Popen([sys.executable, "-c", MAIN, "stage", "a", "--device", "cpu", "--out", str(out)],
                         env=env_with(rt, RT_A_SLEEP=60, RT_A_MARK=mark), text=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        child = int(wait_for(mark, proc=p))
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        assert gone_within(child, 30), "the stage outlived its runner"
    finally:
        if p.poll() is None:
            p.kill()
    r = _cli(rt, "report", run)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "runner died" in r.stdout, r.stdout
    assert "kept" not in r.stdout, r.stdout
    assert "runner died" in (run / "summary.md").read_text()
    assert json.loads((run / "summary.json").read_text())["runner_died"], (run / "summary.json").read_text()
    r = _cli(rt, "report", run)  # now they agree
    assert r.returncode == 0 and "kept" in r.stdout and "rewritten" not in r.stdout, r.stdout + r.stderr


# ---- B12 ------------------------------------------------------------------------------------

def test_b12_report_html_a_folder_is_named(rt, tmp_path):
    run = _run(rt, tmp_path / "out")
    (run / "report.html").unlink()
    (run / "report.html").mkdir()
    r = _cli(rt, "report", run)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr[-2000:])
    assert "report.html" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "see its path" not in r.stderr or str(run / "report.html") in r.stderr, r.stderr


# ---- B2 (part-way): a write that fails after others says which were written --------------------

ENOSPC_AT = '''
import errno, os
from pathlib import Path
from nsa_runner import artifacts as _a
_real = _a.write_text
def _write_text(path, text):
    if Path(path).name == os.environ.get("RT13_ENOSPC_AT"):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))
    return _real(path, text)
_a.write_text = _write_text
'''


def test_b2_a_write_failing_part_way_names_its_path_and_what_was_written(rt, tmp_path):
    run = _run(rt, tmp_path / "out")
    _fail_a(run)
    r = subprocess.run([sys.executable, "-c", ENOSPC_AT + MAIN, "report", str(run)], text=True, timeout=180,
                       capture_output=True, env=env_with(rt, RT13_ENOSPC_AT="junit.xml"))
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr[-2000:])
    assert f"cannot write {run / 'junit.xml'}" in r.stderr.replace("\n", ""), r.stderr
    assert "nothing was written" not in r.stderr and "report.html" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
