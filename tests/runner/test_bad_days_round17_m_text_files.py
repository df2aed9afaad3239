"""Bad days, red-team round 17 (part B) B-1 and B-3, through the CLI: odd text from a stage in the run's files.

- B-1: the terminal dropped C1 controls (U+009B, the 8-bit CSI), DEL and whole OSC sequences, but summary.md
  and junit.xml kept U+009B / U+007F and an OSC's body (``]8;;http://evil``), report.html kept U+009B: three
  rules for one text. Expected: one rule (``_text.CONTROL``) for the terminal and every file.
- B-3: summary.md's link to a declared file named ``\\x1b[31mred.txt`` had the escape dropped from its
  target too: it led to ``./red.txt``, another stage's file. Expected: the target is the real name,
  percent-encoded (report.html's already was); only the shown text is cleaned.
"""

from __future__ import annotations

import subprocess

try:
    from _bad_days import cli_cmd, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, env_with

STAGES = """
from nsa_runner import Stage, StageResult, Status

class C1(Stage):
    name, order, timeout_s = "c1", 80, 60.0
    def run(self, ctx):
        return StageResult(Status.FAIL, "A\\x9b2J\\x9b31mRED\\x7f \\x1b]8;;http://evil\\x07link\\x1b]8;;\\x07 end")

class R1(Stage):
    name, order, timeout_s = "r1", 81, 60.0
    def run(self, ctx):
        (ctx.dir / "red.txt").write_text("r1 evidence")
        return StageResult(Status.PASS, "r1", files=["red.txt"])

class R2(Stage):
    name, order, timeout_s = "r2", 82, 60.0
    def run(self, ctx):
        (ctx.dir / "\\x1b[31mred.txt").write_text("r2 failure evidence")
        return StageResult(Status.FAIL, "see file", files=["\\x1b[31mred.txt"])
"""


def test_odd_text_and_file_names_in_the_run_files(plugins, tmp_path):
    plugins.make("m17-text", "m17_text_mod", STAGES,
                 {"c1": "m17_text_mod:C1", "r1": "m17_text_mod:R1", "r2": "m17_text_mod:R2"})
    out = tmp_path / "o"
    proc = subprocess.run(cli_cmd("oneshot", "--only", "c1,r1,r2", "--out", out, "--device", "cpu"),
                          env=env_with(plugins.env(), NSA_RUN_SPARE_WORKER="0"), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = out / "testrun"
    for name in ("summary.md", "junit.xml", "report.html"):
        text = (run / name).read_text(encoding="utf-8")
        assert "c1" in text, name
        for bad in ("\x9b", "\x7f", "\x1b"):
            assert bad not in text, (name, repr(bad))
        # the OSC's body only as inert text, written out with its escape, where the file quotes the stage's log
        # (whose closing line shows controls visibly since round 19 B U-1: CI on c0709ca), never as a live link
        for at in (i for i in range(len(text)) if text.startswith("http://evil", i)):
            assert text[max(0, at - 8):at] == "\\x1b]8;;", (name, text[max(0, at - 40):at + 20])
        assert "link" in text and "end" in text, name  # the text around the sequences is kept
    rows = {line.split("|")[2].strip(): line for line in (run / "summary.md").read_text().splitlines()
            if line.startswith("| ") and line.count("|") > 4}
    assert "(./red.txt)" in rows["r1"], rows["r1"]
    assert "(./%1B%5B31mred.txt)" in rows["r2"] and "(./red.txt)" not in rows["r2"], rows["r2"]
