"""Bad days, red-team round 19 (part A) U-6, through the CLI: a manifest with ``"finished": null`` and a ``runner``
that is not an nsa-run's note of itself (null, 5, "x", [], {}, {"pid": "x"}) read as a finished run: ``report``
said "3 passed" with no UNFINISHED line, rc 0. ``finished``, ``died``, ``pending`` ... are type-checked when the
manifest is read (one line naming the field, exit 2); ``runner`` now is too, as a pending note's owner is.
"""

from __future__ import annotations

import json
import subprocess

try:
    from _bad_days import cli_cmd, make
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, make


def test_a_runner_that_is_no_runner_note_is_named_not_read_as_finished(plugins, tmp_path):
    out, env = tmp_path / "out", make(plugins)
    r = subprocess.run(cli_cmd("oneshot", "--only", "x,y,z", "--out", out, "--device", "cpu"), env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    folder = out / "testrun"
    good = json.loads((folder / "manifest.json").read_text())
    for runner in (None, 5, "x", [], {}, {"pid": "x"}):
        m = dict(good, finished=None, runner=runner)
        m.pop("_seal", None)
        text = json.dumps(m, indent=2)
        for name in ("manifest.json", ".manifest.json.good"):
            (folder / name).write_text(text)
        rep = subprocess.run(cli_cmd("report", "testrun", "--out", out), env=env, capture_output=True, text=True,
                             timeout=300)
        assert rep.returncode == 2, (runner, rep.stdout + rep.stderr)
        assert "'runner' must" in rep.stderr and "Traceback" not in rep.stderr, (runner, rep.stderr)
        assert "passed" not in rep.stdout, (runner, rep.stdout)
