"""Bad days, red-team round 19 (part A) U-2, through the CLI: ``report`` of a run folder whose manifest.json is a
FIFO or a link to /dev/zero said "not a run folder (no manifest.json)" while one is there (a special file). It now
says what is there: "manifest.json is a FIFO, not a regular file" (one line, exit 2, no hang).
"""

from __future__ import annotations

import os
import subprocess

try:
    from _bad_days import cli_cmd, make
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, make


def test_a_special_manifest_is_named_for_what_it_is(plugins, tmp_path):
    out, env = tmp_path / "out", make(plugins)
    r = subprocess.run(cli_cmd("oneshot", "--only", "x", "--out", out, "--device", "cpu"), env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    path = out / "testrun" / "manifest.json"
    for make_it, words in ((os.mkfifo, "manifest.json is a FIFO, not a regular file"),
                           (lambda p: os.symlink("/dev/zero", p), "manifest.json is a link to a character device"),
                           (lambda p: None, "no manifest.json")):
        path.unlink(missing_ok=True)
        make_it(path)
        rep = subprocess.run(cli_cmd("report", "testrun", "--out", out), env=env, capture_output=True, text=True,
                             timeout=120)
        assert rep.returncode == 2, rep.stdout + rep.stderr
        assert words in rep.stderr and "Traceback" not in rep.stderr, rep.stderr
        if words != "no manifest.json":
            assert "no manifest.json" not in rep.stderr, rep.stderr
