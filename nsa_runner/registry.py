"""Stage discovery through the entry-point group ``nsa_runner.stages`` (DESIGN §5).

Built-in stages (``stages/``) are registered in this project's ``pyproject.toml`` exactly like a
third-party plugin. Loading never raises: an entry point that fails to import, does not name a
Stage, or clashes with another stage's name becomes a ``StageEntry`` with ``error`` set, which
``list`` shows and ``oneshot`` records as ERROR (the run fails; the CLI does not crash).
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import math
import re
import traceback
from dataclasses import dataclass

from nsa_runner.stage import Option, Stage

GROUP = "nsa_runner.stages"
BUILTIN_DIST = "nsa-run"
KNOWN_REQUIREMENTS = ("cuda", "triton")
# flags of `nsa-run stage` itself: a stage option may not reuse them
RESERVED_FLAGS = ("--out", "--profile", "--device", "--strict", "--timeout", "--json", "--help")

INSTALL_HINTS = {
    "cuda": "needs an NVIDIA GPU with a CUDA build of torch (see README: 'On a GPU pod')",
    "triton": "pip install triton   (on CPU the Triton interpreter is used)",
}


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


@dataclass
class StageEntry:
    """One entry point of the group: the loaded stage, or why it could not be loaded."""

    name: str  # the stage name (entry-point name while the stage cannot be loaded)
    value: str  # "module:attr"
    dist: str  # distribution name that declares it
    dist_version: str
    stage: Stage | None = None
    error: str = ""  # one line: why it is unusable
    traceback: str = ""

    @property
    def builtin(self) -> bool:
        return _norm(self.dist) == BUILTIN_DIST

    @property
    def source(self) -> str:
        return "built-in" if self.builtin else f"plugin {self.dist} {self.dist_version}"

    @property
    def order(self) -> int | None:
        return self.stage.order if self.stage is not None else None

    @property
    def requires(self) -> tuple[str, ...]:
        return tuple(self.stage.requires) if self.stage is not None else ()

    @property
    def options(self) -> tuple[Option, ...]:
        return tuple(self.stage.options) if self.stage is not None else ()


# a stage name is a plain word: it names a log file, a history folder and a CLI argument, and is
# shown in rich tables (no '/', no spaces, no markup brackets)
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _problems(stage: Stage, ep_name: str) -> list[str]:
    """What is wrong with a loaded stage's attributes (empty when it can run)."""
    problems = []
    name = stage.name
    if not name:
        problems.append("has no name")
    elif not isinstance(name, str) or not NAME_RE.fullmatch(name):
        problems.append(f"name must be letters, digits, '.', '_' or '-' (at most 64, starting with a letter or "
                        f"digit), got {name!r}")
    elif name != ep_name:
        problems.append(f"is named {name!r} but registered as {ep_name!r}")
    if isinstance(stage.order, bool) or not isinstance(stage.order, int):
        problems.append(f"order must be an int, got {stage.order!r}")
    t = stage.timeout_s
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
        problems.append(f"timeout_s must be a positive number of seconds, got {t!r}")
    if not isinstance(stage.description, str):
        problems.append(f"description must be a string, got {type(stage.description).__name__}")
    requires = stage.requires
    if not isinstance(requires, (tuple, list)) or not all(isinstance(r, str) for r in requires):
        problems.append(f"requires must be a tuple of strings, got {requires!r}")
    else:
        unknown = [r for r in requires if r not in KNOWN_REQUIREMENTS]
        if unknown:
            problems.append(f"unknown requirement(s) {unknown} (known: {', '.join(KNOWN_REQUIREMENTS)})")
    options = stage.options
    if not isinstance(options, (tuple, list)) or any(not isinstance(o, Option) for o in options):
        problems.append("options must be a tuple of nsa_runner.Option instances")
        return problems
    flags = [o.flag for o in options]
    if any(not isinstance(f, str) or not f.startswith("--") for f in flags) or len(set(flags)) != len(flags):
        problems.append(f"option flags must start with '--' and be unique, got {flags}")
    elif any(f in RESERVED_FLAGS for f in flags):
        problems.append(f"option flags {[f for f in flags if f in RESERVED_FLAGS]} are reserved by nsa-run")
    return problems


def _load(ep: md.EntryPoint, dist_name: str, dist_version: str) -> StageEntry:
    # an entry-point name that is not a plain word is shown (and recorded) by a harmless stand-in:
    # it may hold rich markup or '/', and ':' keeps it from ever equalling a real stage's name
    shown = ep.name if NAME_RE.fullmatch(ep.name) else "invalid:" + re.sub(r"[^A-Za-z0-9._-]", "_", ep.name)
    entry = StageEntry(shown, ep.value, dist_name, dist_version)
    try:
        obj = ep.load()
    except BaseException as e:  # noqa: BLE001 - a plugin may raise anything, even SystemExit
        if isinstance(e, KeyboardInterrupt):
            raise
        entry.error = f"failed to import {ep.value}: {type(e).__name__}: {e}".strip()
        entry.traceback = traceback.format_exc()
        return entry
    try:
        stage = obj() if isinstance(obj, type) else obj
    except Exception as e:  # noqa: BLE001
        entry.error = f"{ep.value}: constructing the stage raised {type(e).__name__}: {e}"
        entry.traceback = traceback.format_exc()
        return entry
    if not isinstance(stage, Stage):
        entry.error = f"{ep.value} is a {type(stage).__name__}, not an nsa_runner.Stage subclass"
        return entry
    try:
        problems = _problems(stage, ep.name)
    except Exception as e:  # noqa: BLE001 - a hostile attribute (e.g. a property that raises)
        problems = [f"attributes cannot be read: {type(e).__name__}: {e}"]
    if problems:
        entry.error = f"{ep.value}: stage " + "; ".join(problems)
        return entry
    entry.stage = stage
    return entry


def discover() -> list[StageEntry]:
    """Every stage of the entry-point group, sorted by (order, name); broken ones first.

    Two usable entries with the same name are both marked broken ("duplicate"): which one would
    run must never depend on install order.
    """
    entries: list[StageEntry] = []
    seen: set[tuple[str, str]] = set()
    for dist in md.distributions():
        dist_name = dist.metadata["Name"] or "?"
        key_dist = _norm(dist_name)
        for ep in dist.entry_points:
            if ep.group != GROUP:
                continue
            key = (key_dist, ep.name)
            if key in seen:  # the same distribution found twice on sys.path: first one wins
                continue
            seen.add(key)
            entries.append(_load(ep, dist_name, dist.version or "?"))
    by_name: dict[str, list[StageEntry]] = {}
    for e in entries:
        by_name.setdefault(e.name, []).append(e)
    for name, group in by_name.items():
        if len(group) > 1:
            where = ", ".join(f"{e.value} ({e.source})" for e in group)
            for e in group:
                e.error = f"duplicate stage name {name!r}: declared by {where}"
                e.stage = None
    return sorted(entries, key=lambda e: (e.stage is not None, e.order or 0, e.name))


# ---------------------------------------------------------------------------------------------
# requirements


@dataclass(frozen=True)
class Machine:
    """What this machine offers, as far as stage requirements are concerned."""

    cuda: bool
    triton: bool
    device: str  # the device the run uses: "cuda" or "cpu"


def cuda_available() -> bool:
    try:
        import torch
    except Exception:  # noqa: BLE001 - no torch means no CUDA for our purposes
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


def triton_installed() -> bool:
    """Triton is importable as a package (the import itself is exercised by env-pairing)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


def unmet(stage: Stage, machine: Machine) -> list[str]:
    """The requirements of ``stage`` that this machine/run does not meet."""
    missing = []
    for req in stage.requires:
        if req == "cuda" and not (machine.cuda and machine.device == "cuda"):
            missing.append("cuda")
        elif req == "triton" and not machine.triton:
            missing.append("triton")
    return missing


def skip_reason(stage: Stage, machine: Machine) -> tuple[str, str]:
    """(reason, hint) for a stage skipped because of unmet requirements."""
    missing = unmet(stage, machine)
    parts = []
    for req in missing:
        if req == "cuda":
            parts.append("no CUDA device" if not machine.cuda else "run uses --device cpu")
        else:
            parts.append("triton is not installed")
    hint = "; ".join(INSTALL_HINTS[r] for r in missing if not (r == "cuda" and machine.cuda))
    if "cuda" in missing and machine.cuda:
        hint = "; ".join(filter(None, [hint, "drop --device cpu"]))
    return f"requires {', '.join(missing)}: " + ", ".join(parts), hint


def strict_counts_skip(stage: Stage | None, machine: Machine, *, by_requirement: bool) -> bool:
    """Whether a SKIP of ``stage`` fails the run under ``--strict`` ("this machine should run it").

    - skipped for an unmet requirement: excused only when the requirement is CUDA and this
      machine has none; a missing package (e.g. triton) is fixable here, so it counts;
    - skipped by the stage itself (e.g. no flash backend): excused on a machine without CUDA
      (the accelerator paths stages skip cannot exist there); on a CUDA machine it counts.
    """
    if by_requirement:
        return not (stage is not None and "cuda" in stage.requires and not machine.cuda)
    return machine.cuda
