"""Bad days, red-team round 17 (part B) U-1, through the CLI: a stage's verdict and its own case table disagreed.
A stage returning PASS whose declared case table (``case,status``) had a FAIL row was PASS in manifest.json, the
terminal, summary.md and report.html (``1 passed``) while junit.xml counted a failure; a row whose status was
written ``fail`` / ``FAILED`` / `` PASS`` became a junit *skip*, so such a failure was green in CI.

Expected: a status written another way is read as that status (junit: a failure, the spelling noted); a PASS
with failed rows of its own case table is the stage's FAIL naming the rows, in every output alike.
"""

from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ET

try:
    from _bad_days import cli_cmd, env_with, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, env_with, manifest

STAGES = """
import os
from nsa_runner import Stage, StageResult, Status

class Cases(Stage):
    name, order, timeout_s = "cases", 80, 60.0
    def run(self, ctx):
        (ctx.dir / "cases.csv").write_text(os.environ["M17_TABLE"])
        return StageResult(Status.PASS, "all good", files=["cases.csv"])
"""


def _run(plugins, tmp_path, table):
    plugins.make("m17-cases", "m17_cases_mod", STAGES, {"cases": "m17_cases_mod:Cases"})
    out = tmp_path / "o"
    proc = subprocess.run(cli_cmd("oneshot", "--only", "cases", "--out", out, "--device", "cpu"),
                          env=env_with(plugins.env(), NSA_RUN_SPARE_WORKER="0", M17_TABLE=table),
                          capture_output=True, text=True, timeout=300)
    return proc, out


def test_a_pass_with_failed_rows_of_its_case_table_is_a_fail(plugins, tmp_path):
    proc, out = _run(plugins, tmp_path, "case,status\nc1,PASS\nc2,fail\nc3,FAILED\nc4,N/A\nc5, PASS \n")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (rec,) = manifest(out)["stages"]
    assert rec["status"] == "FAIL", rec
    assert "2 row(s) of its declared case table(s) did not pass (c2 FAIL, c3 FAIL)" in rec["reason"], rec["reason"]
    assert "0 passed, 1 failed" in proc.stdout
    suite = ET.parse(out / "testrun" / "junit.xml").getroot().find("testsuite")
    results = {tc.get("name"): [child.tag for child in tc] for tc in suite.iter("testcase")}
    assert results == {"c1": [], "c2": ["failure"], "c3": ["failure"], "c4": ["skipped"], "c5": []}, results


def test_a_pass_whose_case_table_passes_stays_a_pass(plugins, tmp_path):
    proc, out = _run(plugins, tmp_path, "case,status,note\nc1,PASS,\nc2,N/A,not here\nc3,SKIP,no gpu\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [(s["status"], s["reason"]) for s in manifest(out)["stages"]] == [("PASS", "all good")]


def test_statuses_with_invisible_or_wide_characters_and_a_bom_header_are_read(plugins, tmp_path):
    """Round 18 A-R3 / B U-a: ``FAIL`` with a zero-width space, U+FEFF or a soft hyphen, or in full-width letters,
    was a junit skip under a PASS (rc 0); a table written with a byte-order mark (``utf-8-sig``) gave no testcases."""
    table = "\ufeffcase,status\nc1,PASS\nc2,FAIL\u200b\nc3,\uff26\uff21\uff29\uff2c\nc4,Fail\u00ad\n"
    proc, out = _run(plugins, tmp_path, table)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (rec,) = manifest(out)["stages"]
    assert rec["status"] == "FAIL" and "3 row(s)" in rec["reason"], rec
    suite = ET.parse(out / "testrun" / "junit.xml").getroot().find("testsuite")
    results = {tc.get("name"): [child.tag for child in tc] for tc in suite.iter("testcase")}
    assert results == {"c1": [], "c2": ["failure"], "c3": ["failure"], "c4": ["failure"]}, results
