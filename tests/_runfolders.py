"""Fabricated run folders for the compare / report / reader tests (private test helper).

``make_run`` writes a complete run folder with the real writers (``RunManifest``,
``write_json``, ``write_csv``) in the formats of DESIGN §6: manifest.json, env.json/txt,
routing.json, sanity.json, triton_fwd.csv, triton_bwd.csv, decode.csv, fa2_bench.csv,
bench_selection.csv. Numbers are plausible H100-like figures; ``time_scale`` and
``err_scale`` multiply timings and parity errors so a test can fabricate a "B" run.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from nsa_runner.artifacts import write_csv, write_json, write_text
from nsa_runner.manifest import RunManifest

GPU = "NVIDIA H100 80GB HBM3"
S_LIST = (1024, 4096, 16384, 65536)


def _env(device: str, gpu: str | None) -> dict:
    cuda = device == "cuda"
    return {"schema_version": 1, "device": device, "verdict": "PASS", "reason": "fabricated", "checks": [],
            "facts": {"torch": {"installed": True, "version": "2.11.0+cu130" if cuda else "2.13.0+cpu",
                                "cuda_runtime": "13.0" if cuda else None},
                      "triton": {"installed": True, "version": "3.6.0" if cuda else "3.9.0"},
                      "gpu": {"cuda_available": cuda, "driver_cuda_version": "13.0" if cuda else None,
                              "devices": [{"index": 0, "name": gpu, "capability": "9.0", "memory_gib": 79.1}]
                              if cuda else []}}}


def parity_rows(err_scale: float = 1.0, bwd: bool = False) -> list[dict]:
    base = [("B1-T2K-HQ64-G4-dk192-dv128-bf16-n16-l64", 1, 2048, 64, 4, 192, 128, "bf16", 2.1e-3, 1e-2, "PASS"),
            ("B2-T70-HQ4-G2-dk24-dv16-fp32-n4-l16", 2, 70, 4, 2, 24, 16, "fp32", 1.2e-7, 1e-5, "PASS"),
            ("B1-T50-HQ2-G2-dk16-dv32-fp16-n4-l16", 1, 50, 2, 2, 16, 32, "fp16", 2.3e-4, 2e-3, "PASS"),
            ("B1-T8K-HQ64-G4-dk192-dv128-bf16-n16-l64", 1, 8192, 64, 4, 192, 128, "bf16", float("nan"), float("nan"),
             "SKIP")]
    rows = []
    for case, B, T, HQ, G, dk, dv, dt, err, tol, st in base:
        e = err * err_scale * (1.7 if bwd else 1.0)
        row = {"case": case, "B": B, "T": T, "HQ": HQ, "G": G, "dk": dk, "dv": dv, "dtype": dt,
               "max_abs": e * 3, "rel_err": e, "tol": tol, "status": st,
               "note": "paper-scale case: needs CUDA" if st == "SKIP" else ""}
        if bwd:
            row.update(worst="dk", rel_dq=e / 2, rel_dk=e, rel_dv=e / 3)
        rows.append(row)
    return rows


def decode_rows(time_scale: float = 1.0) -> list[dict]:
    rows = []
    for S in S_LIST:
        sel = min(16 * 64, S)
        cmp_, win = (S - 32) // 16 + 1, min(512, S)
        step = (0.20 + S / 65536 * 0.25) * time_scale
        full = 0.10 + S / 65536 * 1.6
        rows.append({"S": S, "B": 1, "ms_step": step, "ms_step_p20": step * 0.97, "ms_step_p80": step * 1.03,
                     "ms_cmp": step * 0.3, "ms_sel": step * 0.35, "ms_win": step * 0.2, "ms_other": step * 0.15,
                     "ms_full": full, "speedup": full / step, "reads_cmp": cmp_, "reads_sel": sel,
                     "reads_win": win, "reads_total": cmp_ + sel + win, "GB/s": 900.0 / time_scale})
    return rows


def bench_rows(time_scale: float = 1.0) -> list[dict]:
    rows = []
    for T in (8192, 16384, 32768):
        for p, f in (("fwd", 1.0), ("fwd+bwd", 3.2)):
            for impl, k in (("ours", 1.0), ("sdpa-flash", 2.5)):
                ms = T / 8192 * 0.4 * f * k * (time_scale if impl == "ours" else 1.0)
                rows.append({"T": T, "pass": p, "impl": impl, "ms": ms, "p20": ms * 0.98, "p80": ms * 1.02})
    return rows


def fa2_rows() -> list[dict]:
    rows = []
    for S in (2048, 8192):
        for branch in ("cmp", "win"):
            for path, k in (("sdpa", 1.0), ("torch-flash", 0.6)):
                ms = S / 2048 * 0.1 * k
                rows.append({"branch": branch, "path": path, "S": S, "B": 1, "HQ": 32, "G": 2, "D": 128,
                             "dtype": "bf16", "fwd_ms": ms, "fwd_p20": ms * 0.95, "fwd_p80": ms * 1.05,
                             "fwdbwd_ms": 3 * ms, "fwdbwd_p20": 2.9 * ms, "fwdbwd_p80": 3.1 * ms, "note": ""})
    return rows


STAGES = (
    ("env-pairing", 10, "PASS", ["env.txt", "env.json"]),
    ("sanity", 20, "PASS", ["routing.json", "sanity.out", "sanity.json"]),
    ("triton-fwd", 30, "PASS", ["triton_fwd.csv", "triton_fwd.txt"]),
    ("triton-bwd", 40, "PASS", ["triton_bwd.csv", "triton_bwd.txt"]),
    ("fa2-probe", 50, "SKIP", ["fa2_bench.csv"]),
    ("decode-bench", 60, "PASS", ["decode.csv"]),
    ("summary", 70, "PASS", ["summary.md", "summary.json", "junit.xml"]),
)


def make_run(out: Path, run_id: str = "aaaaaaa", *, device: str = "cuda", gpu: str | None = GPU,
             profile: str = "full", time_scale: float = 1.0, err_scale: float = 1.0,
             statuses: dict[str, str] | None = None, only: tuple[str, ...] | None = None) -> Path:
    """A complete fabricated run folder ``out/run_id`` (see module docstring); returns it."""
    folder = out / run_id
    folder.mkdir(parents=True)
    m = RunManifest.create(folder, run_id, ["nsa-run", "oneshot"], device=device, profile=profile, strict=False,
                           command="oneshot")
    write_json(folder / "env.json", _env(device, gpu if device == "cuda" else None))
    write_text(folder / "env.txt", f"fabricated env for tests; device {device} {gpu}\nsee https://example.org\n")
    write_json(folder / "routing.json", {"schema_version": 1, "branches": {
        b: {"backend": "flash" if device == "cuda" else "sdpa", "reason": "fabricated"} for b in ("cmp", "win")}
        | {"slc": {"backend": "triton" if device == "cuda" else "sdpa", "reason": "fabricated"}}})
    write_json(folder / "sanity.json", {
        "schema_version": 1, "shape": {"B": 2, "T": 2048}, "cfg": {"l": 32, "d": 16, "l_sel": 64},
        "checks": [{"check": "cmp/flash forward vs fp64 reference", "ok": True, "detail": "ok",
                    "rel_err": 2e-3 * err_scale, "tol": 1e-2},
                   {"check": "slc/triton dq vs fp64 reference", "ok": True, "detail": "ok",
                    "rel_err": 3e-3 * err_scale, "tol": 1e-2},
                   {"check": "selection structure", "ok": True, "detail": "ascending, forced"}]})
    write_text(folder / "sanity.out", "fabricated\n")
    write_csv(folder / "triton_fwd.csv", parity_rows(err_scale))
    write_text(folder / "triton_fwd.txt", "fabricated\n")
    write_csv(folder / "triton_bwd.csv", parity_rows(err_scale, bwd=True))
    write_text(folder / "triton_bwd.txt", "fabricated\n")
    write_csv(folder / "fa2_bench.csv", fa2_rows())
    write_csv(folder / "decode.csv", decode_rows(time_scale))
    write_csv(folder / "bench_selection.csv", bench_rows(time_scale))
    write_text(folder / "summary.md", "# summary written by the summary stage\n")
    write_json(folder / "summary.json", {"schema_version": 1})
    write_text(folder / "junit.xml", "<testsuites/>\n")
    statuses = statuses or {}
    for name, order, status, files in STAGES:
        if only is not None and name not in only:
            continue
        st = statuses.get(name, status)
        m.record({"name": name, "order": order, "source": "built-in", "status": st, "duration_s": 1.5,
                  "reason": f"fabricated {st.lower()}", "hint": "pip install flash-attn" if st == "SKIP" else "",
                  "files": files if st != "SKIP" else [], "log": f"logs/{name}.log",
                  **({"log_tail": "Traceback (fabricated)\nAssertionError: boom"} if st in ("FAIL", "ERROR") else {})})
    m.finish()
    return folder


def make_pair(root: Path, **kw) -> Path:
    """Two fabricated run folders ``root/aaaaaaa`` and ``root/bbbbbbb`` (a copy of the first under its own run id),
    for ``compare aaaaaaa bbbbbbb --out root``; returns ``root``."""
    import json
    import shutil

    make_run(root, "aaaaaaa", **kw)
    shutil.copytree(root / "aaaaaaa", root / "bbbbbbb")
    path = root / "bbbbbbb" / "manifest.json"
    m = json.loads(path.read_text())
    m["run_id"] = "bbbbbbb"
    path.write_text(json.dumps(m))
    return root


def edit_csv(path: Path, fn) -> None:
    """Rewrite a CSV of a fabricated run through ``fn(DataFrame) -> DataFrame``."""
    df = pd.read_csv(path)
    write_csv(path, fn(df))


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes (to prove nothing was written or deleted)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
