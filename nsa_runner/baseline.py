"""Baselines: expected decode / kernel figures per GPU model (``--baseline FILE``).

The file format is documented in docs/baselines.md. In short (JSON, schema_version 1)::

    {"schema_version": 1, "kind": "nsa-run-baseline", "tolerance": 0.10,
     "machines": {"NVIDIA H100 80GB HBM3": {"profile": "full", "figures": [
        {"file": "decode.csv", "key": {"S": 65536, "B": 1}, "metric": "ms_step", "value": 0.91},
        {"file": "decode.csv", "key": {"S": 65536, "B": 1}, "metric": "speedup", "value": 7.4,
         "tolerance": 0.2}]}}}

The machine key is the label ``compare`` shows for a run: the GPU model as torch names it
(``torch.cuda.get_device_name``), or ``cpu (<arch>)``. ``check(run, baseline)`` turns every
figure of the run's machine into a ``baseline`` row: ``+`` worse than the baseline beyond its
tolerance (a regression), ``-`` better beyond it (time to update the baseline), ``~`` beyond
it but the baseline value lies inside the run's p20..p80, ``x`` not measured here.
"""

from __future__ import annotations

import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from nsa_runner._readers import (
    KERNEL_BENCH_GLOBS,
    TIMING_FILES,
    ArtifactError,
    Run,
    is_reads,
    is_speedup,
    is_time,
    key_columns,
    metric_columns,
    read_json,
)
from nsa_runner.artifacts import file_kind, now_iso, write_json
from nsa_runner.compare import Row, _same, _spread, judge_time

SCHEMA_VERSION = 1
KIND = "nsa-run-baseline"
DEFAULT_TOLERANCE = 0.10
_SCALAR = (str, int, float, bool)


class BaselineError(ArtifactError):
    """The baseline file is missing, unreadable or malformed (exit 2)."""


def _bad(path: Path, where: str, what: str) -> BaselineError:
    return BaselineError(f"{path}: {where}: {what} (format: docs/baselines.md)")


def _tolerance(path: Path, where: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise _bad(path, where, f"tolerance must be a number >= 0, got {v!r}")
    return float(v)


def load(path: str | Path) -> dict:
    """Read and validate a baseline file. Raises BaselineError naming the problem."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError) as e:  # missing, a symlink loop, no permission
        raise BaselineError(f"{path}: no such baseline file" if isinstance(e, FileNotFoundError)
                            else f"{path}: cannot be read ({getattr(e, 'strerror', None) or e})") from None
    if not stat.S_ISREG(mode):  # a FIFO, /dev/zero, a folder: named as what it is, never read
        raise BaselineError(f"{path}: is {file_kind(mode)}, not a baseline file (a regular JSON file)")
    try:
        data = read_json(path, (SCHEMA_VERSION,))
    except ArtifactError as e:
        raise BaselineError(str(e)) from None
    if data.get("kind") != KIND:
        raise _bad(path, "kind", f"expected {KIND!r}, got {data.get('kind')!r}")
    default_tol = _tolerance(path, "tolerance", data.get("tolerance", DEFAULT_TOLERANCE))
    machines = data.get("machines")
    if not isinstance(machines, dict) or not machines:
        raise _bad(path, "machines", "must be a non-empty object {machine label: {...}}")
    for label, sec in machines.items():
        where = f"machines[{label!r}]"
        if not isinstance(sec, dict) or not isinstance(sec.get("figures"), list):
            raise _bad(path, where, "must be an object with a 'figures' list")
        if "profile" in sec and sec["profile"] not in ("quick", "full"):
            raise _bad(path, f"{where}.profile", f"must be quick or full, got {sec['profile']!r}")
        seen: dict[tuple, int] = {}
        for i, f in enumerate(sec["figures"]):
            w = f"{where}.figures[{i}]"
            if not isinstance(f, dict):
                raise _bad(path, w, "must be an object")
            file = f.get("file")
            if not isinstance(file, str) or not file.endswith(".csv") or "/" in file or "\\" in file or ".." in file:
                raise _bad(path, f"{w}.file", f"must be a CSV name in the run folder, got {file!r}")
            key = f.get("key")
            if not isinstance(key, dict) or not all(isinstance(k, str) and isinstance(v, _SCALAR)
                                                    for k, v in key.items()):
                raise _bad(path, f"{w}.key", f"must be an object of column: value, got {key!r}")
            if not isinstance(f.get("metric"), str) or not f["metric"]:
                raise _bad(path, f"{w}.metric", f"must be a column name, got {f.get('metric')!r}")
            # a name no timing table can have ("zz", "MS_STEP") was "not comparable" and the gate passed:
            # a typo disabled the guard (round 19 A U-5)
            m = f["metric"]
            if not (is_time(m) or is_reads(m) or is_speedup(m)):
                raise _bad(path, f"{w}.metric", f"{m!r} is not a timing column (ms, ms_*, *_ms, reads_*, speedup*; "
                                                "names are case-sensitive)")
            near = _case_twin(file)
            if near is not None:
                raise _bad(path, f"{w}.file", f"{file!r} is not {near!r} (file names are case-sensitive)")
            v = f.get("value")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise _bad(path, f"{w}.value", f"must be a finite number >= 0, got {v!r}")
            if v == 0 and not is_reads(f["metric"]):  # a time or speedup of 0 was never measured
                raise _bad(path, f"{w}.value", f"must be > 0 for {f['metric']!r} (a ratio to 0 means nothing; "
                                               "only read counters reads_* may be 0)")
            f["tolerance"] = _tolerance(path, f"{w}.tolerance", f.get("tolerance", default_tol))
            better = f.get("better", "higher" if is_speedup(f["metric"]) else "lower")
            if better not in ("lower", "higher"):
                raise _bad(path, f"{w}.better", f"must be 'lower' or 'higher', got {better!r}")
            f["better"] = better
            # one figure per file + key + metric: two contradictory ones were both used ("1 worse, 1 better")
            ident = (file, tuple(sorted((k, _key_value(v)) for k, v in key.items())), m)
            if ident in seen:
                raise _bad(path, w, f"a second figure for {file} {_key_text(key)} {m} "
                                    f"(the first is {where}.figures[{seen[ident]}]): keep one")
            seen[ident] = i
    data["_path"] = str(path)
    return data


def _case_twin(file: str) -> str | None:
    """The built-in timing table name ``file`` spells in another case (``Decode.csv``), else None."""
    import fnmatch

    for name in TIMING_FILES:
        if file != name and file.lower() == name.lower():
            return name
    for pattern in KERNEL_BENCH_GLOBS:
        if fnmatch.fnmatchcase(file.lower(), pattern) and not fnmatch.fnmatchcase(file, pattern):
            return pattern
    return None


def _key_value(v: Any) -> Any:
    """A key value as the row match sees it (1024 and 1024.0 are one key)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return (type(v).__name__, v)
    return ("number", float(v))


def _key_text(key: dict) -> str:
    return " ".join(f"{k}={v!r}" for k, v in key.items()) or "(all rows)"


def _key_problem(df, key: dict) -> str | None:
    """Why ``key`` cannot name a row of ``df``: a column that is not one of its key columns (an extra
    field, a typo) or a value of the wrong type for its column (``{"S": true}``); None when it fits.
    Such a figure matched nothing and was "not comparable": the gate passed (round 19 A U-5)."""
    import pandas as pd

    keys = key_columns(df)
    t = pd.api.types
    for k, v in key.items():
        if k not in keys:
            return (f"key column {k!r} is not a key column of this run's table (its key columns: "
                    f"{', '.join(keys) or 'none'})")
        s = df[k]
        if t.is_bool_dtype(s):
            fits = isinstance(v, bool)
        elif t.is_numeric_dtype(s):
            fits = isinstance(v, (int, float)) and not isinstance(v, bool)
        else:  # text (object / string): a text value, or a number where the column holds numbers as text
            fits = isinstance(v, str) or (not isinstance(v, bool) and isinstance(v, (int, float))
                                          and s.map(lambda x: not isinstance(x, str)).all())
        if not fits:
            return f"key {k}={v!r} ({type(v).__name__}) does not fit column {k} ({s.dtype})"
    return None


def _match(df, key: dict, path: str, fig_where: str) -> dict | None:
    mask = None
    for k, v in key.items():
        if k not in df.columns:
            return None
        m = df[k].map(lambda x, v=v: _same(x, v))
        mask = m if mask is None else (mask & m)
    hits = df[mask] if mask is not None else df
    if len(hits) > 1:
        raise BaselineError(f"{path}: {fig_where}: key {key} matches {len(hits)} rows; give every key column "
                            f"({', '.join(key_columns(df))})")
    return hits.iloc[0].to_dict() if len(hits) == 1 else None


def check(run: Run, baseline: dict) -> tuple[list[Row], list[str]]:
    """Rows (section ``baseline``) and notes for ``run`` against a loaded baseline."""
    path = baseline.get("_path", "baseline")
    label = run.machine()["label"]
    machines = baseline["machines"]
    if label not in machines:
        note = f"baseline {path} has no figures for {label} (it has: {', '.join(machines)})"
        return [Row("baseline", Path(path).name, label, "-", mark="x", note=note)], [note]
    sec = machines[label]
    notes = []
    profile_ok = sec.get("profile") in (None, run.manifest.get("profile"))
    if not profile_ok:
        notes.append(f"baseline for {label} was recorded with profile {sec['profile']}, this run is "
                     f"{run.manifest.get('profile')}: rows marked x")
    rows = []
    for i, f in enumerate(sec["figures"]):
        key_text = " ".join(f"{k}={v}" for k, v in f["key"].items()) or "(all)"
        row = Row("baseline", f["file"], key_text, f["metric"], a=f["value"])
        df = run.timing(f["file"]) if f["file"] in run.timing_files() else run.csv(f["file"])
        if df is None:
            row.mark, row.note = "x", f"{f['file']} not in this run"
        elif f["metric"] not in df.columns:
            row.mark, row.note = "x", f"no column {f['metric']} in {f['file']}"
        else:
            fig_where = f"machines[{label!r}].figures[{i}]"
            problem = _key_problem(df, f["key"])
            if problem is not None:
                raise BaselineError(f"{path}: {fig_where}.key: {problem} in {f['file']} (format: docs/baselines.md)")
            hit = _match(df, f["key"], path, fig_where)
            v = None if hit is None else hit.get(f["metric"])
            if hit is None:
                row.mark, row.note = "x", "row not measured in this run"
            elif v is None or not math.isfinite(float(v)):
                row.mark, row.note = "x", "no value in this run"
            else:
                row.b = float(v)
                row.ratio, row.mark, row.note = judge_time(
                    float(f["value"]), float(v), f["tolerance"], None, _spread(df, hit, f["metric"]),
                    higher_is_better=f["better"] == "higher")
                if row.mark == "-":
                    row.note += " (update the baseline?)"
                if not profile_ok:
                    row.mark, row.note = "x", f"baseline profile {sec['profile']}"
        rows.append(row)
    return rows, notes


def from_run(run: Run, tolerance: float = DEFAULT_TOLERANCE, note: str = "") -> dict:
    """A baseline holding every timing figure of ``run`` (its machine only)."""
    return figures_of(run, tolerance, note)[0]


def figures_of(run: Run, tolerance: float = DEFAULT_TOLERANCE, note: str = "") -> tuple[dict, list[str]]:
    """``from_run``'s baseline and a note per table left out: one with several rows and no key
    column (its figures, all keyed ``{}``, were written and then refused by ``--baseline``: "key {}
    matches 2 rows")."""
    figures, notes = [], []
    for name in run.timing_files():
        df = run.timing(name)
        if df is None:
            continue
        keys = key_columns(df)
        if not keys and len(df) > 1:  # a figure names its row by the key columns: these rows have none
            notes.append(f"{name} not recorded: its {len(df)} rows have no key column (a string or integer "
                         f"column naming the case) to tell them apart in a baseline")
            continue
        for r in df.to_dict("records"):
            key = {k: _py(r[k]) for k in keys}
            for m in metric_columns(df):
                v = _py(r[m])
                # what load() accepts: a time or speedup of 0 is no measurement (a read count of 0 is)
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) \
                        and (v > 0 or (v == 0 and is_reads(m))):
                    fig = {"file": name, "key": key, "metric": m, "value": v}
                    if is_reads(m):
                        fig["tolerance"] = 0.0  # read counters are deterministic
                    figures.append(fig)
    if not figures:
        why = "; ".join(notes) if notes else "no decode.csv or benchmark CSV in this run"
        raise ArtifactError(f"{run.dir}: no timing figures to record ({why})")
    label = run.machine()["label"]
    return {"schema_version": SCHEMA_VERSION, "kind": KIND,
            "description": note or f"figures of run {run.run_id} on {label}",
            "tolerance": tolerance,
            "machines": {label: {"profile": run.manifest.get("profile"), "source_run": run.run_id,
                                 "recorded": now_iso(), "figures": figures}}}, notes


def _py(v: Any) -> Any:
    if hasattr(v, "item") and callable(v.item):
        v = v.item()
    if isinstance(v, float) and math.isfinite(v) and v == int(v) and abs(v) < 2**53:
        return int(v) if not isinstance(v, bool) else v
    return v


def save_new(path: str | Path, data: dict) -> Path:
    """Write a baseline file; refuses to replace an existing one (BaselineError).

    The text goes to a temporary file first and is hard-linked into place, which fails if the
    name exists by then: an existing file is never replaced, even by a concurrent writer. An
    OSError (unwritable folder, disk full) propagates with no temporary file left behind.
    """
    path = Path(path)
    if path.exists():
        raise BaselineError(f"{path} exists: nothing was overwritten (choose a new name, or merge by hand)")
    if not path.parent.is_dir():
        raise BaselineError(f"{path.parent}: no such folder")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write_json(tmp, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise BaselineError(f"{path} exists: nothing was overwritten") from None
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    return path
