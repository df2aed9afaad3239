"""Bad days, red-team round 14 (part A) BR-3d, through the CLI: a plugin whose import swapped nsa-run's
plugin discovery temp folder (``$TMPDIR/nsa-run-discover-<pid>-*``) for a symlink to an outside folder
(or a file): the discovery child wrote ``result.jsonl`` into the outside folder through the link, and
``nsa-run list`` ended "OSError: Cannot call rmtree on a symbolic link (unexpected)", exit 2, no plugin
named; ``oneshot`` could not start either.

Expected (as for the stages' temp folders, BR-3): the folder is opened once and used through its
descriptor; the plugin whose import did it is listed as broken, naming the folder; nothing outside is
written or removed; the other stages are listed and run; nothing of nsa-run's is left in the temp folder.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with

SWAP = """
import glob, os, shutil
for d in glob.glob(os.path.join(os.environ["TMPDIR"], "nsa-run-discover-*")):
    if os.path.isdir(d) and not os.path.islink(d):
        os.rename(d, d + ".real")
        if os.environ["R15KD_HOW"] == "link":
            os.symlink(os.environ["R15KD_OUTSIDE"], d)
        else:
            open(d, "w").write("x")
from nsa_runner import Stage, StageResult, Status
class D(Stage):
    name, order = "dswap", 16
    def run(self, ctx): return StageResult(Status.PASS, "d")
"""

GOOD = """
from nsa_runner import Stage, StageResult, Status
class Ok(Stage):
    name, order = "okk", 17
    def run(self, ctx): return StageResult(Status.PASS, "ok")
"""


def _cli(env, *args):
    return subprocess.run([sys.executable, "-c", MAIN, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("how", ["link", "file"])
def test_a_plugin_swapping_the_discovery_folder_is_broken_and_nothing_outside_is_touched(plugins, tmp_path, how):
    plugins.make("r15k-swap", "r15k_swap_mod", SWAP, {"dswap": "r15k_swap_mod:D"})
    plugins.make("r15k-good", "r15k_good_mod", GOOD, {"okk": "r15k_good_mod:Ok"})
    tmp, outside = tmp_path / "tmp", tmp_path / "outside"
    tmp.mkdir()
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    env = env_with(plugins.env(), TMPDIR=str(tmp), R15KD_OUTSIDE=str(outside), R15KD_HOW=how,
                   NSA_RUN_SPARE_WORKER="0")
    r = _cli(env, "list", "--json")
    assert "Traceback" not in r.stderr and "unexpected" not in r.stderr, r.stderr[-3000:]
    assert r.returncode in (0, 1), (r.returncode, r.stderr[-3000:])
    listed = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    assert "okk" in listed and "sanity" in listed
    text = json.dumps(listed.get("dswap") or {})
    assert "nsa-run-discover-" in text and "plugin discovery temp folder" in text, text
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]  # nothing written or removed there
    assert (outside / "keep.txt").read_text() == "keep"
    assert not [p.name for p in tmp.iterdir() if p.name.startswith("nsa-run-discover-")], list(tmp.iterdir())
    # a run of the other stages starts and ends
    r = _cli(env, "oneshot", "--only", "okk", "--out", tmp_path / "out")
    assert "Traceback" not in r.stderr and "unexpected" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
