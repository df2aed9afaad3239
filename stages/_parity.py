"""Shared parity machinery of the ``triton-fwd`` / ``triton-bwd`` stages (private).

The case matrix, fresh random inputs with realistic block indices (``F.select_blocks``), the
float64 reference (``nsa_core.selection.reference.selection_attention``; gradients by autograd through
it, chunked over queries so paper-scale cases fit on a GPU) and the CSV/txt writers.

Implementations under test (``--impl a,b``, DESIGN §5): the same named cases run against the
``selection_attention`` part of each implementation (``nsa_runner.impls``; default the built-in
``nsa_core``, whose part is the Triton kernel), on the same inputs (a case's seed does not depend on
the implementation); every row carries an ``impl`` column. A case outside an implementation's
constraints is a SKIP row naming the constraint; a broken adapter makes its rows ERROR.

Test hook: for ``nsa_core`` the stages call :func:`kernel`, which returns ``KERNEL`` when a test has
set it (a function with the signature of ``nsa_core.selection.attention.selection_attention``), else
the real Triton kernel. A deliberately wrong kernel injected there must turn both stages FAIL.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from nsa_runner._text import described
from nsa_runner.impls import ImplError, adapter_code, adapter_failed, describe_failure, plain_tensor
from nsa_runner.stage import Option, Stage, StageResult, Status

from . import _seed

KERNEL = None  # test hook (see module docstring)

INSTALL_HINT = "pip install triton   (CPU runs use the Triton interpreter, TRITON_INTERPRET=1)"
COLUMNS = ["impl", "case", "B", "T", "HQ", "G", "dk", "dv", "dtype", "max_abs", "rel_err", "tol", "status"]


@dataclass(frozen=True)
class Case:
    B: int
    T: int
    HQ: int
    G: int
    dk: int
    dv: int
    dtype: str  # "fp32" / "fp16" / "bf16"
    n: int = 4
    l_sel: int = 16
    ragged: bool = False  # drop random live blocks: counts < n, some queries see nothing
    gpu_only: bool = False  # paper-scale: too big for the CPU interpreter

    @property
    def id(self) -> str:
        from nsa_core.testing import case_id

        cid = case_id(self.B, self.T, self.HQ, self.G, self.dk, self.dv, self.dtype, n=self.n, l=self.l_sel)
        return cid + ("-ragged" if self.ragged else "")

    @property
    def cfg(self):
        from nsa_core import NSAConfig

        if self.l_sel >= 64:
            return NSAConfig(l=32, d=16, l_sel=self.l_sel, n_sel=self.n, w=512)
        return NSAConfig(l=self.l_sel, d=max(1, self.l_sel // 2), l_sel=self.l_sel, n_sel=self.n, w=32)


# Quick: tiny shapes the interpreter runs in seconds. h in {1, 2, 3, 4}, dk != dv, non-power-of-2
# head dims, T not a multiple of the block, B = 2, fewer selected blocks than n (early tokens and
# the ragged case, where some queries select nothing).
QUICK = (
    Case(B=2, T=70, HQ=4, G=2, dk=24, dv=16, dtype="fp32"),
    Case(B=1, T=50, HQ=2, G=2, dk=16, dv=32, dtype="fp16"),
    Case(B=1, T=45, HQ=8, G=2, dk=32, dv=16, dtype="fp16", n=3),
    Case(B=1, T=40, HQ=6, G=2, dk=16, dv=24, dtype="fp32", ragged=True),
)
# Full (GPU): the quick matrix plus paper-scale cases (HQ=64, G=4, dk=192, dv=128, n=16, l'=64).
PAPER = dict(HQ=64, G=4, dk=192, dv=128, n=16, l_sel=64, gpu_only=True)
FULL = QUICK + (
    Case(B=1, T=40, HQ=16, G=1, dk=32, dv=16, dtype="fp32"),  # h = 16 on a small shape
    Case(B=1, T=8192, dtype="bf16", **PAPER),
    Case(B=1, T=4000, dtype="fp16", **PAPER),  # T not a multiple of l' (4000 = 62.5 * 64)
    Case(B=2, T=2048, dtype="bf16", **PAPER),
    Case(B=1, T=2048, dtype="fp32", **PAPER),
    Case(B=1, T=2048, HQ=24, G=2, dk=192, dv=128, dtype="bf16", n=16, l_sel=64, ragged=True, gpu_only=True),
    Case(B=1, T=4096, HQ=16, G=1, dk=128, dv=128, dtype="bf16", n=16, l_sel=64, gpu_only=True),  # h = 16
    Case(B=1, T=2048, HQ=4, G=4, dk=128, dv=128, dtype="fp16", n=16, l_sel=64, gpu_only=True),  # h = 1
)


def cases_for(profile: str, only: str | None = None) -> tuple[Case, ...]:
    cases = FULL if profile == "full" else QUICK
    if only:
        keys = [s.strip() for s in only.split(",") if s.strip()]
        cases = tuple(c for c in cases if any(k in c.id for k in keys))
    return cases


def triton_problem() -> str | None:
    """Why triton cannot be used here ("triton is not installed", its import's exception in one line, or the API
    nsa_core's kernels need missing), else None: nsa_core's own reading (``nsa_core._triton``). Any exception at its
    import counts (round 43 B43-3: a RuntimeError / OSError of a driver or library mismatch;
    round 44 B44-2: SystemExit), and a stub without ``triton.jit`` (round 44 B44-3)."""
    from nsa_core import _triton

    if _triton.ERROR is not None:  # worded here as every reason is (nsa-run's own text rules)
        return f"triton fails to import ({described(_triton.ERROR, 200)})"
    return _triton.PROBLEM


def triton_available() -> bool:
    return triton_problem() is None


def kernel():
    if KERNEL is not None:
        return KERNEL
    from nsa_core.selection import attention as triton_sel

    return triton_sel.selection_attention


def impl_option():
    from nsa_runner.impls import BUILTIN
    from nsa_runner.impls.discovery import impl_option_value

    return Option("--impl", impl_option_value, BUILTIN, "implementations under test, comma-separated "
                  "(see `nsa-run list --impls`; default nsa_core)")


def impl_entries(ctx) -> list:
    """The ImplEntry of every implementation named by ``--impl`` (default the built-in)."""
    return [load_impl(n) for n in impl_names(ctx)]


def impl_case(case: Case, device: str):
    """The ``nsa_runner.impls.Case`` an implementation's constraints are checked against."""
    from nsa_runner.impls import Case as ImplCase

    return ImplCase(B=case.B, T=case.T, HQ=case.HQ, G=case.G, dk=case.dk, dv=case.dv, dtype=case.dtype,
                    device=device, cfg=case.cfg, empty_rows=case.ragged)


def kernel_for(entry, case: Case):
    """A callable with the Triton kernel's signature ``(q, k, v, idx, cnt, block_size, **kw)`` for the
    ``selection_attention`` part of ``entry`` (``nsa_core``: :func:`kernel`, so the test hook works)."""
    from nsa_runner.impls import BUILTIN

    if entry.name == BUILTIN and entry.impl is not None and entry.dist.lower().replace("_", "-") == "nsa-run":
        return kernel()
    part, cfg = entry.impl.parts["selection_attention"], case.cfg

    def call(q, k, v, block_idx, block_count, block_size, **_kw):
        # a plain tensor (its autograd history kept for triton-bwd), made in the stage's guard: an adapter's
        # Tensor subclass never reaches the code after it (round 15 B-R3)
        return plain_tensor(part(q, k, v, block_idx, block_count, cfg), f"{entry.name}'s selection_attention output",
                            view=True, dtype=q.dtype)  # o in q's dtype (round 17 a2)

    c = entry.impl.constraints
    call.tf32 = bool(getattr(c, "fp32_dots_tf32", False))  # what the measure functions check against
    call.deterministic = bool(getattr(c, "deterministic_backward", True))
    return call


# ---- inputs an adapter's part may not change (round 16 B5) ------------------------------------
# A part gets copies of the stage's inputs: the float64 reference, the next implementation and the
# picture read tensors no part ever held. What a part did to its copies is compared with the originals
# afterwards: a part that wrote into an input (a kernel using it as scratch) is that implementation's
# FAIL naming the input, whatever its output.

def handed(*inputs):
    """A copy of each input for an adapter's part: ``clone`` keeps autograd (a gradient reaching the copy
    flows on to the input; a leaf copy stays a leaf only where the caller makes it one)."""
    return tuple(x.clone() for x in inputs)


def _same(a, b) -> bool:
    """Is ``b`` (what a part held) still bit for bit the input ``a``: class, shape, dtype, device, values
    (NaN where NaN)? Read with no ``__torch_function__`` of a class the part may have given it."""
    import torch

    if type(b) is not torch.Tensor or torch._C._dispatch_keys(b).has(torch._C.DispatchKey.Python):
        return False
    if b.layout != a.layout or b.dtype != a.dtype or b.device != a.device or tuple(b.shape) != tuple(a.shape):
        return False
    a, b = a.detach(), b.detach()
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return bool(torch.equal(a, b))


def written(pairs) -> list[str]:
    """Names of the inputs a part changed: ``pairs`` of (name, the input, the copy the part held)."""
    import torch

    with torch._C.DisableTorchFunctionSubclass():
        return [name for name, a, b in pairs if not _same(a, b)]


def written_text(who: str, names) -> str:
    """``"<who> wrote into its input(s) a, b"``: the FAIL of a part that changed what it was given."""
    names = list(names)
    return (f"{who} wrote into its input{'s' if len(names) > 1 else ''} {', '.join(names)} (a part must leave "
            "its inputs as it got them: the reference and the other implementations read the same tensors)")


def preflight(ctx) -> StageResult | None:
    """SKIP when triton is missing or when a CPU run cannot use the interpreter."""
    why = triton_problem()
    if why is not None:
        return StageResult(Status.SKIP, why, hint=INSTALL_HINT)
    if ctx.device == "cpu" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return StageResult(Status.SKIP, "CPU run without TRITON_INTERPRET=1 (set it before triton is imported; "
                           "the nsa-run executor does this)", hint="TRITON_INTERPRET=1 nsa-run stage ...")
    return None


# ---- inputs -----------------------------------------------------------------------------------

def make_inputs(case: Case, device: str, seed: int):
    """Fresh random q, k, v (case dtype), realistic block_idx/block_count, do. Never zeros."""
    import torch

    from nsa_core import functional as F
    from nsa_core.testing import DTYPES_BY_NAME

    dt = DTYPES_BY_NAME[case.dtype]
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(device=device, dtype=dt)

    B, T = case.B, case.T
    q, k, v = rnd(B, T, case.HQ, case.dk), rnd(B, T, case.G, case.dk), rnd(B, T, case.G, case.dv)
    k_cmp = torch.randn(B, T, case.G, case.dk, generator=gen).to(device)
    # realistic indices from the float64-capable torch reference, on every device: on the GPU the
    # default ("auto") compiled the fp32 Triton scoring and top-n kernels anew for every case's
    # head layout and length: 70 s for one case's score kernel on a CPU box's ptxas, most of a cold
    # triton-fwd's 276 s on the H100 (bench/compile_times.py, docs/benchmarks.md). The scoring
    # kernel has its own checks (sanity, selection-map, prefill-bench's parity gate).
    block_idx, block_count = F.select_blocks(q.float(), k_cmp, case.cfg, backend="reference")
    if case.ragged:
        block_idx, block_count = _ragged(block_idx, block_count, gen)
    do = rnd(B, T, case.HQ, case.dv)
    return q, k, v, block_idx.contiguous(), block_count.contiguous(), do


def _ragged(block_idx, block_count, gen):
    """Keep a random ~60% of each row's live blocks (ascending, -1 padded, counts adjusted)."""
    import torch

    n = block_idx.shape[-1]
    live = torch.arange(n, device=block_idx.device) < block_count[..., None]
    keep = live & (torch.rand(block_idx.shape, generator=gen).to(block_idx.device) < 0.6)
    big = torch.iinfo(torch.int32).max
    idx = torch.sort(torch.where(keep, block_idx, torch.full_like(block_idx, big)), dim=-1).values
    idx = torch.where(idx == big, torch.full_like(idx, -1), idx)
    return idx.contiguous(), keep.sum(-1).to(torch.int32).contiguous()


# ---- float64 reference ------------------------------------------------------------------------

def _chunk_rows(B: int, HQ: int, S: int) -> int:
    return max(1, (1 << 27) // max(1, B * HQ * S))


def _chunk_selection(block_idx, block_count, c1: int, block_size: int):
    """Selection rows of queries < c1 restricted to the key blocks that exist among keys 0..c1-1.

    Blocks starting at or after c1 are in the future of every query of the chunk (fully masked),
    and the ids are ascending, so dropping them only shortens each row's live prefix.
    """
    import torch

    nb = (c1 + block_size - 1) // block_size
    n = block_idx.shape[-1]
    live = (torch.arange(n, device=block_idx.device) < block_count[..., None]) & (block_idx < nb)
    return torch.where(live, block_idx, torch.full_like(block_idx, -1)), live.sum(-1).to(torch.int32)


def reference(q, k, v, block_idx, block_count, block_size, do=None):
    """float64 reference: o, and with ``do`` also (dq, dk, dv), on the inputs' device.

    Query chunk [c0, c1) is evaluated against keys 0..c1-1 (its queries sit at positions c0..c1-1,
    exactly as in the full problem); dk/dv sum the chunks' contributions.
    """
    import torch

    from nsa_core.selection import reference as _reference

    B, T, HQ, _ = q.shape
    q64, k64, v64 = (x.detach().to(torch.float64) for x in (q, k, v))
    do64 = None if do is None else do.detach().to(torch.float64)
    C = _chunk_rows(B, HQ, T)
    outs = []
    dq = torch.zeros_like(q64) if do is not None else None
    dk = torch.zeros_like(k64) if do is not None else None
    dv = torch.zeros_like(v64) if do is not None else None
    for c0 in range(0, T, C):
        c1 = min(T, c0 + C)
        idx, cnt = _chunk_selection(block_idx[:, c0:c1], block_count[:, c0:c1], c1, block_size)
        if do is None:
            with torch.no_grad():
                outs.append(_reference.selection_attention(q64[:, c0:c1], k64[:, :c1], v64[:, :c1], idx, cnt,
                                                           block_size))
            continue
        qc = q64[:, c0:c1].clone().requires_grad_(True)
        kc = k64[:, :c1].clone().requires_grad_(True)
        vc = v64[:, :c1].clone().requires_grad_(True)
        oc = _reference.selection_attention(qc, kc, vc, idx, cnt, block_size)
        gq, gk, gv = torch.autograd.grad(oc, (qc, kc, vc), do64[:, c0:c1])
        outs.append(oc.detach())
        dq[:, c0:c1] = gq
        dk[:, :c1] += gk
        dv[:, :c1] += gv
        del qc, kc, vc, oc, gq, gk, gv
    o = torch.cat(outs, dim=1)
    return o if do is None else (o, dq, dk, dv)


# ---- running a matrix -------------------------------------------------------------------------

def impl_names(ctx) -> list[str]:
    """The implementations ``--impl`` names, in order, each once (default the built-in)."""
    from nsa_runner.impls import BUILTIN

    text = (getattr(ctx, "options", None) or {}).get("impl") or BUILTIN
    return list(dict.fromkeys(x.strip() for x in str(text).split(",") if x.strip()))


ADAPTER_PROCESS_ENV = "NSA_RUN_ADAPTER_PROCESS"


def in_stage_process(name: str) -> bool:
    """Whether implementation ``name``'s part runs in the stage's own process: nsa_core (nsa-run's library) always;
    a plugin's adapter only with ``NSA_RUN_ADAPTER_PROCESS`` off (0/false/no/off: to debug an adapter, e.g. under
    pdb, and for the tests of the put-back that still guards sanity, prefill-bench and decode-bench); else in its own
    process. (The CLI refuses a value that is neither on nor off up front, exit 2.)"""
    from nsa_runner._text import env_switch
    from nsa_runner.impls import BUILTIN

    if name == BUILTIN:
        return True
    try:
        return not env_switch(ADAPTER_PROCESS_ENV, True)
    except ValueError:
        return False


def load_impl(name: str):
    from nsa_runner.impls.discovery import load

    return load(name)


def entry_rows(entry, cases, device: str, seed: int, position: dict, measure) -> dict:
    """The rows of one implementation over ``cases``: {"rows", "wrote" {row index: text}, "name", "differences",
    "note", "isolated"} (plain values: it also crosses from an adapter's own process, ``isolated_rows``)."""
    import torch

    rows: list[dict] = []
    wrote_rows: dict[int, str] = {}
    nan = float("nan")
    impl = entry.impl
    if impl is not None and impl.note:
        print(f"# {entry.name}: {impl.note}", flush=True)
    for case in cases:
        base = {"impl": entry.name, "case": case.id, "B": case.B, "T": case.T, "HQ": case.HQ, "G": case.G,
                "dk": case.dk, "dv": case.dv, "dtype": case.dtype, "seed": seed}
        unmeasured = {**base, "max_abs": nan, "rel_err": nan, "tol": nan}
        if impl is None:
            rows.append({**unmeasured, "status": "ERROR", "note": f"{entry.name}: broken adapter: {entry.error}"})
            print(f"[ERROR] {entry.name} {case.id}: {entry.error}", flush=True)
            continue
        if case.gpu_only and device != "cuda":
            rows.append({**unmeasured, "status": "SKIP",
                         "note": "paper-scale case: needs CUDA (too big for the interpreter)"})
            print(f"[SKIP] {entry.name} {case.id}: needs CUDA", flush=True)
            continue
        try:
            why = impl.excluded(impl_case(case, device), "selection_attention")
        except ImplError as e:  # its constraints raised: its ERROR, the others still run (round 12 B5)
            rows.append({**unmeasured, "status": "ERROR", "note": str(e)})
            print(f"[ERROR] {entry.name} {case.id}: {e}", flush=True)
            continue
        if why:
            rows.append({**unmeasured, "status": "SKIP", "note": why})
            print(f"[SKIP] {case.id}: {why}", flush=True)
            continue
        t0 = time.perf_counter()
        print(f"# {entry.name} {case.id} ...", flush=True)  # a TIMEOUT names what ran last (round 17 B U-5)
        try:
            with adapter_code():
                m = measure(case, device, seed + 1000 * position[case.id], kernel_for(entry, case))
            wrote = m.pop("written", None)  # the inputs its part changed (round 16 B5): its FAIL
            status = "PASS" if m.pop("ok") and not wrote else "FAIL"
            row = {**base, **m, "status": status}
            if wrote:
                wrote_rows[len(rows)] = written_text(f"{entry.name}'s selection_attention", wrote)
                row["note"] = "; ".join(filter(None, [wrote_rows[len(rows)], row.get("note")]))
        except BaseException as e:  # noqa: BLE001 - the kernel under test failed on this case
            # SystemExit / GeneratorExit / its own KeyboardInterrupt of an adapter's part too, its text
            # never trusted (round 13 B5); a real SIGINT (noted by adapter_code) stops the stage
            adapter_failed(e)
            row = {**unmeasured, "status": "ERROR", "note": describe_failure(e, 200, adapter=entry.name)}
        row["seconds"] = round(time.perf_counter() - t0, 2)
        if impl.note:
            row["note"] = "; ".join(filter(None, [row.get("note"), impl.note]))
        rows.append(row)
        print(f"[{row['status']}] {entry.name} {case.id}: max_abs={row['max_abs']:.3e} "
              f"rel_err={row['rel_err']:.3e} tol={row['tol']:.0e} ({row['seconds']} s)", flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    differences = impl.differences.get("selection_attention", "") if impl is not None else ""
    return {"rows": rows, "wrote": wrote_rows, "name": entry.name, "differences": str(differences or ""),
            "note": str(impl.note or "") if impl is not None else "", "isolated": False}


def isolated_rows(name: str, which: str, measure, cases, device: str, seed: int, ctx) -> dict:
    """``entry_rows`` of the adapter ``name`` in a process of its own (``stages._impl_host``), started fresh
    and ended after its rows: its import, its calls and whatever they leave (a module's class swapped, a
    thread or a finalizer that changes torch later, triton's knobs, an atexit hook, ``os._exit``) never reach
    this process, the reference or nsa_core's rows (red-team round 47: 15 probes in 6 roots broke the put-back
    of the shared process). Its output goes to the stage's log. Its rows come back as JSON, checked here; a
    process that ends without them makes each of its cases ERROR naming it and how it ended."""
    opts = getattr(ctx, "options", {}) or {}
    job = {"kind": "parity", "name": name, "which": which, "measure": f"{measure.__module__}:{measure.__qualname__}",
           "device": device, "profile": ctx.profile, "cases": opts.get("cases"), "seed": seed}
    part, problem = in_own_process(job, lambda path: _read_rows(path, name, cases))
    if part is None:
        problem = f"{name}: {problem}"
        print(f"[ERROR] {problem}", flush=True)
        nan = float("nan")
        rows = [{"impl": name, "case": c.id, "B": c.B, "T": c.T, "HQ": c.HQ, "G": c.G, "dk": c.dk, "dv": c.dv,
                 "dtype": c.dtype, "seed": seed, "max_abs": nan, "rel_err": nan, "tol": nan,
                 "status": "ERROR", "note": problem} for c in cases]
        part = {"rows": rows, "wrote": {}, "name": name, "differences": "", "note": ""}
    part["isolated"] = True
    return part


def in_own_process(job: dict, read):
    """Run ``job`` (plain JSON: its ``kind`` and ``name``) in a fresh process of its own (``_impl_host``), with this
    process's ``sys.path``, in a temp folder of its own, its output going to the stage's log; then ``read(path)`` of
    what it wrote. Returns (what ``read`` returned, "") or (None, why there is nothing: how the process ended, or
    why what it wrote is refused: ``read`` raising ValueError / OSError)."""
    import json
    import shutil
    import sys
    import tempfile

    from nsa_runner._contained import run_contained

    # inside the stage's own temp folder (``NSA_RUN_STAGE_TMP``), which the runner removes however the stage ends: one
    # in TMPDIR was left behind whenever the stage was stopped while the adapter ran (round 48 B48a-1)
    where = tempfile.mkdtemp(prefix="nsa-run-impl-", dir=os.environ.get("NSA_RUN_STAGE_TMP") or None)
    try:
        job = {**job, "sys_path": list(sys.path), "host": __name__.rpartition(".")[0] + "._impl_host"}
        job_path, out_path = os.path.join(where, "job.json"), os.path.join(where, "out")
        with open(job_path, "w") as f:
            json.dump(job, f)
        print(f"# {job['name']}: runs in a process of its own", flush=True)
        sys.stderr.flush()
        # the stage process's own sys.path first (where it found this package), then the host (-P: no working
        # directory on the path; ``host``: nsa_run_stages as installed, stages in a checkout's tests)
        boot = ("import importlib, json, sys; job = json.load(open(sys.argv[1])); sys.path[:] = job['sys_path']; "
                "importlib.import_module(job['host']).run(sys.argv[1:])")
        # its output reaches the stage's log up to a cap of its own, and what it started is killed as it ends
        # (round 48 B48b-5 / B48b-4: ``nsa_runner._contained``)
        rc, stopped = run_contained([sys.executable, "-P", "-c", boot, job_path, out_path], where)
        ended = (f"was killed by {_signal_name(-rc)}" if rc < 0 else f"exited with code {rc}")
        what = "its process (a plugin's adapter runs in one of its own)"
        if stopped:
            return None, f"{what} {stopped}"
        if not os.path.isfile(out_path):
            return None, f"{what} {ended} before it wrote its results"
        try:
            return read(out_path), ""
        except (OSError, ValueError, RuntimeError, EOFError, TypeError) as e:
            return None, f"{what} {ended} and wrote results that cannot be used ({described(e, 300)})"
    finally:
        shutil.rmtree(where, ignore_errors=True)


_TEXT_COLUMNS = frozenset({"impl", "case", "dtype", "status", "note", "worst", "bitwise_repeat"})
_STATUSES = frozenset({"PASS", "FAIL", "ERROR", "SKIP"})


def _plain_row(r) -> bool:
    """A row as the stage's own code makes it: text in the text columns, numbers (or none) in every other, a status
    of DESIGN's vocabulary (round 48 B48b-1: a text rel_err from an adapter's process took the whole stage down)."""
    return (isinstance(r, dict) and r.get("status") in _STATUSES
            and all(isinstance(k, str) and (isinstance(v, str) if k in _TEXT_COLUMNS
                                            else (isinstance(v, (int, float)) or v is None))
                    for k, v in r.items()))


def _signal_name(n: int) -> str:
    import signal

    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def _read_rows(path: str, name: str, cases) -> dict:
    """The rows an adapter's process wrote (plain JSON, checked: its rows are its own implementation's, of the
    stage's cases, plain values); ValueError when they are not."""
    import json

    with open(path, "rb") as f:
        data = json.loads(f.read(64 << 20))
    ids = [c.id for c in cases]
    ok = (isinstance(data, dict) and isinstance(data.get("rows"), list) and isinstance(data.get("wrote"), dict)
          and all(_plain_row(r) for r in data["rows"])
          and [r.get("case") for r in data["rows"]] == ids and all(r.get("impl") == name for r in data["rows"])
          and all(isinstance(k, str) and k.isdigit() and int(k) < len(ids) and isinstance(v, str)
                  for k, v in data["wrote"].items())
          and all(isinstance(data.get(k), str) for k in ("differences", "note")))
    if not ok:
        raise ValueError("rows that are not its cases' (not its own, or not plain values)")
    return {"rows": data["rows"], "wrote": data["wrote"], "name": name, "differences": data["differences"],
            "note": data["note"]}


def run_matrix(ctx, which: str, measure) -> StageResult:
    """Run ``measure(case, device, seed) -> dict`` over the profile's cases; write CSV + txt.

    ``measure`` returns the row's numbers (max_abs, rel_err, tol, ok, + extra columns; ``written``: the
    names of the inputs the part changed, a FAIL naming them whatever the numbers). A case
    that raises becomes a row with status ERROR; any row not PASS makes the stage FAIL naming it.
    """
    from nsa_runner.artifacts import write_csv, write_text

    opts = getattr(ctx, "options", {}) or {}
    seed = int(opts.get("seed") or 0)
    device = ctx.device
    cases = cases_for(ctx.profile, opts.get("cases"))
    if not cases:
        return StageResult(Status.FAIL, f"--cases {opts.get('cases')!r} matches no case of the {ctx.profile} profile")
    stage = f"triton-{which}"
    impl_text = opts.get("impl")
    replay = _seed.announce(ctx, stage, seed, cases=opts.get("cases"),
                            impl=impl_text if impl_text not in (None, "nsa_core") else None)
    # a case's inputs depend on the base seed and its place in the whole profile, not on --cases:
    # `--seed N --cases ID` replays exactly that case of a full run
    position = {c.id: i for i, c in enumerate(cases_for(ctx.profile))}
    rows = []
    wrote_rows: dict[int, str] = {}  # row number -> what its part did wrong besides its numbers (named in the FAIL)
    infos = []  # per implementation: its name, differences and note (for the header)
    for name in impl_names(ctx):
        if in_stage_process(name):  # nsa-run's own library, in this process (its test hook: ``kernel``)
            part = entry_rows(load_impl(name), cases, device, seed, position, measure)
        else:  # a plugin's adapter (fla's too) in a process of its own: nothing it does reaches this one
            part = isolated_rows(name, which, measure, cases, device, seed, ctx)
        wrote_rows.update({len(rows) + int(i): text for i, text in part["wrote"].items()})
        rows += part["rows"]
        infos.append(part)

    import pandas as pd

    df = pd.DataFrame(rows)
    extra = [c for c in df.columns if c not in COLUMNS]
    df = df[COLUMNS + extra]
    stem = f"triton_{which}"
    write_csv(ctx.dir / f"{stem}.csv", df)
    ran = df[df.status != "SKIP"]
    bad = ran[ran.status != "PASS"]
    skipped = df[df.status == "SKIP"]
    names = [i["name"] for i in infos]
    head = [f"triton-{which}: selection attention of {', '.join(names)} vs float64 reference (DESIGN §7 "
            "tolerances; nsa_core's Triton fp32 uses IEEE fp32 dots, no tf32, so fp32 tol = 1e-5)",
            f"device={device} profile={ctx.profile} seed={seed} cases run={len(ran)} failed={len(bad)} "
            f"skipped={len(skipped)}", f"replay: {replay}   (one case: add --cases CASE)"]
    head += [f"{i['name']}: {i['differences']}" for i in infos if i["differences"]]
    head += [f"{i['name']}: {i['note']}" for i in infos if i["note"]]
    head += [f"{i['name']}: ran in a process of its own (a plugin's adapter never runs in the stage's process)"
             for i in infos if i["isolated"]] + [""]
    write_text(ctx.dir / f"{stem}.txt", "\n".join(head) + df.to_string(index=False) + "\n")
    files = [f"{stem}.csv", f"{stem}.txt"]
    metrics = {"cases": int(len(ran)), "failed": int(len(bad)), "skipped": int(len(skipped)), "seed": seed,
               "worst_rel_err": float(ran.rel_err.max()) if len(ran) and ran.rel_err.notna().all() else None,
               "impls": names}
    gpu_skips = skipped[skipped.note.astype(str).str.startswith("paper-scale")] if len(skipped) else skipped
    skip_note = f"; {len(gpu_skips)} paper-scale case(s) not run here (need CUDA)" if len(gpu_skips) else ""
    other = skipped.drop(gpu_skips.index)
    if len(other):
        skip_note += f"; {len(other)} outside an implementation's constraints: " + "; ".join(
            dict.fromkeys(str(n) for n in other.note))[:600]
    default_only = names == ["nsa_core"]
    label = (lambda r: r.case) if default_only else (lambda r: f"{r.impl}:{r.case}")
    if not len(ran):
        return StageResult(Status.SKIP, f"no case of the selection runs on {device}{skip_note}", files, metrics,
                           hint="run on a CUDA GPU with --profile full")
    if len(bad):
        names_ = ", ".join(f"{label(r)} ({r.status}, rel_err={r.rel_err:.2e} tol={r.tol:.0e}"
                           + (f": {r.note}" if r.status == "ERROR" and isinstance(r.note, str) else "")
                           + (f": {wrote_rows[r.Index]}" if r.Index in wrote_rows else "") + ")"
                           for r in bad.itertuples())
        first = _seed.replay_command(ctx, stage, seed, cases=bad.case.iloc[0],
                                     impl=None if default_only else bad.impl.iloc[0])
        print(f"replay the first failing case with: {first}", flush=True)
        return StageResult(Status.FAIL, f"{len(bad)}/{len(ran)} case(s) failed: {names_}{skip_note}"[:2000], files,
                           metrics, hint=f"replay: {first}")
    per_impl = "" if default_only else " (" + ", ".join(
        f"{n}: {int((ran.impl == n).sum())} run" for n in names) + ")"
    return StageResult(Status.PASS, f"{len(ran)}/{len(ran)} cases within tolerance{per_impl} "
                                    f"(worst rel_err {metrics['worst_rel_err']:.2e}){skip_note}", files, metrics)


class ParityStage(Stage):
    """triton-fwd / triton-bwd: the case matrix of ``which`` ("fwd"/"bwd"), one ``measure`` per case."""

    requires = ("triton",)
    which = ""
    options = (
        Option("--cases", str, None, "only cases whose id contains one of these comma-separated substrings"),
        _seed.option(0, "the random inputs (case i of the profile uses seed + 1000 i)"),
        impl_option(),
    )

    @staticmethod
    def measure(case, device: str, seed: int, kernel=None) -> dict:  # pragma: no cover - interface
        raise NotImplementedError

    def run(self, ctx) -> StageResult:
        skip = preflight(ctx)
        if skip is not None:
            return skip
        return run_matrix(ctx, self.which, self.measure)
