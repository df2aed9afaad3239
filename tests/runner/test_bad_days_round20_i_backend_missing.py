"""Bad days, red-team round 20 (part B) B20-6, through the CLI: a well-formed ``[torch.backends]`` entry point
(which ``import torch`` imports and calls unless TORCH_DEVICE_BACKEND_AUTOLOAD is set to anything but "1") whose
module is gone (the stale dist-info of an uninstalled backend) failed ``import torch`` in every stage ("Only a
single TORCH_LIBRARY ...", naming nothing) while ``list`` showed every stage runnable. Expected: as for an
entry_points.txt importlib cannot parse (round 19 B19-3): refused up front, exit 2, one line naming the file, the
entry point and the way out; with TORCH_DEVICE_BACKEND_AUTOLOAD=0 (torch then loads no backend) nothing is refused
and the stage runs."""

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


def _one_error_line(r) -> str:
    assert "Traceback" not in r.stderr and "TORCH_LIBRARY" not in r.stderr + r.stdout, r.stderr[-3000:]
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 2 and len(err) == 1, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    return err[0]


def test_b20_6_a_backend_entry_point_of_a_missing_module_is_named_up_front(plugins, tmp_path):
    eps = _backend(plugins.site, "missing_tb:init")
    out = tmp_path / "o"
    r = _run(plugins, "oneshot", "--only", "env-pairing", "--out", out)
    line = _one_error_line(r)
    assert (f"{eps}: [torch.backends] tb = missing_tb:init: module missing_tb not found: import torch fails with it "
            f"(uninstall that distribution, or set {AUTOLOAD}=0)") in line, line
    assert not out.exists()  # nothing run
    assert _one_error_line(_run(plugins, "list")) == line
    # torch loads no backend then (its test: the variable is "1" or unset): nothing refused, the stage runs
    r = _run(plugins, "list", **{AUTOLOAD: "0"})
    assert r.returncode == 0 and "error:" not in r.stderr, (r.stdout[-2000:], r.stderr[-3000:])
    r = _run(plugins, "oneshot", "--only", "env-pairing", "--json", "--out", out, **{AUTOLOAD: "0"})
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert [s["status"] for s in json.loads(r.stdout)["stages"]] == ["PASS"], r.stdout[-2000:]


def test_b20_6_b_a_dotted_module_under_a_missing_package_is_named(plugins):
    eps = _backend(plugins.site, "gone_pkg.backend:init")
    line = _one_error_line(_run(plugins, "list"))
    assert f"{eps}: [torch.backends] tb = gone_pkg.backend:init: module gone_pkg not found" in line, line
