"""Bad days, red-team round 19 (part B) U-1, through the CLI: env-pairing wrote env.txt with the raw ESC / OSC / BEL /
U+009B of a stage plugin's METADATA Name and of a flash import error (``cat env.txt`` retitled the terminal), while
the terminal, report.html, junit.xml and summary.md clean them. Expected: env.txt under the one rule
(``_text.CONTROL``), what it takes out written visibly as escapes, never raw, never dropped silently."""

from __future__ import annotations

import subprocess

try:
    from _bad_days import cli_cmd, env_with, make, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, env_with, make, manifest

STAGE = """\
from nsa_runner import Stage, StageResult, Status
class S(Stage):
    name, order, timeout_s = "nm", 80, 30.0
    def run(self, ctx): return StageResult(Status.PASS, "ok")
"""


def test_env_txt_shows_control_characters_as_escapes(plugins, tmp_path):
    from nsa_runner._text import CONTROL

    env = make(plugins)
    (plugins.site / "m_nm.py").write_text(STAGE)
    info = plugins.site / "p_nm-1.0.dist-info"
    info.mkdir()
    (info / "entry_points.txt").write_text("[nsa_runner.stages]\nnm = m_nm:S\n")
    (info / "METADATA").write_bytes(b"Metadata-Version: 2.1\nName: p-nm\x1b]0;pwn\x07\xc2\x9b31m\nVersion: 1.0\n")
    (plugins.site / "flash_attn").mkdir()
    (plugins.site / "flash_attn" / "__init__.py").write_text(
        'raise ImportError("undefined symbol: \\x1b[31m_ZN3c10")\n')
    out = tmp_path / "out"
    r = subprocess.run(cli_cmd("oneshot", "--only", "env-pairing", "--out", out, "--device", "cpu", "--timeout", "120"),
                       env=env_with(env), capture_output=True, text=True, timeout=300)
    (rec,) = manifest(out)["stages"]
    assert rec["status"] == "FAIL", (rec, r.stderr[-2000:])  # the broken flash_attn
    text = (out / "testrun" / "env.txt").read_text()
    assert CONTROL.search(text) is None, [m.group(0) for m in CONTROL.finditer(text)]  # before: ESC, BEL, U+009B
    assert "p-nm\\x1b]0;pwn\\x07\\x9b31m" in text, text  # visible, not dropped
    assert "\\x1b[31m_ZN3c10" in text, text
