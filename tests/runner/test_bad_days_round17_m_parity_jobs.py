"""Bad days, red-team round 17 (part A) U-g, through the CLI: ``NSA_RUN_PARITY_JOBS`` was read inside fa2-probe's
parity run (``int(...)``): ``abc`` was that stage's ValueError on a GPU, not a line of the CLI, while every other
``NSA_RUN_*`` is refused up front. Expected: one line naming the variable, exit 2, nothing run; a count runs."""

from __future__ import annotations

import subprocess

import pytest

try:
    from _bad_days import cli_cmd, env_with, make
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, env_with, make


@pytest.mark.parametrize("value", ["abc", "0", "-3", "1e3", "999", "４"])
def test_a_bad_parity_jobs_value_is_one_line_and_exit_2(plugins, tmp_path, value):
    out = tmp_path / "out"
    r = subprocess.run(cli_cmd("oneshot", "--only", "x", "--out", out, "--device", "cpu"),
                       env=env_with(make(plugins), NSA_RUN_PARITY_JOBS=value), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "NSA_RUN_PARITY_JOBS" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not out.exists() or not any(out.iterdir()), list(out.iterdir())


def test_a_parity_jobs_count_runs(plugins, tmp_path):
    r = subprocess.run(cli_cmd("oneshot", "--only", "x", "--out", tmp_path / "out", "--device", "cpu"),
                       env=env_with(make(plugins), NSA_RUN_PARITY_JOBS="4"), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
