"""Bad days, red-team round 20 (part B) B20-5, through the CLI: an installed torch device backend (an entry point
of group ``torch.backends``, which ``import torch`` imports and calls unless TORCH_DEVICE_BACKEND_AUTOLOAD is set
to anything but "1") that prints when loaded made ``list --json`` / ``list --impls --json`` / ``oneshot --json``
stdout not JSON: the CLI process imports torch (its CUDA check) with its own stdout in place. Expected: stdout is
the JSON alone; what the backend printed with ``print`` shows on stderr, what it wrote on fd 1 goes nowhere."""

from __future__ import annotations

import json
import subprocess
import sys

try:
    from _bad_days import MAIN, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with

AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"


def _run(plugins, *args, **env):
    e = env_with(plugins.env(), NSA_RUN_SPARE_WORKER="0", **env)
    if AUTOLOAD not in env:
        e.pop(AUTOLOAD, None)  # torch's default: every backend loaded
    return subprocess.run([sys.executable, "-c", MAIN, *map(str, args)], env=e, capture_output=True, text=True,
                          timeout=300)


def _backend(site, value: str):
    """The dist-info of a device backend (no plugin of nsa-run): ``[torch.backends] tb = <value>``."""
    info = site / "tb_backend-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tb-backend\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[torch.backends]\ntb = {value}\n")
    return info / "entry_points.txt"


LOUD = '''\
import os
import sys


def init():
    print("tb: accelerator backend loaded (v0.3)")
    sys.__stdout__.write("tb: to sys.__stdout__\\n")
    os.write(1, b"tb: to fd 1\\n")
'''


def test_b20_5_a_backend_printing_at_load_leaves_json_stdout_pure(plugins, tmp_path):
    (plugins.site / "tbmod.py").write_text(LOUD)
    _backend(plugins.site, "tbmod:init")
    for args in (("list", "--json"), ("list", "--impls", "--json"),
                 ("oneshot", "--only", "summary", "--json", "--out", tmp_path / "o")):
        r = _run(plugins, *args)
        assert r.returncode == 0, (args, r.stdout[-2000:], r.stderr[-3000:])
        assert "tb:" not in r.stdout, (args, r.stdout[:300])
        json.loads(r.stdout)  # the JSON alone
        assert "tb: accelerator backend loaded (v0.3)" in r.stderr, (args, r.stderr[-2000:])  # shown, not lost
