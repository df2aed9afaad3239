"""Bad days, red-team round 17 (part A) U-a, through the CLI: ``--out`` a symbolic link to a folder that does not
exist (an unmounted disk, a moved folder) had the link's target folders made and the run written there.
Expected: one line naming the link and its target, exit 2, nothing made."""

from __future__ import annotations

import os
import subprocess

import pytest

try:
    from _bad_days import cli_cmd, env_with, make
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, env_with, make


@pytest.mark.parametrize("below", ["", "sub/deeper"])
def test_out_through_a_dangling_link_is_refused(plugins, tmp_path, below):
    target = tmp_path / "mnt" / "disk"  # not there
    link = tmp_path / "results"
    os.symlink(target, link)
    out = link / below if below else link
    r = subprocess.run(cli_cmd("oneshot", "--only", "x", "--out", out, "--device", "cpu"), env=env_with(make(plugins)),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{link} is a symbolic link to {target}, which does not exist" in r.stderr, r.stderr
    assert not (tmp_path / "mnt").exists()
