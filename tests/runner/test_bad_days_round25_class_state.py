"""Bad days, red-team round 25 B25-1 and B25-3, through the CLI: plugin code that leaves standard-library state
changed which nsa-run's own result writing then calls.

- B25-1: ``_stdlib_put`` put back module-level functions only, not class attributes: a stage's ``run`` (or its
  module's import) leaving a forgotten ``mock.patch.object(Path, "mkdir", side_effect=...).start()``, or an
  orjson-style ``json.JSONEncoder.encode`` returning bytes, or a rebound ``JSONEncoder.iterencode``, lost its PASS
  ("process exited with code 1 without a result" / "unreadable stage result").
- B25-3: ``impls.adapter_code`` put back builtins only: an implementation adapter whose import left ``json.dumps``
  returning bytes, ``os.replace`` mocked or ``Path.mkdir`` mocked made sanity's own result writing fail, every
  verdict lost (nsa_core's too), the adapter not named.

Expected: put back after the plugin code, before nsa-run's code runs again; the stage's own result stands, every
implementation's verdicts are kept, the stage's log names what was put back."""

from __future__ import annotations

import json
import subprocess

try:
    from _bad_days import cli_cmd, manifest, running_first
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, manifest, running_first

MKDIR = ("from unittest import mock\nfrom pathlib import Path\n"
         "mock.patch.object(Path, 'mkdir', side_effect=PermissionError('mocked mkdir')).start()\n")
ENCODE = "import json\njson.JSONEncoder.encode = lambda self, o: b'{}'\n"
ITERENCODE = "import json\njson.JSONEncoder.iterencode = lambda self, o, _one_shot=False: iter(['{}'])\n"
STAGES = running_first(("A", "r25a", 11, MKDIR), ("B", "r25b", 12, ENCODE), ("C", "r25c", 13, ITERENCODE))
AT_IMPORT = MKDIR + """
from nsa_runner import Stage, StageResult, Status

class D(Stage):
    name, order, timeout_s = "r25d", 14, 120.0
    def run(self, ctx):
        return StageResult(Status.PASS, "r25d ok")
"""


def test_class_attributes_a_stage_left_changed_are_put_back(plugins, tmp_path):
    plugins.make("r25-stages", "r25_stages", STAGES, {"r25a": "r25_stages:A", "r25b": "r25_stages:B",
                                                     "r25c": "r25_stages:C"})
    plugins.make("r25-import", "r25_import", AT_IMPORT, {"r25d": "r25_import:D"})
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("oneshot", "--only", "r25a,r25b,r25c,r25d", "--out", out, "--device", "cpu"),
                       env=plugins.env(), capture_output=True, text=True, timeout=900)
    recs = {s["name"]: (s["status"], s["reason"]) for s in manifest(out)["stages"]}
    # before: r25a / r25b / r25d ERROR "process exited with code 1 without a result", r25c "unreadable stage result"
    assert recs == {n: ("PASS", f"{n} ok") for n in ("r25a", "r25b", "r25c", "r25d")}, (recs, r.stderr[-2000:])
    assert r.returncode == 0, r.stderr[-2000:]
    log = (out / "testrun" / "logs" / "r25a.log").read_text()
    assert "pathlib.Path.mkdir" in log and "put back" in log, log[-2000:]


ADAPTER = """
import json, os
from unittest import mock
from pathlib import Path

from nsa_runner.impls import Impl

json.dumps = lambda *a, **k: b'{}'  # an orjson-style shim, process-wide
mock.patch("os.replace", side_effect=PermissionError("mocked replace")).start()
mock.patch.object(Path, "mkdir", side_effect=PermissionError("mocked mkdir")).start()


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F
    return F.select_blocks(q, k_cmp, cfg)


IMPL = Impl("r25i", {"select": _select})
"""


def test_standard_library_state_an_adapter_left_is_put_back(plugins, tmp_path):
    plugins.make("r25-adapter", "r25_adapter", ADAPTER, {"r25i": "r25_adapter:IMPL"}, version="1.0",
                 group="nsa_runner.impls")
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("stage", "sanity", "--impl", "r25i,nsa_core", "--out", out, "--device", "cpu"),
                       env=plugins.env(), capture_output=True, text=True, timeout=900)
    (rec,) = manifest(out)["stages"]
    # before: ERROR "TypeError: can't concat str to bytes" / "PermissionError: mocked ...", every check lost
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:])
    checks = json.loads((out / "testrun" / "sanity.json").read_text())["checks"]
    assert any("r25i" in json.dumps(c) for c in checks) and any("nsa_core" in json.dumps(c) for c in checks)
    log = (out / "testrun" / "logs" / "sanity.log").read_text()
    note = [line for line in log.splitlines() if line.startswith("note: an implementation's code left")]
    assert any("json.dumps" in line and "os.replace" in line and "pathlib.Path.mkdir" in line for line in note), \
        (note, log[-3000:])


LIMITS = """
import resource, sys
from nsa_runner import Stage, StageResult, Status

class Deep(Stage):
    name, order, timeout_s = "r25r", 15, 120.0
    def run(self, ctx):
        sys.setrecursionlimit(60)  # a stage's own recursion guard, never lifted
        return StageResult(Status.PASS, "r25r ok")

class Small(Stage):
    name, order, timeout_s = "r25f", 16, 120.0
    def run(self, ctx):
        resource.setrlimit(resource.RLIMIT_FSIZE, (100, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        return StageResult(Status.PASS, "r25f ok")
"""


def test_limits_a_stage_lowered_are_put_back_before_its_result_is_written(plugins, tmp_path):
    """Round 25 U25-3: ``sys.setrecursionlimit(60)`` or a 100-byte RLIMIT_FSIZE left by a stage lost its PASS
    ("process exited with code 1 without a result")."""
    plugins.make("r25-limits", "r25_limits", LIMITS, {"r25r": "r25_limits:Deep", "r25f": "r25_limits:Small"})
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("oneshot", "--only", "r25r,r25f", "--out", out, "--device", "cpu"),
                       env=plugins.env(), capture_output=True, text=True, timeout=900)
    recs = {s["name"]: (s["status"], s["reason"]) for s in manifest(out)["stages"]}
    assert recs == {"r25r": ("PASS", "r25r ok"), "r25f": ("PASS", "r25f ok")}, (recs, r.stderr[-2000:])
    log = (out / "testrun" / "logs" / "r25f.log").read_text()
    assert "resource.RLIMIT_FSIZE" in log and "put back" in log, log[-2000:]
