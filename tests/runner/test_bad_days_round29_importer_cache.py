"""Bad days, red-team round 29 B29-1, through the CLI: plugin code that empties ``sys.path_hooks`` for a moment while it
tries an optional import (``sys.path_importer_cache.clear()`` then an import) leaves None cached for every folder of
``sys.path``; the three import lists are then as saved, so nothing was put back, and nsa-run's own next import failed
("No module named 'platform'" / 'filelock'): a stage's PASS (from its ``run()`` or its module's import) recorded ERROR
"process exited with code 1 without a result"; an adapter doing it at its import lost every selection-map verdict,
nsa_core's too. Expected: ``sys.path_importer_cache`` put back with the lists; every result stands."""

from __future__ import annotations

import subprocess

try:
    from _bad_days import cli_cmd, manifest, running_first, selection_map
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, manifest, running_first, selection_map

NO_HOOKS = ("import sys\n_hooks = list(sys.path_hooks)\nsys.path_hooks[:] = []\nsys.path_importer_cache.clear()\n"
            "try:\n    import r29_optional_speedup\nexcept ImportError:\n    pass\nsys.path_hooks[:] = _hooks\n")
STAGES = running_first(("A", "r29c", 11, NO_HOOKS))
AT_IMPORT = NO_HOOKS + """
from nsa_runner import Stage, StageResult, Status

class B(Stage):
    name, order, timeout_s = "r29d", 12, 120.0
    def run(self, ctx):
        return StageResult(Status.PASS, "r29d ok")
"""
ADAPTER = NO_HOOKS + """
from nsa_runner.impls import Impl


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F
    return F.select_blocks(q, k_cmp, cfg)


IMPL = Impl("r29i", {"select": _select})
"""


def test_an_importer_cache_left_without_finders_is_put_back_after_a_stage(plugins, tmp_path):
    plugins.make("r29-cache", "r29_cache", STAGES, {"r29c": "r29_cache:A"})
    plugins.make("r29-cache-import", "r29_cache_import", AT_IMPORT, {"r29d": "r29_cache_import:B"})
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("oneshot", "--only", "r29c,r29d", "--out", out, "--device", "cpu"), env=plugins.env(),
                       capture_output=True, text=True, timeout=900)
    recs = {s["name"]: (s["status"], s["reason"]) for s in manifest(out)["stages"]}
    # before: both ERROR "process exited with code 1 without a result"
    assert recs == {"r29c": ("PASS", "r29c ok"), "r29d": ("PASS", "r29d ok")}, (recs, r.stderr[-2000:])


def test_an_importer_cache_left_without_finders_is_put_back_after_an_adapters_import(plugins, tmp_path):
    plugins.make("r29-adapter", "r29_adapter", ADAPTER, {"r29i": "r29_adapter:IMPL"}, version="1.0",
                 group="nsa_runner.impls")
    r, rec, _ = selection_map(plugins, tmp_path, "r29i,nsa_core")
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:])  # before: ERROR, every verdict lost
