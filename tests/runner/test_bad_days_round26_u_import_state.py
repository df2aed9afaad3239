"""Bad days, red-team round 26 U26-1 / U26-2, through the CLI: after plugin code nsa-run imports some of its own modules
lazily, and used whatever ``sys.path`` / ``sys.meta_path`` the plugin code left: a stage that took the standard
library's folders off ``sys.path``, or left a finder raising for every name in front of ``sys.meta_path``, had its PASS
recorded ERROR "process exited with code 1 without a result" (``No module named 'platform'`` at the worker's import of
``nsa_runner.manifest``); an adapter's call doing the same lost every selection-map verdict (``No module named
'html'``), the adapter not named. A stage leaking descriptors up to its limit had its PASS lost the same way ("Too
many open files" at that import and at the result's write). Expected: the import system's lists are put back after
the plugin code (an entry taken away, or shadowed, back in front; the worker, once the stage has ended, exactly as
before it), the worker keeps descriptors for its own result; every result stands, the adapter's log note names
what was put back. (Left: a finder raising for every name that an adapter adds stays, behind the saved ones.)"""

from __future__ import annotations

import resource
import subprocess

try:
    from _bad_days import cli_cmd, manifest, running_first, selection_map
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, manifest, running_first, selection_map

NO_STDLIB = ("import sys, sysconfig\n_std = {sysconfig.get_path('stdlib'), sysconfig.get_path('platstdlib')}\n"
             "_dyn = [p for p in sys.path if p.endswith('lib-dynload')]\n"
             "sys.path[:] = [p for p in sys.path if p not in _std and p not in _dyn and not p.endswith('.zip')]\n")
RAISING_FINDER = ("import sys\nclass _F:\n    def find_spec(self, name, path=None, target=None):\n"
                  "        raise ImportError('hook: ' + name)\n"
                  "if not any(type(f).__name__ == '_F' for f in sys.meta_path):\n    sys.meta_path.insert(0, _F())\n")
FD_LEAK = ("import os\n_kept = []\nwhile True:\n    try:\n        _kept.append(os.open(os.devnull, os.O_RDONLY))\n"
           "    except OSError:\n        break\nimport builtins\nbuiltins._r26_kept = _kept\n")
STAGES = running_first(("A", "r26pa", 11, NO_STDLIB), ("B", "r26pb", 12, RAISING_FINDER), ("C", "r26pc", 13, FD_LEAK))
ADAPTER = """
from nsa_runner.impls import Impl


def _select(q, k_cmp, cfg):
    exec(%r, {})
    from nsa_core import functional as F
    return F.select_blocks(q, k_cmp, cfg)


IMPL = Impl("r26q", {"select": _select})
"""


def _descriptors_1024() -> None:  # the runner's limit, which the worker inherits (the put-back limit, then)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))


def test_a_stage_leaving_the_import_system_or_no_descriptors_keeps_its_pass(plugins, tmp_path):
    plugins.make("r26-paths", "r26_paths", STAGES, {n: f"r26_paths:{a}" for a, n in
                                                     (("A", "r26pa"), ("B", "r26pb"), ("C", "r26pc"))})
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("oneshot", "--only", "r26pa,r26pb,r26pc", "--out", out, "--device", "cpu"),
                       env=plugins.env(), capture_output=True, text=True, timeout=900, preexec_fn=_descriptors_1024)
    recs = {s["name"]: (s["status"], s["reason"]) for s in manifest(out)["stages"]}
    # before: each ERROR "process exited with code 1 without a result"
    assert recs == {n: ("PASS", f"{n} ok") for n in ("r26pa", "r26pb", "r26pc")}, (recs, r.stderr[-2000:])
    log = (out / "testrun" / "logs" / "r26pa.log").read_text()
    assert "sys.path" in log and "put back" in log, log[-2000:]


def test_an_adapter_call_leaving_the_import_system_keeps_every_verdict(plugins, tmp_path):
    # (a finder raising for every name, added by an adapter, is kept, behind the saved ones: an entry plugin code adds
    # is a library's, kept for the next plugin, round 20 B20-4; it still stops imports that only later finders serve)
    for i in range(2):  # two: the second narrows sys.path again after the first one's was put back
        source = ADAPTER.replace("%r", repr(NO_STDLIB)).replace("r26q", f"r26q{i}")
        plugins.make(f"r26-adapter{i}", f"r26_adapter{i}", source, {f"r26q{i}": f"r26_adapter{i}:IMPL"},
                     version="1.0", group="nsa_runner.impls")
    r, rec, log = selection_map(plugins, tmp_path, "r26q0,r26q1,nsa_core")
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:])  # before: ERROR "No module named 'html'"
    assert "sys.path" in log and "put back" in log, log[-2000:]
