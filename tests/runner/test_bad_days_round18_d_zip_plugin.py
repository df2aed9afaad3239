"""Bad days, red-team round 18 B-2, through the CLI: a plugin distribution inside a zip on PYTHONPATH
(``importlib.metadata`` finds it through ``zipfile.Path``) was no longer discovered after round 17's safe
reading of distribution files (6edc6e4): ``os.open("<zip>/<dist-info>/entry_points.txt")`` failed with
NotADirectoryError, taken for "nothing there", so the plugin was neither listed nor named broken and
``--only`` called its stage unknown.

Expected: it is discovered as before (its files read through the zip's own path object, bounded), and
runs; a member that cannot be read (a bad CRC) makes it "broken", naming the file and why, never dropped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

try:
    from _bad_days import MAIN, env_with, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with, manifest

MOD = """from nsa_runner import Stage, StageResult, Status
class Z(Stage):
    name, order, timeout_s = "zz18d", 80, 30.0
    def run(self, ctx): return StageResult(Status.PASS, "zip ok")
"""
META = b"Metadata-Version: 2.1\nName: p-zip18d\nVersion: 1.0\n"


def _zip(path, meta: bytes = META):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("m_zip18d.py", MOD)
        z.writestr("p_zip18d-1.0.dist-info/METADATA", meta)
        z.writestr("p_zip18d-1.0.dist-info/entry_points.txt", "[nsa_runner.stages]\nzz18d = m_zip18d:Z\n")
    return path


def _run(plugins, zip_path, *args):
    env = env_with(plugins.env(), NSA_RUN_SPARE_WORKER="0")
    env["PYTHONPATH"] = os.pathsep.join([str(zip_path), env["PYTHONPATH"]])
    return subprocess.run([sys.executable, "-c", MAIN, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=300)


def _stages(r, rc: int = 0) -> dict[str, dict]:
    assert r.returncode == rc and "Traceback" not in r.stderr, (r.returncode, r.stderr[-3000:])
    return {s["name"]: s for s in json.loads(r.stdout)["stages"]}


def test_b2_a_plugin_in_a_zip_is_listed_and_runs(plugins, tmp_path):
    zp = _zip(tmp_path / "plug.zip")
    stages = _stages(_run(plugins, zp, "list", "--json"))
    assert "zz18d" in stages, sorted(stages)
    assert stages["zz18d"]["runs_here"], stages["zz18d"]
    assert "p-zip18d" in json.dumps(stages["zz18d"]), stages["zz18d"]
    out = tmp_path / "o"
    r = _run(plugins, zp, "oneshot", "--only", "zz18d", "--out", out)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert [(s["name"], s["status"]) for s in manifest(out)["stages"]] == [("zz18d", "PASS")]


def _bad_crc_zip(tmp_path):
    zp = _zip(tmp_path / "plug.zip", META.replace(b"p-zip18d", b"p-ZIP18D"))
    data = zp.read_bytes()
    zp.write_bytes(data.replace(b"p-ZIP18D", b"p-zip18d", 1))  # the stored bytes no longer match their CRC
    return zp


def test_b2_b_an_unreadable_member_names_the_plugin_broken(plugins, tmp_path, monkeypatch):
    """With torch's device-backend autoload off (``import torch`` then reads no distribution's files), a bad
    CRC in the plugin's METADATA makes that plugin "broken", naming the file and why, never dropped, and the
    built-in stages still run."""
    monkeypatch.setenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    stages = _stages(_run(plugins, _bad_crc_zip(tmp_path), "list", "--json"), rc=1)  # (exit 1: a broken plugin)
    broken = [s for s in stages.values() if s["why_not"].startswith("broken")]
    assert len(broken) == 1, broken
    assert "METADATA" in broken[0]["why_not"] and "CRC" in broken[0]["why_not"], broken
    assert stages["sanity"]["runs_here"], sorted(stages)


def test_b2_b_with_autoload_import_torch_itself_fails_and_is_named(plugins, tmp_path, monkeypatch):
    """With the autoload on (torch's default) ``import torch`` reads every distribution's metadata for its
    ``torch.backends`` entry points and raises on the bad CRC: no stage can run, so exit 2 naming the file,
    why, and that torch fails with it (found by CI on c0709ca: round 19's check made this exit 2, the test
    above then still expected a runnable sanity, which torch cannot give here)."""
    monkeypatch.delenv("TORCH_DEVICE_BACKEND_AUTOLOAD", raising=False)
    r = _run(plugins, _bad_crc_zip(tmp_path), "list", "--json")
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == "", (r.returncode, r.stderr[-3000:])
    assert "METADATA" in r.stderr and "CRC" in r.stderr and "import torch fails" in r.stderr, r.stderr
