"""Side-by-side table of the implementations under test in one run folder (issue 15), as markdown:
parity per case and implementation (triton_fwd.csv / triton_bwd.csv), the sanity checks per
implementation (with their SKIP reasons), and the prefill speed of NSA vs fla per T.

    python bench/impls_table.py <run folder>
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd


def _fmt(x) -> str:
    return "-" if x is None or (isinstance(x, float) and x != x) else (f"{x:.2e}" if isinstance(x, float) else str(x))


def parity(run: Path, name: str) -> list[str]:
    p = run / name
    if not p.is_file():
        return [f"{name}: not in this run", ""]
    df = pd.read_csv(p)
    impls = list(dict.fromkeys(df.impl)) if "impl" in df.columns else ["nsa_core"]
    if "impl" not in df.columns:
        df["impl"] = "nsa_core"
    out = [f"**{name}** (rel_err vs float64; tol per dtype, DESIGN §7)", "",
           "| case | " + " | ".join(impls) + " | note |", "|---|" + "---|" * (len(impls) + 1)]
    for case, g in df.groupby("case", sort=False):
        cells, notes = [], []
        for i in impls:
            r = g[g.impl == i]
            if not len(r):
                cells.append("-")
                continue
            r = r.iloc[0]
            cells.append(f"{r.status} {_fmt(r.rel_err)}" if r.status != "SKIP" else "SKIP")
            if r.status != "PASS" and isinstance(r.get("note"), str):
                notes.append(r.note[:140])
        out.append(f"| {case} | " + " | ".join(cells) + f" | {'; '.join(dict.fromkeys(notes))} |")
    return out + [""]


def sanity(run: Path) -> list[str]:
    p = run / "sanity.json"
    if not p.is_file():
        return ["sanity.json: not in this run", ""]
    doc = json.loads(p.read_text())
    out = [f"**sanity.json** implementations {', '.join(doc.get('impls', ['nsa_core']))}", "",
           "| check | ok | rel_err | tol |", "|---|---|---|---|"]
    for c in doc["checks"]:
        if "rel_err" in c or not c["ok"]:
            out.append(f"| {c['check']} | {'ok' if c['ok'] else 'FAIL'} | {_fmt(c.get('rel_err'))} | "
                       f"{_fmt(c.get('tol'))} |")
    out += [f"| {s['check']} | SKIP | {s['reason']} | |" for s in doc.get("skipped", [])]
    return out + [""]


def prefill(run: Path) -> list[str]:
    p = run / "prefill.csv"
    if not p.is_file():
        return ["prefill.csv: not in this run", ""]
    df = pd.read_csv(p)
    whole = df[(df.part == "whole") & df.path.isin(["nsa", "fla", "full-fastest"])]
    if whole.empty:
        return ["prefill.csv: no whole-NSA rows", ""]
    t = whole.pivot_table(index=["pass", "T"], columns="path", values="ms", aggfunc="first")
    out = ["**prefill.csv** whole forward (ms, median; fla = its own cmp + top-k + slc, no window)", "",
           "| pass | T | " + " | ".join(t.columns) + " | fla / nsa |", "|---|---|" + "---|" * (len(t.columns) + 1)]
    for (pas, T), r in t.iterrows():
        ratio = r.get("fla", float("nan")) / r.get("nsa", float("nan")) if "fla" in r and "nsa" in r else float("nan")
        out.append(f"| {pas} | {T} | " + " | ".join(f"{v:.3f}" for v in r) + f" | {ratio:.2f} |")
    return out + [""]


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python bench/impls_table.py <run folder>", file=sys.stderr)
        return 2
    run = Path(argv[0])
    lines = [f"## implementations side by side: {run.name}", ""]
    lines += parity(run, "triton_fwd.csv") + parity(run, "triton_bwd.csv") + sanity(run) + prefill(run)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
