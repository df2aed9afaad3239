"""Bad days (round 16's left-open list, fixed in stop 30), through the CLI: a stage plugin's own exception
is described in its ERROR's reason as ``TYPE: first line``. A class name of 30 MB made the reason (and so
the stage's result) larger than a record may be: the stage was ERROR "the stage's result is too large for
manifest.json", what it raised lost. A ``__str__`` that raises killed the worker in its own error path
(ERROR "exited ... without a result"), and ``sys.exit`` with a 30 MB message was "too large" too.

Expected: the reason names the exception's (clipped) class and first line; the record is kept.
"""

from __future__ import annotations

import subprocess

try:
    from _bad_days import cli_cmd, env_with, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, env_with, manifest

STAGES = """
from nsa_runner import Stage, StageResult, Status

class Huge(Stage):
    name, order, timeout_s = "huge", 10, 120.0
    def run(self, ctx):
        raise type("E" * 30_000_000, (Exception,), {})("first line\\nsecond line")

class BadStr(Exception):
    def __str__(self):
        raise RuntimeError("no text")

class Unprintable(Stage):
    name, order, timeout_s = "unprintable", 11, 120.0
    def run(self, ctx):
        raise BadStr()

class Exits(Stage):
    name, order, timeout_s = "exits", 12, 120.0
    def run(self, ctx):
        raise SystemExit("m" * 30_000_000)
"""


def test_a_stage_exception_with_a_huge_name_or_text_keeps_its_own_reason(plugins, tmp_path):
    plugins.make("m17-exc", "m17_exc_mod", STAGES,
                 {"huge": "m17_exc_mod:Huge", "unprintable": "m17_exc_mod:Unprintable", "exits": "m17_exc_mod:Exits"})
    out = tmp_path / "o"
    proc = subprocess.run(cli_cmd("oneshot", "--only", "huge,unprintable,exits", "--out", out, "--device", "cpu"),
                          env=env_with(plugins.env(), NSA_RUN_SPARE_WORKER="0"), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    stages = {s["name"]: s for s in manifest(out)["stages"]}
    assert {n: s["status"] for n, s in stages.items()} == {"huge": "ERROR", "unprintable": "ERROR", "exits": "ERROR"}
    huge = stages["huge"]["reason"]
    assert huge.startswith("E" * 100 + "… (29999900 more characters): first line"), huge[:300]
    assert len(huge) < 1000
    assert stages["unprintable"]["reason"].startswith("BadStr: (its text could not be read"), stages["unprintable"]
    exits = stages["exits"]["reason"]
    assert exits.startswith("stage called sys.exit('mmm") and len(exits) < 3000, exits[:300]
