"""Bad days, red-team round 20 (part B) U-1, through the CLI: the stage log's closing line ("# stage env-pairing: FAIL
after 3.8s <reason>") held the raw ESC / OSC / BEL / U+009B of the reason (a flash import error's text): ``cat`` of the
log retitled the terminal, while env.txt (28f0610) shows them as escapes.

Expected: the worker writes that line under the one text rule (``_text.CONTROL``): what it matches written visibly
as its escapes, never raw, never dropped.
"""

from __future__ import annotations

import subprocess

try:
    from _bad_days import cli_cmd, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, manifest


def test_the_closing_line_shows_control_characters_as_escapes(plugins, tmp_path):
    from nsa_runner._text import CONTROL

    (plugins.site / "flash_attn").mkdir()
    (plugins.site / "flash_attn" / "__init__.py").write_text(
        'raise ImportError("x \\x1b]0;pwn\\x07 \\u009b31mRED")\n')
    out = tmp_path / "out"
    r = subprocess.run(cli_cmd("stage", "env-pairing", "--out", out, "--device", "cpu", "--timeout", "120"),
                       env=plugins.env(), capture_output=True, text=True, timeout=300)
    (rec,) = manifest(out)["stages"]
    assert rec["status"] == "FAIL", (rec, r.stderr[-2000:])  # the broken flash_attn
    log = (out / "testrun" / "logs" / "env-pairing.log").read_text(errors="replace")
    closing = [line for line in log.splitlines() if line.startswith("# stage env-pairing:")]
    assert len(closing) == 1, log[-3000:]
    assert CONTROL.search(closing[0]) is None, closing  # before: raw ESC ] 0;pwn BEL and U+009B
    assert "x \\x1b]0;pwn\\x07 \\x9b31mRED" in closing[0], closing  # visible, not dropped
    assert CONTROL.search(log) is None, [m.group(0) for m in CONTROL.finditer(log)]
