"""Bad days, red-team round 26 U26-5, through the CLI: U+2028 / U+2029 (line and paragraph separators) in a stage's
reason reached the terminal raw, in ``oneshot``'s table and ``compare``'s, while ESC, BEL, NUL, C1 and the bidi controls
were stripped (one rule, ``_text.CONTROL``). Expected: taken out like the rest; the reason's other text shown."""

from __future__ import annotations

import subprocess

try:
    from _bad_days import cli_cmd
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd

STAGES = """
from nsa_runner import Stage, StageResult, Status

class Sep(Stage):
    name, order, timeout_s = "r26s", 11, 120.0
    def run(self, ctx):
        return StageResult(Status.PASS, "line\\u2028one para\\u2029two")
"""


def test_line_separators_never_reach_the_terminal(plugins, tmp_path):
    plugins.make("r26-sep", "r26_sep", STAGES, {"r26s": "r26_sep:Sep"})
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("oneshot", "--only", "r26s", "--out", out, "--device", "cpu"), env=plugins.env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "lineoneparatwo" in "".join(r.stderr.split()), r.stderr[-2000:]
    r2 = subprocess.run(cli_cmd("compare", "testrun", "testrun", "--out", out), env=plugins.env(), capture_output=True,
                        text=True, timeout=600)
    for text in (r.stdout + r.stderr, r2.stdout + r2.stderr):
        assert "\u2028" not in text and "\u2029" not in text, text[-2000:]  # before: raw in both tables
