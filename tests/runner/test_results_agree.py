"""One truth about a run's results (issue 12): the CLI's closing line, summary.md, summary.json,
junit.xml and report.html give the same counts; junit.xml is valid against the common JUnit
schema, has one testcase per named case of a case table, carries no ANSI / control characters,
and is written on every exit path (``--skip summary``, ``stage X``, Ctrl-C)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import xmlschema

from nsa_runner.results.junit import suite_status

# Jenkins' junit-10.xsd (tests/runner/data/junit-10.xsd, from
# https://github.com/jenkinsci/xunit-plugin/blob/master/src/main/resources/org/jenkinsci/plugins/xunit/types/model/xsd/junit-10.xsd)
JUNIT_XSD = Path(__file__).parent / "data" / "junit-10.xsd"

STAGES = r'''
import sys, time
from nsa_runner import Stage, StageResult, Status
from nsa_runner.artifacts import write_csv

class Good(Stage):
    name, order = "good", 1
    def run(self, ctx):
        return StageResult(Status.PASS, "fine")

class Cases(Stage):
    name, order = "cases", 2
    def run(self, ctx):
        write_csv(ctx.dir / "cases.csv", [
            {"case": "T=64 fp32", "rel_err": 1e-7, "tol": 1e-5, "status": "PASS", "note": ""},
            {"case": "T=128 fp16", "rel_err": 5e-3, "tol": 2e-3, "status": "FAIL", "note": "over tol"},
            {"case": "T=256 bf16", "rel_err": "", "tol": 1e-2, "status": "SKIP", "note": "no bf16 here"}])
        return StageResult(Status.FAIL, "1 case over tolerance", files=["cases.csv"])

class Noisy(Stage):
    name, order = "noisy", 3
    def run(self, ctx):
        print("\x1b[31mred text\x1b[0m and a bell \x07 and NUL-ish \x01 end", flush=True)
        raise RuntimeError("boom \x1b[1mbold\x1b[0m")

class Skips(Stage):
    name, order = "skips", 4
    def run(self, ctx):
        return StageResult(Status.SKIP, "no flash here", hint="pip install flash-attn")

class Slow(Stage):
    name, order = "slow", 5
    def run(self, ctx):
        print("slow stage started", flush=True)
        time.sleep(60)
        return StageResult(Status.PASS, "slept")
'''
ALL = {"good": "Good", "cases": "Cases", "noisy": "Noisy", "skips": "Skips", "slow": "Slow"}
LINE = re.compile(r"(\d+) passed, (\d+) failed, (\d+) skipped")


@pytest.fixture
def fake(plugins):
    plugins.make("agree-stages", "agree_stages_mod", STAGES, {k: f"agree_stages_mod:{v}" for k, v in ALL.items()})
    return plugins


def _triple(text: str) -> tuple[int, int, int]:
    m = LINE.findall(text)
    assert m, text[-500:]
    return tuple(map(int, m[-1]))


def _junit_checked(folder: Path) -> ET.Element:
    path = folder / "junit.xml"
    xmlschema.XMLSchema(JUNIT_XSD).validate(path)  # raises with the reason when invalid
    text = path.read_text(encoding="utf-8")
    assert "\x1b" not in text and not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f]", text)
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites" and root.get("skipped") is None
    return root


def _junit_triple(root: ET.Element) -> tuple[int, int, int]:
    st = [suite_status(s) for s in root.findall("testsuite")]
    return st.count("PASS"), st.count("FAIL"), st.count("SKIP")


def test_counts_agree_everywhere_and_junit_is_valid(fake, cli, tmp_path):
    r = cli("oneshot", "--out", tmp_path, "--only", "good,cases,noisy,skips,summary", "--device", "cpu")
    assert r.exit_code == 1, r.stdout + r.stderr
    folder = tmp_path / "testrun"
    cli_line = _triple(r.stdout.strip().splitlines()[-1])
    assert cli_line == (2, 2, 1)  # good + summary | cases + noisy | skips
    summary = json.loads((folder / "summary.json").read_text())
    assert tuple(summary["counts"].values()) == cli_line
    assert _triple((folder / "summary.md").read_text()) == cli_line
    assert _triple((folder / "report.html").read_text()) == cli_line
    root = _junit_checked(folder)
    assert _junit_triple(root) == cli_line
    assert json.loads((folder / "manifest.json").read_text())["exit_code"] == 1

    suites = {s.get("name"): s for s in root.findall("testsuite")}
    cases = {c.get("name"): c for c in suites["cases"].findall("testcase")}
    assert list(cases) == ["T=64 fp32", "T=128 fp16", "T=256 bf16"]  # one testcase per named case
    assert cases["T=128 fp16"].find("failure").get("message") == "over tol"
    assert cases["T=256 bf16"].find("skipped").get("message") == "no bf16 here"
    assert all(cases["T=64 fp32"].find(x) is None for x in ("failure", "error", "skipped"))
    noisy = suites["noisy"].find("testcase/error")
    assert "boom bold" in noisy.get("message") and "red text and a bell" in noisy.text


def test_skip_summary_still_writes_the_reports(fake, cli, tmp_path):
    r = cli("oneshot", "--out", tmp_path, "--only", "good,skips", "--device", "cpu")
    assert r.exit_code == 0
    root = _junit_checked(tmp_path / "testrun")
    assert [s.get("name") for s in root.findall("testsuite")] == ["good", "skips"]
    assert _junit_triple(root) == _triple(r.stdout) == (1, 0, 1)
    assert (tmp_path / "testrun" / "summary.md").is_file()


def test_stage_refreshes_the_runs_junit_and_report(fake, cli, tmp_path):
    assert cli("oneshot", "--out", tmp_path, "--only", "good", "--device", "cpu").exit_code == 0
    folder = tmp_path / "testrun"
    before = (folder / "report.html").read_text()
    r = cli("stage", "skips", "--out", tmp_path, "--device", "cpu")
    assert r.exit_code == 0
    root = _junit_checked(folder)
    assert [s.get("name") for s in root.findall("testsuite")] == ["good", "skips"]
    assert _triple((folder / "summary.md").read_text()) == (1, 0, 1)
    after = (folder / "report.html").read_text()
    assert after != before and "skips" in after and _triple(after) == (1, 0, 1)


def test_ctrl_c_writes_valid_junit_and_exits_130(fake, tmp_path, spawn):
    """Non-TTY: stage lines appear as they happen (before the run ends); SIGINT -> 130 + reports."""
    # spawn (tests/runner/conftest.py): the CLI, its stage worker and their children die with the test
    proc = spawn([sys.executable, "-m", "nsa_runner.cli", "oneshot", "--out", str(tmp_path),
                  "--only", "good,slow", "--device", "cpu"], env=fake.env(), cwd=tmp_path,
                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    seen: list[str] = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if re.search(r"\bslow\b.*start", line):
                break
        assert any(re.search(r"\bgood\b.*PASS", s) for s in seen), "".join(seen)  # finished line, live
        assert proc.poll() is None  # ... while the run is still going
        time.sleep(1.0)
        spawn.snapshot()  # CLI + worker, recorded before the interrupt
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            spawn.cleanup()
    assert proc.returncode == 130, "".join(seen) + rest
    folders = [p for p in tmp_path.iterdir() if (p / "manifest.json").is_file()]
    assert len(folders) == 1
    root = _junit_checked(folders[0])
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert suite_status(suites["good"]) == "PASS" and suite_status(suites["slow"]) == "FAIL"
    assert "interrupted" in suites["slow"].find("testcase/error").get("message")
    assert json.loads((folders[0] / "manifest.json").read_text())["exit_code"] == 130
