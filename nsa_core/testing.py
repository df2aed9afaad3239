"""One comparator and one case naming scheme, shared by pytest and the parity stages.

``compare(out, ref, dtype)`` measures ``||out - ref|| / ||ref||`` against a float64 reference
and applies the DESIGN §7 tolerance for the dtype the computation ran in. NaN/Inf never pass.
``case_id(...)`` builds the name used both as the pytest id and as the CSV key, so a red CSV
row maps to ``pytest -k <id>``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# DESIGN §7. fp32 through Triton dot may use tf32: callers pass tf32=True and the report says so.
TOLERANCES = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
TF32_TOLERANCE = 1e-3

DTYPE_NAMES = {torch.float64: "fp64", torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
DTYPES_BY_NAME = {v: k for k, v in DTYPE_NAMES.items()}


def tolerance(dtype: torch.dtype, tf32: bool = False) -> float:
    if dtype == torch.float32 and tf32:
        return TF32_TOLERANCE
    try:
        return TOLERANCES[dtype]
    except KeyError:
        raise ValueError(f"no tolerance defined for dtype {dtype}") from None


@dataclass(frozen=True)
class Comparison:
    max_abs: float
    rel_err: float
    tol: float
    finite: bool

    @property
    def ok(self) -> bool:
        return self.finite and self.rel_err <= self.tol

    def __str__(self) -> str:
        verdict = "ok" if self.ok else ("NON-FINITE" if not self.finite else "OVER TOLERANCE")
        return f"max_abs={self.max_abs:.3e} rel_err={self.rel_err:.3e} tol={self.tol:.0e} {verdict}"


def compare(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype | None = None, *,
            tf32: bool = False, tol: float | None = None) -> Comparison:
    """Compare ``out`` with a (float64) reference. ``dtype`` picks the tolerance (default out.dtype)."""
    if out.shape != ref.shape:
        raise ValueError(f"compare: shape mismatch {tuple(out.shape)} vs reference {tuple(ref.shape)}")
    dtype = dtype or out.dtype
    o = out.detach().to(torch.float64)
    r = ref.detach().to(torch.float64).to(o.device)
    finite = bool(torch.isfinite(o).all()) and bool(torch.isfinite(r).all())
    if finite:
        diff = o - r
        max_abs = float(diff.abs().max()) if diff.numel() else 0.0
        denom = float(torch.linalg.vector_norm(r))
        num = float(torch.linalg.vector_norm(diff))
        rel = num / denom if denom > 0 else (0.0 if num == 0 else math.inf)
    else:
        max_abs, rel = math.nan, math.nan
    return Comparison(max_abs, rel, tol if tol is not None else tolerance(dtype, tf32), finite)


def _len(n: int) -> str:
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}K"
    return str(n)


def case_id(B: int, T: int, HQ: int, G: int, dk: int, dv: int, dtype: torch.dtype | str, **extra) -> str:
    """``B1-T8K-HQ64-G4-dk192-dv128-bf16`` (+ ``-key<value>`` for extra fields, e.g. n=16 -> n16)."""
    dn = dtype if isinstance(dtype, str) else DTYPE_NAMES[dtype]
    parts = [f"B{B}", f"T{_len(T)}", f"HQ{HQ}", f"G{G}", f"dk{dk}", f"dv{dv}", dn]
    parts += [f"{k}{v}" for k, v in extra.items()]
    return "-".join(parts)


def fill_nan_(t: torch.Tensor) -> torch.Tensor:
    """Poison a fresh allocation so an unwritten output cannot pass a comparison."""
    if t.is_floating_point():
        t.fill_(float("nan"))
    return t
