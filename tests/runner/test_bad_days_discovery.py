"""Bad days, plugin discovery (issue 16): plugins are imported in a child process with a time
limit. A plugin whose import segfaults, hangs or calls ``os._exit(0)`` is listed as broken with
the reason and the other stages still run; one that prints on import leaves ``--json`` stdout
pure. Through the CLI as a separate process (a segfault in the CLI's own process would take the
test down with it)."""

from __future__ import annotations

import json
import subprocess

from _bad_days import cli_cmd

GOOD = """
from nsa_runner import Stage, StageResult, Status

class Good(Stage):
    name, order = "good", 30
    def run(self, ctx):
        (ctx.dir / "good.txt").write_text("ok")
        return StageResult(Status.PASS, "fine", files=["good.txt"])
"""

HOSTILE = {
    "segfault": ("import ctypes\nctypes.string_at(0)\n", "SIGSEGV"),
    "hang": ("import time\ntime.sleep(1000)\n", "did not finish within 4s"),
    "exit0": ("import os\nos._exit(0)\n", "exit code 0"),
    "exit3": ("import os\nos._exit(3)\n", "exit code 3"),
    "abort": ("import os\nos.abort()\n", "SIGABRT"),
}


def _plugins(plugins, kinds):
    plugins.make("good-plugin", "good_mod", GOOD, {"good": "good_mod:Good"})
    for kind in kinds:
        code = HOSTILE[kind][0] if kind in HOSTILE else ""
        if kind == "prints":
            code = ("import sys, os\nprint('noise on stdout')\nos.write(1, b'raw noise\\n')\n"
                    "sys.stderr.write('noise\\n')\n")
        plugins.make(f"{kind}-plugin", f"{kind}_mod",
                     code + GOOD.replace('"good", 30', f'"{kind}", 31').replace("Good", "Bad"),
                     {kind: f"{kind}_mod:Bad"})
    env = plugins.env()
    env["NSA_RUN_DISCOVERY_TIMEOUT"] = "4"
    return env


def test_plugins_whose_import_kills_or_hangs_are_listed_as_broken_and_the_others_run(plugins, tmp_path):
    env = _plugins(plugins, sorted(HOSTILE))  # all at once: a new child goes on after each one
    r = subprocess.run(cli_cmd("list", "--device", "cpu", "--json"), env=env, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    rows = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    for kind, (_, shown) in HOSTILE.items():
        assert rows[kind]["runs_here"] is False and shown in rows[kind]["why_not"], rows[kind]
    assert rows["good"]["runs_here"] is True and rows["sanity"]["runs_here"] is True  # the others are found
    r = subprocess.run(cli_cmd("oneshot", "--out", tmp_path / "out", "--only", "good,exit0", "--device", "cpu",
                               "--json"), env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 1, r.stderr[-2000:]
    st = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    assert st["good"]["status"] == "PASS"
    assert st["exit0"]["status"] == "ERROR" and "exit code 0" in st["exit0"]["reason"]


def test_a_plugin_that_prints_on_import_keeps_json_stdout_pure(plugins, tmp_path):
    env = _plugins(plugins, ["prints"])
    r = subprocess.run(cli_cmd("list", "--device", "cpu", "--json"), env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {s["name"]: s for s in json.loads(r.stdout)["stages"]}  # nothing but the JSON
    assert rows["prints"]["runs_here"] and rows["good"]["runs_here"]
    r = subprocess.run(cli_cmd("stage", "prints", "--out", tmp_path / "out", "--device", "cpu", "--json"), env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["stages"][0]["status"] == "PASS"


def test_stage_options_are_parsed_by_the_stage_in_the_child(cli, tmp_path):
    """Option values still reach the stage and bad values still exit 2 (parsed in the child)."""
    r = cli("stage", "fa2-probe", "--out", tmp_path / "out", "--device", "cpu", "--S-list", "0")
    assert r.exit_code == 2 and "invalid value '0' for --S-list of stage fa2-probe" in r.stderr
    r = cli("stage", "fa2-probe", "--out", tmp_path / "out", "--device", "cpu", "--bench", "maybe")
    assert r.exit_code == 2 and "is not one of yes, no" in r.stderr
