"""Bad days, red-team round 20 (part B) B20-4, through the CLI: the put-back of torch's attributes (round 19 e61aba6,
also run around each plugin import by d81c6e8) DELETED an attribute a library ADDED to torch at its import while the
library stayed imported: an adapter whose import adds ``torch.Tensor.mylib_prepare`` and whose ``select`` uses it
FAILed (AttributeError), a healthy plugin using ``torch.libx`` (added by a vendor library another plugin imported
first) was listed broken and recorded ERROR.

Expected: a new attribute that hides nothing of torch's is kept (what torch has, rebound or deleted, is still put
back: round 19's test); the adapter PASSes, the plugin runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

try:
    from _bad_days import MAIN
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN

ADAPTER = '''
import torch
from nsa_runner.impls import Impl

def _contig_f32(self):
    return self.contiguous().float()

if not hasattr(torch.Tensor, "mylib_prepare"):  # a library's own helper, added at its import
    torch.Tensor.mylib_prepare = _contig_f32

def _select(q, k_cmp, cfg):
    from nsa_core import functional as F
    return F.select_blocks(q.mylib_prepare(), k_cmp.mylib_prepare(), cfg)

def make():
    return Impl(name="addi", parts={"select": _select}, description="select through a Tensor helper added at import")
'''


def _manifest(out: Path) -> dict:
    return json.loads((out / "testrun" / "manifest.json").read_text())


def test_a_tensor_helper_an_adapter_adds_at_import_is_kept(plugins, tmp_path):
    plugins.make("addi-impl", "addimpl20f", ADAPTER, {"addi": "addimpl20f:make"}, version="0.1",
                 group="nsa_runner.impls")
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-c", MAIN, "stage", "selection-map", "--impl", "addi,nsa_core",
                        "--device", "cpu", "--out", str(out)], env=plugins.env(), text=True, capture_output=True,
                       timeout=600)
    (rec,) = _manifest(out)["stages"]
    log = (out / "testrun" / "logs" / "selection-map.log").read_text(errors="replace")
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:], log[-3000:])  # before: FAIL, AttributeError
    assert r.returncode == 0
    assert "mylib_prepare" not in log, log[-3000:]  # kept, never "put back"


def _plugin(site: Path, n: str, cls: str, body: str) -> None:
    site.mkdir(parents=True)
    (site / f"px{n}20f.py").write_text(textwrap.dedent(body) + textwrap.dedent(f"""
        from nsa_runner import Stage, StageResult, Status
        class {cls}(Stage):
            name = "x{n}20f"; order = 9
            def run(self, ctx): return StageResult(Status.PASS, "x{n} ok")
        """))
    info = site / f"px{n}20f_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: px{n}20f-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[nsa_runner.stages]\nx{n}20f = px{n}20f:{cls}\n")


def test_a_namespace_a_shared_library_adds_to_torch_at_import_is_kept(plugins, tmp_path):
    """x0's import loads torch, xa's loads the vendor library (adding ``torch.libx``), xb's uses ``torch.libx``."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libx20f.py").write_text(
        "import torch, types\nif not hasattr(torch, 'libx20f'):\n"
        "    torch.libx20f = types.SimpleNamespace(fused_norm=lambda x: x / x.norm())\n")
    sites = [tmp_path / s for s in ("s0", "s1", "s2")]
    _plugin(sites[0], "0", "Z", "import torch\n")
    _plugin(sites[1], "a", "A", "import torch, libx20f\n")
    _plugin(sites[2], "b", "B", "import torch, libx20f\nNORM = torch.libx20f.fused_norm\n")
    env = plugins.env()
    env["PYTHONPATH"] = ":".join([*map(str, sites), str(lib), env["PYTHONPATH"]])
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-c", MAIN, "stage", "xb20f", "--device", "cpu", "--out", str(out)],
                       env=env, text=True, capture_output=True, timeout=600)
    (rec,) = _manifest(out)["stages"]
    assert rec["status"] == "PASS", (rec, r.stdout[-2000:], r.stderr[-2000:])  # before: ERROR, no attribute 'libx20f'
    assert r.returncode == 0
