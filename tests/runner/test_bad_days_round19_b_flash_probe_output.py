"""Bad days, red-team round 19 (part B) B19-7, through the CLI: env-pairing's flash probe read its records from the
probe child's stdout, which the flash package's own import writes to: a progress message without a newline glued
onto the first record, which was dropped, and a working FA-2 became "BROKEN: not probed (exit status 0)" (env-pairing
PASS -> FAIL). Expected: the records travel on their own channel; what the package printed is in the stage log."""

from __future__ import annotations

import json
import subprocess

try:
    from _bad_days import cli_cmd, env_with, make, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, env_with, make, manifest

CHATTY_FA2 = """\
import sys; sys.stdout.write("flash_attn: loading kernels... ")   # a progress message without a newline
__version__ = "2.6.3"
import flash_attn_2_cuda
def flash_attn_func(*a, **k): pass
def flash_attn_varlen_func(*a, **k): pass
"""


def test_a_flash_package_printing_on_import_never_changes_the_verdict(plugins, tmp_path):
    env = make(plugins)
    (plugins.site / "flash_attn").mkdir()
    (plugins.site / "flash_attn" / "__init__.py").write_text(CHATTY_FA2)
    (plugins.site / "flash_attn_2_cuda.py").write_text("def fwd(*a, **k): pass\n")
    out = tmp_path / "out"
    r = subprocess.run(cli_cmd("oneshot", "--only", "env-pairing", "--out", out, "--device", "cpu", "--timeout", "120"),
                       env=env_with(env), capture_output=True, text=True, timeout=300)
    (rec,) = manifest(out)["stages"]
    doc = json.loads((out / "testrun" / "env.json").read_text())
    fa2 = next(p for p in doc["flash"] if p["module"] == "flash_attn")
    assert fa2["ok"] is True, (fa2, rec["reason"], r.stderr[-2000:])  # before: "not probed (exit status 0)"
    assert "FA-2 ok" in rec["reason"] and rec["status"] == "PASS", rec
    # what the package printed is kept for diagnosis, in the stage's log, never taken as a record
    log = (out / "testrun" / "logs" / "env-pairing.log").read_text()
    assert "flash_attn: loading kernels..." in log, log[-3000:]
