"""Bad days (round 17 U-3), through the CLI: a StageResult whose reason (or hint, a declared file name,
a metric key or value, the status) is a str SUBCLASS whose ``__str__`` / ``__format__`` / ... raise killed
nsa-run's own worker (a traceback in the stage's log from its closing ``# stage ...`` line), the record
ERROR "process exited with code 1 without a result", the problem not named.

Expected: the text is taken as the plain str it holds (str's own methods, never the subclass's), the
stage's own verdict recorded; a field that cannot be read at all (a property that raises) is the stage's
ERROR "the stage's StageResult is malformed: <field> could not be read (...)" (a status that is no Status:
"status must be one of ..."), its declared files kept.
"""

from __future__ import annotations

import subprocess

try:
    from _bad_days import cli_cmd, env_with, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, env_with, manifest

STAGES = """
from nsa_runner import Stage, StageResult, Status

class Bad(str):
    def _no(self, *a, **k):
        raise RuntimeError("no text")
    __str__ = __repr__ = __format__ = __len__ = __iter__ = __eq__ = __getitem__ = __add__ = _no
    strip = split = encode = startswith = replace = _no
    __hash__ = str.__hash__

class Odd(Stage):
    name, order, timeout_s, preload = "oddtext", 10, 120.0, False
    def run(self, ctx):
        (ctx.dir / "a.txt").write_text("evidence")
        return StageResult(Status.FAIL, Bad("the check did not hold"), files=[Bad("a.txt")],
                           metrics={Bad("k"): Bad("v"), "n": [Bad("w")]}, hint=Bad("rerun"))

class OddStatus(Stage):
    name, order, timeout_s, preload = "oddstatus", 12, 120.0, False
    def run(self, ctx):
        return StageResult(Bad("SKIP"), "not on this machine")

class BogusStatus(Stage):
    name, order, timeout_s, preload = "bogusstatus", 13, 120.0, False
    def run(self, ctx):
        (ctx.dir / "c.txt").write_text("evidence")
        return StageResult("bogus", "x", files=["c.txt"])

class _NoReason(StageResult):
    @property
    def reason(self):
        raise RuntimeError("no reason here")
    @reason.setter
    def reason(self, value):
        pass

class Unreadable(Stage):
    name, order, timeout_s, preload = "noreason", 11, 120.0, False
    def run(self, ctx):
        (ctx.dir / "b.txt").write_text("evidence")
        return _NoReason(Status.FAIL, "x", files=["b.txt"])
"""


def test_a_str_subclass_in_a_result_is_read_as_plain_text(plugins, tmp_path):
    plugins.make("b17-text", "b17_text_mod", STAGES,
                 {"oddtext": "b17_text_mod:Odd", "noreason": "b17_text_mod:Unreadable",
                  "oddstatus": "b17_text_mod:OddStatus", "bogusstatus": "b17_text_mod:BogusStatus"})
    out = tmp_path / "o"
    only = "oddtext,noreason,oddstatus,bogusstatus"
    proc = subprocess.run(cli_cmd("oneshot", "--only", only, "--out", out, "--device", "cpu"),
                          env=env_with(plugins.env(), NSA_RUN_SPARE_WORKER="0"), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    stages = {s["name"]: s for s in manifest(out)["stages"]}
    odd = stages["oddtext"]
    assert odd["status"] == "FAIL", odd
    assert (odd["reason"], odd["hint"], odd["files"]) == ("the check did not hold", "rerun", ["a.txt"]), odd
    assert odd["metrics"] == {"k": "v", "n": ["w"]}, odd
    assert "Traceback" not in (out / "testrun" / "logs" / "oddtext.log").read_text()
    unreadable = stages["noreason"]
    assert unreadable["status"] == "ERROR", unreadable
    assert unreadable["reason"].startswith("the stage's StageResult is malformed: reason could not be read "
                                           "(RuntimeError: no reason here)"), unreadable
    assert unreadable["files"] == ["b.txt"], unreadable
    assert (stages["oddstatus"]["status"], stages["oddstatus"]["reason"]) == ("SKIP", "not on this machine")
    bogus = stages["bogusstatus"]  # the field named, the declared files kept
    assert bogus["status"] == "ERROR" and bogus["files"] == ["c.txt"], bogus
    assert bogus["reason"].startswith("the stage's StageResult is malformed: status must be one of PASS, FAIL, "), bogus
