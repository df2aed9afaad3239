"""Bad days, red-team round 30 B30-1 / B30-2, through the CLI: process state an adapter's code left changed that the
round-29 table (``impls._interpreter_settings``) did not cover: decimal's traps and flags, ``threading.settrace`` /
``setprofile``, the except / unraisable / breakpoint / display hooks, ``logging.disable`` and the root logger's level,
the async-generator hooks, coroutine origin tracking, the dlopen flags, the C environment (``os.unsetenv``: os.environ
still said PATH, a child started by the stage found none), the time zone (``TZ`` + ``time.tzset``: put back in
os.environ, never re-read), faulthandler switched off or pointed at /dev/null (a later segfault left no stack in the
log). Expected: put back after each adapter's code, the log's note naming them; the next adapter's verdicts stand and
a later crash still leaves its stack."""

from __future__ import annotations

try:
    from _bad_days import selection_map
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import selection_map

CHANGES = """
import asyncio, decimal, faulthandler, logging, os, sys, threading, time


def _mark(fn):
    fn._r30 = True
    return fn


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    ctx = decimal.getcontext()
    ctx.traps[decimal.Inexact] = True
    ctx.flags[decimal.Clamped] = True
    threading.settrace(_mark(lambda *a: None))
    threading.setprofile(_mark(lambda *a: None))
    sys.excepthook = _mark(lambda *a: None)
    threading.excepthook = _mark(lambda *a: None)
    sys.unraisablehook = _mark(lambda *a: None)
    sys.breakpointhook = _mark(lambda *a: None)
    sys.displayhook = _mark(lambda *a: None)
    logging.disable(logging.CRITICAL)
    logging.root.setLevel(5)
    sys.set_asyncgen_hooks(firstiter=_mark(lambda g: None))
    sys.set_coroutine_origin_tracking_depth(7)
    sys.setdlopenflags(os.RTLD_NOW | os.RTLD_GLOBAL | os.RTLD_NODELETE)
    os.unsetenv("PATH")
    os.environ["TZ"] = "XYZ-5:30"
    time.tzset()
    faulthandler.disable()
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r30m", {"select": _select})
"""
CHECKS = """
import decimal, faulthandler, logging, os, subprocess, sys, threading, time


def _marked(fn):
    return getattr(fn, "_r30", False) is True


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    ctx = decimal.getcontext()
    zone = time.tzname, time.timezone
    time.tzset()  # what the zone is, read afresh from the environment
    env = subprocess.run(["/usr/bin/env"], capture_output=True, check=True).stdout
    left = {"decimal traps": ctx.traps[decimal.Inexact], "decimal flags": ctx.flags[decimal.Clamped],
            "threading.settrace": _marked(threading.gettrace()),
            "threading.setprofile": _marked(threading.getprofile()),
            "sys.excepthook": _marked(sys.excepthook), "threading.excepthook": _marked(threading.excepthook),
            "sys.unraisablehook": _marked(sys.unraisablehook), "sys.breakpointhook": _marked(sys.breakpointhook),
            "sys.displayhook": _marked(sys.displayhook), "logging.disable": logging.root.manager.disable != 0,
            "root level": logging.root.level == 5, "asyncgen": _marked(sys.get_asyncgen_hooks().firstiter),
            "coroutine depth": sys.get_coroutine_origin_tracking_depth() == 7,
            "dlopen": sys.getdlopenflags() == os.RTLD_NOW | os.RTLD_GLOBAL | os.RTLD_NODELETE,
            "C PATH": b"PATH=" not in env, "TZ": "TZ" in os.environ, "tz stale": zone != (time.tzname, time.timezone),
            "faulthandler": not faulthandler.is_enabled()}
    assert not any(left.values()), f"left: {sorted(k for k, v in left.items() if v)}"
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r30k", {"select": _select})
"""


def test_process_state_an_adapter_changed_is_put_back_before_the_next(plugins, tmp_path):
    plugins.make("r30-changes", "r30_changes", CHANGES, {"r30m": "r30_changes:IMPL"}, version="1.0",
                 group="nsa_runner.impls")
    plugins.make("r30-checks", "r30_checks", CHECKS, {"r30k": "r30_checks:IMPL"}, version="1.0",
                 group="nsa_runner.impls")
    r, rec, log = selection_map(plugins, tmp_path, "r30m,r30k,nsa_core")
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:])  # before: FAIL "r30k: ... left: [...]"
    for name in ("threading.settrace", "sys.excepthook", "threading.excepthook", "sys.unraisablehook",
                 "sys.displayhook", "logging.disable", "the root logger's level", "sys.set_asyncgen_hooks",
                 "sys.set_coroutine_origin_tracking_depth", "sys.setdlopenflags", "faulthandler (disabled)",
                 "the decimal context", "the C environment (PATH", "the time zone (time.tzset)"):
        assert name in log, (name, log[-3000:])


REDIRECTS = """
import faulthandler, os


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    faulthandler.enable(file=open(os.devnull, "w"))  # on, but writing nowhere
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r30r", {"select": _select})
"""
CRASHES = """
import ctypes


def _select(q, k_cmp, cfg):
    ctypes.string_at(0)  # SIGSEGV


from nsa_runner.impls import Impl

IMPL = Impl("r30s", {"select": _select})
"""


def test_a_crash_after_an_adapter_pointed_faulthandler_away_still_leaves_its_stack(plugins, tmp_path):
    plugins.make("r30-redirects", "r30_redirects", REDIRECTS, {"r30r": "r30_redirects:IMPL"}, version="1.0",
                 group="nsa_runner.impls")
    plugins.make("r30-crashes", "r30_crashes", CRASHES, {"r30s": "r30_crashes:IMPL"}, version="1.0",
                 group="nsa_runner.impls")
    r, rec, log = selection_map(plugins, tmp_path, "r30r,r30s")
    assert rec["status"] == "ERROR", (rec, r.stderr[-2000:])
    assert "Segmentation fault" in log and "r30_crashes" in log, log[-3000:]  # before: no stack, no frame named
