"""Finding implementations: the entry-point group ``nsa_runner.impls`` (see ``nsa_runner.impls``).

- :func:`names` reads the entry points' names only (nothing imported): the CLI checks ``--impl``
  against them in its own process;
- :func:`load` imports one and validates it; it never raises: a broken adapter becomes an
  :class:`ImplEntry` with ``error`` set (its cases are ERROR with that reason);
- :func:`describe_all` loads every one in a CHILD process (``python -m nsa_runner.impls.discovery``),
  so an adapter that hangs, crashes or exits at import cannot take ``nsa-run list --impls`` down.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
import traceback
from dataclasses import dataclass

from nsa_runner.impls import BUILTIN, GROUP, PARTS, Impl

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
BUILTIN_DIST = "nsa-run"
PROBE_TIMEOUT_S = 300.0


@dataclass
class ImplEntry:
    name: str
    value: str  # "module:attr"
    dist: str
    dist_version: str
    impl: Impl | None = None
    error: str = ""  # one line: why it is broken
    traceback: str = ""

    @property
    def source(self) -> str:
        norm = self.dist.lower().replace("_", "-")
        return "built-in" if norm == BUILTIN_DIST else f"plugin {self.dist} {self.dist_version}"


def _entry_points() -> list[tuple[md.EntryPoint, str, str]]:
    out, seen = [], set()
    for dist in md.distributions():
        dist_name = dist.metadata["Name"] or "?"
        for ep in dist.entry_points:
            if ep.group != GROUP or (dist_name.lower(), ep.name) in seen:
                continue  # the same distribution found twice on sys.path: first one wins
            seen.add((dist_name.lower(), ep.name))
            out.append((ep, dist_name, dist.version or "?"))
    return out


def names() -> list[str]:
    """Entry-point names of the group (valid plain words), built-in first; nothing is imported."""
    found = sorted({ep.name for ep, _, _ in _entry_points() if NAME_RE.fullmatch(ep.name)})
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


def _load_one(ep: md.EntryPoint, dist: str, version: str) -> ImplEntry:
    entry = ImplEntry(ep.name, ep.value, dist, version)
    try:
        obj = ep.load()
        impl = obj() if callable(obj) and not isinstance(obj, Impl) else obj
    except BaseException as e:  # noqa: BLE001 - an adapter may raise anything, even SystemExit
        if isinstance(e, KeyboardInterrupt):
            raise
        entry.error = f"failed to load {ep.value}: {type(e).__name__}: {e}".strip()
        entry.traceback = traceback.format_exc()
        return entry
    if not isinstance(impl, Impl):
        entry.error = f"{ep.value} gives a {type(impl).__name__}, not an nsa_runner.impls.Impl"
        return entry
    try:
        problems = impl.problems()
        if impl.name != ep.name:
            problems.append(f"is named {impl.name!r} but registered as {ep.name!r}")
    except Exception as e:  # noqa: BLE001 - hostile attributes
        problems = [f"attributes cannot be read: {type(e).__name__}: {e}"]
    if problems:
        entry.error = f"{ep.value}: " + "; ".join(problems)
        return entry
    entry.impl = impl
    return entry


def load(name: str) -> ImplEntry:
    """Load the implementation registered as ``name`` (a duplicate name is broken, never a pick)."""
    found = [(ep, d, v) for ep, d, v in _entry_points() if ep.name == name]
    if not found:
        return ImplEntry(name, "?", "?", "?", error=f"no implementation named {name!r} is registered "
                                                      f"(known: {', '.join(names()) or 'none'})")
    if len(found) > 1:
        where = ", ".join(f"{ep.value} ({d})" for ep, d, _ in found)
        return ImplEntry(name, found[0][0].value, found[0][1], found[0][2],
                         error=f"duplicate implementation name {name!r}: declared by {where}")
    return _load_one(*found[0])


def _row(e: ImplEntry, device: str) -> dict:
    impl = e.impl
    if impl is None:
        runs, why = False, f"broken: {e.error}"
    elif impl.unavailable:
        runs, why = False, impl.unavailable + (f" (fix: {impl.hint})" if impl.hint else "")
    elif impl.constraints.needs_cuda and device != "cuda":
        runs, why = False, "needs CUDA"
    else:
        runs, why = True, ""
    return {
        "name": e.name, "source": e.source, "entry_point": e.value,
        "parts": [p for p in PARTS if impl is not None and p in impl.parts],
        "constraints": impl.constraints.describe() if impl is not None else None,
        "differences": dict(impl.differences) if impl is not None else {},
        "description": impl.description if impl is not None else "",
        "note": impl.note if impl is not None else "",
        "runs_here": runs, "why_not": why, "broken": impl is None,
    }


def _describe_here(device: str) -> list[dict]:
    return [_row(load(n), device) for n in names()] + [
        _row(ImplEntry(ep.name, ep.value, d, v, error=f"entry-point name {ep.name!r} is not a plain word"), device)
        for ep, d, v in _entry_points() if not NAME_RE.fullmatch(ep.name)]


def describe_all(device: str) -> list[dict]:
    """Every registered implementation, loaded in a child process: parts, constraints, whether it
    can run here and why not. A child that crashes or hangs marks every implementation broken."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    if device == "cpu":
        env.setdefault("TRITON_INTERPRET", "1")
    try:
        r = subprocess.run([sys.executable, "-m", "nsa_runner.impls.discovery", device], capture_output=True,
                           text=True, env=env, timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
        doc = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else None
        why = f"exit status {r.returncode}: {(r.stderr.strip().splitlines() or [''])[-1][:200]}"
    except subprocess.TimeoutExpired:
        doc, why = None, f"timed out after {PROBE_TIMEOUT_S:.0f} s"
    except (OSError, ValueError) as e:
        doc, why = None, f"{type(e).__name__}: {e}"
    if isinstance(doc, list):
        return doc
    return [{"name": n, "source": "?", "entry_point": "?", "parts": [], "constraints": None, "differences": {},
             "description": "", "note": "", "runs_here": False, "broken": True,
             "why_not": f"broken: loading the implementations in a child process failed ({why})"} for n in names()]


if __name__ == "__main__":
    # the child of describe_all: only the JSON line on stdout (an adapter's prints go to stderr)
    real_stdout, sys.stdout = sys.stdout, sys.stderr
    rows = _describe_here(sys.argv[1] if len(sys.argv) > 1 else "cpu")
    sys.stdout = real_stdout
    print(json.dumps(rows, default=str))
