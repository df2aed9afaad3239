"""Bad days, red-team round 16 part B, U3 (/tmp/rt16b/report.md): Unicode bidi controls (U+202E RIGHT-TO-LEFT
OVERRIDE, isolates, marks) in a stage's reason or a case table's note reached summary.md and junit.xml as
they were, though the terminal drops them (``_text.CONTROL``: they reorder what is shown after them) and
summary.md drops every other control character. Root: ``results.junit.clean`` (junit.xml's and
summary.md's one text policy) removed only ANSI escapes and XML-illegal characters. Now it drops the
bidi controls too (``_text.BIDI``, the terminal's set); a link's target keeps the file's own name
(percent-encoded), so it still leads to the file; summary.json (data) keeps the text as it was.

Through the CLI: a plugin stage with such a reason, case note and declared file name, ``oneshot``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

try:  # tests/ is on sys.path under pytest's default (prepend) import mode
    from _bad_days import cli_cmd
except ImportError:  # pragma: no cover - run as a package
    from tests._bad_days import cli_cmd

PLUGIN = """
from nsa_runner import Stage, StageResult, Status

class B(Stage):
    name, order, timeout_s = "bidi", 15, 60.0
    def run(self, ctx):
        (ctx.dir / "r\\u202eb.txt").write_text("x")
        (ctx.dir / "bidi.csv").write_text(
            "impl,case,status,note\\nx,c1,FAIL,\\u202eSSAP\\u2066 \\u200fok\\nx,c2,PASS,\\n")
        return StageResult(Status.FAIL, "impl x: \\u202eSSAP\\u202c LIAF \\u2067y\\u2069 \\u061c",
                           files=["bidi.csv", "r\\u202eb.txt"])
"""


def test_bidi_controls_are_not_in_summary_md_or_junit_xml(tmp_path):
    import importlib

    site = tmp_path / "site"
    site.mkdir()
    (site / "r16h_u3_mod.py").write_text(textwrap.dedent(PLUGIN))
    info = site / "r16h_u3-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: r16h-u3\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[nsa_runner.stages]\nbidi = r16h_u3_mod:B\n")
    importlib.invalidate_caches()
    env = dict(os.environ)
    repo = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(repo), env.get("PYTHONPATH", "")])
    out = tmp_path / "out"
    r = subprocess.run(cli_cmd("oneshot", "--device", "cpu", "--only", "bidi", "--out", out), env=env, text=True,
                       capture_output=True, timeout=180)
    run = out / "testrun"
    assert r.returncode == 1 and (run / "junit.xml").is_file(), r.stderr[-2000:]
    bidi = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")  # _text.BIDI
    md = (run / "summary.md").read_text()
    junit = (run / "junit.xml").read_text()
    assert not bidi.search(md), [c for c in md if bidi.match(c)]
    assert not bidi.search(junit), [c for c in junit if bidi.match(c)]
    page = (run / "report.html").read_text()  # report.html's text too (its own escaping, report._CONTROL)
    assert "SSAP LIAF y" in page and not bidi.search(page), [c for c in page if bidi.match(c)]
    assert "SSAP LIAF y" in md and "%E2%80%AE" in md  # the text shown, the link to r\u202eb.txt kept
    assert "SSAP LIAF y" in junit
    root = ET.fromstring(junit)
    fails = [tc.get("name") for tc in root.iter("testcase") if tc.find("failure") is not None]
    assert fails == ["c1"], fails
    assert root.find(".//failure").get("message") == "SSAP ok"
    doc = json.loads((run / "summary.json").read_text())  # data: as the stage said it
    assert doc["stages"][0]["reason"] == "impl x: \u202eSSAP\u202c LIAF \u2067y\u2069 \u061c"
