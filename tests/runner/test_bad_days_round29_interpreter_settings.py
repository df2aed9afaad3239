"""Bad days, red-team round 29 B29-3, through the CLI: process-wide interpreter settings an adapter's code changed (the
umask, socket's default timeout, the garbage collector switched off, the switch interval, the int-to-str digit limit,
decimal's precision, the thread stack size, a profile function) were neither put back nor named: the next adapter,
healthy alone, FAILed blamed on itself, no note. Expected: put back after each adapter's code like the rest of the
process's state (adapters run in nsa-run's own state), the log's note naming them; the next adapter's verdicts stand."""

from __future__ import annotations

try:
    from _bad_days import selection_map
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import selection_map

CHANGES = """
import decimal, gc, os, socket, sys, threading


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    os.umask(0o077)
    socket.setdefaulttimeout(0.001)
    gc.disable()
    sys.setswitchinterval(0.5)
    sys.set_int_max_str_digits(640)
    decimal.getcontext().prec = 3
    threading.stack_size(1 << 20)
    sys.setprofile(lambda *a: None)
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r29m", {"select": _select})
"""
CHECKS = """
import decimal, gc, os, socket, sys, threading


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    mask = os.umask(0o022)
    os.umask(mask)
    left = {"umask": mask == 0o077, "timeout": socket.getdefaulttimeout() is not None, "gc": not gc.isenabled(),
            "switch": sys.getswitchinterval() == 0.5, "digits": sys.get_int_max_str_digits() == 640,
            "decimal": decimal.getcontext().prec == 3, "stack": threading.stack_size() == 1 << 20,
            "profile": sys.getprofile() is not None}
    assert not any(left.values()), f"left: {sorted(k for k, v in left.items() if v)}"
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r29k", {"select": _select})
"""


def test_interpreter_settings_an_adapter_changed_are_put_back_before_the_next(plugins, tmp_path):
    plugins.make("r29-changes", "r29_changes", CHANGES, {"r29m": "r29_changes:IMPL"}, version="1.0",
                 group="nsa_runner.impls")
    plugins.make("r29-checks", "r29_checks", CHECKS, {"r29k": "r29_checks:IMPL"}, version="1.0",
                 group="nsa_runner.impls")
    r, rec, log = selection_map(plugins, tmp_path, "r29m,r29k,nsa_core")
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:])  # before: FAIL "r29k: ... left: [...]"
    for name in ("the umask", "socket.setdefaulttimeout", "the garbage collector", "sys.setprofile",
                 "the decimal context"):
        assert name in log, (name, log[-3000:])
