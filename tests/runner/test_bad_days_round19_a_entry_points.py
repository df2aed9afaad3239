"""Bad days, red-team round 19 (part B) B19-3, through the CLI: an entry_points.txt that importlib.metadata cannot
parse (a line without "=", or not UTF-8), in ANY installed distribution, plugin or not, breaks ``import torch`` in
every process (torch parses every distribution's entry points): ``list`` said all was well, then every stage of
every run ERRORed with torch's "Only a single TORCH_LIBRARY can be used to register the namespace triton",
naming neither the file nor the package.

Expected: as for an entry_points.txt that is a FIFO (test_bad_days_round6): refused up front, exit 2, one line
naming the file and why, nothing run; ``report`` / ``compare`` (which import no torch) work as they do then."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with


def _run(plugins, *args):
    env = env_with(plugins.env(), NSA_RUN_SPARE_WORKER="0")
    return subprocess.run([sys.executable, "-c", MAIN, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=300)


def _junk(site, text: bytes):
    info = site / "junk_pkg-0.1.dist-info"  # a package that is no plugin of nsa-run at all
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: junk-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_bytes(text)
    return info / "entry_points.txt"


def _one_error_line(r) -> str:
    assert "Traceback" not in r.stderr and "TORCH_LIBRARY" not in r.stderr + r.stdout, r.stderr[-3000:]
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 2 and len(err) == 1, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    return err[0]


@pytest.mark.parametrize("text, why", [(b"[console_scripts]\njunk\n", "line 2 'junk' has no '='"),
                                       (b"[nsa_runner.stages]\nl\xfc = m:S\n", "not UTF-8")])
def test_b19_3_a_malformed_entry_points_file_is_named_up_front(plugins, tmp_path, text, why):
    eps = _junk(plugins.site, text)
    out = tmp_path / "o"
    r = _run(plugins, "oneshot", "--only", "env-pairing", "--out", out)
    line = _one_error_line(r)
    assert str(eps) in line and why in line and "import torch" in line, line
    assert not out.exists()  # nothing run
    for args in (("list",), ("stage", "selection-map", "--T", "64")):
        assert _one_error_line(_run(plugins, *args)) == line


def test_b19_3_b_report_and_compare_treat_it_as_a_fifo_entry_points(plugins, tmp_path):
    """report / compare of an earlier run: unaffected by either (they import no torch), as before for a FIFO."""
    out = tmp_path / "o"
    r = _run(plugins, "oneshot", "--only", "sanity", "--out", out, "--device", "cpu")
    assert r.returncode == 0, r.stderr[-3000:]
    eps = _junk(plugins.site, b"[console_scripts]\njunk\n")
    results = {}
    for kind in ("malformed", "fifo"):
        if kind == "fifo":
            eps.unlink()
            os.mkfifo(eps)
        run = out / "testrun"
        results[kind] = (_run(plugins, "report", run).returncode, _run(plugins, "compare", run, run).returncode,
                         _run(plugins, "list").returncode)
    assert results["malformed"] == results["fifo"] == (0, 0, 2), results
