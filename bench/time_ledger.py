"""Where a oneshot's wall time went, from its run folder alone (issue 13: "measure where the time goes").

    python bench/time_ledger.py artifacts/runner/<run-id> [--md]

Reads what the run already records and prints one ledger:

* the whole: manifest.json ``started`` -> ``finished``, the stages' ``duration_s`` (each includes
  its own process start: Python, ``import torch``, CUDA context) and the runner's remainder
  (locks, manifest updates) = whole - sum of stages. The command's own start (CLI import,
  discovery) and its closing report come before / after the manifest's span: time the command
  itself for those (bench/gpu_final.sh records each command's seconds);
* fa2-probe: ``fa2_probe.json`` ``wall_s`` (probe / parity / bench), the parity rows' ``wall_s``
  summed per path (fa2_varlen.csv: each row is one fwd+bwd, first call included, so a path that
  builds a cuDNN graph or JIT-compiles per shape shows it here) and the bench rows' ``bench_s``
  summed per path and per S (fa2_bench.csv);
* prefill-bench: the phases between its log's ``[  12.3 s]`` stamps (parity gate, baseline checks,
  each T), each charged to the line that ends it;
* every other stage: its duration only (its log has no stamps).

The parts of each section add up to that section's figure (a remainder line says what no part
claims), so the ledger never double counts. Nothing here runs a kernel: it is safe on any machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from datetime import datetime
from pathlib import Path

STAMP = re.compile(r"^\[\s*(\d+(?:\.\d+)?) s\] (.*)$")


def _secs(a: str, b: str) -> float:
    return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()


def _rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _num(x) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return 0.0
    return v if v == v else 0.0  # NaN -> 0


def _sum_by(rows: list[dict], key, value: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in rows:
        k = key(r)
        out[k] = out.get(k, 0.0) + _num(r.get(value))
    return out


def whole(manifest: dict) -> list[tuple[str, float, str]]:
    stages = manifest.get("stages", [])
    lines = [(s["name"], float(s.get("duration_s") or 0.0), s.get("status", "")) for s in stages]
    if manifest.get("started") and manifest.get("finished"):
        total = _secs(manifest["started"], manifest["finished"])
        lines.append(("(runner: discovery, locks, closing report)", total - sum(x for _, x, _ in lines), ""))
        lines.append(("WHOLE ONESHOT", total, ""))
    return lines


def _duration(manifest: dict, name: str) -> float | None:
    for s in manifest.get("stages", []):
        if s.get("name") == name:
            return float(s.get("duration_s") or 0.0)
    return None


def fa2_probe(run: Path, manifest: dict) -> list[tuple[str, float, str]]:
    doc_path = run / "fa2_probe.json"
    if not doc_path.is_file():
        return []
    doc = json.loads(doc_path.read_text())
    wall = doc.get("wall_s", {})
    out = [(f"fa2-probe {k}", float(v), "") for k, v in wall.items() if k != "total"]
    if "total" in wall:
        out.append(("fa2-probe (rest: tables, files)", float(wall["total"]) - sum(x for _, x, _ in out), ""))
        dur = _duration(manifest, "fa2-probe")
        if dur is not None:
            out.append(("fa2-probe (process start, imports, result)", dur - float(wall["total"]), ""))
    par = _rows(run / "fa2_varlen.csv")
    kids = doc.get("parity_children") or {}
    beside = set(kids.get("apart") or []) if kids.get("children") else set()
    by_path = _sum_by(par, lambda r: r.get("path", "?"), "wall_s")
    if by_path:
        n = {p: sum(1 for r in par if r.get("path") == p) for p in by_path}
        here = {p: s for p, s in by_path.items() if p not in beside}
        out += [(f"  parity {p}", s, f"{n[p]} rows, {s / max(n[p], 1):.2f} s/row")
                for p, s in sorted(here.items(), key=lambda kv: -kv[1])]
        if "parity" in wall:  # the rest of the parity wall: references, comparisons, waiting for the children
            out.append(("  parity (references, comparisons, children)", float(wall["parity"]) - sum(here.values()),
                        ""))
        # rows of child processes ran beside the above: their row times overlap, not part of the sum
        out += [(f"    beside: parity {p}", 0.0, f"{n[p]} rows in {kids['children']} child processes, "
                 f"{by_path[p]:.1f} s of row time") for p in sorted(beside & set(by_path))]
    bench = _rows(run / "fa2_bench.csv")
    if bench:
        for label, key in (("bench path", lambda r: f"{r.get('branch')}/{r.get('path')}"),
                           ("bench S", lambda r: str(r.get("S")))):
            sums = _sum_by(bench, key, "bench_s")
            out += [(f"  {label} {k}", s, "") for k, s in sorted(sums.items(), key=lambda kv: -kv[1])]
    return out


def prefill_phases(run: Path, manifest: dict) -> list[tuple[str, float, str]]:
    log = run / "logs" / "prefill-bench.log"
    if not log.is_file():
        return []
    last, out = 0.0, []
    for line in log.read_text(errors="replace").splitlines():
        m = STAMP.match(line)
        if not m:
            continue
        t = float(m[1])
        out.append((f"  prefill {m[2][:70]}", t - last, ""))
        last = t
    dur = _duration(manifest, "prefill-bench")
    if out and dur is not None:  # the stamps count from run(): before it, and after the last one
        out.append(("  prefill (process start, imports; tables, plot, files)", dur - last, ""))
    return out


def env_pairing(run: Path, manifest: dict) -> list[tuple[str, float, str]]:
    """env.json ``wall_s``: the stage's parts in its run(), then its process start and imports."""
    try:
        wall = json.loads((run / "env.json").read_text()).get("wall_s") or {}
    except (OSError, ValueError):
        return []
    out = [(f"env-pairing {k}", _num(v), "") for k, v in wall.items()]
    dur = _duration(manifest, "env-pairing")
    if out and dur is not None:
        out.append(("env-pairing (process start, imports, result)", dur - sum(s for _, s, _ in out), ""))
    return out


def ledger(run: Path) -> list[tuple[str, float, str]]:
    manifest = json.loads((run / "manifest.json").read_text())
    return whole(manifest) + env_pairing(run, manifest) + fa2_probe(run, manifest) + prefill_phases(run, manifest)


def render(lines, md: bool) -> str:
    if md:
        body = ["| where | s | note |", "|---|---|---|"] + [f"| {w} | {s:.1f} | {n} |" for w, s, n in lines]
    else:
        body = [f"{w:58} {s:8.1f} s  {n}" for w, s, n in lines]
    return "\n".join(body)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a run folder (artifacts/runner/<run-id>)")
    ap.add_argument("--md", action="store_true", help="a markdown table (for docs/benchmarks.md)")
    a = ap.parse_args(argv)
    if not (a.run / "manifest.json").is_file():
        print(f"error: {a.run} has no manifest.json (not a run folder)", file=sys.stderr)
        return 2
    print(render(ledger(a.run), a.md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
