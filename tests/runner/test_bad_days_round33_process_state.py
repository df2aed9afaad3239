"""Bad days, round 33 (found reading round 32's fixes, before the round's probes came back), through the CLI: still
more process-wide state an adapter's call left changed, neither put back nor named, the next adapter's verdict
blamed: torch's new fp32-precision API (``torch.backends.cuda.matmul.fp32_precision = "tf32"``, which also made
``torch.get_float32_matmul_precision()`` raise, so that nothing of torch's state was put back: the default dtype
stayed float64), the scaled-dot-product math backend off (nsa_core's CPU branches run through SDPA), cuDNN's
benchmark switch, numpy's error handling (``np.seterr(all="raise")``), the locale, the process's niceness, and a stub
module put into ``sys.modules`` over one loaded before. Then the round's probes (B33-1 to B33-4): the C library's
rounding mode and floating-point traps (a later NaN killed the stage with SIGFPE, every verdict lost),
``warnings.simplefilter("error")``, standard-library functions MODULES did not list (``bisect.bisect_left``),
``csv.field_size_limit(5)``, ``torch.set_printoptions(precision=0)``, a kernel registered over
``aten::sort.stable`` (nsa_core's reference FAILed), ``gc.callbacks = None`` (said "could not be put back" and "put
back" in one line). Expected: each put back after the adapter's code and named; the next verdicts stand."""

from __future__ import annotations

try:
    from _bad_days import changes_then_checks
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import changes_then_checks

CHANGES = """
import locale, os, sys, types
import numpy as np
import torch

ORIG = {}


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    import csv
    out = F.select_blocks(q, k_cmp, cfg)  # its own work first: what follows is what it leaves behind
    ORIG.update(nice=os.getpriority(os.PRIO_PROCESS, 0), csv=csv, locale=locale.setlocale(locale.LC_ALL))
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.set_default_dtype(torch.float64)
    torch.backends.cuda.enable_math_sdp(False)
    torch.backends.cudnn.benchmark = True
    np.seterr(all="raise")
    locale.setlocale(locale.LC_NUMERIC, "C.UTF-8")
    os.nice(1)
    sys.modules["csv"] = types.ModuleType("csv")
    import bisect, ctypes, gc, warnings
    libc = ctypes.CDLL(None)
    libc.fesetround(0x800)  # upward
    libc.feenableexcept(0x01)  # FE_INVALID: a later NaN is SIGFPE
    warnings.simplefilter("error")
    bisect.bisect_left = lambda a, x, *r, **k: 0
    csv.field_size_limit(5)
    torch.set_printoptions(precision=0)
    gc.callbacks = None
    global _LIB
    _LIB = torch.library.Library("aten", "IMPL")  # a careless "fast sort" ignoring descending, kept alive

    def _sort(self, stable=None, dim=-1, descending=False):
        return torch.ops.aten.sort.default(self.neg() if descending else self, dim)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _LIB.impl("sort.stable", _sort, "CPU")
    return out


from nsa_runner.impls import Impl

IMPL = Impl("r33m", {"select": _select})
"""
CHECKS = """
import locale, os, sys
import numpy as np
import torch


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    orig = sys.modules["r33_changes"].ORIG
    back = os.geteuid() == 0 or os.getrlimit(os.RLIMIT_NICE)[0] >= 21  # lowering niceness needs privilege
    left = {"fp32_precision": torch.backends.cuda.matmul.fp32_precision != "none",
            "default dtype": torch.get_default_dtype() != torch.float32,
            "math sdp": not torch.backends.cuda.math_sdp_enabled(), "cudnn.benchmark": torch.backends.cudnn.benchmark,
            "np.seterr": np.geterr()["divide"] == "raise", "locale": locale.setlocale(locale.LC_ALL) != orig["locale"],
            "nice": back and os.getpriority(os.PRIO_PROCESS, 0) != orig["nice"],
            "sys.modules": sys.modules.get("csv") is not orig["csv"]}
    assert not any(left.values()), f"left: {sorted(k for k, v in left.items() if v)}"
    torch.get_float32_matmul_precision()  # raised under the mixed APIs
    import bisect, csv, ctypes, gc, warnings
    libc = ctypes.CDLL(None)
    left = {"rounding": libc.fegetround() != 0, "traps": libc.fegetexcept() != 0,
            "warnings": any(f[0] == "error" for f in warnings.filters), "bisect": bisect.bisect_left([1, 2, 3], 3) != 2,
            "csv": csv.field_size_limit() == 5, "printoptions": "1.25" not in str(torch.tensor([1.25])),
            "gc.callbacks": not isinstance(gc.callbacks, list),
            "aten::sort": torch.sort(torch.tensor([1.0, 3.0, 2.0]), stable=True, descending=True).values.tolist()
            != [3.0, 2.0, 1.0]}
    assert not any(left.values()), f"left: {sorted(k for k, v in left.items() if v)}"
    float("nan") * 0.0  # a NaN: SIGFPE under the trap
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r33k", {"select": _select})
"""


def test_torch_switches_numpy_locale_niceness_and_sys_modules_are_put_back_and_named(plugins, tmp_path):
    r, rec, log = changes_then_checks(plugins, tmp_path, "r33", CHANGES, CHECKS)
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:], log[-3000:])
    for name in ("torch.backends.cuda.matmul.fp32_precision", "torch's default dtype",
                 "torch.backends.cuda.enable_math_sdp", "torch.backends.cudnn.benchmark", "numpy.seterr",
                 "locale.setlocale", "os.nice / os.setpriority", "sys.modules (csv)",
                 "floating-point traps (feenableexcept)", "the floating-point rounding mode (fesetround)",
                 "warnings.filters", "bisect.bisect_left", "csv.field_size_limit",
                 "torch._tensor_str.PRINT_OPTS.precision",
                 "gc.callbacks", "torch kernels registered over aten/sort.stable"):
        assert name in log, (name, log[-3000:])
    assert "could not be put back" not in log, log[-3000:]
