"""Bad days, red-team round 18 B-1, through the CLI: the built-in env-pairing stage listed the stage
plugins through importlib.metadata (``ep.dist.metadata["Name"]``, ``ep.dist.version``: blocking,
unbounded), though discovery reads distributions safely since round 17 (6edc6e4). A plugin whose
dist-info METADATA is a FIFO hung env-pairing to its timeout; a symlink loop there made it ERROR with an
OSError traceback, a latin-1 METADATA made it ERROR with a UnicodeDecodeError naming no file, while
``nsa-run list`` named that plugin broken and went on.

Expected: env-pairing reads them the same safe way: such a plugin is listed as unreadable (env.json's
``error``, env.txt), naming the file and why; the other plugins are listed with their versions and the
stage's verdict is its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

try:
    from _bad_days import MAIN, env_with, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with, manifest

GOOD = """
from nsa_runner import Stage, StageResult, Status
class Ok(Stage):
    name, order = "ok18d", 17
    def run(self, ctx): return StageResult(Status.PASS, "ok")
"""


def test_b1_env_pairing_lists_a_plugin_with_unreadable_metadata_and_goes_on(plugins, tmp_path):
    plugins.make("r18d-ok", "r18d_ok_mod", GOOD, {"ok18d": "r18d_ok_mod:Ok"}, version="4.5.6")
    loop = plugins.site / "r18d_loop-1.0.dist-info"
    loop.mkdir()
    (loop / "METADATA").symlink_to("METADATA")  # a symlink loop: ELOOP
    (loop / "entry_points.txt").write_text("[nsa_runner.stages]\nloop18d = r18d_ok_mod:Ok\n")
    fifo = plugins.site / "r18d_fifo-1.0.dist-info"
    fifo.mkdir()
    os.mkfifo(fifo / "METADATA")  # nobody ever writes it: a blocking read waits forever
    (fifo / "entry_points.txt").write_text("[nsa_runner.stages]\nfifo18d = r18d_ok_mod:Ok\n")
    latin = plugins.site / "r18d_latin-1.0.dist-info"  # the likeliest in practice: METADATA not UTF-8
    latin.mkdir()
    (latin / "METADATA").write_bytes(b"Metadata-Version: 2.1\nName: r18d-latin\nVersion: 1.0\nAuthor: J\xfcrgen\n")
    (latin / "entry_points.txt").write_text("[nsa_runner.stages]\nlatin18d = r18d_ok_mod:Ok\n")
    out = tmp_path / "o"
    env = env_with(plugins.env(), NSA_RUN_SPARE_WORKER="0")
    r = subprocess.run([sys.executable, "-c", MAIN, "oneshot", "--only", "env-pairing,ok18d", "--out", out],
                       env=env, capture_output=True, text=True, timeout=900)
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    stages = {s["name"]: s for s in manifest(out)["stages"]}
    assert stages["ok18d"]["status"] == "PASS", stages
    assert stages["env-pairing"]["status"] not in ("ERROR", "TIMEOUT"), (stages["env-pairing"], r.stdout[-2000:])
    run_dir = out / "testrun"
    envj = json.loads(next(run_dir.rglob("env.json")).read_text())
    by_dist = {p["dist"]: p for p in envj["plugins"]}
    assert by_dist["r18d-ok"]["name"] == "ok18d" and by_dist["r18d-ok"]["version"] == "4.5.6", by_dist
    assert "error" not in by_dist["r18d-ok"], by_dist
    errors = [p["error"] for p in envj["plugins"] if p.get("error")]
    assert len(errors) == 3, envj["plugins"]
    assert any(str(loop / "METADATA") in e and "symbolic links" in e for e in errors), errors
    assert any(str(fifo / "METADATA") in e and "FIFO" in e for e in errors), errors
    assert any(str(latin) in e and "UnicodeDecodeError" in e for e in errors), errors
    text = next(run_dir.rglob("env.txt")).read_text()
    assert text.count("unreadable: ") == 3 and "ok18d" in text, text
