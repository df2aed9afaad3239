"""Bad days, red-team round 19 (part B) B19-6, through the CLI: env-pairing's flash probe read its child's output
through pipes and waited for their EOF: a flash_attn whose import starts a helper process (it inherits stdout /
stderr) stalled env-pairing until the helper ended (300 s, the probe's timeout, for a daemon). Expected: the probe
stops once its child has exited and ends the child's whole tree: the helper never runs to its end."""

from __future__ import annotations

import json
import subprocess

try:
    from _bad_days import alive, cli_cmd, env_with, make, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import alive, cli_cmd, env_with, make, manifest

HELPER_FA2 = """\
import os, subprocess
# a helper daemon: a session of its own, inherits stdout / stderr; it writes MARK only if it lives 30 s
h = subprocess.Popen(["sh", "-c", 'sleep 30; echo lived > "$B19_6_MARK"'], start_new_session=True)
with open(os.environ["B19_6_PID"], "w") as f:
    f.write(str(h.pid))
__version__ = "2.6.3"
import flash_attn_2_cuda
def flash_attn_func(*a, **k): pass
def flash_attn_varlen_func(*a, **k): pass
"""


def test_a_helper_a_flash_import_starts_neither_stalls_the_probe_nor_outlives_it(plugins, tmp_path):
    env = make(plugins)
    (plugins.site / "flash_attn").mkdir()
    (plugins.site / "flash_attn" / "__init__.py").write_text(HELPER_FA2)
    (plugins.site / "flash_attn_2_cuda.py").write_text("def fwd(*a, **k): pass\n")
    out, mark, pid = tmp_path / "out", tmp_path / "helper-lived", tmp_path / "helper.pid"
    r = subprocess.run(cli_cmd("oneshot", "--only", "env-pairing", "--out", out, "--device", "cpu", "--timeout", "120"),
                       env=env_with(env, B19_6_MARK=mark, B19_6_PID=pid), capture_output=True, text=True, timeout=300)
    (rec,) = manifest(out)["stages"]
    assert rec["status"] == "PASS" and "FA-2 ok" in rec["reason"], (rec, r.stderr[-2000:])
    # before: the probe waited for the helper's EOF, i.e. for it to end (it wrote the mark); now it is killed
    # with the probe's tree as soon as the probe child has exited
    assert not mark.exists(), "env-pairing waited for the flash import's helper to end"
    assert pid.is_file() and not alive(int(pid.read_text()))
    doc = json.loads((out / "testrun" / "env.json").read_text())
    assert next(p for p in doc["flash"] if p["module"] == "flash_attn")["ok"] is True
