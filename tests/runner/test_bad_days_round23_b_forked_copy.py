"""Bad days, red-team round 23 B23-6 (discovery), through the CLI: a plugin (stage or impl) whose import forks a
helper that ends with ``sys.exit(0)`` (``os._exit`` meant) or raises: the forked copy unwound into nsa-run's
discovery child and reported the plugin broken ("failed to import ...: SystemExit: 0"), at random or always (here the
real import waits for its helper first). Expected: a forked copy ends as in plain Python and reports nothing; the
real import's record stands."""

from __future__ import annotations

import json
import subprocess

try:
    from _bad_days import cli_cmd, make, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, make, manifest


def _stage(name: str, cls: str, order: int) -> str:
    return (f"from nsa_runner import Stage, StageResult, Status\n"
            f"class {cls}(Stage):\n    name, order, timeout_s = {name!r}, {order}, 60.0\n"
            f"    def run(self, ctx): return StageResult(Status.PASS, {name + ' ok'!r})\n")


def _listed(env) -> dict:
    r = subprocess.run(cli_cmd("list", "--json"), env=env, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return {s["name"]: s for s in json.loads(r.stdout)["stages"]}


# the helper's copy is waited for before the import goes on: its report (before the fix) always came first
FORKS = """import os, sys
_pid = os.fork()
if _pid == 0:  # a helper process: a little work, then leave ({how})
    {how}
os.waitpid(_pid, 0)
"""


def test_a_plugin_whose_import_forks_a_helper_ending_with_sys_exit_is_not_broken(plugins, tmp_path):
    env = make(plugins)
    plugins.make("f23b-plugin", "f23b_mod", FORKS.format(how="sys.exit(0)") + _stage("ff23b", "F", 81),
                 {"ff23b": "f23b_mod:F"})
    plugins.make("g23b-plugin", "g23b_mod",
                 FORKS.format(how="raise RuntimeError('helper: upload failed')") + _stage("gg23b", "G", 82),
                 {"gg23b": "g23b_mod:G"})
    listed = _listed(env)
    # before: "no: broken: failed to import f23b_mod:F: SystemExit: 0"
    assert listed["ff23b"]["runs_here"] is True, listed["ff23b"]
    assert listed["gg23b"]["runs_here"] is True, listed["gg23b"]
    assert listed["z"]["runs_here"] is True, listed["z"]
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("stage", "ff23b", "--out", out, "--device", "cpu"), env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [(s["name"], s["status"]) for s in manifest(out)["stages"]] == [("ff23b", "PASS")]


def test_an_impl_whose_import_forks_a_helper_ending_with_sys_exit_is_not_broken(plugins):
    # (the real import goes on a little after its helper ended: before the fix the helper's report, read first,
    # ended the pass; with the fix the order does not matter)
    plugins.make("h23b-impl", "h23b_impl", FORKS.format(how="sys.exit(0)") + "import time\ntime.sleep(1)\n"
                 + "from nsa_runner.impls.nsa_core import make\nIMPL = make()\nIMPL.name = 'h23b'\n",
                 {"h23b": "h23b_impl:IMPL"}, group="nsa_runner.impls")
    r = subprocess.run(cli_cmd("list", "--impls", "--json", "--device", "cpu"), env=plugins.env(),
                       capture_output=True, text=True, timeout=300)
    rows = {x["name"]: x for x in json.loads(r.stdout)["impls"]}
    assert "h23b" in rows and "SystemExit" not in json.dumps(rows["h23b"]), rows.get("h23b")
    assert not rows["h23b"].get("error"), rows["h23b"]
