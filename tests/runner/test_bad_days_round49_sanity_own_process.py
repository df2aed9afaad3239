"""Bad days (stop 42): sanity runs a plugin adapter's checks in a process of its own, as triton-fwd, triton-bwd and
selection-map do since stop 41 (``sanity._isolated_checks``, ``stages._impl_host``).

Before, sanity imported every adapter in the stage's own process before nsa_core's checks ran, behind the put-back
that round 47 broke in 6 roots: a module class swapped at import (``torch.__class__``) or a thread that bends torch
later made nsa_core's own checks fail. Expected now: nsa_core's checks stand; the adapter's own checks carry what it
did to itself; a process that dies is that adapter's failed check, named; checks its process makes up in another's
name are refused as its failure.
"""

from __future__ import annotations

import json
import subprocess

import pytest

try:
    from _bad_days import cli_cmd, manifest
    from test_bad_days_round47_isolated_adapter import HOSTILE
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, manifest
    from tests.runner.test_bad_days_round47_isolated_adapter import HOSTILE

ODD = """
import json, os, sys

from nsa_runner.impls import Impl
from nsa_runner.impls import nsa_core as _base

if len(sys.argv) == 3 and sys.argv[1].endswith("job.json"):  # only in its own process
    HOW = os.environ.get("R49_HOW", "")
    if HOW == "die":
        os._exit(3)
    FORGED = {  # checks of its own making
        "forge": {"check": "nsa_core module forward", "ok": False, "detail": "forged"},  # in nsa_core's name
        "nan": {"check": "r49o cmp forward", "ok": True, "detail": "forged", "rel_err": float("nan"), "tol": 1.0},
        "bigint": {"check": "r49o cmp forward", "ok": True, "detail": "forged", "rel_err": 10 ** 400, "tol": 1.0},
        "newline": {"check": "r49o x\\n  [ok  ] nsa_core fwd", "ok": True, "detail": "forged"},
    }
    if HOW in FORGED:
        with open(sys.argv[2], "w") as f:
            json.dump({"checks": [FORGED[HOW]], "skipped": []}, f)
        os._exit(0)
    if HOW == "huge":  # its own check, with a 40 MiB detail and control characters in it
        with open(sys.argv[2], "w") as f:
            json.dump({"checks": [{"check": "r49o cmp forward", "ok": False,
                                   "detail": "x\\n\\x1b[31m\\u202e" + "d" * (40 << 20)}], "skipped": []}, f)
        os._exit(0)


def make():
    return Impl(name="r49o", parts=dict(_base.make().parts), description="dies or forges in its own process")
"""


def _sanity(plugins, tmp_path, impls, **extra):
    out = tmp_path / "o"
    env = {**plugins.env(), **extra}
    r = subprocess.run(cli_cmd("stage", "sanity", "--impl", impls, "--device", "cpu", "--out", out), env=env,
                       capture_output=True, text=True, timeout=900)
    (rec,) = manifest(out)["stages"]
    doc = json.loads((out / "testrun" / "sanity.json").read_text())
    return r, rec, doc


def _theirs(check: str, name: str) -> bool:
    return check.startswith(f"{name} ")


@pytest.mark.parametrize("how", ["class", "thread"])
def test_a_hostile_adapter_cannot_reach_nsa_cores_sanity_checks(plugins, tmp_path, how):
    plugins.make("r47-hostile", "r47_hostile", HOSTILE, {"r47h": "r47_hostile:make"}, version="1.0",
                 group="nsa_runner.impls")
    r, rec, doc = _sanity(plugins, tmp_path, "nsa_core,r47h", R47_HOW=how)
    mine = [x for x in doc["checks"] if not _theirs(x["check"], "r47h")]
    theirs = [x for x in doc["checks"] if _theirs(x["check"], "r47h")]
    assert mine and theirs, (doc["checks"], r.stderr[-2000:])
    # before (class): nsa_core's own forward / backward checks failed, its module's too
    assert [x for x in mine if not x["ok"]] == [], [x for x in mine if not x["ok"]]
    assert any(not x["ok"] for x in theirs), theirs  # what it did to its own process shows in its own checks
    assert rec["status"] == "FAIL" and "r47h" in rec["reason"], rec
    assert "Traceback" not in r.stderr, r.stderr[-3000:]


@pytest.mark.parametrize("how", ["die", "forge", "nan", "bigint", "newline"])
def test_an_adapters_process_that_dies_or_forges_is_its_own_failed_check(plugins, tmp_path, how):
    """Round 50 B50a-1 / B50a-3 too: a NaN or 10**400 in its check made sanity ERROR with a traceback (nsa_core's
    checks lost); a newline in its check's name wrote a line of its making, "[ok  ] nsa_core fwd", into sanity.out."""
    plugins.make("r49-odd", "r49_odd", ODD, {"r49o": "r49_odd:make"}, version="1.0", group="nsa_runner.impls")
    r, rec, doc = _sanity(plugins, tmp_path, "nsa_core,r49o", R49_HOW=how)
    failed = [x for x in doc["checks"] if not x["ok"]]
    assert [x["check"] for x in failed] == ["r49o adapter"], (failed, r.stderr[-2000:])
    said = {"die": "exited with code 3"}.get(how, "not its own")
    assert "nsa_core fwd" not in (tmp_path / "o" / "testrun" / "sanity.out").read_text()
    assert said in failed[0]["detail"] and "its process" in failed[0]["detail"], failed
    assert rec["status"] == "FAIL" and "r49o adapter" in rec["reason"], rec
    assert not any(x["detail"] == "forged" for x in doc["checks"])


def test_a_quiet_adapters_checks_come_back_whole(plugins, tmp_path):
    """A well-behaved adapter (nsa_core's own parts): every check it would have run in the stage's process runs
    in its own, with the same names, and passes; its lines are in the log once."""
    plugins.make("r49-odd", "r49_odd", ODD, {"r49o": "r49_odd:make"}, version="1.0", group="nsa_runner.impls")
    r, rec, doc = _sanity(plugins, tmp_path, "nsa_core,r49o", R49_HOW="")
    (tmp_path / "same").mkdir()
    own = _sanity(plugins, tmp_path / "same", "nsa_core,r49o", R49_HOW="", NSA_RUN_ADAPTER_PROCESS="0")[2]
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:])
    names = [x["check"] for x in doc["checks"] if _theirs(x["check"], "r49o")]
    assert names and names == [x["check"] for x in own["checks"] if _theirs(x["check"], "r49o")], names
    log = (tmp_path / "o" / "testrun" / "logs" / "sanity.log").read_text()
    assert log.count(f"[ok] {names[0]}:") == 1, log[-3000:]


def test_an_adapters_huge_check_detail_is_clipped_one_line(plugins, tmp_path):
    """Round 50 B50a-2: a 40 MiB detail in its own check made sanity's record too large for manifest.json (the
    stage ERROR, nsa_core's verdict lost). It is now its own FAIL, its detail one line, clipped."""
    plugins.make("r49-odd", "r49_odd", ODD, {"r49o": "r49_odd:make"}, version="1.0", group="nsa_runner.impls")
    r, rec, doc = _sanity(plugins, tmp_path, "nsa_core,r49o", R49_HOW="huge")
    assert rec["status"] == "FAIL" and "r49o cmp forward" in rec["reason"], (rec, r.stderr[-2000:])
    (theirs,) = [x for x in doc["checks"] if x["check"] == "r49o cmp forward"]
    assert len(theirs["detail"]) < 3000 and "more characters" in theirs["detail"], theirs["detail"][:300]
    assert "\n" not in theirs["detail"] and "\x1b" not in theirs["detail"] and "\u202e" not in theirs["detail"]
    assert all(x["ok"] for x in doc["checks"] if not x["check"].startswith("r49o "))
