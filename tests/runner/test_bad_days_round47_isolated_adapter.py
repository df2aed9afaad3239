"""Bad days, red-team round 47 (hostile adapters), through the CLI: triton-fwd / triton-bwd run a plugin's adapter
in a process of its own.

Round 47 broke the put-back around adapter code (the shared stage process) 15 times in 6 roots: a module's
``__class__`` swapped (``torch``, ``nsa_core.functional``: vars() unchanged, nothing seen), a thread or a gc
finalizer that changes torch again after the put-back, triton's own knobs and ``triton.language`` data (never
saved), an nsa_core module first loaded under a changed environment, a thread's delayed ``os._exit`` (the stage
ERROR naming no one), an atexit hook that rewrote the stage's CSV after its verdict. Each made nsa_core's own rows
FAIL or ERROR, or its evidence change. A process can only be put back by not sharing it: each plugin adapter's rows
now run in a fresh process (``stages._impl_host``), and nsa_core's rows and the reference stay in the stage's.

Expected for each hostile adapter: nsa_core's rows PASS (in the CSV on disk too), the adapter's own rows carry
whatever it did to itself, and an adapter whose process dies has its rows ERROR naming it.
"""

from __future__ import annotations

import csv
import os
import subprocess

import pytest

try:
    from _bad_days import cli_cmd, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, manifest

HOSTILE = """
import atexit, glob, os, sys, threading, time, types

import torch

from nsa_runner.impls import Impl
from nsa_runner.impls import nsa_core as _base

HOW = os.environ.get("R47_HOW", "")


class _Bent(types.ModuleType):  # a module class that bends what torch hands out
    def __getattribute__(self, name):
        value = super().__getattribute__(name)
        if name in ("softmax", "matmul", "einsum", "exp", "bmm") and callable(value):
            return lambda *a, **k: value(*a, **k) * 1.01
        return value


def _bend_torch_later():
    real = torch.softmax
    def loop():
        while True:
            torch.softmax = lambda *a, **k: real(*a, **k) * 1.01
            time.sleep(0.01)
    threading.Thread(target=loop, daemon=True).start()


def _rewrite_csvs():
    for p in glob.glob(os.path.join(os.getcwd(), "*.csv")):
        with open(p) as f:
            t = f.read()
        with open(p, "w") as f:
            f.write(t.replace(",PASS,", ",FAIL,"))


if HOW == "class":
    torch.__class__ = _Bent
elif HOW == "fclass":  # nsa_core.functional's class: every live block id its select_blocks hands out -> 0
    import nsa_core.functional as _F

    class _BentF(type(_F)):
        def __getattribute__(self, name):
            value = super().__getattribute__(name)
            if name == "select_blocks":
                def bent(*a, **k):
                    idx, cnt = value(*a, **k)
                    return torch.where(idx >= 0, idx * 0, idx), cnt
                return bent
            return value

    _F.__class__ = _BentF
elif HOW == "thread":
    _bend_torch_later()
elif HOW == "atexit":
    atexit.register(_rewrite_csvs)

PARTS = dict(_base.make().parts)
if HOW == "exit":  # its second call starts a thread that ends the process while the call waits
    _calls = []
    _real = PARTS["selection_attention"]

    def _ending(*a, **k):
        _calls.append(1)
        if len(_calls) == 2:
            threading.Thread(target=lambda: os._exit(0), daemon=True).start()
            time.sleep(5)
        return _real(*a, **k)

    PARTS["selection_attention"] = _ending


def make():
    return Impl(name="r47h", parts=dict(PARTS), description="a hostile adapter (round 47)")
"""


def _rows(out):
    run = out / "testrun"
    with open(run / "triton_fwd.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("how", ["class", "thread", "atexit", "exit"])
def test_a_hostile_adapter_cannot_reach_nsa_cores_rows(plugins, tmp_path, how):
    plugins.make("r47-hostile", "r47_hostile", HOSTILE, {"r47h": "r47_hostile:make"}, version="1.0",
                 group="nsa_runner.impls")
    env = {**plugins.env(), "R47_HOW": how, "TRITON_INTERPRET": "1"}
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("stage", "triton-fwd", "--impl", "nsa_core,r47h", "--cases", "T50,T40",
                               "--device", "cpu", "--out", out), env=env, capture_output=True, text=True, timeout=900)
    (rec,) = manifest(out)["stages"]
    rows = _rows(out)
    mine = [x for x in rows if x["impl"] == "nsa_core"]
    theirs = [x for x in rows if x["impl"] == "r47h"]
    assert len(mine) == 2 and len(theirs) == 2, (rows, r.stderr[-2000:])
    # before: nsa_core's rows FAIL (class: rel_err ~5e-2; thread: 9.9e-3) or "FAIL" on disk after a PASS verdict
    # (atexit), or no rows at all and the stage ERROR "exited with code 0 without a result" naming no one (exit)
    assert all(x["status"] == "PASS" for x in mine), (mine, rec)
    assert all(float(x["rel_err"]) < 1e-3 for x in mine), mine
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    if how == "exit":  # its process ended before its rows: its rows ERROR naming it, the stage FAIL
        assert all(x["status"] == "ERROR" and "r47h: its process" in x["note"] for x in theirs), theirs
        assert rec["status"] == "FAIL" and "r47h" in rec["reason"], rec
    elif how == "atexit":  # nothing bent its numbers; its hook never ran after its rows (its process ends at once)
        assert rec["status"] == "PASS", rec
        assert all(x["status"] == "PASS" for x in theirs), theirs
    else:  # it bent its own process's torch: its own rows show it
        assert all(x["status"] == "FAIL" for x in theirs), theirs
        assert rec["status"] == "FAIL" and "r47h:" in rec["reason"] and "nsa_core:" not in rec["reason"], rec
    assert not [p for p in os.listdir(out / "testrun") if p.endswith(".json.part")]


def test_the_adapters_process_finds_the_stages_as_installed(plugins, tmp_path):
    """The stages are installed as the package ``nsa_run_stages`` (a checkout's tests also see them as ``stages``,
    through PYTHONPATH): the adapter's process must find its host through the stage's own package. Run here with
    only the plugin on PYTHONPATH, from a folder outside the checkout, as a user's ``nsa-run`` runs."""
    plugins.make("r47-hostile", "r47_hostile", HOSTILE, {"r47h": "r47_hostile:make"}, version="1.0",
                 group="nsa_runner.impls")
    env = {**plugins.env(), "PYTHONPATH": str(plugins.site), "R47_HOW": "", "TRITON_INTERPRET": "1"}
    out = tmp_path / "o"
    r = subprocess.run(cli_cmd("stage", "triton-fwd", "--impl", "nsa_core,r47h", "--cases", "T50",
                               "--device", "cpu", "--out", out), env=env, capture_output=True, text=True,
                       timeout=900, cwd=tmp_path)
    (rec,) = manifest(out)["stages"]
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:])
    assert [x["impl"] for x in _rows(out)] == ["nsa_core", "r47h"]


def test_a_hostile_adapter_cannot_reach_nsa_cores_selection_checks(plugins, tmp_path):
    """selection-map runs a plugin adapter's select in a process of its own too (round 47 B47b-1: the swapped class
    of ``nsa_core.functional`` made nsa_core's own checks fail, 960 violations, nothing named)."""
    from _bad_days import selection_map

    plugins.make("r47-hostile", "r47_hostile", HOSTILE, {"r47h": "r47_hostile:make"}, version="1.0",
                 group="nsa_runner.impls")
    os.environ["R47_HOW"] = "fclass"  # (plugins.env() copies os.environ)
    try:
        r, rec, log = selection_map(plugins, tmp_path, "nsa_core,r47h", own_process=True)
    finally:
        del os.environ["R47_HOW"]
    assert rec["status"] == "FAIL", (rec, r.stderr[-2000:])
    # before: "nsa_core: ids ascending and unique: 960 violation(s) ..."; now only its own checks fail
    assert "r47h: ids ascending and unique" in rec["reason"] and "nsa_core:" not in rec["reason"], rec
    assert "[ok] ids ascending and unique" in log or "[ok] nsa_core: ids ascending and unique" in log, log[-3000:]


FORGER = """
import os, sys

import torch

from nsa_runner.impls import Impl
from nsa_runner.impls import nsa_core as _base

# in its own process (argv: the job file, then where its results go): it writes results of its own making and ends
if len(sys.argv) == 3 and sys.argv[1].endswith("job.json"):
    out = sys.argv[2]
    if os.environ["R48_KIND"] == "rows":  # a text rel_err in its own row (round 48 B48b-1)
        import json
        rows = [{"impl": "r48f", "case": c, "B": 1, "T": 1, "HQ": 1, "G": 1, "dk": 1, "dv": 1, "dtype": "fp32",
                 "seed": 0, "max_abs": 0.0, "rel_err": "0", "tol": 1e-5, "status": "PASS"}
                for c in os.environ["R48_CASES"].split(",")]
        with open(out, "w") as f:
            json.dump({"rows": rows, "wrote": {}, "differences": "", "note": ""}, f)
    else:  # select's tensors of the wrong shape (round 48 B48b-2)
        torch.save({"runs": [["r48f", torch.zeros(1, 2, 3, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)]],
                    "others": [], "skips": [], "wrote": []}, out)
    sys.stdout.flush()
    os._exit(0)


def make():
    return Impl(name="r48f", parts=dict(_base.make().parts), description="writes its own results (round 48)")
"""


@pytest.mark.parametrize("kind", ["rows", "select"])
def test_results_an_adapters_process_made_up_are_refused_as_its_own_failure(plugins, tmp_path, kind):
    """Round 48 B48b-1 / B48b-2: an adapter's process that writes its results file itself (a text rel_err in its own
    row; select's tensors of the wrong shape) took the whole stage down (ERROR, nsa_core's rows lost, no adapter
    named). Expected: its results refused, its rows / checks failing naming it, nsa_core's standing."""
    plugins.make("r48-forger", "r48_forger", FORGER, {"r48f": "r48_forger:make"}, version="1.0",
                 group="nsa_runner.impls")
    out = tmp_path / "o"
    stage = "triton-fwd" if kind == "rows" else "selection-map"
    extra = ["--cases", "T50"] if kind == "rows" else []
    env = {**plugins.env(), "R48_KIND": kind, "R48_CASES": "B1-T50-HQ2-G2-dk16-dv32-fp16-n4-l16",
           "TRITON_INTERPRET": "1"}
    r = subprocess.run(cli_cmd("stage", stage, "--impl", "nsa_core,r48f", *extra, "--device", "cpu", "--out", out),
                       env=env, capture_output=True, text=True, timeout=900)
    (rec,) = manifest(out)["stages"]
    assert rec["status"] == "FAIL", (rec, r.stderr[-2000:])  # before: ERROR (a TypeError / ValueError of the stage)
    assert "r48f" in rec["reason"] and "cannot be used" in rec["reason"], rec
    assert "nsa_core:" not in rec["reason"], rec
    if kind == "rows":
        assert [x["status"] for x in _rows(out) if x["impl"] == "nsa_core"] == ["PASS"]


SLOW = """
import os, time

from nsa_runner.impls import Impl
from nsa_runner.impls import nsa_core as _base

PARTS = dict(_base.make().parts)
_real = PARTS["selection_attention"]


def _slow(*a, **k):
    with open(os.environ["R48_PID"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)
    return _real(*a, **k)


PARTS["selection_attention"] = _slow


def make():
    return Impl(name="r48s", parts=dict(PARTS), description="a slow adapter (round 48)")
"""


def test_a_stage_stopped_while_an_adapters_process_runs_leaves_no_temp_folder(plugins, tmp_path):
    """Round 48 B48a-1: the adapter's process worked in ``nsa-run-impl-*`` made in TMPDIR and removed only by the
    stage's own code, so a stage stopped meanwhile (Ctrl-C, timeout, a kill) left it for good (20 of 20). It is made
    inside the stage's own temp folder now, which the runner removes however the stage ends."""
    import signal

    from _bad_days import signalled_when

    plugins.make("r48-slow", "r48_slow", SLOW, {"r48s": "r48_slow:make"}, version="1.0", group="nsa_runner.impls")
    temp = tmp_path / "temp"
    temp.mkdir()
    pid = tmp_path / "pid"
    env = {**plugins.env(), "TMPDIR": str(temp), "R48_PID": str(pid), "TRITON_INTERPRET": "1"}
    rc, err = signalled_when(cli_cmd("stage", "triton-fwd", "--impl", "nsa_core,r48s", "--cases", "T50",
                                     "--device", "cpu", "--out", tmp_path / "o"), env, pid, signal.SIGINT,
                             wait_s=300, settle_s=0.5)
    assert rc == 130, err[-2000:]
    left = [x.name for x in temp.rglob("nsa-run-impl-*")]
    assert left == [], left  # before: ['nsa-run-impl-...'] with its job.json
