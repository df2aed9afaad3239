"""Bad days, red-team round 36 B36-1..B36-3, through the CLI: more state an adapter's call left changed, neither put
back nor named, the next adapter blamed: torch code outside the namespaces the put-back copied (a name added to
``torch.nn.Linear`` over ``Module.__call__``, the ``F`` and ``_pair`` globals of ``torch.nn.modules.*``,
``Parameter.__deepcopy__``, ``Function.apply``, ``FunctionCtx.save_for_backward``, ``torch._C._nn.linear``), torch's
switches and configs (``fill_uninitialized_memory``, dynamo's ``suppress_errors``, the TensorExpr fuser, a forward-AD
level left entered), and the standard library's and numpy's (a handler added to the root logger, ``gc.freeze()``,
``tempfile.tempdir``, a ``copyreg`` entry, numpy's print options). Expected: each put back after the adapter's code and
named; the next verdicts stand."""

from __future__ import annotations

try:
    from _bad_days import changes_then_checks, put_back_and_named
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import changes_then_checks, put_back_and_named

CHANGES_TORCH = """
import importlib
import types
import torch
import torch.nn.modules.activation as A
import torch.nn.modules.linear as L
import torch.nn.modules.utils as U
from torch.autograd.function import Function, FunctionCtx
from torch.nn.parameter import Parameter

ORIG = {}


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    out = F.select_blocks(q, k_cmp, cfg)  # its own work first: what follows is what it leaves behind
    ORIG.update(LF=L.F, AF=A.F, pair=U._pair, deepcopy=Parameter.__deepcopy__, apply=vars(Function)["apply"],
                save=FunctionCtx.save_for_backward, c_linear=torch._C._nn.linear,
                fill=torch.utils.deterministic.fill_uninitialized_memory, texpr=torch._C._jit_texpr_fuser_enabled())
    fake = types.SimpleNamespace(**{k: getattr(torch.nn.functional, k) for k in dir(torch.nn.functional)
                                    if not k.startswith("__")})
    fake.linear = lambda x, w, b=None: torch.nn.functional.linear(x, w, b) * 0
    torch.nn.Linear.__call__ = lambda self, x: x * 0
    L.F = fake
    A.F = fake
    U._pair = lambda x: (1, 1)
    Parameter.__deepcopy__ = lambda self, memo: None
    Function.apply = classmethod(lambda cls, *a: None)
    FunctionCtx.save_for_backward = lambda self, *t: None
    torch._C._nn.linear = lambda x, w, b=None: x
    torch.utils.deterministic.fill_uninitialized_memory = not ORIG["fill"]
    dynamo = importlib.import_module("torch._dynamo")
    ORIG["suppress"] = dynamo.config.suppress_errors
    dynamo.config.suppress_errors = not ORIG["suppress"]
    torch._C._jit_set_texpr_fuser_enabled(not ORIG["texpr"])
    global _LEVEL
    _LEVEL = torch.autograd.forward_ad.dual_level()
    _LEVEL.__enter__()
    return out


from nsa_runner.impls import Impl

IMPL = Impl("r36m", {"select": _select})
"""
CHECKS_TORCH = """
import sys
import torch
import torch.nn.modules.activation as A
import torch.nn.modules.linear as L
import torch.nn.modules.utils as U
from torch.autograd.function import Function, FunctionCtx
from torch.nn.parameter import Parameter


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    orig = sys.modules["r36_changes"].ORIG
    left = {"Linear.__call__": "__call__" in vars(torch.nn.Linear),
            "Linear zero": bool((torch.nn.Linear(4, 4)(torch.ones(1, 4)) == 0).all()),
            "linear.F": L.F is not orig["LF"], "activation.F": A.F is not orig["AF"],
            "_pair": U._pair is not orig["pair"],
            "__deepcopy__": Parameter.__deepcopy__ is not orig["deepcopy"],
            "apply": vars(Function)["apply"] is not orig["apply"],
            "save_for_backward": FunctionCtx.save_for_backward is not orig["save"],
            "_C._nn.linear": torch._C._nn.linear is not orig["c_linear"],
            "fill": torch.utils.deterministic.fill_uninitialized_memory != orig["fill"],
            "suppress_errors": "torch._dynamo" in sys.modules
                               and sys.modules["torch._dynamo"].config.suppress_errors != orig["suppress"],
            "texpr": torch._C._jit_texpr_fuser_enabled() != orig["texpr"],
            "dual level": torch.autograd.forward_ad._current_level != -1}
    assert not any(left.values()), f"left: {sorted(k for k, v in left.items() if v)}"
    with torch.autograd.forward_ad.dual_level():  # its own level: nothing of the other's left entered
        pass
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r36k", {"select": _select})
"""


def test_torch_code_outside_the_copied_namespaces_switches_and_a_forward_ad_level_are_put_back(plugins, tmp_path):
    put_back_and_named(changes_then_checks(plugins, tmp_path, "r36", CHANGES_TORCH, CHECKS_TORCH),
                       ("torch.nn.modules.linear.Linear.__call__ (added)", "torch.nn.modules.linear.F",
                        "torch.nn.modules.activation.F", "torch.nn.modules.utils._pair",
                        "torch.nn.parameter.Parameter.__deepcopy__", "torch.autograd.function.Function.apply",
                        "torch.autograd.function.FunctionCtx.save_for_backward", "torch._C._nn.linear",
                        "torch.utils.deterministic.fill_uninitialized_memory", "torch._dynamo.config.suppress_errors",
                        "torch._C._jit_set_texpr_fuser_enabled", "torch.autograd.forward_ad.dual_level (left entered)"))


CHANGES_PROCESS = """
import copyreg, gc, io, logging, tempfile
import numpy as np

ORIG = {}


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    out = F.select_blocks(q, k_cmp, cfg)
    ORIG.update(handlers=list(logging.getLogger().handlers), freeze=gc.get_freeze_count(), tempdir=tempfile.tempdir,
                dispatch=dict(copyreg.dispatch_table), precision=np.get_printoptions()["precision"])
    logging.getLogger().addHandler(logging.StreamHandler(io.StringIO()))
    gc.freeze()
    tempfile.tempdir = "/nonexistent-r36-tempdir"
    copyreg.pickle(complex, lambda c: (complex, (0, 0)))
    np.set_printoptions(precision=1)
    return out


from nsa_runner.impls import Impl

IMPL = Impl("r36m", {"select": _select})
"""
CHECKS_PROCESS = """
import copyreg, gc, logging, sys, tempfile
import numpy as np


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    orig = sys.modules["r36_changes"].ORIG
    left = {"root handlers": logging.getLogger().handlers != orig["handlers"],
            "gc.freeze": gc.get_freeze_count() > orig["freeze"],
            "tempfile.tempdir": tempfile.tempdir != orig["tempdir"],
            "copyreg": dict(copyreg.dispatch_table) != orig["dispatch"],
            "numpy print": np.get_printoptions()["precision"] != orig["precision"]}
    assert not any(left.values()), f"left: {sorted(k for k, v in left.items() if v)}"
    with tempfile.TemporaryFile():
        pass
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r36k", {"select": _select})
"""


def test_root_logger_handlers_gc_freeze_tempdir_copyreg_and_numpy_print_options_are_put_back(plugins, tmp_path):
    put_back_and_named(changes_then_checks(plugins, tmp_path, "r36", CHANGES_PROCESS, CHECKS_PROCESS),
                       ("the root logger's handlers", "gc.freeze", "tempfile.tempdir", "copyreg.dispatch_table",
                        "numpy.set_printoptions"))
