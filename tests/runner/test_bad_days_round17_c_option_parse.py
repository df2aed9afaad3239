"""Bad days, red-team round 17 U-7, through the CLI: a stage option whose ``parse`` raises
KeyboardInterrupt (or hangs, or ends the process) was reported as the plugin's *import*:
"its options could not be parsed: mopt:O: importing it killed the discovery process (SIGINT)" /
"its import did not finish within 60s (hangs?)". No signal was sent and the import was fine.

Expected: exit 2, one line, no traceback, naming the stage, the option and its parse (not the import):
a parse raising anything (KeyboardInterrupt and SystemExit included) is that option's error; a parse
that hangs or ends the discovery process is named as the parse of that option."""

from __future__ import annotations

import subprocess
import sys

try:
    from _bad_days import MAIN, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with

SOURCE = """
import os, time
from nsa_runner import Option, Stage, StageResult, Status

def _parse(text):
    if text == "ki":
        raise KeyboardInterrupt
    if text == "exit":
        raise SystemExit(3)
    if text == "boom":
        raise RuntimeError("parse went wrong")
    if text == "hang":
        time.sleep(1000)
    if text == "die":
        os._exit(7)
    return text

class O(Stage):
    name, order = "mopt", 17
    options = (Option("--mode", parse=_parse, default="a", help="how"),)
    def run(self, ctx):
        return StageResult(Status.PASS, "mode " + str(ctx.options["mode"]))
"""


def _stage(plugins, tmp_path, value, **env):
    if not list(plugins.site.glob("r17c_mopt-*.dist-info")):
        plugins.make("r17c-mopt", "r17c_mopt_mod", SOURCE, {"mopt": "r17c_mopt_mod:O"})
    cmd = [sys.executable, "-c", MAIN, "stage", "mopt", "--mode", value, "--out", tmp_path / f"o-{value}"]
    return subprocess.run(cmd, env=env_with(plugins.env(), NSA_RUN_SPARE_WORKER="0", **env),
                          capture_output=True, text=True, timeout=300)


def _error_line(r) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, r.stderr[-3000:]
    return lines[0]


def test_u7_a_parse_raising_keyboard_interrupt_is_named_as_the_option_parse(plugins, tmp_path):
    line = _error_line(_stage(plugins, tmp_path, "ki"))
    assert "mopt" in line and "--mode" in line and "parse" in line, line
    assert "KeyboardInterrupt" in line, line
    assert "import" not in line and "SIGINT" not in line and "killed" not in line, line


def test_u7_b_parse_raising_system_exit_or_another_error_names_the_option(plugins, tmp_path):
    for value, what in (("exit", "SystemExit"), ("boom", "RuntimeError: parse went wrong")):
        line = _error_line(_stage(plugins, tmp_path, value))
        assert "mopt" in line and "--mode" in line and "parse" in line and what in line, line
        assert "describing it" not in line and "import" not in line, line


def test_u7_c_parse_that_hangs_is_named_as_the_option_parse_not_the_import(plugins, tmp_path):
    line = _error_line(_stage(plugins, tmp_path, "hang", NSA_RUN_DISCOVERY_TIMEOUT="3"))
    assert "mopt" in line and "--mode" in line and "parse" in line and "did not finish within 3s" in line, line
    assert "import" not in line, line


def test_u7_d_parse_that_ends_the_process_is_named_as_the_option_parse(plugins, tmp_path):
    line = _error_line(_stage(plugins, tmp_path, "die"))
    assert "mopt" in line and "--mode" in line and "parse" in line and "exit code 7" in line, line
    assert "importing it" not in line, line


def test_u7_e_a_good_value_still_runs(plugins, tmp_path):
    r = _stage(plugins, tmp_path, "fine")
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert "mode fine" in r.stdout, r.stdout[-2000:]
