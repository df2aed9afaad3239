"""Compare two run folders (``nsa-run compare A B``): what changed from run A to run B.

Rows, by section (marks as in ``asv compare``)::

    +  worse            B/A beyond the factor (timings), parity error more than 2x larger
    -  better           the same, the other way
    !  newly failing    a stage or case that did not fail in A fails in B
    *  fixed            failed in A, passes in B
    x  not comparable   different GPU model / device / profile, different case definition,
                        skipped or absent on one side, no value on one side
    ~  within noise     beyond the factor, but inside the recorded spread (p20..p80) of a run

Sections: ``env`` (versions, GPU, routing: information only), ``stage`` (status per stage),
``parity`` (sanity checks with an error, triton_fwd.csv / triton_bwd.csv per case),
``timing`` (decode.csv, fa2_bench.csv, kernel benchmark CSVs: every ms / reads / speedup column per
row), ``baseline`` (see ``nsa_runner.baseline``). ``+`` and ``!`` are regressions (exit 1).

Timings are only judged between runs on the same GPU model (or both on CPU) with the same
profile; otherwise every timing and parity row is ``x``. A parity error below tol/1000 counts
as zero (round-off noise), so 0 -> 1e-12 is not a "2x" regression.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from nsa_runner._readers import (
    ArtifactError,
    Run,
    fmt_key,
    is_reads,
    is_speedup,
    is_time,
    key_columns,
    metric_columns,
    parity_key,
    spread_columns,
)
from nsa_runner.artifacts import unfinished
from nsa_runner.results import FAILED, PARITY_REQUIRED
from nsa_runner.results.summary import interrupted_line, md_cell

SCHEMA_VERSION = 1
MARKS = {
    "+": "worse",
    "-": "better",
    "!": "newly failing",
    "*": "fixed",
    "x": "not comparable",
    "~": "beyond the factor but within noise",
}
REGRESSION_MARKS = ("+", "!")
NOISE_FLOOR = 1e-3  # parity errors below tol * NOISE_FLOOR count as zero
SECTIONS = ("env", "stage", "parity", "timing", "baseline")


@dataclass(frozen=True)
class Settings:
    threshold: float = 0.10  # timings: flagged beyond a ratio of 1 + threshold (or below 1 / (1 + threshold))
    parity_factor: float = 2.0  # parity errors: flagged beyond this factor

    def __post_init__(self) -> None:
        if not (isinstance(self.threshold, (int, float)) and math.isfinite(self.threshold) and self.threshold >= 0):
            raise ValueError(f"threshold must be a finite number >= 0, got {self.threshold!r}")
        if not (isinstance(self.parity_factor, (int, float)) and math.isfinite(self.parity_factor)
                and self.parity_factor > 1):
            raise ValueError(f"parity factor must be a finite number > 1, got {self.parity_factor!r}")


@dataclass
class Row:
    section: str  # one of SECTIONS
    source: str  # stage name or file
    key: str  # case / row key ("B1-T8K-...", "S=1024 B=1")
    metric: str  # "status", "rel_err", "ms_step", ...
    a: Any = None
    b: Any = None
    ratio: float | None = None  # B / A where that means something
    mark: str = ""  # one of MARKS or ""
    note: str = ""

    @property
    def regression(self) -> bool:
        return self.mark in REGRESSION_MARKS

    @property
    def changed(self) -> bool:
        return bool(self.mark) or (self.section == "env" and self.a != self.b)

    def to_dict(self) -> dict:
        return {"section": self.section, "source": self.source, "key": self.key, "metric": self.metric,
                "a": _plain(self.a), "b": _plain(self.b), "ratio": _plain(self.ratio), "mark": self.mark,
                "meaning": MARKS.get(self.mark, ""), "note": self.note}


def _plain(v: Any) -> Any:
    """JSON-safe: NaN/inf -> None, numpy scalars -> Python."""
    if hasattr(v, "item") and callable(v.item):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


@dataclass
class Comparison:
    a: dict | None  # run info of A (None: a baseline check of one run)
    b: dict
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    settings: Settings = field(default_factory=Settings)

    @property
    def regressions(self) -> list[Row]:
        return [r for r in self.rows if r.regression]

    @property
    def exit_code(self) -> int:
        return 1 if self.regressions else 0

    def counts(self) -> dict[str, int]:
        return {m: sum(r.mark == m for r in self.rows) for m in MARKS}

    def verdict(self) -> str:
        n = len(self.regressions)
        c = self.counts()
        parts = [f"{c[m]} {MARKS[m]} ({m})" for m in MARKS if c[m]]
        head = f"{n} regression(s)" if n else "no regression"
        return head + (": " + ", ".join(parts) if parts else "")

    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "a": self.a, "b": self.b,
                "settings": {"threshold": self.settings.threshold, "parity_factor": self.settings.parity_factor},
                "notes": list(self.notes), "marks": MARKS, "counts": self.counts(),
                "regressions": len(self.regressions), "exit_code": self.exit_code, "verdict": self.verdict(),
                "rows": [r.to_dict() for r in self.rows]}


def run_info(run: Run) -> dict:
    m = run.manifest
    return {"run_id": run.run_id, "dir": str(run.dir), "started": m.get("started"), "device": m.get("device"),
            "profile": m.get("profile"), "machine": run.machine()["label"]}


# ---------------------------------------------------------------------------------------------
# formatting helpers (shared with the renderers)


def fmt(v: Any, metric: str = "") -> str:
    v = _plain(v)
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        if metric in ("rel_err", "max_abs") or (v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e6)):
            return f"{v:.2e}"
        return f"{v:.4g}"
    return str(v)


def fmt_ratio(r: float | None) -> str:
    if r is None:
        return ""
    if isinstance(r, float) and math.isinf(r):
        return "inf"
    if isinstance(r, float) and math.isnan(r):
        return ""
    return f"{r:.2f}"


# ---------------------------------------------------------------------------------------------
# sections


def _comparable(A: Run, B: Run) -> tuple[bool, list[str]]:
    """Can timings / parity errors of A and B be compared? (bool, notes)"""
    ma, mb = A.machine(), B.machine()
    notes, ok = [], True
    if ma["device"] != mb["device"] or (ma["gpu"] and mb["gpu"] and ma["gpu"] != mb["gpu"]):
        ok = False
        notes.append(f"not comparable: A ran on {ma['label']}, B on {mb['label']}; timing and parity rows are "
                     "marked x (compare runs from the same GPU model)")
    elif ma["device"] == "cuda" and not (ma["known"] and mb["known"]):
        which = " and ".join(n for n, m in (("A", ma), ("B", mb)) if not m["known"])
        notes.append(f"warning: GPU model of {which} unknown (env.json not in the run): same GPU assumed")
    pa, pb = A.manifest.get("profile"), B.manifest.get("profile")
    if pa != pb:
        ok = False
        notes.append(f"not comparable: profile {pa} (A) vs {pb} (B) run different shapes; timing and parity rows "
                     "are marked x")
    return ok, notes


def _env_rows(A: Run, B: Run) -> list[Row]:
    rows = [Row("env", "env.json", "machine", "gpu", A.machine()["label"], B.machine()["label"])]
    va, vb = A.versions(), B.versions()
    for k in dict.fromkeys([*va, *vb]):
        rows.append(Row("env", "env.json", "versions", k, va.get(k, "-"), vb.get(k, "-")))
    ra, rb = A.json("routing.json"), B.json("routing.json")
    if ra is not None or rb is not None:
        ba, bb = _backends(ra), _backends(rb)
        for br in dict.fromkeys([*ba, *bb]):
            rows.append(Row("env", "routing.json", f"branch {br}", "backend", ba.get(br, "-"), bb.get(br, "-")))
    for r in rows:
        if r.a != r.b:
            r.note = "changed"
    return rows


def _backends(routing: dict | None) -> dict[str, str]:
    if not routing:
        return {}
    br = routing.get("branches") or {}
    out = {}
    if isinstance(br, dict):
        for name, v in br.items():
            out[name] = v.get("backend", "?") if isinstance(v, dict) else str(v)
    return out


def _stage_rows(A: Run, B: Run, comparable: bool) -> list[Row]:
    rows = []
    # with the stages B planned and has no result for, whether A ran them or not: B set out to run them and did
    # not (killed, stopped, still running), so it passes no gate on what it has (round 19 A U-1: B planned
    # pa,pb,pc, was kill -9'd in pb, A ran only pa: "no regression", exit 0; ``compare K K`` of it too)
    names = list(dict.fromkeys([s["name"] for s in A.stages] + [s["name"] for s in B.stages] + _planned(B)))
    for name in names:
        sa, sb = A.stage(name), B.stage(name)
        a, b = (sa or {}).get("status"), (sb or {}).get("status")
        row = Row("stage", "manifest.json", name, "status", a or "-", b or "-")
        reason_b = ((sb or {}).get("reason") or "")[:160]
        reason_a = ((sa or {}).get("reason") or "")[:160]
        if sb is None and name in _planned(B):  # B meant to run it and has no result: its run was stopped or died
            row.mark, row.note = "!", "planned in B, no result there (its run was stopped or its runner died)"
        elif sb is None:
            row.mark, row.note = "x", "not in B"
        elif sa is None:
            row.mark, row.note = ("!", f"new in B and failing: {reason_b}") if b in FAILED else ("x", "not in A")
        elif not comparable and a != b:
            row.mark, row.note = "x", "status changed, but on another machine/profile"
        elif b in FAILED and a not in FAILED:
            row.mark, row.note = "!", reason_b
        elif a in FAILED and b == "PASS":
            row.mark, row.note = "*", "fixed"
        elif b == "SKIP" and a != "SKIP":
            row.mark, row.note = "x", f"skipped in B (not validated there): {reason_b}"
        elif a == "SKIP" and b != "SKIP":
            row.note = "runs in B, skipped in A"
        elif a in FAILED and b in FAILED:
            row.note = f"still failing: {reason_b}"
        elif a == "SKIP" and b == "SKIP":
            row.note = f"skipped in both: {reason_a}"
        rows.append(row)
    return rows


def _error_row(section: str, source: str, key: str, a_status: str | None, b_status: str | None,
               a_err: float, b_err: float, tol: float, comparable: bool, factor: float,
               definition_changed: str = "", a_note: str = "", b_note: str = "") -> Row:
    """One parity row: status change first, then the error ratio."""
    row = Row(section, source, key, "rel_err", a_err if a_status else None, b_err if b_status else None)
    if b_status is None:
        row.mark, row.note = "x", "only in A"
        return row
    if a_status is None:
        row.mark, row.note = ("!", f"new in B and {b_status}") if b_status in FAILED else ("x", "only in B")
        return row
    if definition_changed:
        row.mark, row.note = "x", f"case definition changed: {definition_changed}"
        return row
    if not comparable:
        row.mark, row.note = "x", "another machine/profile"
        return row
    if b_status in FAILED and a_status not in FAILED:
        row.mark, row.note = "!", f"{a_status} -> {b_status}" + (f": {b_note}" if b_note else "")
        return row
    if a_status in FAILED and b_status == "PASS":
        row.mark, row.note = "*", f"{a_status} -> PASS"
        return row
    if "SKIP" in (a_status, b_status):
        note = b_note or a_note
        if a_status == b_status:  # nothing measured on either side: no change, nothing to compare
            row.note = "skipped in both" + (f": {note}" if note else "")
        else:
            row.mark = "x"
            row.note = f"skipped in {'A' if a_status == 'SKIP' else 'B'}" + (f": {note}" if note else "")
        return row
    if not (_finite(a_err) and _finite(b_err)):
        row.mark, row.note = "x", "no finite error on " + ("both sides" if not (_finite(a_err) or _finite(b_err))
                                                           else ("A" if not _finite(a_err) else "B"))
        if a_status in FAILED and b_status in FAILED:
            row.note += f"; still {b_status}"
        return row
    floor = tol * NOISE_FLOOR if _finite(tol) and tol > 0 else 0.0
    ea, eb = max(a_err, floor), max(b_err, floor)
    if ea == 0:
        row.ratio = 1.0 if eb == 0 else math.inf
    else:
        row.ratio = eb / ea
    if row.ratio > factor:
        row.mark, row.note = "+", f"error {row.ratio:.3g}x larger (> {factor:g}x)"
    elif row.ratio < 1 / factor:
        row.mark, row.note = "-", f"error {1 / row.ratio:.3g}x smaller"
    if a_status in FAILED and b_status in FAILED:
        row.note = (row.note + "; " if row.note else "") + f"still {b_status}"
    return row


def _finite(x: Any) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def _sanity_rows(A: Run, B: Run, comparable: bool, factor: float) -> list[Row]:
    sa, sb = A.sanity_checks(), B.sanity_checks()  # validated: "ok" true/false, numbers numbers
    if sa is None and sb is None:
        return []
    if sa is None or sb is None:
        return [Row("parity", "sanity.json", "-", "rel_err", mark="x",
                    note=f"sanity.json not in {'A' if sa is None else 'B'}")]
    da, db = A.json("sanity.json"), B.json("sanity.json")
    defn = ""
    for k in ("shape", "cfg"):
        if da.get(k) != db.get(k):
            defn = f"{k} {da.get(k)} -> {db.get(k)}"
    ca = {c["check"]: c for c in sa}
    cb = {c["check"]: c for c in sb}
    rows = []
    for name in dict.fromkeys([*ca, *cb]):
        a, b = ca.get(name), cb.get(name)
        if not (_has_err(a) or _has_err(b) or _flipped(a, b)):
            continue  # structural checks without an error number: shown only when they change
        rows.append(_error_row("parity", "sanity.json", name, (a or {}).get("status"), (b or {}).get("status"),
                               _num(a, "rel_err"), _num(b, "rel_err"), _num(b or a, "tol"), comparable, factor, defn,
                               b_note=_text((b or {}).get("detail"))[:120]))
    return rows


def _text(v: Any) -> str:
    return "" if v is None else str(v)


def _has_err(c: dict | None) -> bool:
    return c is not None and c["has_err"]


def _flipped(a: dict | None, b: dict | None) -> bool:
    return a is None or b is None or a["status"] != b["status"]


def _num(d: dict | None, k: str) -> float:
    try:
        return float((d or {}).get(k))
    except (TypeError, ValueError):
        return float("nan")


def _parity_rows(A: Run, B: Run, name: str, comparable: bool, factor: float) -> list[Row]:
    da, db = A.parity(name), B.parity(name)
    if da is None and db is None:
        return []
    if da is None or db is None:
        return [Row("parity", name, "-", "rel_err", mark="x", note=f"{name} not in {'A' if da is None else 'B'}")]
    definition = [c for c in PARITY_REQUIRED if c not in ("case", "max_abs", "rel_err", "status")]
    definition += [c for c in da.columns if c in db.columns and c not in definition and c in ("n", "l_sel", "tf32")]
    # keyed by the (impl, case) tuple Run.parity refuses duplicates of: every row of either table is
    # one row here (a joined "impl:case" string, or an empty impl read as nsa_core's, collapsed two)
    ra = {parity_key(r): r for r in da.to_dict("records")}
    rb = {parity_key(r): r for r in db.to_dict("records")}
    rows = []
    for key in dict.fromkeys([*ra, *rb]):
        a, b = ra.get(key), rb.get(key)
        changed = ""
        if a is not None and b is not None:
            diffs = [f"{c} {a[c]} -> {b[c]}" for c in definition if not _same(a.get(c), b.get(c))]
            changed = ", ".join(diffs)
        rows.append(_error_row("parity", name, _parity_label(key), (a or {}).get("status"), (b or {}).get("status"),
                               _num(a, "rel_err"), _num(b, "rel_err"), _num(b or a, "tol"), comparable, factor,
                               changed, a_note=str((a or {}).get("note", "") or "")[:120],
                               b_note=str((b or {}).get("note", "") or "")[:120]))
    return rows


def _parity_label(key: tuple[str, str]) -> str:
    """A parity row's label: the case id, with `` [impl=NAME]`` for an implementation other than the
    built-in (rows of runs from before the ``impl`` column are nsa_core's and keep their bare case).
    A label only: rows are matched by the (impl, case) tuple."""
    impl, case = key
    return case if impl == "nsa_core" else f"{case} [impl={impl}]"


def _same(x: Any, y: Any) -> bool:
    if _finite(x) and _finite(y):
        return math.isclose(float(x), float(y), rel_tol=1e-9, abs_tol=0.0)
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return str(x) == str(y)


def judge_time(a: float, b: float, threshold: float, spread_a=None, spread_b=None, *, higher_is_better=False
               ) -> tuple[float, str, str]:
    """(ratio b/a, mark, note) for one measured number. Spreads are (p20, p80) or None."""
    ratio = b / a if a else (math.inf if b else 1.0)
    worse = ratio < 1 / (1 + threshold) if higher_is_better else ratio > 1 + threshold
    better = ratio > 1 + threshold if higher_is_better else ratio < 1 / (1 + threshold)
    if not (worse or better):
        return ratio, "", ""
    if higher_is_better:
        word = "lower" if worse else "higher"
    else:
        word = "slower" if worse else "faster"
    inside = []
    if spread_a is not None and _finite(spread_a[0]) and _finite(spread_a[1]) and spread_a[0] <= b <= spread_a[1]:
        inside.append("B inside A's p20..p80")
    if spread_b is not None and _finite(spread_b[0]) and _finite(spread_b[1]) and spread_b[0] <= a <= spread_b[1]:
        inside.append("A inside B's p20..p80")
    if inside:
        return ratio, "~", f"{word} beyond {threshold:.0%}, but {' and '.join(inside)}"
    return ratio, ("+" if worse else "-"), f"{word} beyond {threshold:.0%}"


def _timing_rows(A: Run, B: Run, name: str, comparable: bool, threshold: float, cpu: bool = False) -> list[Row]:
    """Rows of one timing table. ``cpu``: both runs timed on a CPU — their times are shown with B/A
    but never marked (a shared, unpinned CPU swings several-fold between same-commit reruns, inside
    and outside the recorded spread); read counters are still judged (deterministic)."""
    da, db = A.timing(name), B.timing(name)
    if da is None and db is None:
        return []
    if da is None or db is None:
        return [Row("timing", name, "-", "-", mark="x", note=f"{name} not in {'A' if da is None else 'B'}")]
    where = _stage_setting(A, name), _stage_setting(B, name)
    if comparable and None not in where and where[0] != where[1]:
        return [Row("timing", name, "-", "-", mark="x",
                    note=f"measured with {where[0]} (A) vs {where[1]} (B): not comparable")]
    ka, kb = key_columns(da), key_columns(db)
    if ka != kb:
        return [Row("timing", name, "-", "-", mark="x",
                    note=f"case definition changed: key columns {ka} (A) vs {kb} (B)")]
    ma, mb = metric_columns(da), metric_columns(db)
    metrics = [m for m in ma if m in mb]
    rows = []
    for m in dict.fromkeys([*ma, *mb]):
        if m not in metrics:
            rows.append(Row("timing", name, "-", m, mark="x", note=f"column only in {'A' if m in ma else 'B'}"))
    recs_a, recs_b = da.to_dict("records"), db.to_dict("records")
    by_position = not ka and max(len(recs_a), len(recs_b)) > 1
    if by_position:
        # no key column (no string or integer column naming the case): the rows are matched by their
        # position. Keyed by () every row of the table was one row, the last one: a 10x read
        # regression in row 1 was "no regression"
        ra = {(f"row {i}",): r for i, r in enumerate(recs_a, 1)}
        rb = {(f"row {i}",): r for i, r in enumerate(recs_b, 1)}
    else:
        ra = {tuple(str(r[k]) for k in ka): r for r in recs_a}
        rb = {tuple(str(r[k]) for k in kb): r for r in recs_b}
    # label rows by the key columns that vary (impl=torch on every row says nothing); match on all
    both = [*ra.values(), *rb.values()]
    shown = [k for k in ka if len({str(r[k]) for r in both}) > 1] or ka[:1]
    if "case" in shown:  # a case id already names T=256 etc.: keep only what it does not say
        shown = [k for k in shown if k == "case" or not all(str(r[k]) in str(r["case"]) for r in both)]
    position_note = "no key column: rows matched by their position in the table"
    for key in dict.fromkeys([*ra, *rb]):
        a, b = ra.get(key), rb.get(key)
        label = key[0] if by_position else (fmt_key(a or b, shown) or "(all)")
        if a is None or b is None:
            note = f"only in {'A' if b is None else 'B'}" + (f" ({position_note})" if by_position else "")
            rows.append(Row("timing", name, label, "-", mark="x", note=note))
            continue
        for m in metrics:
            va, vb = a.get(m), b.get(m)
            if not (_finite(va) or _finite(vb)):
                continue  # measured on neither side (an optional column left empty): nothing to say
            row = Row("timing", name, label, m, va, vb)
            if not (_finite(va) and _finite(vb)):
                note = (a.get("note") if not _finite(va) else b.get("note")) or ""
                row.mark = "x"
                side, bad = ("A", va) if not _finite(va) else ("B", vb)
                # an infinite cell (1e309 in the CSV) is shown as inf: said so, not "no value" (round 32 U32-5)
                said = "an infinite value" if math.isinf(_num({"v": bad}, "v")) else "no value"
                row.note = f"{said} in {side}" + (f" ({note})" if _finite_str(note) else "")
            else:
                va, vb = float(va), float(vb)
                if is_derived(m):
                    row.ratio = vb / va if va else (math.inf if vb else 1.0)
                    row.note = "derived from other columns: not judged (its timings are judged in their own rows)"
                elif is_reads(m):
                    row.ratio = vb / va if va else (math.inf if vb else 1.0)
                    if not math.isclose(va, vb, rel_tol=1e-9):
                        row.mark, row.note = ("+" if vb > va else "-"), "read counter changed (deterministic)"
                else:
                    spa = _spread(da, a, m)
                    spb = _spread(db, b, m)
                    row.ratio, row.mark, row.note = judge_time(va, vb, threshold, spa, spb,
                                                               higher_is_better=is_speedup(m))
                    if cpu and row.mark:
                        row.mark, row.note = "", f"CPU timing, not judged ({row.note})"
                if not comparable:
                    row.mark, row.note = "x", "another machine/profile"
            if by_position:
                row.note = f"{row.note}; {position_note}" if row.note else position_note
            rows.append(row)
    return rows


def is_derived(metric: str) -> bool:
    """A number computed from other measured columns of the row (a ratio such as ``speedup`` = a/b,
    or a sum of parts). It carries no spread of its own, so a change in it cannot be told from noise:
    it is shown but never flagged; its components are compared (with their spread) as their own rows."""
    return is_speedup(metric) or metric.endswith("_ratio") or metric.endswith("_sum_ms")


def _stage_setting(run: Run, name: str) -> str | None:
    """'device=cuda profile=full' of the stage that wrote ``name`` (a later ``nsa-run stage X`` may run
    with other settings than the run), or None when the manifest does not record them."""
    owner = run.declared_by(name)
    entry = run.stage(owner) if owner else None
    if not entry or not (entry.get("device") or entry.get("profile")):
        return None
    return f"device={entry.get('device') or '?'} profile={entry.get('profile') or '?'}"


def _finite_str(s: Any) -> bool:
    return isinstance(s, str) and bool(s.strip()) and s.strip().lower() != "nan"


def _spread(df, row: dict, metric: str) -> tuple[float, float] | None:
    if not is_time(metric):
        return None
    cols = spread_columns(df, metric)
    if cols is None:
        return None
    lo, hi = row.get(cols[0]), row.get(cols[1])
    return (float(lo), float(hi)) if _finite(lo) and _finite(hi) else None


# ---------------------------------------------------------------------------------------------


def compare_runs(A: Run, B: Run, settings: Settings | None = None) -> Comparison:
    """Every section for runs A (before) and B (after). Raises ArtifactError on a broken artifact."""
    settings = settings or Settings()
    comparable, notes = _comparable(A, B)
    cmp = Comparison(run_info(A), run_info(B), notes=notes, settings=settings)
    cmp.rows += _env_rows(A, B)
    cmp.rows += _stage_rows(A, B, comparable)
    cmp.rows += _sanity_rows(A, B, comparable, settings.parity_factor)
    for name in dict.fromkeys([*A.parity_files(), *B.parity_files()]):
        cmp.rows += _parity_rows(A, B, name, comparable, settings.parity_factor)
    cpu = A.machine()["device"] == "cpu" and B.machine()["device"] == "cpu"
    if cpu:
        cmp.notes.append("both runs timed on a CPU: timings are shown with B/A but not judged (CPU timings swing "
                         "several-fold between same-commit reruns); compare GPU runs for speed")
    for name in dict.fromkeys([*A.timing_files(), *B.timing_files()]):
        cmp.rows += _timing_rows(A, B, name, comparable, settings.threshold, cpu)
    if A.dir.resolve() == B.dir.resolve():
        cmp.notes.append("A and B are the same run folder: every ratio is 1 by construction")
    cmp.notes += running_notes({"A": A, "B": B}) + unfinished_notes({"A": A, "B": B})
    return cmp


def _planned(run: Run) -> list[str]:
    """The stages ``run``'s oneshot planned (``planned`` in its manifest; [] when not noted)."""
    planned = run.manifest.get("planned")
    return [n for n in planned if isinstance(n, str)] if isinstance(planned, list) else []


def unfinished_notes(runs: dict[str, Run]) -> list[str]:
    """An UNFINISHED note per run whose runner died or stopped it (``artifacts.unfinished``) and an INTERRUPTED
    note per run stopped by a signal: a run killed half-way was "no regression" with only "not comparable" rows
    for what it never ran (round 18 A-R5)."""
    notes = []
    for which, run in runs.items():
        if which == "B" and runs.get("A") is not None and runs["A"].dir == run.dir:
            continue
        line = unfinished(run.manifest)
        if line is not None:
            notes.append(f"UNFINISHED: run {which} ({run.run_id}): {line}")
        elif run.manifest.get("interrupted"):
            notes.append(f"INTERRUPTED: run {which} ({run.run_id}) {interrupted_line(run.manifest)}")
    return notes


def running_notes(runs: dict[str, Run]) -> list[str]:
    """A RUNNING note per run an nsa-run is still at work in (a oneshot, a rerun whose earlier files
    are set aside): its rows are of the stages finished so far. Called after the rows are read."""
    notes = []
    for which, run in runs.items():
        line = run.running()
        if line is not None and not (which == "B" and runs.get("A") is not None and runs["A"].dir == run.dir):
            notes.append(f"RUNNING: run {which} ({run.run_id}): {line}; its rows are of the stages finished so far")
    return notes


def _md(text: Any) -> str:
    """One markdown line / table cell from file-provided text (CSV keys, baselines, manifests): summary.md's
    one rule (``results.summary.md_cell``: control characters removed, whitespace collapsed, every markdown /
    HTML metacharacter backslash-escaped), so a plugin's key can neither break the table nor become a link,
    a code span or HTML in a CI comment (round 23 U23-6: ``[click](javascript:...)`` stayed a live link)."""
    return md_cell(text)


def visible_rows(cmp: Comparison, show_all: bool = False) -> list[Row]:
    """The rows a reader sees: those with a mark or a change (env), or every row with ``show_all``."""
    return [r for r in cmp.rows if show_all or r.changed]


def title(cmp: Comparison) -> str:
    b = cmp.b
    if cmp.a is None:
        return f"nsa-run baseline check of {b['run_id']} ({b['machine']}, {b['profile']})"
    a = cmp.a
    return f"nsa-run compare {a['run_id']} ({a['machine']}, {a['profile']}) -> {b['run_id']} ({b['machine']}, " \
           f"{b['profile']})"


def to_markdown(cmp: Comparison, show_all: bool = False) -> str:
    """GitHub markdown: the title, the verdict, notes, then one table per section (changed rows only,
    or every row with ``show_all``); the verdict again as the last line."""
    lines = [f"### {_md(title(cmp))}", "", f"**{_md(cmp.verdict())}**", ""]
    lines += [f"> {_md(n)}" for n in cmp.notes]
    if cmp.notes:
        lines.append("")
    rows = visible_rows(cmp, show_all)
    hidden = len(cmp.rows) - len(rows)
    if hidden:
        lines += [f"{hidden} unchanged row(s) not shown (--all shows them).", ""]
    for section in SECTIONS:
        sec = [r for r in rows if r.section == section]
        if not sec:
            continue
        lines += [f"**{section}**", "", "| | source | key | metric | A | B | B/A | note |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in sec:
            lines.append(f"| {r.mark or ' '} | {_md(r.source)} | {_md(r.key)} | {_md(r.metric)} | "
                         f"{_md(fmt(r.a, r.metric))} | {_md(fmt(r.b, r.metric))} | {fmt_ratio(r.ratio)} | "
                         f"{_md(r.note)} |")
        lines.append("")
    legend = ", ".join(f"`{m}` {w}" for m, w in MARKS.items())
    lines += [f"marks: {legend}", "", f"**{cmp.verdict()}**", ""]
    return "\n".join(lines)


__all__ = ["ArtifactError", "Comparison", "MARKS", "Row", "Settings", "compare_runs", "fmt", "fmt_ratio",
           "is_derived", "judge_time", "run_info", "title", "to_markdown", "visible_rows"]
