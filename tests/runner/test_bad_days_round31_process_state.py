"""Bad days, red-team round 31 B31-1 .. B31-4, through the CLI: more process state an adapter's code left changed
(``sys.tracebacklimit = 0``: a later failure left no traceback; the log's streams reconfigured to ASCII; a raising
``warnings.showwarning`` / log record factory; ``gc.set_threshold(0)``; the process pinned to one CPU), decimal's
traps set at the adapter module's import when that was decimal's first import (never compared), hooks whose ``__eq__``
says True (kept) or raises (the whole put-back stopped: os.environ and the working directory leaked, the adapter
FAILed with nsa-run's own exception), a time zone set with ``os.putenv`` and a replaced root logger (both noted "put
back" while they stayed). Expected: each put back and named; the next adapter runs in nsa-run's own state."""

from __future__ import annotations

try:
    from _bad_days import selection_map
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import selection_map

CHANGES = """
import decimal  # B31-2: decimal's first import in the stage's process, with a trap set at it
decimal.getcontext().traps[decimal.Inexact] = True

import gc, logging, os, sys, time, warnings

ORIG = {}


class EqTrue:  # says it equals anything (mock.ANY does)
    def __eq__(self, other):
        return True

    def __call__(self, *a):
        pass


class EqRaises:
    def __eq__(self, other):
        raise ZeroDivisionError("division by zero")

    def __call__(self, *a):
        pass


def _raise(*a, **k):
    raise ZeroDivisionError("from the adapter's hook")


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    time.tzset()
    ORIG.update(affinity=os.sched_getaffinity(0), threshold=gc.get_threshold(), encoding=sys.stdout.encoding,
                root=logging.root, level=logging.root.level, zone=(time.tzname, time.timezone), cwd=os.getcwd(),
                excepthook=sys.excepthook, displayhook=sys.displayhook)
    sys.tracebacklimit = 0
    sys.stdout.reconfigure(encoding="ascii", errors="strict")
    sys.stderr.reconfigure(encoding="ascii", errors="strict")
    warnings.showwarning = _raise
    logging.setLogRecordFactory(_raise)
    gc.set_threshold(0)
    os.sched_setaffinity(0, {sorted(ORIG["affinity"])[0]})
    sys.excepthook = EqTrue()
    sys.displayhook = EqRaises()
    os.putenv("TZ", "XYZ-5:30")
    time.tzset()
    logging.root = logging.Logger.root = logging.Logger.manager.root = logging.RootLogger(logging.CRITICAL)
    os.environ["R31_LEAK"] = "1"  # after the raising hook: put back only where the put-back went on past it
    os.chdir("/")
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r31m", {"select": _select})
"""
CHECKS = """
import decimal, gc, logging, os, sys, time, warnings


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    orig = sys.modules["r31_changes"].ORIG
    time.tzset()  # the zone as the environment says it now
    print("3 \\u00b5s per call")  # the log's stream as the stage's own code uses it
    warnings.warn("r31k warns")
    logging.getLogger("r31k").warning("r31k logs")
    left = {"decimal trap (at import)": decimal.getcontext().traps[decimal.Inexact],
            "sys.tracebacklimit": hasattr(sys, "tracebacklimit"),
            "stdout encoding": sys.stdout.encoding != orig["encoding"],
            "showwarning": warnings.showwarning.__module__ != "warnings",
            "record factory": logging.getLogRecordFactory() is not logging.LogRecord,
            "gc threshold": gc.get_threshold() != orig["threshold"],
            "affinity": os.sched_getaffinity(0) != orig["affinity"],
            "excepthook (eq True)": sys.excepthook is not orig["excepthook"],
            "displayhook (eq raises)": sys.displayhook is not orig["displayhook"],
            "environ after the raising hook": "R31_LEAK" in os.environ, "cwd": os.getcwd() != orig["cwd"],
            "TZ (putenv)": (time.tzname, time.timezone) != orig["zone"],
            "root logger": logging.root is not orig["root"] or logging.root.level != orig["level"]}
    assert not any(left.values()), f"left: {sorted(k for k, v in left.items() if v)}"
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r31k", {"select": _select})
"""


def test_more_process_state_an_adapter_changed_is_put_back_and_named(plugins, tmp_path):
    plugins.make("r31-changes", "r31_changes", CHANGES, {"r31m": "r31_changes:IMPL"}, version="1.0",
                 group="nsa_runner.impls")
    plugins.make("r31-checks", "r31_checks", CHECKS, {"r31k": "r31_checks:IMPL"}, version="1.0",
                 group="nsa_runner.impls")
    r, rec, log = selection_map(plugins, tmp_path, "r31m,r31k,nsa_core")
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:])  # before: FAIL, r31m with nsa-run's own exception too
    for name in ("sys.tracebacklimit", "sys.stdout.reconfigure", "sys.stderr.reconfigure", "warnings.showwarning",
                 "logging.setLogRecordFactory", "gc.set_threshold", "os.sched_setaffinity", "sys.excepthook",
                 "sys.displayhook", "the C environment (TZ", "the time zone (time.tzset)", "logging.root (replaced)",
                 "the decimal context"):
        assert name in log, (name, log[-3000:])
    assert "could not be put back" not in log, log[-3000:]
