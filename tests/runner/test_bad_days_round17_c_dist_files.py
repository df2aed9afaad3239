"""Bad days, red-team round 17 U-6, through the CLI: an installed package that is no plugin at all (it
declares no entry points of nsa-run) whose dist-info ``METADATA`` is a FIFO, a link to /dev/zero or a
70 MiB file made EVERY command exit 2 ("an installed package's metadata cannot be read: ... is a FIFO"),
while a plugin whose entry_points.txt is not UTF-8 is named broken per distribution and the rest runs.

Expected (one policy): nsa-run reads a distribution's files safely (non-blocking, checked on the
descriptor, bounded) and its METADATA only when its entry points declare nsa-run's group: a package
that is no plugin is passed over, a plugin whose METADATA cannot be read is listed as broken, naming the
file and why; the other plugins and the built-in stages run. (An entry_points.txt that is a FIFO stays
refused up front: ``import torch`` reads every distribution's, test_bad_days_round6.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN, env_with, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with, manifest

GOOD = """
from nsa_runner import Stage, StageResult, Status
class Ok(Stage):
    name, order = "okc", 17
    def run(self, ctx): return StageResult(Status.PASS, "ok")
"""


def _bad_metadata(folder, how: str):
    folder.mkdir()
    meta = folder / "METADATA"
    if how == "fifo":
        os.mkfifo(meta)
    elif how == "zero":
        meta.symlink_to("/dev/zero")
    else:  # 70 MiB (sparse)
        with open(meta, "wb") as f:
            f.truncate(70 << 20)
    return meta


def _run(plugins, *args):
    env = env_with(plugins.env(), NSA_RUN_SPARE_WORKER="0")
    return subprocess.run([sys.executable, "-c", MAIN, *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=300)


def _stages(r) -> dict[str, dict]:
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return {s["name"]: s for s in json.loads(r.stdout)["stages"]}


@pytest.mark.parametrize("how", ["fifo", "zero", "huge"])
def test_u6_a_a_package_that_is_no_plugin_never_stops_list(plugins, how):
    plugins.make("r17c-ok", "r17c_ok_mod", GOOD, {"okc": "r17c_ok_mod:Ok"})
    info = plugins.site / "unrelated-1.0.dist-info"
    _bad_metadata(info, how)
    (info / "entry_points.txt").write_text("[console_scripts]\nunrelated = unrelated:main\n")
    r = _run(plugins, "list", "--json")
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    stages = _stages(r)
    assert stages["okc"]["runs_here"] and stages["env-pairing"]["runs_here"], stages.keys()
    assert not [s for s in stages.values() if s["why_not"].startswith("broken")], stages


def test_u6_b_a_plugin_whose_metadata_is_a_fifo_is_named_broken_and_the_rest_runs(plugins, tmp_path):
    plugins.make("r17c-ok", "r17c_ok_mod", GOOD, {"okc": "r17c_ok_mod:Ok"})
    _bad_metadata(plugins.site / "unrelated-1.0.dist-info", "fifo")  # (no entry_points.txt at all)
    info = plugins.site / "r17c_fifo-1.0.dist-info"
    meta = _bad_metadata(info, "fifo")
    (info / "entry_points.txt").write_text("[nsa_runner.stages]\nfifoc = r17c_ok_mod:Ok\n")
    r = _run(plugins, "list", "--json")
    stages = _stages(r)
    broken = [s for s in stages.values() if s["why_not"].startswith("broken")]
    assert len(broken) == 1, broken
    assert str(meta) in broken[0]["why_not"] and "FIFO" in broken[0]["why_not"], broken
    assert stages["okc"]["runs_here"] and stages["sanity"]["runs_here"], stages.keys()
    out = tmp_path / "o"
    r = _run(plugins, "oneshot", "--only", "okc", "--out", out)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    assert [(s["name"], s["status"]) for s in manifest(out)["stages"]] == [("okc", "PASS")]


def test_u6_c_an_implementation_plugin_whose_metadata_is_a_fifo_is_named_broken(plugins):
    _bad_metadata(plugins.site / "unrelated-1.0.dist-info", "zero")
    info = plugins.site / "r17c_impl-1.0.dist-info"
    meta = _bad_metadata(info, "fifo")
    (info / "entry_points.txt").write_text("[nsa_runner.impls]\nr17c = r17c_impl_mod:make\n")
    r = _run(plugins, "list", "--impls", "--json")
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    text = r.stdout
    json.loads(text)
    assert "nsa_core" in text and str(meta) in text and "FIFO" in text, (r.returncode, text[-3000:], r.stderr[-2000:])
