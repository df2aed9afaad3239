"""Bad days, red-team round 19 (part B) B19-1, through the CLI: a torch dist-info first on sys.path whose METADATA is a
FIFO hung env-pairing (``envinfo.torch_triton_requirement`` read torch's requirements through importlib.metadata,
blocking and whole); a latin-1 METADATA made it ERROR (UnicodeDecodeError naming no file). Expected: PASS / FAIL, the
unreadable file said as a fact in env.json / env.txt."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

try:
    from _bad_days import cli_cmd, env_with, make, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, env_with, make, manifest


@pytest.mark.parametrize("kind", ["fifo", "latin-1"])
def test_an_unreadable_torch_metadata_is_a_fact_not_a_hang_or_an_error(plugins, tmp_path, kind):
    env = make(plugins)
    info = plugins.site / "torch-9.9.dist-info"
    info.mkdir()
    if kind == "fifo":
        os.mkfifo(info / "METADATA")
        said = "torch's METADATA is not a regular file"
    else:
        (info / "METADATA").write_bytes(b"Metadata-Version: 2.1\nName: torch\nVersion: 9.9\nAuthor: J\xfcrgen\n"
                                        b"Requires-Dist: triton==3.3.0\n")
        said = "torch's METADATA cannot be read: not UTF-8"
    out = tmp_path / "out"
    # --timeout 60: before the fix the FIFO run hung to it (TIMEOUT), the latin-1 run was an ERROR at once
    r = subprocess.run(cli_cmd("oneshot", "--only", "env-pairing", "--out", out, "--device", "cpu", "--timeout", "60"),
                       env=env_with(env), capture_output=True, text=True, timeout=300)
    (rec,) = manifest(out)["stages"]
    assert rec["status"] in ("PASS", "FAIL"), (rec["status"], rec["reason"], r.stderr[-2000:])
    doc = json.loads((out / "testrun" / "env.json").read_text())
    note = doc["facts"]["torch_triton_requirement"]["note"]
    assert note.startswith(said), note
    assert said in (out / "testrun" / "env.txt").read_text()


def test_an_undecodable_flash_attn_metadata_is_named_in_its_build_facts(plugins, tmp_path):
    """The same root in ``envinfo.flash_build`` (the other importlib.metadata read of env-pairing): a latin-1
    flash-attn METADATA gave the build facts a bare "UnicodeDecodeError: ..." naming no file."""
    env = make(plugins)
    info = plugins.site / "flash_attn-2.6.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_bytes(b"Metadata-Version: 2.1\nName: flash-attn\nVersion: 2.6.3\nAuthor: J\xfcrgen\n")
    out = tmp_path / "out"
    r = subprocess.run(cli_cmd("oneshot", "--only", "env-pairing", "--out", out, "--device", "cpu", "--timeout", "60"),
                       env=env_with(env), capture_output=True, text=True, timeout=300)
    (rec,) = manifest(out)["stages"]
    assert rec["status"] in ("PASS", "FAIL"), (rec["status"], rec["reason"], r.stderr[-2000:])
    doc = json.loads((out / "testrun" / "env.json").read_text())
    fa2 = next(p for p in doc["flash"] if p["module"] == "flash_attn")
    assert fa2["build"]["error"].startswith("flash-attn's metadata cannot be read: not UTF-8"), fa2["build"]
