"""Bad days, red-team round 24 U24-5, through the CLI: the discovery child's output (what plugins print at their
import) went to a file in TMPDIR with no cap, so a plugin printing without end filled the disk under TMPDIR until
the per-import limit (60 s by default) stopped it. Expected: the child is stopped once its output passes 64 MiB, that
plugin listed broken saying so, the others listed as usual, and nothing of the pass left in TMPDIR."""

from __future__ import annotations

import json
import subprocess
import time

try:
    from _bad_days import cli_cmd, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, env_with

STAGE = ("from nsa_runner import Stage, StageResult, Status\n"
         "class S(Stage):\n    name = {name!r}; order = 9\n"
         "    def run(self, ctx):\n        return StageResult(Status.PASS, 'ok')\n")
FLOOD = "import os\nline = b'plugin: warming up the cache\\n' * 40000\nwhile True:\n    os.write(1, line)\n"


def test_a_plugin_printing_without_end_at_import_is_stopped_at_the_output_cap(plugins, tmp_path):
    plugins.make("aa-u24", "aa_u24", FLOOD + STAGE.format(name="aa-u24"), {"aa-u24": "aa_u24:S"})
    plugins.make("bb-u24", "bb_u24", STAGE.format(name="bb-u24"), {"bb-u24": "bb_u24:S"})
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = env_with(plugins.env(), TMPDIR=str(tmp), NSA_RUN_DISCOVERY_TIMEOUT="600")
    t0 = time.monotonic()
    r = subprocess.run(cli_cmd("list", "--json"), env=env, capture_output=True, text=True, timeout=900)
    took = time.monotonic() - t0
    listed = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    assert listed["bb-u24"]["runs_here"] is True, listed["bb-u24"]
    aa = next(s for s in json.loads(r.stdout)["stages"] if "aa_u24" in json.dumps(s))
    assert aa["runs_here"] is False and "printed more than 64 MiB" in aa["why_not"], aa
    assert took < 300, took  # stopped at the cap, not at the 600 s limit (before: wrote until the limit)
    left = [p for p in tmp.rglob("*") if p.is_file()]
    assert not left, left
