"""Bad days, red-team round 20 (part B) B20-4, the import-machinery form, through the CLI: discovery put sys.meta_path
(and sys.path, sys.path_hooks) back to what it was before each plugin's import (round 19 d81c6e8), taking away what a
library registers once at its import while it stays imported: after one plugin's ``import six``, six's meta-path
importer was gone and the next plugin's ``from six.moves import urllib`` failed (listed broken, ``stage`` ERROR).

Expected: what an import added is kept (after the earlier entries: it shadows nothing); what it took away is put back.
Here a vendored library registers a meta-path importer for its virtual ``vend20m.moves`` module, as six does.
"""

from __future__ import annotations

import json
import subprocess
import sys

try:
    from _bad_days import MAIN
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN

VENDOR = '''
import importlib.abc, importlib.util, sys, types

__path__ = []  # a module that lets submodules be found (six does the same)

class _Moves(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name == "vend20m.moves" else None
    def create_module(self, spec):
        return types.ModuleType(spec.name)
    def exec_module(self, module):
        module.answer = 42

sys.meta_path.append(_Moves())  # once, at the library's import (six does the same)
'''
STAGE = ("from nsa_runner import Stage, StageResult, Status\n"
         "class S(Stage):\n    name = {name!r}; order = {order}\n"
         "    def run(self, ctx): return StageResult(Status.PASS, 'ok')\n")


def _plugin(site, mod: str, stage: str, order: int, head: str) -> None:
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{mod}.py").write_text(head + STAGE.format(name=stage, order=order))
    info = site / f"{mod}_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {mod}-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[nsa_runner.stages]\n{stage} = {mod}:S\n")


def test_an_import_hook_a_library_registers_at_its_import_stays_for_the_next_plugin(plugins, tmp_path):
    lib, first, second = tmp_path / "lib", tmp_path / "s1", tmp_path / "s2"
    lib.mkdir()
    (lib / "vend20m.py").write_text(VENDOR)
    _plugin(first, "pa20m", "sa20m", 10, "import vend20m\n")  # imported first: loads the library
    _plugin(second, "pb20m", "sb20m", 11, "from vend20m.moves import answer\nassert answer == 42\n")
    env = plugins.env()
    env["PYTHONPATH"] = ":".join([str(first), str(second), str(lib), env["PYTHONPATH"]])
    listed = subprocess.run([sys.executable, "-c", MAIN, "list", "--json"], env=env, text=True, capture_output=True,
                            timeout=600)
    rows = {s["name"]: s for s in json.loads(listed.stdout)["stages"]}
    # before: sb20m not runnable, "broken: ... ModuleNotFoundError: No module named 'vend20m.moves'"
    assert rows["sb20m"]["runs_here"], rows["sb20m"]["why_not"]
    assert rows["sa20m"]["runs_here"], rows["sa20m"]["why_not"]
    assert listed.returncode == 0, listed.stderr[-2000:]
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-c", MAIN, "stage", "sb20m", "--device", "cpu", "--out", str(out)],
                       env=env, text=True, capture_output=True, timeout=600)
    (rec,) = json.loads((out / "testrun" / "manifest.json").read_text())["stages"]
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:])
    assert r.returncode == 0
