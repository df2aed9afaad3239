"""Bad days, red-team round 11 (issue 16), part B's breaks and A-R3, each through the CLI.

Every test here reproduces a break of round 11 (docs/reliability.md, "Red-team round 11") that
worked on the code before its fix:

- B-B1: a hand-edited sanity.json ``"ok": "false"`` counted as passing (``compare`` said "FAIL ->
  PASS", "no regression: 1 fixed", exit 0); ``rel_err`` of the wrong type (``"abc"``, ``[1]``,
  ``true``) was accepted;
- B-B2: a manifest stage name with a control character (``a\\x1b``, ``a\\ufffe``, a lone surrogate)
  ended the next ``stage b`` with "ExpatError: not well-formed (unexpected)", junit.xml and summary
  not rewritten;
- B-B3: a declared case table with a short row (``status,case\\nFAIL\\nPASS,ok``) ended the oneshot
  with "TypeError: can only concatenate str (not "NoneType") to str (unexpected)", no junit.xml,
  summary or report.html, and every later ``stage`` there the same way;
- B-B4: ``rel_err: 1e308`` in sanity.json: ``report`` printed matplotlib's "RuntimeWarning:
  overflow encountered in power" on stderr;
- A-R3: ``report`` / ``compare`` while a rerun of stage ``a`` runs (its a.csv set aside in
  history/ by a live nsa-run) said "a.csv ... missing (deleted or moved?)", "repair or move the
  broken file aside", exit 2, instead of saying the run is RUNNING.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

try:
    from _bad_days import MAIN, env_with, wait_for
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with, wait_for

from nsa_runner.manifest import RunManifest

# the nsa-run script itself (cli.main: what a terminal or CI job runs), run id pinned

# stages a, b: each runs $R11B_<X>_CMD (a shell command) in the run folder, then writes <x>.txt and
# declares it and the names in $R11B_<X>_FILES
STAGES = """
import os, subprocess
from nsa_runner import Stage, StageResult, Status

def _act(ctx, x):
    cmd = os.environ.get(f"R11B_{x.upper()}_CMD", "")
    if cmd:
        subprocess.run(["sh", "-c", cmd], cwd=ctx.dir, check=True)
    (ctx.dir / f"{x}.txt").write_text(x)
    return StageResult(Status.PASS, "ok", files=[f"{x}.txt"] + os.environ.get(f"R11B_{x.upper()}_FILES", "").split())

class A(Stage):
    name, order, timeout_s = "a", 15, 120.0
    def run(self, ctx):
        return _act(ctx, "a")

class B(Stage):
    name, order, timeout_s = "b", 16, 120.0
    def run(self, ctx):
        return _act(ctx, "b")
"""


@pytest.fixture
def ab(plugins):
    plugins.make("r11b-plugin", "r11b_mod", STAGES, {"a": "r11b_mod:A", "b": "r11b_mod:B"})
    return plugins.env()


def main_cmd(*args) -> list[str]:
    return [sys.executable, "-c", MAIN, *map(str, args)]


def _main(env, *args, timeout=120, **kw):
    return subprocess.run(main_cmd(*args), env=env, text=True, timeout=timeout, capture_output=True, **kw)


def _clean(r):
    assert "Traceback" not in r.stderr and "(unexpected" not in r.stderr, r.stderr[-3000:]


def _one_error_line(r, *names):
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    _clean(r)
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and all(n in err[0] for n in names), r.stderr[-2000:]
    return err[0]


def _sanity_run(out, rid, checks):
    """A finished run folder ``out/rid`` whose stage sanity declared sanity.json with ``checks``."""
    run = out / rid
    run.mkdir(parents=True)
    m = RunManifest.create(run, rid, ["nsa-run", "oneshot"], device="cpu", profile="quick")
    (run / "sanity.json").write_text(json.dumps({"schema_version": 1, "checks": checks}))
    m.record({"name": "sanity", "status": "PASS", "order": 2, "source": "built-in", "reason": "ok",
              "files": ["sanity.json"], "duration_s": 1.0})
    m.finish()
    return run


# ---- B-B1 -----------------------------------------------------------------------------------------

GOOD = {"check": "cmp forward vs fp64 reference", "ok": False, "rel_err": 0.5, "tol": 1e-3, "detail": "bad"}


@pytest.mark.parametrize("field, value", [("ok", "false"), ("ok", None), ("ok", 0), ("rel_err", "abc"),
                                          ("rel_err", [1]), ("rel_err", True), ("tol", "x")])
def test_a_sanity_check_of_the_wrong_type_is_a_broken_file_for_compare_and_report(ab, tmp_path, field, value):
    """`"ok": "false"` is a non-empty string, truthy: compare printed FAIL -> PASS, "1 fixed", exit 0."""
    out = tmp_path / "o"
    _sanity_run(out, "aaaaaaa", [GOOD])
    b = _sanity_run(out, "bbbbbbb", [{**GOOD, field: value}])
    before = (b / "sanity.json").read_bytes()
    r = _main(ab, "compare", "aaaaaaa", "bbbbbbb", "--out", out)
    line = _one_error_line(r, "sanity.json", field)
    assert "FAIL -> PASS" not in r.stdout and "no regression" not in r.stdout, r.stdout
    assert "broken file" in r.stderr, r.stderr
    r = _main(ab, "report", "bbbbbbb", "--out", out)
    assert _one_error_line(r, "sanity.json", field) == line
    assert not (b / "report.html").exists() and (b / "sanity.json").read_bytes() == before
    # the right types still compare: false -> true is "fixed"
    _sanity_run(out, "ccccccc", [{**GOOD, "ok": True, "rel_err": 1e-4}])
    r = _main(ab, "compare", "aaaaaaa", "ccccccc", "--out", out)
    assert r.returncode == 0 and "FAIL -> PASS" in r.stdout, r.stdout + r.stderr


# ---- B-B2 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["a\x1b", "a\ufffe", "a\udcff"], ids=["escape", "nonchar", "surrogate"])
def test_a_stage_name_with_a_control_character_never_breaks_junit_and_is_named(ab, tmp_path, bad):
    out = tmp_path / "o"
    r = _main(ab, "oneshot", "--out", out, "--only", "a", "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    run = out / "testrun"
    data = json.loads((run / "manifest.json").read_text())
    assert data["stages"][0]["name"] == "a"
    data["stages"][0]["name"] = bad
    (run / "manifest.json").write_text(json.dumps(data))  # ASCII: a lone surrogate is written \\udcff
    r = _main(ab, "stage", "b", "--out", out, "--device", "cpu")
    _clean(r)
    if r.returncode == 2:  # the runner may refuse the hand-edited manifest: then it names the entry
        _one_error_line(r, "manifest.json")
    else:
        assert r.returncode == 0, r.stderr[-2000:]
        # junit.xml is well-formed XML with both suites, the bad character left out
        root = ET.fromstring((run / "junit.xml").read_bytes())
        suites = [s.get("name") for s in root.iter("testsuite")]
        assert suites == ["a", "b"], suites
        assert "b" in (run / "summary.md").read_text()
        assert [s["name"] for s in json.loads((run / "summary.json").read_text())["stages"]][1:] == ["b"]
    # report / compare read the manifest's stage names: a control character is left out where the
    # name is shown (test_escaping's contract); a lone surrogate is no text: the entry is named
    before = (run / "report.html").read_bytes()  # the oneshot's
    for args in (("report", "testrun"), ("compare", "testrun", "testrun")):
        r = _main(ab, *args, "--out", out)
        if bad == "a\udcff":
            line = _one_error_line(r, "manifest.json", "stages[0]", "not text")
            assert "U+DCFF" in line, line
        else:
            _clean(r)
            # compare: the hand-renamed record leaves the planned stage a without a result, "!" (round 19 A U-1)
            assert r.returncode == (1 if args[0] == "compare" else 0), r.stderr[-2000:]
    if bad == "a\udcff":
        assert (run / "report.html").read_bytes() == before
    else:
        html = (run / "report.html").read_text()
        assert "\x1b" not in html  # U+FFFE is UTF-8 text: HTML carries it, XML 1.0 (junit.xml) cannot


# ---- B-B3 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("table", ["status,case\nFAIL\nPASS,ok\n", "case,status\nx,PASS,extra\ny,FAIL\n"],
                         ids=["short row", "long row"])
def test_a_case_table_with_a_short_row_is_named_and_every_report_is_still_written(ab, tmp_path, table):
    out = tmp_path / "o"
    env = env_with(ab, R11B_A_CMD=f"printf '{table}' > cases.csv", R11B_A_FILES="cases.csv")
    r = _main(env, "oneshot", "--out", out, "--only", "a,summary", "--device", "cpu")
    _clean(r)
    assert r.returncode == 0, r.stderr[-2000:]
    run = out / "testrun"
    for name in ("junit.xml", "summary.md", "summary.json", "report.html"):
        assert (run / name).is_file(), name
    notes = [ln for ln in r.stderr.splitlines() if "cases.csv" in ln and "line 2" in ln]
    assert notes, r.stderr[-2000:]
    root = ET.fromstring((run / "junit.xml").read_bytes())
    suite = next(s for s in root.iter("testsuite") if s.get("name") == "a")
    assert "cases.csv" in ET.tostring(suite, encoding="unicode")
    assert suite.get("failures") == "0" and suite.get("errors") == "0"  # stage a PASSed: so does its suite
    # a later stage there is not broken by it
    r = _main(ab, "stage", "b", "--out", out, "--device", "cpu")
    _clean(r)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [s.get("name") for s in ET.fromstring((run / "junit.xml").read_bytes()).iter("testsuite")] == \
        ["a", "summary", "b"]


# ---- B-B4 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [1e308, 1.7e308, 1e-300])
def test_a_huge_rel_err_is_plotted_without_a_warning_on_stderr(ab, tmp_path, value):
    out = tmp_path / "o"
    run = _sanity_run(out, "aaaaaaa", [{**GOOD, "rel_err": value},
                                       {**GOOD, "check": "win", "ok": True, "rel_err": 1e-6, "tol": 1e-3}])
    r = _main(ab, "report", "aaaaaaa", "--out", out)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.strip() == "", r.stderr[-2000:]
    assert (run / "report.html").is_file()


# ---- A-R3 -----------------------------------------------------------------------------------------


def test_report_and_compare_during_a_rerun_say_running_not_missing(ab, spawn, tmp_path):
    out = tmp_path / "o"
    env = env_with(ab, R11B_A_CMD="printf 'T,ms\\n1,2.0\\n' > a.csv", R11B_A_FILES="a.csv")
    r = _main(env, "oneshot", "--out", out, "--only", "a", "--device", "cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    run = out / "testrun"
    assert (run / "a.csv").is_file()
    mark = tmp_path / "mark"
    slow = env_with(env, R11B_A_CMD=f"echo $$ > {mark}; sleep 60; printf 'T,ms\\n1,2.0\\n' > a.csv")
    p = spawn(main_cmd("stage", "a", "--out", out, "--device", "cpu"), env=slow,
              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(mark, proc=p)
        assert not (run / "a.csv").exists()  # set aside in history/ by the live rerun
        r = _main(ab, "report", "testrun", "--out", out)
        _clean(r)
        assert "missing" not in r.stderr and "repair" not in r.stderr, r.stderr[-2000:]
        assert r.returncode == 0, r.stderr[-2000:]
        assert "RUNNING" in r.stdout and "stage a" in r.stdout, r.stdout
        r = _main(ab, "compare", "testrun", "testrun", "--out", out)
        _clean(r)
        assert "missing" not in r.stderr and "repair" not in r.stderr, r.stderr[-2000:]
        assert r.returncode in (0, 1), r.stderr[-2000:]
        assert "RUNNING" in r.stdout and "stage a" in r.stdout, r.stdout
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(60)
    # the interrupted rerun put the earlier result back: report reads it again, no RUNNING
    assert (run / "a.csv").is_file()
    r = _main(ab, "report", "testrun", "--out", out)
    assert r.returncode == 0 and "RUNNING" not in r.stdout, r.stdout + r.stderr
