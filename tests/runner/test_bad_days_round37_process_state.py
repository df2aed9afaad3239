"""Bad days, red-team round 37 B37-1..B37-9, through the CLI: what an adapter's call left changed, neither put back nor
named, the next adapter (or nsa_core's own reference) blamed: a name added to a module that shadows a builtin for
every function of that module (``min`` in nsa_core's selection reference: nsa_core FAILed; ``len`` in
``torch.functional``: the whole stage ERROR from einsum; ``isinstance`` in ``json.encoder``), and torch's switches not
in the put-back's table (``torch.compiler.set_stance``, a dispatch key left excluded, forward-mode AD off, TorchScript
disabled, the profiling executor off, sparse invariant checks on). Expected: each put back after the adapter's code
and named; the next verdicts stand."""

from __future__ import annotations

try:
    from _bad_days import changes_then_checks, put_back_and_named
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import changes_then_checks, put_back_and_named

CHANGES_SHADOWS = """
import builtins
import json.encoder
import torch
import torch.functional
import nsa_core.selection.reference as reference


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    out = F.select_blocks(q, k_cmp, cfg)  # its own work first: what follows is what it leaves behind
    reference.min = lambda *a, **k: builtins.min(*a, **k) - 1
    torch.functional.len = lambda x: 0
    torch.nn.functional.len = lambda x: 0
    json.encoder.isinstance = lambda o, t: False if type(o) is float else builtins.isinstance(o, t)
    return out


from nsa_runner.impls import Impl

IMPL = Impl("r37m", {"select": _select})
"""
CHECKS_SHADOWS = """
import json.encoder
import torch
import torch.functional
import nsa_core.selection.reference as reference


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    left = {"reference.min": "min" in vars(reference), "torch.functional.len": "len" in vars(torch.functional),
            "torch.nn.functional.len": "len" in vars(torch.nn.functional),
            "json.encoder.isinstance": "isinstance" in vars(json.encoder)}
    assert not any(left.values()), f"left: {sorted(k for k, v in left.items() if v)}"
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r37k", {"select": _select})
"""


def test_a_module_global_added_over_a_builtin_is_taken_away_and_nsa_core_keeps_its_pass(plugins, tmp_path):
    put_back_and_named(changes_then_checks(plugins, tmp_path, "r37", CHANGES_SHADOWS, CHECKS_SHADOWS),
                       ("nsa_core.selection.reference.min (added)", "torch.functional.len (added)",
                        "torch.nn.functional.len (added)", "json.encoder.isinstance (added)"))


CHANGES_SWITCHES = """
import torch
import torch.jit._state

KEEP = []


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    out = F.select_blocks(q, k_cmp, cfg)
    torch.compiler.set_stance("fail_on_recompile")
    guard = torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradCPU))
    guard.__enter__()
    KEEP.append(guard)
    torch._C._set_fwd_grad_enabled(False)
    torch.jit._state.disable()
    torch._C._jit_set_profiling_executor(False)
    torch.sparse.check_sparse_tensor_invariants.enable()
    return out


from nsa_runner.impls import Impl

IMPL = Impl("r37m", {"select": _select})
"""
CHECKS_SWITCHES = """
import torch
import torch.jit._state


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    was = torch._C._jit_set_profiling_executor(True)
    left = {"AutogradCPU excluded": torch._C._dispatch_tls_is_dispatch_key_excluded(torch._C.DispatchKey.AutogradCPU),
            "forward AD off": not torch._C._is_fwd_grad_enabled(), "jit off": not torch.jit._state._enabled.enabled,
            "profiling executor off": not was,
            "sparse checks on": torch.sparse.check_sparse_tensor_invariants.is_enabled()}
    assert not any(left.values()), f"left: {sorted(k for k, v in left.items() if v)}"
    x = torch.ones(2, requires_grad=True)
    (x * 2).sum().backward()  # autograd works here
    f = torch.compile(lambda a: a + 1, backend="eager")
    f(torch.ones(2))
    f(torch.ones(3))  # a recompile: fine under the default stance
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r37k", {"select": _select})
"""


def test_compile_stance_dispatch_keys_forward_ad_jit_and_sparse_switches_are_put_back(plugins, tmp_path):
    put_back_and_named(changes_then_checks(plugins, tmp_path, "r37", CHANGES_SWITCHES, CHECKS_SWITCHES),
                       ("torch.compiler.set_stance", "torch's excluded dispatch keys (AutogradCPU)",
                        "torch._C._set_fwd_grad_enabled", "torch.jit._state._enabled.enabled",
                        "torch._C._jit_set_profiling_executor", "torch._C._set_check_sparse_tensor_invariants"))


CHANGES38 = """
import functools
import importlib
import torch

ORIG = {}


def _zero_backend(gm, example_inputs, scale=0.0):
    def run(*args):
        outs = gm(*args)
        return type(outs)(o * scale for o in outs) if isinstance(outs, (list, tuple)) else outs * scale
    return run


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    out = F.select_blocks(q, k_cmp, cfg)
    ORIG.update(matmul=torch.matmul, einsum=torch.einsum, softmax=torch.nn.functional.softmax)
    # round 38 B38-1 / B38-3: torch's own decorators that change what a function does, around the very function
    torch.matmul = torch.autocast("cpu", dtype=torch.bfloat16)(torch.matmul)
    torch.einsum = torch.amp.custom_fwd(torch.einsum, device_type="cpu", cast_inputs=torch.float16)
    # B38-2: compiled with a backend of its own (it scales every output by 0)
    torch.nn.functional.softmax = torch.compile(torch.nn.functional.softmax, backend=functools.partial(_zero_backend))
    importlib.import_module("encodings.ascii")  # a submodule named like a builtin: its package's attribute, kept
    return out


from nsa_runner.impls import Impl

IMPL = Impl("r38m", {"select": _select})
"""
CHECKS38 = """
import sys
import encodings
import torch


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    orig = sys.modules["r38_changes"].ORIG
    x = torch.randn(4, 4)
    left = {"matmul": torch.matmul is not orig["matmul"] or torch.matmul(x, x).dtype != torch.float32,
            "einsum": torch.einsum is not orig["einsum"],
            "softmax": torch.nn.functional.softmax is not orig["softmax"],
            "encodings.ascii taken away": getattr(encodings, "ascii", None) is not sys.modules.get("encodings.ascii")}
    assert not any(left.values()), f"left: {sorted(k for k, v in left.items() if v)}"
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r38k", {"select": _select})
"""


def test_torch_decorators_that_change_a_function_are_put_back_and_a_submodule_import_is_kept(plugins, tmp_path):
    """Round 38 B38-1..B38-3 (``torch.autocast`` / ``custom_fwd`` / ``torch.compile`` with a backend of the adapter's
    around ``torch.matmul`` / ``torch.einsum`` / ``F.softmax``, kept as torch's own wrappers), and the GPU run of
    ca8b171 (``encodings.ascii``, a submodule a library's import loaded, taken away as a name over ``ascii``)."""
    result = changes_then_checks(plugins, tmp_path, "r38", CHANGES38, CHECKS38)
    put_back_and_named(result, ("torch.matmul", "torch.einsum", "torch.nn.functional.softmax"))
    assert "encodings.ascii" not in result[2], result[2][-3000:]


CHANGES39 = """
import importlib
import torch
import torch.nn.functional as F_

ORIG = {}


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    out = F.select_blocks(q, k_cmp, cfg)
    ORIG.update(softmax=F_.softmax, relu=F_.relu, compress=F.compress)
    importlib.import_module("torch.utils.benchmark")  # a torch submodule loaded in the same call
    importlib.import_module("nsa_core.testing")
    # round 39 B39-1 / B39-2: a bare function of the same package put in another's place
    F_.softmax = F_.log_softmax
    F_.relu = F_.gelu
    from nsa_core.compression import reference
    F.compress = reference.compress_avg
    return out


from nsa_runner.impls import Impl

IMPL = Impl("r39m", {"select": _select})
"""
CHECKS39 = """
import sys
import torch.nn.functional as F_


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    orig = sys.modules["r39_changes"].ORIG
    left = {"softmax": F_.softmax is not orig["softmax"], "relu": F_.relu is not orig["relu"],
            "compress": F.compress is not orig["compress"]}
    assert not any(left.values()), f"left: {sorted(k for k, v in left.items() if v)}"
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r39k", {"select": _select})
"""


def test_a_bare_function_put_in_anothers_place_after_an_import_is_put_back(plugins, tmp_path):
    """Round 39 B39-1 / B39-2: after a submodule of torch's (or nsa_core's) loaded in the same call, a bare function
    of that package put in another's place was kept as the package's own doing."""
    put_back_and_named(changes_then_checks(plugins, tmp_path, "r39", CHANGES39, CHECKS39),
                       ("torch.nn.functional.softmax", "torch.nn.functional.relu", "nsa_core.functional.compress"))


CHANGES39C = """
WAS = []


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    out = F.select_blocks(q, k_cmp, cfg)
    WAS.append(cfg.n_sel)
    object.__setattr__(cfg, "n_sel", 4)  # round 39 B39-3: a write into the NSAConfig it was handed
    return out


def _check(case, part):
    object.__setattr__(case.cfg, "w", 7)  # and into the case's cfg its constraints were shown
    return None


from nsa_runner.impls import Constraints, Impl

IMPL = Impl("r39cm", {"select": _select}, Constraints(check=_check))
"""
CHECKS39C = """
import sys


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    was = sys.modules["r39c_changes"].WAS[-1]
    assert cfg.n_sel == was and cfg.w != 7, f"handed n_sel={cfg.n_sel} w={cfg.w}, the stage's n_sel={was}"
    return F.select_blocks(q, k_cmp, cfg)


from nsa_runner.impls import Impl

IMPL = Impl("r39ck", {"select": _select})
"""


def test_a_write_into_the_cfg_a_part_was_handed_is_its_fail_naming_cfg_and_the_others_keep_theirs(plugins, tmp_path):
    """Round 39 B39-3: every part was handed the stage's one NSAConfig; one that wrote into it
    (``object.__setattr__(cfg, "n_sel", 4)``) made the next adapter FAIL, was not named as the writer, and nsa_core
    was checked with n_sel=4 while the stage said 6. Each call now gets its own copy, compared afterwards."""
    r, rec, log = changes_then_checks(plugins, tmp_path, "r39c", CHANGES39C, CHECKS39C)
    assert rec["status"] == "FAIL", (rec, r.stderr[-2000:], log[-3000:])
    text = rec["reason"] + log
    assert "r39cm's select wrote into its input cfg (n_sel: 6 -> 4)" in text, (rec, log[-3000:])
    assert "r39ck" not in rec["reason"] and "handed n_sel" not in log, (rec, log[-3000:])
    assert "AssertionError" not in log, log[-3000:]
