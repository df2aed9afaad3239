"""Bad days, red-team round 24 U24-4, through the CLI: matplotlib reads MPLBACKEND at its import and refuses a name it
does not know, so with ``MPLBACKEND=nonsense`` every stage that draws failed in its own figure and report.html was not
written, found out only after the whole run. Expected: refused before any command, one line naming the variable,
exit 2, no run folder made; a backend matplotlib knows (a GUI one on a machine without a display too: nsa-run draws
on its own Agg canvases) and an empty value run as before."""

from __future__ import annotations

import subprocess
import sys

try:
    from _bad_days import MAIN, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with


def _nsa_run(env, *args):
    return subprocess.run([sys.executable, "-c", MAIN, *args], env=env, capture_output=True, text=True, timeout=600)


def test_an_unknown_mplbackend_is_refused_before_any_stage_runs(plugins, tmp_path):
    out = tmp_path / "out"
    r = _nsa_run(env_with(plugins.env(), MPLBACKEND="nonsense"), "oneshot", "--only", "selection-map",
                 "--out", str(out), "--device", "cpu")
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    assert "MPLBACKEND='nonsense' is not a backend matplotlib knows" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 2, r.stderr  # error + hint
    assert not out.exists() or not any(out.rglob("manifest.json")), list(out.rglob("*"))


def test_a_known_gui_backend_or_an_empty_value_runs_as_before(plugins, tmp_path):
    for i, value in enumerate(("TkAgg", "")):
        out = tmp_path / f"out{i}"
        r = _nsa_run(env_with(plugins.env(), MPLBACKEND=value), "oneshot", "--only", "selection-map",
                     "--out", str(out), "--device", "cpu")
        assert r.returncode == 0, (value, r.stdout[-2000:], r.stderr[-2000:])
        assert list(out.rglob("selection.png")) and list(out.rglob("report.html")), value
