"""Artifact readers with validation, shared by ``compare``, ``report`` and baselines (private).

Policy: a file that is absent is "not in this run" (the reader returns None); a file that is
present but broken (truncated, not JSON, wrong columns, non-numeric numbers, an unknown
``schema_version``) raises :class:`ArtifactError` naming the file and the problem. A file the
manifest lists for a stage but that is gone also raises: something deleted evidence.

Nothing here writes. Run arguments are resolved by :func:`resolve_run`: a run id under
``--out`` (``40e81ff``, ``40e81ff-dirty-6b9d72362e.2``; never ``/`` or ``..``) or the path of a
run folder (anything holding a valid ``manifest.json``).
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsa_runner._text import clip, shown, word_shown
from nsa_runner.artifacts import (
    MANIFEST_NAME,
    JsonTextError,
    ManifestError,
    UnsafeFileError,
    declared_type_problem,
    json_loads,
    load_manifest,
    not_a_file_words,
    outside_problem,
    read_limited,
    read_text_limited,
    set_aside_copy,
    still_running,
)
from nsa_runner.results import (  # the schema's owner; re-exported for report / compare / baseline
    DECODE_FILE,
    DECODE_REQUIRED,
    KERNEL_BENCH_GLOBS,
    PARITY_FILES,
    PARITY_NUMERIC,
    PARITY_REQUIRED,
    STATUSES,
    TIMING_FILES,
)

SUPPORTED_JSON_SCHEMAS = (1,)
RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,199}$")

_TIME = re.compile(r"^(ms|ms_\w+|\w+_ms)$")
_SPREAD = re.compile(r"^(\w+_)?(p20|p80)$")
_READS = re.compile(r"^reads_\w+$")
_SPEEDUP = re.compile(r"^speedup(_\w+)?$")
# measurement settings and free text: never part of a row's identity
_NOT_KEYS = {"note", "notes", "timer", "comment", "error", "status", "reason", "message", "seconds", "time_s",
             "iters", "warmup", "reps", "repeats", "n_iter", "samples"}


class ArtifactError(ValueError):
    """A run or one of its files cannot be used; the message names the file and the problem."""


# ---------------------------------------------------------------------------------------------
# run arguments


def check_run_id(text: str) -> str:
    """Validate a run id (the name of a folder under ``--out``). Raises ArtifactError."""
    if not text:
        raise ArtifactError("empty run id")
    if "\x00" in text:
        raise ArtifactError("run id contains a NUL byte")
    if "/" in text or "\\" in text or ".." in text:
        raise ArtifactError(f"{text!r} is not a run id: run ids never contain '/', '\\' or '..' "
                            "(give the path of an existing run folder instead)")
    if not RUN_ID_RE.match(text):
        raise ArtifactError(f"{text!r} is not a run id (letters, digits, '.', '_', '+', '-'; "
                            "e.g. 40e81ff or 40e81ff-dirty-6b9d72362e.2)")
    return text


def _looks_like_path(text: str) -> bool:
    return "/" in text or os.sep in text or text.startswith(".") or text.startswith("~")


def _runs_under(out: Path) -> list[str]:
    try:
        return sorted(p.name for p in out.iterdir() if (p / MANIFEST_NAME).is_file())
    except OSError:
        return []


def _is(path: Path, kind: str) -> bool:
    """``path.is_dir()`` / ``is_file()`` for a path the user gave: Python 3.11 raises OSError where the
    system cannot look the name up (a name longer than the file system allows, ENAMETOOLONG), which
    ended `report` / `compare` as an anonymous "OSError (unexpected)". Raises ArtifactError naming it."""
    try:
        return path.is_dir() if kind == "dir" else path.is_file()
    except OSError as e:
        raise ArtifactError(f"{shown(str(path), 120)}: cannot be looked up ({e.strerror or e})") from None


def resolve_run(arg: str, out: Path) -> Path:
    """A run argument -> its folder (not created, not changed). Raises ArtifactError.

    ``arg`` is a run id under ``out`` or the path of a run folder; either way the folder must
    hold a valid ``manifest.json``.
    """
    if not isinstance(arg, str) or not arg.strip():
        raise ArtifactError("empty run argument: give a run id under --out or a run folder")
    if "\x00" in arg:
        raise ArtifactError("run argument contains a NUL byte")
    if _looks_like_path(arg):
        folder = Path(arg).expanduser()
        if not _is(folder, "dir"):
            why = "not a run id (ids never contain '/' or '..')" if ("/" in arg or ".." in arg) else "no such folder"
            raise ArtifactError(f"{arg!r}: {why}, and no run folder exists at that path")
    else:
        check_run_id(arg)
        folder = out / arg
        if not _is(folder, "dir"):
            known = _runs_under(out)
            listing = (", ".join(known[-8:]) + (" ..." if len(known) > 8 else "")) if known else "none"
            raise ArtifactError(f"no run {arg!r} under {word_shown(out)} (runs there: {listing}; for a folder "
                                f"elsewhere give its path, e.g. ./{arg})")
    if not _is(folder / MANIFEST_NAME, "file"):
        raise ArtifactError(f"{word_shown(folder)}: not a run folder ({not_a_file_words(folder / MANIFEST_NAME)})")
    return folder


# ---------------------------------------------------------------------------------------------
# low-level validated readers


def _read_text(path: Path) -> str:
    """UTF-8 text of a file, refused by type and size before reading (no FIFO, device, 10 GB file)."""
    try:
        return read_text_limited(path)
    except UnsafeFileError as e:
        raise ArtifactError(str(e)) from None
    except UnicodeDecodeError as e:
        raise ArtifactError(f"{word_shown(path)}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ArtifactError(f"{word_shown(path)}: cannot read ({e.strerror or e})") from None


def read_bytes_checked(path: Path) -> bytes:
    """The bytes of a file, refused by type and size before reading. Raises ArtifactError."""
    try:
        return read_limited(path)
    except UnsafeFileError as e:
        raise ArtifactError(str(e)) from None
    except OSError as e:
        raise ArtifactError(f"{word_shown(path)}: cannot read ({e.strerror or e})") from None


def read_json(path: Path, versions: tuple[int, ...] = SUPPORTED_JSON_SCHEMAS) -> dict:
    """A JSON object with a supported ``schema_version``. Raises ArtifactError."""
    text = _read_text(path)
    if not text.strip():
        raise ArtifactError(f"{word_shown(path)}: empty file (truncated?)")
    try:
        data = json_loads(text)
    except JsonTextError as e:
        if str(e) == "nested too deeply":
            raise ArtifactError(f"{word_shown(path)}: not usable JSON (nested too deeply)") from None
        raise ArtifactError(f"{word_shown(path)}: not valid JSON, truncated or corrupt ({e})") from None
    if not isinstance(data, dict):
        raise ArtifactError(f"{word_shown(path)}: expected a JSON object, got {type(data).__name__}")
    _check_version(path, data.get("schema_version"), versions)
    return data


def _check_version(path: Path, version: Any, versions: tuple[int, ...], where: str = "") -> None:
    if isinstance(version, bool) or version not in versions:
        shown = "missing" if version is None else repr(version)
        raise ArtifactError(f"{word_shown(path)}{where}: schema_version {shown} is not supported "
                            f"(this nsa-run reads {', '.join(map(str, versions))})")


def read_jsonl(path: Path, versions: tuple[int, ...] = SUPPORTED_JSON_SCHEMAS) -> list[dict]:
    """One JSON object per line, each with a supported ``schema_version``. Raises ArtifactError."""
    text = _read_text(path)
    if text and not text.endswith("\n"):
        raise ArtifactError(f"{word_shown(path)}: truncated (the last line has no newline)")
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json_loads(line)
        except JsonTextError as e:
            if str(e) == "nested too deeply":
                raise ArtifactError(f"{word_shown(path)}: line {i} is not usable JSON (nested too deeply)") from None
            why = str(e).split(" at line ")[0]
            raise ArtifactError(f"{word_shown(path)}: line {i} is not valid JSON ({why})") from None
        if not isinstance(obj, dict):
            raise ArtifactError(f"{word_shown(path)}: line {i} is not a JSON object")
        _check_version(path, obj.get("schema_version"), versions, f" line {i}")
        rows.append(obj)
    return rows


def read_csv(path: Path, required: tuple[str, ...] = (), numeric: tuple[str, ...] = (),
             status_col: str | None = None):
    """A CSV as a pandas DataFrame, validated. Raises ArtifactError.

    Checks: not empty, ends with a newline (else truncated), every line has the header's number
    of fields, ``required`` columns present, values of ``numeric`` columns (and of every column
    whose name says it is a measurement) are numbers or empty, ``status_col`` values are statuses.

    Every cell is read as the exact text written, and only then typed (:func:`_typed_column`): the
    text columns (``impl``, ``case``, ``status``, notes...) stay that text, so any implementation or
    case name comes back as given. pandas' own parsing read ``NA`` / ``None`` / ``nan`` as empty
    (an empty impl is nsa_core's) and ``1`` / ``1.0`` as one number: an implementation of such a
    name beside nsa_core (or ``1`` beside ``1.0``) was "appears more than once", and the run could
    never be reported or compared (round 15 B-R4).
    """
    import pandas as pd

    text = _read_text(path)
    if not text.strip():
        raise ArtifactError(f"{word_shown(path)}: empty file (truncated?)")
    if not text.endswith("\n"):
        raise ArtifactError(f"{word_shown(path)}: truncated (the last line has no newline)")
    try:
        lines = list(csv.reader(io.StringIO(text)))
    except csv.Error as e:
        raise ArtifactError(f"{word_shown(path)}: not valid CSV ({e})") from None
    header = lines[0]
    if len(set(header)) != len(header) or any(not h.strip() for h in header):
        raise ArtifactError(f"{word_shown(path)}: bad header (empty or duplicate column names): {header}")
    for i, fields in enumerate(lines[1:], 2):
        if fields and len(fields) != len(header):
            raise ArtifactError(f"{word_shown(path)}: line {i} has {len(fields)} fields, the header has {len(header)} "
                                "(truncated or corrupt)")
    missing = [c for c in required if c not in header]
    if missing:
        raise ArtifactError(f"{word_shown(path)}: missing column(s) {', '.join(missing)} (has: {', '.join(header)})")
    rows = [fields for fields in lines[1:] if fields]  # a blank line is no row (as pandas skipped it)
    lineno = [i for i, fields in enumerate(lines[1:], 2) if fields]
    measured = set(numeric) | {c for c in header if is_time(c) or is_spread(c) or is_reads(c) or is_speedup(c)}
    columns = {}
    for j, c in enumerate(header):
        values = [r[j] for r in rows]
        if c in measured:
            conv = pd.to_numeric(pd.Series([None if v.strip() in _NA_WORDS else v for v in values],
                                            dtype=object), errors="coerce")
            bad = [k for k, v in enumerate(values) if v.strip() not in _NA_WORDS and pd.isna(conv[k])]
            if bad:
                shown_v = repr(values[bad[0]])
                shown_v = shown_v if len(shown_v) <= 80 else f"{shown_v[:60]}... ({len(shown_v)} characters)"
                raise ArtifactError(f"{word_shown(path)}: column {c!r} line {lineno[bad[0]]}: {shown_v} is not a "
                                    "number (or too long to be one)")
            columns[c] = conv
        else:
            columns[c] = _typed_column(c, values)
    df = pd.DataFrame(columns, columns=header)
    if status_col is not None:
        vals = df[status_col].astype(str)
        bad = ~vals.isin(STATUSES)
        if bad.any():
            i = int(bad.idxmax())
            raise ArtifactError(f"{word_shown(path)}: column {status_col!r} line {lineno[i]}: {vals[i]!r} is not "
                                f"one of {', '.join(STATUSES)}")
    return df


# the words pandas reads as "no value": an empty measurement (only in number columns, never in text)
_NA_WORDS = frozenset({"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
                       "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"})
# columns that are text whatever they hold: a row's identity (impl, case) and the runner's words
_TEXT_COLUMNS = frozenset({"impl", "case", "status", "dtype", "note", "notes", "comment", "error", "reason",
                           "message", "timer"})


def _typed_column(name: str, values: list[str]):
    """A column that is no measurement, from its exact texts: numbers when every non-empty cell is a
    number and no two different texts are one number (``1`` and ``1.0``, ``8`` and ``08`` stay text,
    so two rows never become one), an empty cell then being no value; else the texts as written
    (an empty cell ''). ``_TEXT_COLUMNS`` are always text."""
    import pandas as pd

    full = [v for v in values if v != ""]
    if name not in _TEXT_COLUMNS:
        if not full:
            return pd.Series([math.nan] * len(values), dtype="float64")
        conv = pd.to_numeric(pd.Series([v if v != "" else None for v in values], dtype=object), errors="coerce")
        numbers = conv[[v != "" for v in values]]
        if not numbers.isna().any() and numbers.nunique() == len(set(full)):
            return conv
    return pd.Series(values, dtype=object)


# the types readers rely on in the built-in JSON artifacts: "a.b" is key b of object a; "a.*" is
# every value of object a; "a[]" every item of list a. A missing key is fine (absent, not wrong).
JSON_SHAPES: dict[str, dict[str, type | tuple[type, ...]]] = {
    "env.json": {"facts": dict, "facts.gpu": dict, "facts.torch": dict, "facts.triton": dict,
                 "facts.gpu.devices": list},
    "routing.json": {"branches": dict},
    # a check's verdict and numbers: "ok": "false" (a non-empty string, truthy) counted as passing
    "sanity.json": {"checks": list, "checks[].ok": bool, "checks[].rel_err": (int, float, type(None)),
                    "checks[].tol": (int, float, type(None))},
}


def check_shape(path: Path, data: dict, shape: dict) -> None:
    """Raise ArtifactError naming the first field of ``data`` whose type is not ``shape``'s."""
    for spec, types in shape.items():
        for where, value in _walk(data, spec):
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in _tuple(types)):
                want = " or ".join(_TYPE_WORDS.get(t, t.__name__) for t in _tuple(types))
                got = type(value).__name__
                if not isinstance(value, (dict, list)):
                    got += f" {shown(value, 40)}"
                raise ArtifactError(f"{word_shown(path)}: {where!r} must be {want}, got {got}")


_TYPE_WORDS = {bool: "true or false", dict: "an object", list: "a list", str: "a string", int: "an integer",
               float: "a number", type(None): "null"}


def _tuple(t) -> tuple:
    return t if isinstance(t, tuple) else (t,)


def _walk(data: Any, spec: str, where: str = ""):
    """(where, value) pairs that ``spec`` names in ``data`` (only where the parents are right)."""
    head, _, rest = spec.partition(".")
    items = head.endswith("[]")
    key = head[:-2] if items else head
    if not isinstance(data, dict):
        return
    if key == "*":
        pairs = [(f"{where}.{k}" if where else str(k), v) for k, v in data.items()]
    elif key in data:
        pairs = [(f"{where}.{key}" if where else key, data[key])]
    else:
        return
    for w, v in pairs:
        if items:
            if not isinstance(v, list):
                continue  # the list itself is checked by its own entry
            for i, x in enumerate(v):
                if rest:
                    yield from _walk(x, rest, f"{w}[{i}]")
                else:
                    yield f"{w}[{i}]", x
        elif rest:
            yield from _walk(v, rest, w)
        else:
            yield w, v


# ---------------------------------------------------------------------------------------------
# column roles of the timing tables


def is_time(c: str) -> bool:
    return bool(_TIME.match(c)) and not is_spread(c)


def is_spread(c: str) -> bool:
    return bool(_SPREAD.match(c))


def is_reads(c: str) -> bool:
    return bool(_READS.match(c))


def is_speedup(c: str) -> bool:
    return bool(_SPEEDUP.match(c))


def metric_columns(df) -> list[str]:
    """Columns compared across runs: times (lower is better), reads (lower), speedups (higher)."""
    return [c for c in df.columns if is_time(c) or is_reads(c) or is_speedup(c)]


def key_columns(df) -> list[str]:
    """Columns that define a row (the case): strings and integers that are not measurements."""
    import pandas as pd

    keys = []
    for c in df.columns:
        if c in _NOT_KEYS or is_time(c) or is_spread(c) or is_reads(c) or is_speedup(c):
            continue
        s = df[c]
        t = pd.api.types
        if t.is_integer_dtype(s) or t.is_bool_dtype(s) or t.is_object_dtype(s) or t.is_string_dtype(s):
            keys.append(c)
        elif t.is_float_dtype(s) and s.notna().all() and (s == s.round()).all() and c in ("S", "T", "B"):
            keys.append(c)  # an integer column that came back as float
    return keys


def spread_columns(df, metric: str) -> tuple[str, str] | None:
    """(p20, p80) columns recorded for ``metric`` (``fwd_ms`` -> ``fwd_p20``/``fwd_ms_p20``; ``ms_step`` ->
    ``ms_step_p20``/``step_p20``); the bare ``p20``/``p80`` when the table has one time metric."""
    stems = [metric]
    if metric.endswith("_ms"):
        stems.append(metric[:-3])
    if metric.startswith("ms_"):
        stems.append(metric[3:])
    for s in stems:
        lo, hi = f"{s}_p20", f"{s}_p80"
        if lo in df.columns and hi in df.columns:
            return lo, hi
    if "p20" in df.columns and "p80" in df.columns and is_time(metric) and (
            metric == "ms" or ("ms" not in df.columns and sum(is_time(c) for c in df.columns) == 1)):
        return "p20", "p80"
    return None


def parity_key(row: dict) -> tuple[str, str]:
    """The identity of a parity table's row: ``(impl, case)``, as text. An empty ``impl`` (or a table
    without that column: runs from before it) is the built-in ``nsa_core``. A tuple, never a joined
    string: ``impl:case`` made ``x`` / ``a:b`` and ``x:a`` / ``b`` one row."""
    return _key_text(row.get("impl")) or "nsa_core", _key_text(row.get("case"))


def _key_text(v: Any) -> str:
    """A key cell as text ('' for an empty cell; ``1.0`` of a column pandas read as float as ``1``)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return _fmt_val(v)


def fmt_key(row: dict, keys: list[str]) -> str:
    return " ".join(f"{k}={_fmt_val(row[k])}" for k in keys)


def _fmt_val(v: Any) -> str:
    if isinstance(v, float) and math.isfinite(v) and v == int(v):
        return str(int(v))
    return str(v)


# ---------------------------------------------------------------------------------------------
# one run folder


def _not_text(name: Any) -> str | None:
    """The first lone surrogate of ``name`` (a string that cannot be written as UTF-8), else None."""
    if not isinstance(name, str):
        return None
    return next((ch for ch in name if 0xD800 <= ord(ch) <= 0xDFFF), None)


@dataclass
class Run:
    """A run folder, read lazily and strictly. ``Run.open(folder)`` validates manifest.json."""

    dir: Path
    manifest: dict
    _cache: dict = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, folder: Path) -> Run:
        try:
            m = load_manifest(folder)
        except ManifestError as e:
            raise ArtifactError(str(e)) from None
        # every section, table and plot shows the stage names: control characters are escaped or left
        # out where they are shown (junit.xml, summary.md, report.html), but a lone surrogate (a
        # hand-edited "\udcff", a name that was not UTF-8) is no text: no file can be written with it
        for i, s in enumerate(m["stages"]):
            bad = _not_text(s.get("name"))
            if bad is not None:
                raise ArtifactError(f"{Path(folder) / MANIFEST_NAME}: stages[{i}] name {clip(ascii(s['name']), 80)} "
                                    f"is not text (a lone surrogate, U+{ord(bad):04X}, at character "
                                    f"{s['name'].index(bad) + 1}): a hand-edited entry? repair the name")
        return cls(Path(folder), m)

    @property
    def run_id(self) -> str:
        return self.manifest["run_id"]

    @property
    def stages(self) -> list[dict]:
        return self.manifest["stages"]

    def stage(self, name: str) -> dict | None:
        return next((s for s in self.stages if s.get("name") == name), None)

    def declared_by(self, name: str) -> str | None:
        """The stage whose manifest entry lists file ``name``, if any."""
        for s in self.stages:
            if name in (s.get("files") or []):
                return s["name"]
        return None

    def inside(self, name: str) -> Path:
        """``self.dir / name`` once ``name`` is known to stay inside the run folder (no absolute
        path, no ``..``, no link leading out): a hand-edited manifest ``files`` entry
        ``../../secret.csv`` or ``/etc/x.csv`` was read and its rows copied into report.html.
        Raises ArtifactError naming the entry; nothing is read."""
        why = outside_problem(self.dir, name)
        if why is not None:
            owner = self.declared_by(name)
            listed = f"manifest.json lists it for stage {owner!r}" if owner else "a run file"
            raise ArtifactError(f"{self.dir}: {shown(str(name), 120)} ({listed}) is outside the run folder: "
                                f"{clip(why, 300)}; refused, not read")
        return self.dir / name

    def _present(self, name: str) -> Path | None:
        p = self.inside(name)
        owner = self.declared_by(name)
        if owner is None and declared_type_problem(self.dir, name) is not None:
            return None  # listed by no stage of this run and unreadable (a FIFO, device, oversize file the
            # runner refused when the stage was recorded, round 15 A2): not in this run, as a missing file
        aside = self._set_aside(owner, name) if owner is not None else None
        if aside is not None:  # (round 32 B32-3, round 33 B33-6; None: not in this run while the rerun is at work)
            return self._aside_file(owner, aside)
        if p.is_file():
            return p
        if p.exists():
            raise ArtifactError(f"{p}: expected a file")
        if owner is not None:
            raise ArtifactError(f"{p}: the manifest lists it as written by stage {owner!r}, but the file is "
                                "missing (deleted or moved?)")
        return None

    def _rerunning(self, stage: str) -> bool:
        """Is a live nsa-run on this host rerunning ``stage`` in this folder now? Its earlier files are
        set aside in history/ until the new result is recorded (``pending`` of manifest.json, read again:
        the rerun may have started after ``Run.open``). Such files are "not in this run (yet)", and
        ``running()`` says RUNNING, as for a oneshot at work: it said "missing (deleted or moved?)",
        "repair or move the broken file aside", exit 2."""
        try:
            fresh = load_manifest(self.dir)
        except ManifestError:
            return False
        line = still_running({"pending": [p for p in fresh.get("pending") or []
                                          if isinstance(p, dict) and p.get("stage") == stage]}, self.dir)
        if line is not None:
            self._cache["_rerun"] = f"{line} (a rerun: its earlier files are set aside until it ends)"
        return line is not None

    def recorded(self, name: str, owner: str | None = None) -> Path | None:
        """The file holding what the manifest records for ``name`` (a file of stage ``owner``, by default the stage
        that declares it; its log too): in place, or, while a rerun has the stage's files set aside in history/,
        their set-aside copy (``artifacts.set_aside_copy``), None where there is none. ``running`` / ``unfinished``
        say so. Raises ArtifactError for a name outside the run folder."""
        p = self.inside(name)
        owner = owner or self.declared_by(name)
        aside = self._set_aside(owner, name) if owner is not None else None
        return p if aside is None else self._aside_file(owner, aside)

    def _aside_file(self, owner: str, aside: str) -> Path | None:
        self._rerunning(owner)  # a live one: ``running`` says it
        return self.dir / aside if aside else None

    def _set_aside(self, stage: str, name: str) -> str | None:
        """``artifacts.set_aside_copy`` of ``stage``'s ``name`` on manifest.json as it is now (a rerun may have
        started after ``Run.open``)."""
        try:
            fresh = load_manifest(self.dir)
        except ManifestError:
            return None
        return set_aside_copy(fresh, stage, str(name), self.dir)

    def running(self) -> str | None:
        """One line when an nsa-run on this host is at work in this run (a oneshot's stage, a rerun
        whose earlier files a reader found set aside), else None: the results read are of the
        stages finished so far, not a verdict."""
        return self._cache.get("_rerun") or still_running(self.manifest)

    def _cached(self, key: str, fn):
        self._cache.setdefault("_touched", []).append(key.partition(":")[2])  # what a report section read
        if key not in self._cache:
            self._cache[key] = fn()
        return self._cache[key]

    def json(self, name: str) -> dict | None:
        """A JSON artifact, or None when it is not in this run. The built-in files readers walk
        (env.json, routing.json, sanity.json) are checked for the types they use (``JSON_SHAPES``)."""
        def load():
            p = self._present(name)
            if p is None:
                return None
            data = read_json(p)
            check_shape(p, data, JSON_SHAPES.get(name, {}))
            return data
        return self._cached(f"json:{name}", load)

    def sanity_checks(self) -> list[dict] | None:
        """The checks of sanity.json (None when it is not in the run), the one reader ``report`` and
        ``compare`` share: each ``{"check", "status", "rel_err", "tol", "detail", "has_err"}``, its
        status PASS only for ``"ok": true`` (a hand-edited ``"ok": "false"``, truthy, counted as a
        pass). Wrong types (``ok`` not true/false, ``rel_err`` / ``tol`` not a number or null) are
        refused by ``JSON_SHAPES`` as a broken file, naming the field. A check that is no object is
        passed over; a check name or detail of another type is shown as text. Two checks of one name
        are refused too, naming it (as duplicate case ids of a parity table are): ``compare`` pairs
        checks by name, and kept one copy (a failing one before a passing one: "no regression")
        while ``report`` counted both (round 13 B-B11)."""
        doc = self.json("sanity.json")
        if doc is None:
            return None
        out = [{"check": str(c.get("check")), "status": "PASS" if c.get("ok") is True else "FAIL",
                "rel_err": c.get("rel_err"), "tol": c.get("tol"), "detail": c.get("detail"),
                "has_err": "rel_err" in c}
               for c in doc.get("checks") or [] if isinstance(c, dict)]
        seen: set[str] = set()
        for c in out:
            if c["check"] in seen:
                raise ArtifactError(f"{self.dir / 'sanity.json'}: check {shown(c['check'], 120)} appears more "
                                    "than once")
            seen.add(c["check"])
        return out

    def jsonl(self, name: str) -> list[dict] | None:
        def load():
            p = self._present(name)
            return None if p is None else read_jsonl(p)
        return self._cached(f"jsonl:{name}", load)

    def csv(self, name: str, required: tuple[str, ...] = (), numeric: tuple[str, ...] = (),
            status_col: str | None = None):
        def load():
            p = self._present(name)
            return None if p is None else read_csv(p, required, numeric, status_col)
        return self._cached(f"csv:{name}", load)

    def parity(self, name: str):
        """triton_fwd.csv / triton_bwd.csv, validated; two rows of one :func:`parity_key` (the same case
        of the same implementation, an empty ``impl`` being nsa_core's) are an error naming both lines:
        ``compare`` pairs rows by that key, and kept one of two (a FAIL beside a PASS of an empty impl:
        "no regression") while ``report`` showed both (round 14 B-R5)."""
        df = self.csv(name, PARITY_REQUIRED, PARITY_NUMERIC, "status")
        if df is not None:
            seen: dict[tuple[str, str], int] = {}
            for i, r in enumerate(df.to_dict("records"), 2):
                key = parity_key(r)
                if key in seen:
                    raise ArtifactError(f"{self.dir / name}: case {shown(key[1], 120)} of implementation "
                                        f"{shown(key[0], 120)} appears more than once (lines {seen[key]} and {i}; "
                                        "an empty impl is nsa_core)")
                seen[key] = i
        return df

    def declared(self, suffix: str = "") -> list[str]:
        """Files the stages declared (manifest ``files``), in run order, optionally by suffix."""
        names = [f for s in self.stages for f in (s.get("files") or []) if str(f).endswith(suffix)]
        return list(dict.fromkeys(names))

    def _header(self, name: str) -> list[str] | None:
        """The CSV header of ``name`` (None when absent or unreadable: the full reader says why)."""
        try:
            p = self.recorded(name)
            if p is None:
                return None
            text = read_text_limited(p)
            return next(csv.reader(io.StringIO(text)), None)
        except (OSError, UnicodeDecodeError, UnsafeFileError, csv.Error, ArtifactError):
            return None  # outside the run folder: never read; timing() names it

    def parity_files(self) -> list[str]:
        """Case tables of parity stages: the declared CSVs with the parity columns (DESIGN §6), e.g.
        triton_fwd.csv / triton_bwd.csv or a plugin's; the built-in names also when undeclared."""
        names = [n for n in PARITY_FILES if (self.dir / n).is_file() or self.declared_by(n)]
        for n in self.declared(".csv"):
            head = self._header(n)
            if n not in names and head is not None and all(c in head for c in PARITY_REQUIRED):
                names.append(n)
        return names

    def timing_files(self) -> list[str]:
        """The timing tables of this run: every declared CSV (any stage, plugins included) with a
        timing column (``ms_*``, ``*_ms``, ``ms``, ``reads_*``, ``speedup*``) that is not a parity
        table, plus the built-in names and bench/ kernel tables found in the folder."""
        names = [n for n in TIMING_FILES if (self.dir / n).is_file() or self.declared_by(n)]
        parity = set(self.parity_files())
        for n in self.declared(".csv"):
            head = self._header(n)
            if n in names or n in parity:
                continue
            if head is None or any(is_time(c) or is_reads(c) or is_speedup(c) for c in head):
                names.append(n)  # unreadable: listed, so that timing() names the problem
        for pattern in KERNEL_BENCH_GLOBS:
            names += sorted(p.name for p in self.dir.glob(pattern) if p.name not in names)
        return names

    def images(self) -> list[tuple[str, str]]:
        """(file, stage) of every PNG a stage declared, in run order."""
        return [(f, s["name"]) for s in self.stages for f in (s.get("files") or []) if str(f).endswith(".png")]

    def timing(self, name: str):
        """A timing table, validated: duplicate rows (same key columns) are an error."""
        required = DECODE_REQUIRED if name == DECODE_FILE else ()
        df = self.csv(name, required)
        if df is None:
            return None
        if not metric_columns(df):
            raise ArtifactError(f"{self.dir / name}: no timing column (ms_*, *_ms, ms, reads_*, speedup*) "
                                f"among {', '.join(map(str, df.columns))}")
        keys = key_columns(df)
        if keys and df.duplicated(subset=keys).any():
            i = int(df.duplicated(subset=keys).idxmax())
            raise ArtifactError(f"{self.dir / name}: two rows for {fmt_key(df.iloc[i].to_dict(), keys)}")
        return df

    @property
    def env(self) -> dict | None:
        return self.json("env.json")

    def machine(self) -> dict:
        """Where the run ran: ``{"device", "gpu", "label", "known"}``.

        ``label`` is the GPU model (``torch.cuda.get_device_name``) on CUDA, ``cpu (<arch>)`` on
        CPU. ``known`` is False when env.json is not in the run (GPU model unknown).
        """
        device = self.manifest.get("device")
        env = self.env
        gpu, known = None, env is not None
        if env is not None:
            device = device or env.get("device")
            devs = ((env.get("facts") or {}).get("gpu") or {}).get("devices") or []
            if devs and isinstance(devs[0], dict):
                gpu = devs[0].get("name")
        arch = (self.manifest.get("host") or {}).get("machine") or "?"
        if device == "cuda":
            label = gpu or "cuda (GPU model unknown: env.json not in this run)"
            known = known and gpu is not None
        else:
            label = f"cpu ({arch})"
        return {"device": device or "?", "gpu": gpu, "label": label, "known": known}

    def versions(self) -> dict[str, str]:
        """torch / triton / CUDA versions from env.json (empty when it is not in the run)."""
        env = self.env
        if env is None:
            return {}
        f = env.get("facts") or {}
        t, tri, g = f.get("torch") or {}, f.get("triton") or {}, f.get("gpu") or {}
        out = {"torch": t.get("version"), "triton": tri.get("version"), "cuda runtime": t.get("cuda_runtime"),
               "driver cuda": g.get("driver_cuda_version")}
        return {k: str(v) for k, v in out.items() if v}
