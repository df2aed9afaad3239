"""Bad days, red-team round 34 B34-1..B34-4, through the CLI: more state an adapter's call left changed, neither put
back nor named, the next adapter (or nsa_core's reference) blamed: ``torch.sort`` rebound to the adapter's function
under ``@torch.no_grad()`` (kept: the wrapper's code lies in torch's folder), a kernel over ``aten::sort.stable``
registered through a subclass of ``torch.library.Library`` (the stage ERROR, RecursionError), ``torch.autograd.grad``,
``torch.nn.Module.__call__``, ``csv.DictWriter.writerow`` and ``numpy.where`` rebound, the multi-head-attention fast
path off, and what made the stage 15x slower (a TIMEOUT under ``--timeout``): torch's autograd profiler left on,
``tracemalloc`` started, autograd's multithreading off. Expected: each put back after the adapter's code and named;
the next verdicts stand."""

from __future__ import annotations

try:
    from _bad_days import changes_then_checks
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import changes_then_checks

CHANGES = """
import csv, sys, tracemalloc, warnings
import numpy as np
import torch

ORIG = {}


class MyLibrary(torch.library.Library):
    pass


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    out = F.select_blocks(q, k_cmp, cfg)  # its own work first: what follows is what it leaves behind
    ORIG.update(sort=torch.sort, grad=torch.autograd.grad, call=torch.nn.Module.__call__,
                writerow=csv.DictWriter.writerow, where=np.where)
    sort = torch.sort

    @torch.no_grad()
    def my_sort(*a, **k):  # "faster" (the report's: it dropped descending)
        k.pop("descending", None)
        return sort(*a, **k)
    torch.sort = my_sort
    global _LIB
    _LIB = MyLibrary("aten", "IMPL")

    def _stable(self, stable=None, dim=-1, descending=False):
        return torch.ops.aten.sort.default(self, dim)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _LIB.impl("sort.stable", _stable, "CPU")
    torch.autograd.grad = lambda *a, **k: None
    torch.nn.Module.__call__ = lambda self, *a, **k: None
    csv.DictWriter.writerow = lambda self, row: 0
    np.where = lambda *a, **k: 0
    torch.backends.mha.set_fastpath_enabled(False)
    torch._C._set_multithreading_enabled(False)
    global _PROF
    _PROF = torch.autograd.profiler.profile()
    _PROF.__enter__()
    tracemalloc.start()
    return out


from nsa_runner.impls import Impl

IMPL = Impl("r34m", {"select": _select})
"""
CHECKS = """
import csv, sys, tracemalloc
import numpy as np
import torch


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    orig = sys.modules["r34_changes"].ORIG
    left = {"torch.sort": torch.sort is not orig["sort"], "grad": torch.autograd.grad is not orig["grad"],
            "Module.__call__": torch.nn.Module.__call__ is not orig["call"],
            "writerow": csv.DictWriter.writerow is not orig["writerow"], "np.where": np.where is not orig["where"],
            "aten::sort": torch.sort(torch.tensor([1.0, 3.0, 2.0]), stable=True, descending=True).values.tolist()
            != [3.0, 2.0, 1.0],
            "mha": not torch.backends.mha.get_fastpath_enabled(),
            "multithreading": not torch._C._is_multithreading_enabled(),
            "profiler": torch.autograd._profiler_enabled(), "tracemalloc": tracemalloc.is_tracing()}
    assert not any(left.values()), f"left: {sorted(k for k, v in left.items() if v)}"
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r34k", {"select": _select})
"""


def test_wrapped_rebinds_library_subclasses_more_namespaces_and_slowing_switches_are_put_back(plugins, tmp_path):
    r, rec, log = changes_then_checks(plugins, tmp_path, "r34", CHANGES, CHECKS)
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:], log[-3000:])
    for name in ("torch.sort", "torch kernels registered over aten/sort.stable", "torch.autograd.grad",
                 "Module.__call__", "csv.DictWriter.writerow", "numpy.where",
                 "torch.backends.mha.set_fastpath_enabled", "torch._C._set_multithreading_enabled",
                 "torch's autograd profiler (left on)", "tracemalloc.start"):
        assert name in log, (name, log[-3000:])


CHANGES35 = """
import torch

ORIG = {"linear": torch.nn.Linear.forward, "einsum": torch.einsum}
# at its import (round 35 B35-1..B35-3): a global forward hook, a "fast linear" dropping the bias, einsum without grad
torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: out * 0 if torch.is_tensor(out) else out)
torch.nn.Linear.forward = lambda self, x: torch.nn.functional.linear(x, self.weight)
torch.einsum = torch.no_grad()(torch.einsum)


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r35m", {"select": _select})
"""
CHECKS35 = """
import sys
import torch


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    orig = sys.modules["r35_changes"].ORIG
    left = {"hooks": bool(torch.nn.modules.module._global_forward_hooks),
            "linear": torch.nn.Linear.forward is not orig["linear"], "einsum": torch.einsum is not orig["einsum"]}
    assert not any(left.values()), f"left: {sorted(k for k, v in left.items() if v)}"
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r35k", {"select": _select})
"""


def test_global_module_hooks_nn_classes_and_grad_mode_wrappers_left_at_import_are_put_back(plugins, tmp_path):
    r, rec, log = changes_then_checks(plugins, tmp_path, "r35", CHANGES35, CHECKS35)
    assert rec["status"] == "PASS", (rec, r.stderr[-2000:], log[-3000:])
    for name in ("torch.nn's global module hooks (_global_forward_hooks)", "torch.nn.modules.linear.Linear.forward",
                 "torch.einsum"):
        assert name in log, (name, log[-3000:])
