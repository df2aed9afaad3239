"""Bad days, red-team round 20 (part B) B20-3, through the CLI: a triton dist-info first on sys.path whose METADATA
cannot be read (latin-1, a FIFO) made env-pairing say "triton not installed (fix: pip install triton)" and skip its
triton launch check, though ``import triton`` works (``envinfo.dist_version`` returned None = not installed for an
unreadable one). Expected: the unreadable file said as a fact naming it, the version from the module, the launch
check run. The same hole in FA-4's build facts: an installed CuTe DSL library whose metadata cannot be read was
"missing"."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

try:
    from _bad_days import cli_cmd, env_with, make, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, env_with, make, manifest

LATIN1 = b"Metadata-Version: 2.1\nName: %s\nVersion: %s\nAuthor: J\xfcrgen M\xfcller\n"


def _unreadable(info, kind: str, name: bytes, version: bytes) -> str:
    info.mkdir()
    if kind == "fifo":
        os.mkfifo(info / "METADATA")
        return "METADATA is not a regular file"
    (info / "METADATA").write_bytes(LATIN1 % (name, version))
    return "METADATA cannot be read: not UTF-8"


def _env_pairing(env, out) -> tuple[dict, dict, str]:
    r = subprocess.run(cli_cmd("oneshot", "--only", "env-pairing", "--out", out, "--device", "cpu", "--timeout", "60"),
                       env=env_with(env), capture_output=True, text=True, timeout=300)
    (rec,) = manifest(out)["stages"]
    assert rec["status"] in ("PASS", "FAIL"), (rec["status"], rec["reason"], r.stderr[-2000:])
    return rec, json.loads((out / "testrun" / "env.json").read_text()), (out / "testrun" / "env.txt").read_text()


@pytest.mark.parametrize("kind", ["fifo", "latin-1"])
def test_an_unreadable_triton_metadata_is_said_and_the_launch_check_still_runs(plugins, tmp_path, kind):
    import triton  # this venv's: the one the CLI imports too (the planted dist-info holds no module)

    env = make(plugins)
    said = _unreadable(plugins.site / "triton-3.9.0.dist-info", kind, b"triton", b"3.9.0")
    rec, doc, text = _env_pairing(env, tmp_path / "out")
    tri = doc["facts"]["triton"]
    # before: installed False, version None, "triton not installed (fix: pip install triton)", no launch
    assert tri["installed"] is True and tri["version"] == triton.__version__, tri
    assert tri["metadata_error"].startswith(f"triton's {said}"), tri
    assert str(plugins.site / "triton-3.9.0.dist-info") in tri["metadata_error"], tri
    checks = {c["check"]: c for c in doc["checks"]}
    assert checks["triton-launch"]["status"] == "ok", checks["triton-launch"]
    assert "pip install triton" not in text and f"triton's {said}" in text, text
    assert doc["paths"]["triton selection kernel"].startswith("yes"), doc["paths"]


def test_an_unreadable_cute_dsl_library_metadata_is_no_missing_library(plugins, tmp_path):
    """FA-4's build facts read the CuTe DSL library distributions' versions the same way: one installed whose
    METADATA is latin-1 was left out ("no CUDA (libs missing)")."""
    from tests import _fake_flash as fake

    env = make(plugins)
    fake._write_dist(plugins.site, "flash-attn-4", "4.0.0b36", {
        "flash_attn/cute/__init__.py": fake._CUTE_4_INIT, "flash_attn/cute/interface.py": fake._CUTE_4_INTERFACE})
    _unreadable(plugins.site / "nvidia_cutlass_dsl_libs_cu13-4.3.0.dist-info", "latin-1",
                b"nvidia-cutlass-dsl-libs-cu13", b"4.3.0")
    rec, doc, text = _env_pairing(env, tmp_path / "out")
    fa4 = next(p for p in doc["flash"] if p["module"] == "flash_attn.cute")
    libs = fa4["build"]["cutlass_dsl_libs"]
    assert list(libs) == ["cu13"], fa4["build"]  # before: {} ("no CUDA (libs missing)")
    assert libs["cu13"].startswith("installed, metadata unreadable: nvidia-cutlass-dsl-libs-cu13's METADATA cannot "
                                   "be read: not UTF-8"), libs
    assert "libs missing" not in fa4["build"]["built_for"], fa4["build"]
