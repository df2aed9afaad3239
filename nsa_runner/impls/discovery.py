"""Finding implementations: the entry-point group ``nsa_runner.impls`` (see ``nsa_runner.impls``).

- :func:`names` reads the entry points' names only (nothing imported): the CLI checks ``--impl``
  against them in its own process;
- :func:`load` imports one and validates it; it never raises: a broken adapter becomes an
  :class:`ImplEntry` with ``error`` set (its cases are ERROR with that reason). A plugin's import is
  first tried in a child process (:func:`import_problem`, through the stage plugins' machinery,
  ``nsa_runner.registry.discover_group``, with its timeout): one whose import segfaults, hangs or
  calls ``os._exit`` is broken with that reason and never imported in the stage's process, so the
  other implementations' cases (nsa_core's included) still run. Built-in entries need no child;
- :func:`describe_all` describes every one through ``discover_group`` too (one child for all in
  the normal case; a child that dies or hangs names the entry point it was importing as broken and
  a new child goes on with the rest), so one bad adapter cannot take ``nsa-run list --impls`` or
  the other implementations down.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import math
import os
import re
import traceback
from dataclasses import dataclass

from nsa_runner._text import clip
from nsa_runner.impls import BUILTIN, GROUP, PARTS, TEXT_CHARS, Impl, adapter_code, plain_impl, stops, type_name

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
BUILTIN_DIST = "nsa-run"
DESCRIBE_IMPL = "nsa_runner.impls.discovery:describe_impl"
# what an adapter's declaration may hold (round 15 B-R2: 50 000 differences keys of 1 000 characters made
# `list --impls --json` print 51 MB, 100 000 dtypes and a 40 MB check docstring 44 MB): beyond a bound the
# adapter is broken, the attribute and its size named
MAX_DIFFERENCES = len(PARTS)  # entries of differences (one per part at most)
KEY_CHARS = 64  # a differences key (a part's name)
MAX_DTYPES = 64  # entries of constraints.dtypes
INFO_CHARS = 64 << 10  # an adapter's whole description as JSON (what `list --impls --json` prints of it)


@dataclass
class ImplEntry:
    name: str
    value: str  # "module:attr"
    dist: str
    dist_version: str
    impl: Impl | None = None
    error: str = ""  # one line: why it is broken
    traceback: str = ""
    dist_path: str = ""  # the distribution's metadata folder: decides built-in-ness (not its Name)

    def __setattr__(self, name: str, value) -> None:
        # round 15 B-R6: a broken adapter's import error (20 MB) was kept whole and every stage wrote it into
        # each case row (an 84 MB triton_fwd.csv; sanity's result too large to record): whatever sets it
        # (the import check in a child, the import here, the checks, a duplicate), it is one plain line,
        # clipped; the traceback keeps the rest
        if name == "error":
            value = one_line(value)
        object.__setattr__(self, name, value)

    @property
    def builtin(self) -> bool:
        return _builtin(self.dist, self.dist_path, self.value)

    @property
    def source(self) -> str:
        return "built-in" if self.builtin else f"plugin {self.dist} {self.dist_version}"


def _plain(text) -> str:
    """``text`` as a plain ``str`` (never a plugin's subclass: its methods may be hostile); never raises."""
    try:
        if not isinstance(text, str):
            text = str(text)
        return text if type(text) is str else str.__getitem__(text, slice(0, None))
    except BaseException as e:  # noqa: BLE001 - a plugin's __str__
        if stops(e):
            raise
        return f"<unprintable {type_name(text)}>"


def one_line(text) -> str:
    """``text`` as a broken entry's error: a plain ``str``, its whitespace folded to one line, at most
    ``TEXT_CHARS`` characters (what is left out counted); never raises."""
    text = _plain(text)
    line = " ".join(text[:2 * TEXT_CHARS].split())
    if len(line) <= TEXT_CHARS and len(text) <= 2 * TEXT_CHARS:
        return line
    return f"{line[:TEXT_CHARS]}… (of {len(text)} characters)"


def _format_exc(limit: int = 20_000) -> str:
    """The traceback being handled, its last ``limit`` characters; never raises."""
    try:
        return traceback.format_exc()[-limit:]
    except BaseException as e:  # noqa: BLE001 - formatting runs the plugin's __str__ / __repr__
        if stops(e):
            raise
        return ""


def _failure(e: BaseException) -> str:
    """``TYPE: message`` of what a plugin raised, clipped (its ``__str__`` may raise or return megabytes)."""
    try:
        text = str(e)
        if type(text) is not str:
            text = str.__getitem__(text, slice(0, None))
    except BaseException as e2:  # noqa: BLE001 - its __str__ is the plugin's code
        if stops(e2):
            raise
        text = "<unprintable>"
    return one_line(f"{type_name(e)}: {text}")


def _builtin(dist: str, dist_path: str, value: str) -> bool:
    """Whether entry point ``value`` of distribution ``dist`` (metadata folder ``dist_path``) is
    nsa-run's own: the running nsa-run's metadata folder and a module file of nsa-run's own packages
    (``registry.is_builtin_dist``), never the Name its METADATA claims nor a file a plugin writes
    (round 12 B2 / round 13 B4: such a plugin skipped the import check in a child, and its segfault
    killed the sanity stage)."""
    from nsa_runner.registry import is_builtin_dist

    return is_builtin_dist(dist, dist_path, value)


def _entry_points() -> list[tuple[md.EntryPoint, str, str, str]]:
    out, seen = [], set()
    from nsa_runner._discover import distributions

    for dist in distributions():  # read safely; METADATA only of one declaring the group (round 17 U-6)
        try:  # one distribution's unreadable metadata never hides the others (nor crashes the CLI)
            eps = [ep for ep in dist.entry_points if ep.group == GROUP]
            if not eps:
                continue
            dist_name = dist.metadata["Name"] or "?"
        except Exception:  # noqa: BLE001 - malformed entry_points.txt / METADATA: describe_all names it
            continue
        for ep in eps:
            if (dist_name.lower(), ep.name) in seen:
                continue  # the same distribution found twice on sys.path: first one wins
            seen.add((dist_name.lower(), ep.name))
            out.append((ep, dist_name, dist.version or "?", str(getattr(dist, "_path", "") or "")))
    return out


def names() -> list[str]:
    """Entry-point names of the group (valid plain words), built-in first; nothing is imported."""
    found = sorted({ep.name for ep, *_ in _entry_points() if NAME_RE.fullmatch(ep.name)})
    return sorted(found, key=lambda n: n != BUILTIN)


def parse_names(text: str) -> list[str]:
    """``"nsa_core,fla"`` -> ["nsa_core", "fla"]; ValueError naming an unknown one (and the known)."""
    wanted = list(dict.fromkeys(n.strip() for n in str(text).split(",") if n.strip()))
    if not wanted:
        raise ValueError("needs a comma-separated list of implementation names")
    known = names()
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ValueError(f"unknown implementation {', '.join(repr(n) for n in unknown)} "
                         f"(known: {', '.join(known) or 'none'}; see `nsa-run list --impls`)")
    return wanted


def impl_option_value(text: str) -> str:
    """Parser of the stages' ``--impl`` option: validated, normalised "a,b"."""
    return ",".join(parse_names(text))


def _check(obj, ep: md.EntryPoint) -> tuple[Impl | None, str, str]:
    """(impl, error, traceback) for what an entry point loaded (an Impl or a factory of one)."""
    try:  # its factory is the adapter's code: in the guard (round 16 B2: its own KeyboardInterrupt re-raised
        # by isinstance ended the whole parity stage "process died with SIGINT"; only a real stop, ``stops``)
        with adapter_code(loading=ep.name):
            impl = obj() if callable(obj) and not isinstance(obj, Impl) else obj
    except BaseException as e:  # noqa: BLE001 - an adapter may raise anything, even SystemExit
        if stops(e):
            raise
        return None, one_line(f"failed to load {ep.value}: {_failure(e)}"), _format_exc()
    # round 15 B-R1: the runner keeps a plain copy (texts clipped, types checked), made in the adapter guard
    plain, error = plain_impl(impl, ep.name)
    return (plain, "", "") if plain is not None else (None, one_line(f"{ep.value}: {error}"), "")


def _load_one(ep: md.EntryPoint, dist: str, version: str, dist_path: str = "") -> ImplEntry:
    entry = ImplEntry(ep.name, ep.value, dist, version, dist_path=dist_path)
    if not entry.builtin:  # a plugin: its import tried in a child first (built-ins need none)
        problem = import_problem(ep, dist)
        if problem:
            entry.error = problem
            return entry
    try:  # its import is the adapter's code too (round 16 B2, as _check)
        with adapter_code(loading=ep.name):
            obj = ep.load()
    except BaseException as e:  # noqa: BLE001 - an adapter may raise anything, even SystemExit
        if stops(e):
            raise
        entry.error = f"failed to load {ep.value}: {_failure(e)}"
        entry.traceback = _format_exc()
        return entry
    entry.impl, entry.error, entry.traceback = _check(obj, ep)
    return entry


_CHECKED: dict[str, str] = {}  # entry key -> '' (imports fine in a child) or why not; per process


def import_problem(ep: md.EntryPoint, dist: str) -> str:
    """'' when entry point ``ep`` of ``dist`` imports (and describes) fine in a child process, else
    one line why not: its import segfaults / exits / hangs (``NSA_RUN_DISCOVERY_TIMEOUT`` s, default
    60), raises, or it is not a usable Impl. The same child machinery as stage plugins
    (``registry.discover_group``); remembered per process (a stage loads an implementation once
    per case at most, the child runs once)."""
    from nsa_runner._discover import entry_key
    from nsa_runner.registry import discover_group

    key = entry_key(dist, ep)
    if key not in _CHECKED:
        recs = discover_group(GROUP, DESCRIBE_IMPL, only=key)
        rec = recs[0] if recs else {"error": f"{ep.value}: the import check in a child process did not find "
                                             "this entry point again"}
        if rec.get("error"):
            _CHECKED[key] = one_line(rec["error"]) or f"{ep.value}: broken"
        elif isinstance(rec.get("impl"), dict):
            _CHECKED[key] = ""
        else:
            _CHECKED[key] = f"{ep.value}: the import check in a child process described it wrongly"
    return _CHECKED[key]


def load(name: str) -> ImplEntry:
    """Load the implementation registered as ``name`` (a duplicate name is broken, never a pick)."""
    found = [f for f in _entry_points() if f[0].name == name]
    if not found:
        return ImplEntry(name, "?", "?", "?", error=f"no implementation named {name!r} is registered "
                                                      f"(known: {', '.join(names()) or 'none'})")
    builtin = [f for f in found if _builtin(f[1], f[3], f[0].value)]
    if len(found) > 1 and len(builtin) == 1:  # a plugin never switches off one of nsa-run's own
        return _load_one(*builtin[0])
    if len(found) > 1:
        where = ", ".join(f"{ep.value} ({d})" for ep, d, *_ in found)
        return ImplEntry(name, found[0][0].value, found[0][1], found[0][2],
                         error=f"duplicate implementation name {name!r}: declared by {where}")
    return _load_one(*found[0])


def describe_impl(obj, ep: md.EntryPoint, args=None) -> dict:
    """(In the discovery child, ``registry.discover_group``) a loaded entry point ->
    ``{"impl": {plain description}}`` or ``{"error": ...}``; plain JSON values only."""
    impl, error, tb = _check(obj, ep)
    if impl is None:
        return {"error": error, "traceback": tb}
    c = impl.constraints
    cons = c.describe()
    if isinstance(cons, dict) and isinstance(cons.get("more"), str):  # check's docstring: display text, clipped
        cons["more"] = clip(_plain(cons["more"]), TEXT_CHARS)
    info = {"parts": [p for p in PARTS if p in impl.parts], "constraints": cons,
            "needs_cuda": bool(c.needs_cuda), "differences": {str(k): str(v) for k, v in impl.differences.items()},
            "description": str(impl.description or ""), "note": str(impl.note or ""),
            "unavailable": str(impl.unavailable or ""), "hint": str(impl.hint or "")}
    return {"impl": plain_json(info)}


def plain_json(value, depth: int = 0):
    """``value`` as strict JSON values: what JSON cannot hold (NaN, infinities, objects, keys that are
    not strings) becomes text. Round 13 B10: a ``check.__doc__`` of inf or a ``describe()`` giving NaN
    made ``list --impls --json`` print ``Infinity`` / ``NaN`` (not JSON). Never raises."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else str(value)
    if depth < 32 and isinstance(value, dict):
        return {_text(k): plain_json(v, depth + 1) for k, v in value.items()}
    if depth < 32 and isinstance(value, (list, tuple)):
        return [plain_json(v, depth + 1) for v in value]
    return _text(value)


def _text(value) -> str:
    """``str(value)`` of a plugin's object, or its type's name when even that raises."""
    if isinstance(value, str):
        return str.__str__(value)
    try:
        return str(value)
    except Exception:  # noqa: BLE001 - a hostile __str__
        return f"<{type_name(value)}>"


def _info_problem(info) -> str:
    """What is wrong with a child's description of an implementation (plugin code ran there: its
    record is checked again here); '' when it can be shown."""
    if not isinstance(info, dict):
        return "the discovery process described it wrongly"
    if not isinstance(info.get("parts"), list) or not all(p in PARTS for p in info["parts"]):
        return f"parts must be among {', '.join(PARTS)}, got {info.get('parts')!r}"[:300]
    cons = info.get("constraints")
    if not isinstance(cons, dict) or not isinstance(cons.get("dtypes", []), list) \
            or not all(isinstance(d, str) for d in cons.get("dtypes", [])):
        return "constraints described wrongly"
    if not isinstance(info.get("needs_cuda"), bool):
        return "constraints.needs_cuda described wrongly"
    diffs = info.get("differences")
    if not isinstance(diffs, dict) or not all(isinstance(v, str) for v in diffs.values()):
        return "differences must be a dict {part: text}"
    # the child ran plugin code: the bounds checked again (round 15 B-R2)
    if len(diffs) > MAX_DIFFERENCES:
        return f"differences has {len(diffs)} entries (at most {MAX_DIFFERENCES}: one per part)"
    if any(len(k) > KEY_CHARS for k in diffs):
        return f"differences has a key of {max(map(len, diffs))} characters (at most {KEY_CHARS}: a part's name)"
    if len(cons.get("dtypes", [])) > MAX_DTYPES:
        return f"constraints.dtypes has {len(cons['dtypes'])} entries (at most {MAX_DTYPES})"
    bad = [k for k in ("description", "note", "unavailable", "hint") if not isinstance(info.get(k), str)]
    if bad:
        return f"{', '.join(bad)} must be text"
    size = len(json.dumps(info))
    if size > INFO_CHARS:
        return f"its description is {size} characters as JSON (at most {INFO_CHARS})"
    return ""


def _row(rec: dict, device: str, error: str = "") -> dict:
    from nsa_runner.registry import META_CHARS, invalid_name

    name = str(rec.get("name") or "?")
    if not NAME_RE.fullmatch(name):  # shown in tables and manifests: a plain word, never markup
        # (a record's own error first: a distribution whose metadata cannot be read, round 17 U-6)
        error = (error or str(rec.get("error") or "")
                 or f"entry-point name {clip(name, META_CHARS)!r} is not a plain word")
        name = invalid_name(name)
    info = rec.get("impl")
    error = error or str(rec.get("error") or "") or _info_problem(info)
    if error:
        info, runs, why = None, False, f"broken: {clip(' '.join(error.split()), 2000)}"
    elif info["unavailable"]:
        runs, why = False, info["unavailable"] + (f" (fix: {info['hint']})" if info["hint"] else "")
    elif info["needs_cuda"] and device != "cuda":
        runs, why = False, "needs CUDA"
    else:
        runs, why = True, ""
    # a plugin's metadata texts clipped (round 14 R1)
    dist, version = clip(str(rec.get("dist", "?")), META_CHARS), clip(str(rec.get("version", "?")), META_CHARS)
    entry = ImplEntry(name, clip(str(rec.get("value", "?")), META_CHARS), dist, version,
                      dist_path=str(rec.get("dist_path") or ""))
    return {
        "name": name, "source": entry.source, "entry_point": entry.value,
        "parts": list(info["parts"]) if info else [],
        "constraints": info["constraints"] if info else None,
        "differences": dict(info["differences"]) if info else {},
        "description": info["description"] if info else "",
        "note": info["note"] if info else "",
        "runs_here": runs, "why_not": why, "broken": info is None,
    }


def describe_all(device: str) -> list[dict]:
    """Every registered implementation (built-in first): parts, constraints, whether it can run
    here and why not. Imported in child processes (``registry.discover_group``): an adapter whose
    import segfaults, hangs or exits is listed as broken with the reason, the others as usual."""
    from nsa_runner.registry import META_CHARS, discover_group

    added = device == "cpu" and "TRITON_INTERPRET" not in os.environ
    if added:  # the children import triton-based adapters as a CPU stage would (before triton loads)
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        recs = discover_group(GROUP, DESCRIBE_IMPL)
    finally:
        if added:
            os.environ.pop("TRITON_INTERPRET", None)
    by_name: dict[str, list[dict]] = {}
    for rec in recs:
        by_name.setdefault(str(rec.get("name") or "?"), []).append(rec)
    rows = []
    for name, group in by_name.items():
        builtin = [r for r in group if _builtin(str(r.get("dist", "?")), str(r.get("dist_path") or ""),
                                                str(r.get("value", "")))]
        if len(group) > 1 and len(builtin) == 1:  # as load(): the built-in stays, the plugin is left out
            for r in group:
                if r is builtin[0]:
                    rows.append(_row(r, device))
                    continue
                taken = (f"implementation name {name!r} is taken by the built-in ({builtin[0].get('value', '?')}); "
                         f"{clip(str(r.get('value', '?')), 200)} ({clip(str(r.get('dist', '?')), 200)}) is left out: "
                         "rename it")
                row = _row(r, device, taken)
                # its own name in lists: `--impl nsa_core` stays the built-in's
                from nsa_runner.registry import invalid_name

                row["name"] = invalid_name(f"{r.get('dist', '?')}.{name}")
                rows.append(row)
            continue
        dup = ""
        if len(group) > 1:  # as load(): a duplicate is broken, never a pick
            dup = f"duplicate implementation name {name!r}: declared by " + ", ".join(
                f"{clip(str(r.get('value', '?')), META_CHARS)} ({clip(str(r.get('dist', '?')), META_CHARS)})"
                for r in group)
        rows += [_row(r, device, dup) for r in group]
    return sorted(rows, key=lambda r: (r["name"] != BUILTIN, r["name"]))
