"""Bad days, red-team round 14 part B, R10 and R9 (/tmp/rt14b/report.md B14, B13): ``nsa-run report``
writing a run's summary.md / junit.xml / summary.json again from manifest.json.

- R10: junit.xml was quadratic in the stages: junitparser's ``add_testsuite`` compares each new suite
  with every earlier one (8 000 stages: 118 s). Checked by what is compared, not by a clock: no two
  suites are compared while junit.xml is built, and each manifest entry is one suite.
- R9: the digest the runner records (``reports_of``) left out run-level fields the three files show
  (run id, started, host, device, profile, command): after an edit of one, ``report`` said "kept"
  while summary.md disagreed with manifest.json.
Through the CLI (the typer app, in process) on fabricated run folders."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import xml.etree.ElementTree as ET

import junitparser
import pytest
from typer.testing import CliRunner

from nsa_runner.cli import app

try:  # tests/ is on sys.path under pytest's default (prepend) import mode
    from _bad_days import cli_cmd
    from _runfolders import make_run
except ImportError:  # pragma: no cover - run as a package
    from tests._bad_days import cli_cmd

    from tests._runfolders import make_run

PLUGIN = """
from nsa_runner import Stage, StageResult, Status

class A(Stage):
    name, order, timeout_s = "a", 10, 120.0
    def run(self, ctx):
        (ctx.dir / "a.txt").write_text("a")
        return StageResult(Status.PASS, "a", files=["a.txt"])
"""


def _cli(*args):
    r = CliRunner().invoke(app, [str(a) for a in args])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.output
    return r


def test_junit_of_many_stages_compares_no_suites(tmp_path, monkeypatch):
    run = make_run(tmp_path / "runs", "aaaaaaa", device="cpu", only=("summary",))
    mp = run / "manifest.json"
    m = json.loads(mp.read_text())
    base = m["stages"][0]
    stages = []
    for i in range(60):
        s = copy.deepcopy(base)
        s["name"], s["status"], s["files"] = f"s{i}", ("PASS", "FAIL", "SKIP")[i % 3], []
        stages.append(s)
    m["stages"], m["reports_of"] = stages, "stale"
    mp.write_text(json.dumps(m))
    compared = []

    def eq(self, other):
        compared.append((self.name, other.name))
        return False

    monkeypatch.setattr(junitparser.TestSuite, "__eq__", eq)
    r = _cli("report", run)
    assert r.exit_code == 0, r.output
    assert compared == []  # add_testsuite compared each suite with every earlier one: 1 830 here
    root = ET.parse(run / "junit.xml").getroot()
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == [f"s{i}" for i in range(60)]
    assert root.get("failures") == str(sum(int(s.get("failures")) for s in suites)) == "20"


def _edit(m, field):
    if field == "host.platform":
        m["host"]["platform"] = "EDITED-platform"
    elif field == "argv":
        m["argv"] = ["nsa-run", "EDITED-argv"]
    else:
        m[field] = f"EDITED-{field}"


@pytest.mark.parametrize("field", ["device", "argv", "host.platform", "started", "run_id", "profile"])
def test_a_run_level_edit_makes_the_summaries_stale(plugins, tmp_path, field):
    plugins.make("rt14d-plugin", "rt14d_mod", PLUGIN, {"a": "rt14d_mod:A"})
    env = plugins.env()
    out = tmp_path / "out"
    r = subprocess.run(cli_cmd("oneshot", "--device", "cpu", "--only", "a", "--out", out), env=env, text=True,
                       capture_output=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    run = out / "testrun"
    same = tmp_path / "same"
    shutil.copytree(run, same)
    r = _cli("report", same)  # the control: nothing edited, the summaries agree
    assert r.exit_code == 0 and "kept" in r.output and "rewritten" not in r.output, r.output
    m = json.loads((run / "manifest.json").read_text())
    _edit(m, field)
    (run / "manifest.json").write_text(json.dumps(m))
    r = _cli("report", run)
    assert r.exit_code == 0, r.output
    assert "kept" not in r.output and "rewritten" in r.output, r.output  # "kept", summary.md disagreeing
    assert "EDITED" in (run / "summary.md").read_text().replace("\\", "")
    if field != "argv":  # summary.json shows every run-level field but the command
        assert "EDITED" in (run / "summary.json").read_text()
    r = _cli("report", run)  # recorded as agreeing now
    assert r.exit_code == 0 and "kept" in r.output and "rewritten" not in r.output, r.output
