"""Bad days, red-team round 22 B22-2, through the CLI: a ``[torch.backends]`` init that fails only in the stage's
process (a careless backend: a lock file it takes at its first load and never releases, so the CLI's own check
passes) gave the stage's ERROR "Only a single TORCH_LIBRARY ..." (torch's second import in that process), naming
neither the backend nor its error. Expected: the stage's reason also says what ``import torch`` says in a fresh
process (the backend's entry point and its error), with the way out as the hint."""

from __future__ import annotations

import subprocess

try:
    from _bad_days import cli_cmd, env_with, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, env_with, manifest


def test_a_backend_failing_only_in_the_stages_process_is_named_in_its_error(plugins, tmp_path):
    lock = tmp_path / "backend.lock"
    info = plugins.site / "tb_lock-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tb-lock\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntb = tb_lock:init\n")
    (plugins.site / "tb_lock.py").write_text(
        "import os\n"
        "def init():\n"
        f"    if os.path.exists({str(lock)!r}):\n"
        "        raise ImportError('tb: device busy (lock held)')\n"
        f"    open({str(lock)!r}, 'w').close()\n")
    env = plugins.env()
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("oneshot", "--only", "env-pairing", "--out", out, "--device", "cpu"),
                       env=env_with(env), capture_output=True, text=True, timeout=600)
    assert r.returncode == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-3000:])
    (rec,) = manifest(out)["stages"]
    assert rec["status"] == "ERROR", rec
    assert "device busy" in rec["reason"] and "tb = tb_lock:init" in rec["reason"], rec["reason"]
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in rec["hint"], rec["hint"]
