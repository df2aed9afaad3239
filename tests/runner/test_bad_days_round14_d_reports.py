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
import xml.etree.ElementTree as ET

import junitparser
from typer.testing import CliRunner

from nsa_runner.cli import app

try:  # tests/ is on sys.path under pytest's default (prepend) import mode
    from _runfolders import make_run
except ImportError:  # pragma: no cover - run as a package
    from tests._runfolders import make_run


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
