"""Bad days, red-team round 13 (part B): hostile impl adapters and duplicate sanity checks, through the CLI.

Every test here reproduces a break of round 13 part B that worked on the code before its fix:

- B5: an impl adapter's ``check`` or part that raised ``SystemExit`` / ``KeyboardInterrupt`` /
  ``GeneratorExit``, or returned / raised a value whose ``__str__`` raises, still ended the whole
  sanity (and selection-map) stage as an anonymous ERROR ("stage called sys.exit(3)", "process died
  with SIGINT", "RuntimeError: format boom"), nsa_core's checks lost. A real SIGINT to the stage's
  process must still stop it (guarded here too);
- B11: sanity.json with two checks of one name: ``compare`` kept the last (a failing copy before a
  passing one: "no regression", exit 0) while ``report`` counted both ("36 of 37 checks hold").
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

try:
    from _bad_days import MAIN, wait_for
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, wait_for

from nsa_runner.manifest import RunManifest


def _main(env, *args, timeout=300):
    return subprocess.run([sys.executable, "-c", MAIN, *map(str, args)], env=env, text=True, timeout=timeout,
                          capture_output=True)


def _clean(r):
    assert "Traceback" not in r.stderr and "(unexpected" not in r.stderr, r.stderr[-3000:]


def _dist(site, dirname, name, version, module, source, group, entries):
    (site / f"{module}.py").write_text(source)
    info = site / f"{dirname}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()))


# ---- B5 -------------------------------------------------------------------------------------------

# adapters providing only `select` (cheap on CPU); each misbehaves in one way
ODD = '''
import os, time
from nsa_runner.impls import Constraints, Impl
from nsa_runner.impls.nsa_core import make

_select = make().parts["select"]


class Unprintable:
    def __str__(self):
        raise RuntimeError("format boom")
    __format__ = __repr__ = lambda self, *a: (_ for _ in ()).throw(RuntimeError("format boom"))


class BadExc(Exception):
    def __str__(self):
        raise RuntimeError("str boom")


class NonStrExc(Exception):
    def __str__(self):
        return 42


def _raiser(exc):
    def f(*a):
        raise exc
    return f


def _impl(name, check=None, select=_select):
    if name.startswith("oddq"):  # selection_attention (the parity stages' part)
        return Impl(name, {"selection_attention": select}, Constraints(check=check))
    return Impl(name, {"select": select}, Constraints(check=check))


CHECKS = {"oddexit": _raiser(SystemExit(3)), "oddkbi": _raiser(KeyboardInterrupt()),
          "oddgen": _raiser(GeneratorExit()), "oddstr": lambda case, part: Unprintable()}
PARTS = {"oddpexit": _raiser(SystemExit(4)), "oddpexc": _raiser(BadExc()), "oddpnon": _raiser(NonStrExc()),
         "oddpkbi": _raiser(KeyboardInterrupt()), "oddqexit": _raiser(SystemExit(5)), "oddqexc": _raiser(BadExc())}


def _wait(q, k, cfg):
    with open(os.environ["ODD_PIDFILE"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)
    return _select(q, k, cfg)


def get(name):
    if name == "oddwait":
        return _impl(name, select=_wait)
    if name in CHECKS:
        return _impl(name, check=CHECKS[name])
    return _impl(name, select=PARTS[name])
'''
NAMES = ["oddexit", "oddkbi", "oddgen", "oddstr", "oddpexit", "oddpexc", "oddpnon", "oddpkbi"]


@pytest.fixture
def odd_env(plugins):
    names = [*NAMES, "oddwait", "oddqexit", "oddqexc"]
    entries = {n: f"oddmod:{n.upper()}" for n in names}
    src = ODD + "".join(f"{n.upper()} = lambda: get({n!r})\n" for n in names)
    _dist(plugins.site, "odd13_impl", "odd13-impl", "1.0", "oddmod", src, "nsa_runner.impls", entries)
    return plugins.env()


def test_an_adapters_base_exception_or_unprintable_value_is_its_own_failure_the_others_still_run(odd_env, tmp_path):
    """Before: sanity ERROR "stage called sys.exit(3)" (or "process died with SIGINT", "RuntimeError:
    format boom"), no sanity.json, nsa_core's checks lost; selection-map the same."""
    out = tmp_path / "o"
    r = _main(odd_env, "oneshot", "--out", out, "--only", "sanity,selection-map", "--device", "cpu",
              "--impl", ",".join(["nsa_core", *NAMES]), timeout=600)
    _clean(r)
    run = out / "testrun"
    st = {s["name"]: s for s in json.loads((run / "manifest.json").read_text())["stages"]}
    for stage in ("sanity", "selection-map"):
        assert st[stage]["status"] == "FAIL", st[stage]
    checks = json.loads((run / "sanity.json").read_text())["checks"]
    core = [c for c in checks if not c["check"].startswith("odd")]
    assert len(core) >= 10 and all(c["ok"] for c in core), [c for c in core if not c["ok"]][:3]
    for name in NAMES:  # each adapter: its own failed check, naming it and what it raised
        mine = [c for c in checks if c["check"].split()[0] == name]
        assert mine and not any(c["ok"] for c in mine), (name, mine)
    details = {c["check"].split()[0]: c["detail"] for c in checks if c["check"].startswith("odd")}
    assert "SystemExit" in details["oddexit"] and "KeyboardInterrupt" in details["oddkbi"], details
    assert "GeneratorExit" in details["oddgen"] and "SystemExit" in details["oddpexit"], details
    assert "BadExc" in details["oddpexc"] and "NonStrExc" in details["oddpnon"], details
    text = (run / "selection_map.txt").read_text()
    assert "[ok] nsa_core:" in text, text[:3000]
    for name in NAMES:
        assert f"[FAIL] {name}: select" in text, (name, text[-3000:])


def test_an_adapters_selection_attention_raising_system_exit_is_its_parity_error(odd_env, tmp_path):
    """Before: triton-fwd ERROR "stage called sys.exit(5)", no triton_fwd.csv, the other adapter's rows lost."""
    out = tmp_path / "o"
    r = _main(odd_env, "oneshot", "--out", out, "--only", "triton-fwd", "--device", "cpu",
              "--impl", "oddqexit,oddqexc", timeout=600)
    _clean(r)
    st = {s["name"]: s for s in json.loads((out / "testrun" / "manifest.json").read_text())["stages"]}
    assert st["triton-fwd"]["status"] == "FAIL", st["triton-fwd"]
    import csv

    rows = list(csv.DictReader((out / "testrun" / "triton_fwd.csv").open()))
    by = {n: [x for x in rows if x["impl"] == n] for n in ("oddqexit", "oddqexc")}
    assert by["oddqexit"] and by["oddqexc"], rows[:3]
    ran = [x for n in by for x in by[n] if x["status"] != "SKIP"]
    assert ran and all(x["status"] == "ERROR" for x in ran), ran[:3]
    assert all("SystemExit" in x["note"] for x in by["oddqexit"] if x["status"] == "ERROR")
    assert all("BadExc" in x["note"] for x in by["oddqexc"] if x["status"] == "ERROR")


@pytest.mark.parametrize("own_process", [False, True])
def test_a_real_sigint_to_the_stage_process_still_stops_it(odd_env, tmp_path, own_process):
    """A Ctrl-C (SIGINT) that reaches the process running an adapter's part is never taken for the adapter's own
    KeyboardInterrupt. In the stage's process (``NSA_RUN_ADAPTER_PROCESS=0``) it stops the stage (ERROR naming SIGINT);
    in the adapter's own process (the default since round 47) that process ends by it, named in its failure, and
    nsa_core's checks stand."""
    out, pidfile = tmp_path / "o", tmp_path / "pid"
    env = {**odd_env, "ODD_PIDFILE": str(pidfile), "NSA_RUN_ADAPTER_PROCESS": "1" if own_process else "0"}
    p = subprocess.Popen([sys.executable, "-c", MAIN, "oneshot", "--out", str(out), "--only", "selection-map",
                          "--device", "cpu", "--impl", "nsa_core,oddwait"], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        pid = int(wait_for(pidfile, 120, p))
        t0 = time.monotonic()
        os.kill(pid, signal.SIGINT)
        _, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert time.monotonic() - t0 < 60  # not the part's 120 s sleep
    assert "Traceback" not in err, err[-3000:]
    st = {s["name"]: s for s in json.loads((out / "testrun" / "manifest.json").read_text())["stages"]}
    if not own_process:
        assert st["selection-map"]["status"] == "ERROR" and "SIGINT" in st["selection-map"]["reason"], st
        return
    reason = st["selection-map"]["reason"]
    assert st["selection-map"]["status"] == "FAIL" and "oddwait" in reason and "killed by SIGINT" in reason, st
    assert "nsa_core:" not in reason, st


# ---- B11 ------------------------------------------------------------------------------------------


def _sanity_run(out, rid, checks):
    """A finished run folder ``out/rid`` whose stage sanity declared sanity.json with ``checks``."""
    run = out / rid
    run.mkdir(parents=True)
    m = RunManifest.create(run, rid, ["nsa-run", "oneshot"], device="cpu", profile="quick")
    (run / "sanity.json").write_text(json.dumps({"schema_version": 1, "checks": checks}))
    m.record({"name": "sanity", "status": "PASS", "order": 2, "source": "built-in", "reason": "ok",
              "files": ["sanity.json"], "duration_s": 1.0})
    m.finish()
    return run


OK_ERR = {"check": "cmp/triton forward vs fp64 reference", "ok": True, "rel_err": 1e-5, "tol": 1e-3, "detail": "ok"}
OK_STRUCT = {"check": "select structure", "ok": True, "detail": "ascending"}


@pytest.mark.parametrize("check", [OK_STRUCT, OK_ERR], ids=["structural", "with rel_err"])
@pytest.mark.parametrize("failing_first", [True, False], ids=["failing first", "failing last"])
def test_a_duplicate_sanity_check_name_never_hides_a_failure(plugins, tmp_path, check, failing_first):
    """Before: compare A -> B said "no regression", exit 0 (the failing copy before the passing one
    in B), or "FAIL -> PASS, 1 fixed" (the failing copy last in A); report said "N of N+1 checks hold"."""
    env = plugins.env()
    out = tmp_path / "o"
    bad = {**check, "ok": False, "detail": "STRUCT BROKEN"}
    two = [bad, check] if failing_first else [check, bad]
    other = OK_STRUCT if check is OK_ERR else OK_ERR
    _sanity_run(out, "aaaaaaa", [other, check])
    b = _sanity_run(out, "bbbbbbb", [other, *two])
    lines = []
    for args in (("compare", "aaaaaaa", "bbbbbbb"), ("compare", "bbbbbbb", "aaaaaaa"), ("report", "bbbbbbb")):
        r = _main(env, *args, "--out", out, timeout=120)
        _clean(r)
        assert r.returncode == 2, (args, r.returncode, r.stdout[-2000:], r.stderr[-2000:])
        assert "no regression" not in r.stdout and "fixed" not in r.stdout, r.stdout
        err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
        assert len(err) == 1 and "sanity.json" in err[0] and check["check"] in err[0], r.stderr[-2000:]
        lines.append(err[0])
    assert not (b / "report.html").exists()
    # unique names still compare and report
    _sanity_run(out, "ccccccc", [other, check, {**check, "check": check["check"] + " #2"}])
    r = _main(env, "compare", "aaaaaaa", "ccccccc", "--out", out, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
