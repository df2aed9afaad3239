"""Bad days (round 17, the worker's own error path), through the CLI: a stage raising an exception whose
class refuses ``__qualname__`` / ``__module__`` (a metaclass ``__getattribute__``) made
``traceback.format_exc()`` raise inside the worker's ``except`` clause: the worker died, the record was
ERROR "process exited with code 1 without a result", what the stage raised not named.

Expected: the stage's ERROR names its exception (``TYPE: first line``); the traceback is said to be
unformattable instead of killing the worker.
"""

from __future__ import annotations

import subprocess

try:
    from _bad_days import cli_cmd, env_with, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, env_with, manifest

STAGES = """
from nsa_runner import Stage, StageResult, Status

class Meta(type):
    def __getattribute__(cls, name):
        if name in ("__module__", "__qualname__"):
            raise RuntimeError("no " + name)
        return type.__getattribute__(cls, name)

class Odd(Exception, metaclass=Meta):
    pass

class Raises(Stage):
    name, order, timeout_s, preload = "oddexc", 10, 120.0, False
    def run(self, ctx):
        raise Odd("the real problem")

class Exits(Stage):
    name, order, timeout_s, preload = "oddexit", 11, 120.0, False
    def run(self, ctx):
        try:
            raise Odd("inner")
        except Odd:
            raise SystemExit(3)
"""


def test_an_exception_whose_traceback_cannot_be_formatted_is_named(plugins, tmp_path):
    plugins.make("b17-tb", "b17_tb_mod", STAGES, {"oddexc": "b17_tb_mod:Raises", "oddexit": "b17_tb_mod:Exits"})
    out = tmp_path / "o"
    proc = subprocess.run(cli_cmd("oneshot", "--only", "oddexc,oddexit", "--out", out, "--device", "cpu"),
                          env=env_with(plugins.env(), NSA_RUN_SPARE_WORKER="0"), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    stages = {s["name"]: s for s in manifest(out)["stages"]}
    odd = stages["oddexc"]
    assert (odd["status"], odd["reason"]) == ("ERROR", "Odd: the real problem"), odd
    assert "could not be formatted" in odd.get("traceback", ""), odd
    exits = stages["oddexit"]
    assert (exits["status"], exits["reason"]) == ("ERROR", "stage called sys.exit(3)"), exits
