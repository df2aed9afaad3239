"""Bad days, red-team round 2 (issue 16): the discovery child is killed as a tree, as a stage is:
a plugin whose import starts a daemon (``setsid sleep``) leaves nothing running after ``nsa-run
list``; a CLI killed (kill -9) while a plugin's import hangs takes the discovery child with it."""

from __future__ import annotations

import signal
import subprocess

from _bad_days import cli_cmd, gone_within, wait_for

DAEMON = """
import os, subprocess, time
from pathlib import Path
from nsa_runner import Stage, StageResult, Status

p = subprocess.Popen(["setsid", "sleep", "1000"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)
Path(os.environ["DH_PIDS"]).open("a").write(f"{p.pid} {os.getpid()}\\n")
time.sleep(float(os.environ.get("DH_HANG", "0")))

class D(Stage):
    name, order = "d", 10
    def run(self, ctx):
        return StageResult(Status.PASS, "ok")
"""


def test_a_daemon_started_by_a_plugin_import_does_not_outlive_list(plugins, tmp_path):
    plugins.make("dh-plugin", "dh_mod", DAEMON, {"d": "dh_mod:D"})
    pids = tmp_path / "pids"
    env = {**plugins.env(), "DH_PIDS": str(pids)}
    r = subprocess.run(cli_cmd("list", "--device", "cpu", "--json"), env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    daemon = int(pids.read_text().split()[0])
    assert gone_within(daemon, 10), f"setsid sleep {daemon} still runs"


def test_the_discovery_child_dies_with_a_killed_cli(plugins, tmp_path, spawn):
    plugins.make("dh-plugin", "dh_mod", DAEMON, {"d": "dh_mod:D"})
    pids = tmp_path / "pids"
    env = {**plugins.env(), "DH_PIDS": str(pids), "DH_HANG": "300"}
    proc = spawn(cli_cmd("list", "--device", "cpu"), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    daemon, child = map(int, wait_for(pids, proc=proc).split()[:2])
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert gone_within(child, 15), f"discovery child {child} still runs"
    assert gone_within(daemon, 15), f"setsid sleep {daemon} still runs"
