"""Bad days, red-team round 25 U25-4 and U25-7 (round 24 U24-1), through the CLI:

- ``NSA_RUN_SPARE_WORKER=enable`` (neither on nor off) was refused by ``stage`` / ``oneshot`` only, while ``list``,
  ``report``, ``compare`` ran; the other switches are refused before any command. Expected: the same for all three.
- ``NSA_RUN_LOG_LIMIT_MIB=1e-300`` was taken as a 1-byte limit: every stage ERROR "its log passed 9.5e-07 MiB" on
  nsa-run's own header line. Expected: a limit below 1 MiB refused up front, one line naming it, exit 2, nothing
  run."""

from __future__ import annotations

import os
import subprocess
import sys

try:
    from _bad_days import MAIN, cli_cmd, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, cli_cmd, env_with


def test_a_bad_spare_switch_is_refused_by_every_command(plugins, tmp_path):
    env = env_with(plugins.env(), NSA_RUN_SPARE_WORKER="enable")
    for args in (["list"], ["report", "nosuch", "--out", str(tmp_path)], ["compare", "a", "b", "--out", str(tmp_path)]):
        r = subprocess.run([sys.executable, "-c", MAIN, *args], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 2, (args, r.stderr[-2000:])
        assert "NSA_RUN_SPARE_WORKER='enable' is not one of" in r.stderr, (args, r.stderr[-2000:])


def test_a_log_limit_below_one_mib_is_refused_before_anything_runs(plugins, tmp_path):
    for value in ("1e-300", "0.5"):
        out = tmp_path / f"o{value}"
        r = subprocess.run(cli_cmd("stage", "selection-map", "--out", out, "--device", "cpu"),
                           env=env_with(plugins.env(), NSA_RUN_LOG_LIMIT_MIB=value), capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 2, (value, r.stderr[-2000:])
        assert f"NSA_RUN_LOG_LIMIT_MIB={value!r} is below 1 MiB" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and not (out / "testrun").exists(), value


def test_an_out_that_is_no_folder_is_named_for_what_it_is(tmp_path):
    """Round 25 U25-6: ``--out /dev/full`` (or a file, a FIFO) was refused in one line, exit 2, worded "File
    exists"."""
    plain = tmp_path / "plain"
    plain.write_text("x")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for out, words in (("/dev/full", "/dev/full is a character device, not a folder"),
                       (plain / "sub", f"{plain} is a file, not a folder"), (fifo, f"{fifo} is a FIFO, not a folder")):
        r = subprocess.run(cli_cmd("stage", "selection-map", "--out", out, "--device", "cpu"), capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 2 and words in r.stderr, (out, r.stderr)
        assert len(r.stderr.splitlines()) == 2, r.stderr
