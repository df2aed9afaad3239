"""Bad days, red-team round 17 (part B) U-5, through the CLI: an impl adapter that hangs made triton-fwd TIMEOUT
"no result after 12s: the stage's processes were killed": neither the record nor the log named the implementation
or the case it hung in. Expected: the stage logs each case before it runs, and a TIMEOUT's reason carries the last
line of the stage's log. Since stop 42 a plugin adapter hung in its own process is stopped before the stage's timeout
(round 49 U49a-1): the stage ends FAIL with that adapter's rows ERROR, named; the TIMEOUT naming is tested with the
adapter in the stage's process (``NSA_RUN_ADAPTER_PROCESS=0``), where nothing can stop it but the timeout."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN

ADAPTER = '''
import time
from nsa_runner.impls import Impl


def _hang(*args, **kwargs):
    time.sleep(600)


def slowpoke():
    return Impl("slowpoke", {"selection_attention": _hang})
'''


@pytest.mark.parametrize("own_process", [False, True])
def test_a_timeout_names_the_implementation_and_case_that_ran_last(plugins, tmp_path, own_process):
    plugins.make("m17-slow", "m17_slow", ADAPTER,
                 {"slowpoke": "m17_slow:slowpoke"}, version="1.0", group="nsa_runner.impls")
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-c", MAIN, "oneshot", "--only", "triton-fwd", "--device", "cpu",
                        "--impl", "slowpoke", "--timeout", "20", "--out", str(out)],
                       env=plugins.env() | {"NSA_RUN_SPARE_WORKER": "0",
                                            "NSA_RUN_ADAPTER_PROCESS": str(int(own_process))},
                       text=True, capture_output=True, timeout=600)
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    rec = next(s for s in m["stages"] if s["name"] == "triton-fwd")
    if own_process:  # stopped before the stage's timeout, its rows ERROR naming it
        assert rec["status"] == "FAIL", (rec, r.stdout[-2000:], r.stderr[-2000:])
        assert "slowpoke" in rec["reason"] and "had not ended" in rec["reason"], rec["reason"]
        return
    assert rec["status"] == "TIMEOUT", (rec, r.stdout[-2000:], r.stderr[-2000:])
    assert "the last line of its log: # slowpoke " in rec["reason"], rec["reason"]


SELECT = '''
import time
from nsa_runner.impls import Impl


def _hang(*args, **kwargs):
    print("working...", flush=True)  # its own line after the stage's
    time.sleep(600)


def hg():
    return Impl("hg", {"select": _hang})
'''


@pytest.mark.parametrize("own_process", [False, True])
def test_a_timeout_names_the_implementation_that_printed_then_hung(plugins, tmp_path, own_process):
    """Round 18 B U-c: selection-map with an adapter that printed a line, then hung: the reason quoted its line only."""
    plugins.make("m18-hg", "m18_hg", SELECT, {"hg": "m18_hg:hg"}, version="1.0", group="nsa_runner.impls")
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-c", MAIN, "oneshot", "--only", "selection-map", "--device", "cpu",
                        "--impl", "hg", "--timeout", "20", "--out", str(out)],
                       env=plugins.env() | {"NSA_RUN_SPARE_WORKER": "0",
                                            "NSA_RUN_ADAPTER_PROCESS": str(int(own_process))},
                       text=True, capture_output=True, timeout=600)
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    rec = next(s for s in m["stages"] if s["name"] == "selection-map")
    if own_process:  # stopped before the stage's timeout: its select's failure, named
        assert rec["status"] == "FAIL", (rec, r.stdout[-2000:], r.stderr[-2000:])
        assert "hg" in rec["reason"] and "had not ended" in rec["reason"], rec["reason"]
        return
    assert rec["status"] == "TIMEOUT", (rec, r.stdout[-2000:], r.stderr[-2000:])
    assert "the last line of its log: working..." in rec["reason"], rec["reason"]
    assert "(its last progress line: # hg: select ...)" in rec["reason"], rec["reason"]
