"""Bad days, red-team round 6 (issue 16): new probes of the same families, each through the CLI.

Every test here reproduces an attack that worked on the code before round 6's fixes (see
docs/reliability.md, "Red-team round 6"): an installed distribution whose ``entry_points.txt`` is a
FIFO or a link to /dev/zero (every ``list`` / ``stage`` / ``oneshot`` hung forever or ran out of
memory in ``import torch``, which reads every distribution's entry points), nsa-run started from a
deleted folder (exit 2 without a word: torch / MKL cannot load), and a SKIP whose reason is only
an escape sequence or a zero-width character (accepted: a skip that says nothing).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

try:
    from _bad_days import cli_cmd, make, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, make, manifest


@pytest.fixture
def bd(plugins):
    return make(plugins)


def _run(env, *args, timeout=90, **kw):
    return subprocess.run(cli_cmd(*args), env=env, text=True, timeout=timeout, capture_output=True, **kw)


def _bad_distribution(plugins, how: str):
    info = plugins.site / "hostile_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hostile-pkg\nVersion: 1.0\n")
    eps = info / "entry_points.txt"
    if how == "fifo":
        os.mkfifo(eps)
    else:
        eps.symlink_to("/dev/zero")
    return eps


@pytest.mark.parametrize("how", ["fifo", "zero"])
@pytest.mark.parametrize("args", [("list",), ("oneshot", "--only", "x"), ("stage", "x", "--help")])
def test_special_file_as_installed_entry_points_is_named_not_hung(bd, plugins, tmp_path, how, args):
    """An installed distribution's entry_points.txt that is a FIFO (or /dev/zero): `nsa-run list`
    hung forever in `import torch` (its device-backend hook reads every distribution's entry points;
    /dev/zero ate the memory). Now exit 2 with one line naming the file, nothing run."""
    eps = _bad_distribution(plugins, how)
    out = tmp_path / "o"
    extra = ("--out", out) if args[0] == "oneshot" else ()
    r = _run(bd, *args, *extra, timeout=60)
    assert r.returncode == 2, r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and str(eps) in err[0] and "not a regular file" in err[0], r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists()


def test_deleted_cwd_is_one_line_not_silent(bd, tmp_path):
    """nsa-run started from a folder deleted under it: exit 2 with nothing printed (torch's MKL
    cannot load). Now one line says the current folder cannot be read."""
    gone = tmp_path / "gone"
    gone.mkdir()
    code = ("import os, subprocess, sys; os.chdir(sys.argv[1]); os.rmdir(sys.argv[1]); "
            "r = subprocess.run(sys.argv[2:], capture_output=True, text=True); "
            "sys.stdout.write(r.stderr); sys.exit(r.returncode)")
    env = dict(bd, PYTHONPATH=os.pathsep.join(p for p in bd["PYTHONPATH"].split(os.pathsep) if p))  # no "" entry:
    # Python itself cannot start from a deleted cwd with a relative sys.path entry
    r = subprocess.run([sys.executable, "-c", code, str(gone), *cli_cmd("list")], env=env, text=True,
                       capture_output=True, timeout=90)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "error: the current folder cannot be read" in r.stdout, r.stdout


@pytest.mark.parametrize("reason", ["\x1b[0m", "\u200b", "\ufeff \x07", "\u2028"])
def test_skip_with_an_invisible_reason_is_an_error(plugins, tmp_path, reason):
    """A SKIP whose reason is only an escape sequence, a zero-width character or a separator was
    accepted: every report showed a skip that says nothing (DESIGN §5: a skip always says why)."""
    plugins.make("inv-plugin", "inv_mod", f"""
        from nsa_runner import Stage, StageResult, Status
        class X(Stage):
            name, order = "x", 10
            def run(self, ctx):
                return StageResult(Status.SKIP, {reason!r})
        """, {"x": "inv_mod:X"})
    out = tmp_path / "o"
    r = _run(plugins.env(), "stage", "x", "--out", out)
    assert r.returncode == 1, r.stderr
    rec = manifest(out)["stages"][0]
    assert rec["status"] == "ERROR" and "without a reason" in rec["reason"]
