"""Bad days, red-team round 18 (part B) B-1, the flash part, through the CLI: an installed flash-attn distribution
(not a plugin) whose dist-info METADATA is a FIFO hung env-pairing until its timeout: ``envinfo`` and the flash
probe read it through importlib.metadata (blocking, whole). Expected: no hang; the record names the file."""

from __future__ import annotations

import json
import os
import subprocess

try:
    from _bad_days import cli_cmd, env_with, make, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, env_with, make, manifest


def test_a_flash_attn_distribution_with_a_fifo_metadata_does_not_hang_env_pairing(plugins, tmp_path):
    env = make(plugins)
    info = plugins.site / "flash_attn-2.6.3.dist-info"
    info.mkdir()
    os.mkfifo(info / "METADATA")
    out = tmp_path / "out"
    r = subprocess.run(cli_cmd("oneshot", "--only", "env-pairing", "--out", out, "--device", "cpu", "--timeout", "120"),
                       env=env_with(env), capture_output=True, text=True, timeout=400)
    (rec,) = manifest(out)["stages"]
    assert rec["status"] in ("PASS", "FAIL"), (rec["status"], rec["reason"], r.stderr[-2000:])  # before: TIMEOUT
    doc = json.loads((out / "testrun" / "env.json").read_text())
    assert "flash-attn's METADATA is not a regular file" in json.dumps(doc), json.dumps(doc.get("flash"))[:3000]
