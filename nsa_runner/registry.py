"""Stage discovery through the entry-point group ``nsa_runner.stages`` (DESIGN §5).

Built-in stages (``stages/``) are registered in this project's ``pyproject.toml`` exactly like a
third-party plugin. Loading never raises: an entry point that fails to import, does not name a
Stage, or clashes with another stage's name becomes a ``StageEntry`` with ``error`` set, which
``list`` shows and ``oneshot`` records as ERROR (the run fails; the CLI does not crash).

Plugins are imported in a child process (``discover_group``, ``nsa_runner/_discover.py``), never
in the CLI's own: a plugin whose import segfaults, hangs, calls ``os._exit`` or prints is listed
as broken with the reason (or changes nothing), and the others run. The CLI gets plain
descriptions (``StageInfo``, ``OptionInfo``); a stage's option values are parsed in a child too
(``parse_options``). ``discover_group(group, describe)`` serves any entry-point group.
"""

from __future__ import annotations

import errno
import importlib.metadata as md
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from nsa_runner import _python
from nsa_runner._discover import (
    EXIT_TEMP_FULL,
    SafeDistribution,
    _distfiles,
    _why,
    distributions,
    entry_key,
    note,
    stdout_parked,
)
from nsa_runner._text import clip, env_seconds, shown
from nsa_runner.stage import Option, Stage

GROUP = "nsa_runner.stages"
ERROR_CHARS = 2000  # a broken entry's one-line error at most (as a reason in the run table)
# what a plugin's metadata and stage declaration may put in every record, list and manifest (round 14
# R1: a 55 MB METADATA Name was recorded whole as each stage's `source`: a 275 MiB manifest its own
# reader refused; `list --json` printed 3-11 MB): display texts are clipped (``_text.clip``), values
# the runner uses as they are (an entry point's module:attr, a flag, a choice, a default, the order)
# are bounded: a stage beyond a bound is broken, with the reason
META_CHARS = 200  # a distribution's Name / Version, an entry point's name / value
DESCRIPTION_CHARS = 4000  # a stage's description
HELP_CHARS = 1000  # an option's help
MAX_OPTIONS = 64  # options of one stage
MAX_CHOICES = 256  # choices of one option
CHOICE_CHARS = 200  # one choice as listed (the stage's own parse checks the whole one, in its child)
DEFAULTS_CHARS = 256 << 10  # a stage's option defaults together, as JSON (each one is recorded in the manifest)
MAX_ORDER = 10**9  # |order|
MAX_REQUIRES = 8  # entries of a stage's requires (each one of KNOWN_REQUIREMENTS; round 15 B-R2: 3 000 000 made
# `list --json` print 345 MB)
MAX_DEPTH = 32  # how deep an option's value (its default, what its parse returns) may nest lists / dicts
BUILTIN_DIST = "nsa-run"
KNOWN_REQUIREMENTS = ("cuda", "triton")
# flags of `nsa-run stage` itself: a stage option may not reuse them
RESERVED_FLAGS = ("--out", "--profile", "--device", "--strict", "--timeout", "--json", "--help", "--debug")

INSTALL_HINTS = {
    "cuda": "needs an NVIDIA GPU with a CUDA build of torch (see README: 'On a GPU pod')",
    "triton": "pip install triton   (on CPU the Triton interpreter is used)",
}


def _norm(name: str) -> str:
    """A distribution name normalised as PEP 503 does (runs of '-', '_', '.' are one '-'; lower case)."""
    return re.sub(r"[-_.]+", "-", str(name)).lower()


_OWN: list[frozenset[str]] = []
OWN_PACKAGES = {"nsa_runner": ("nsa_runner",), "nsa_core": ("nsa_core",),
                "nsa_run_stages": ("nsa_run_stages", "stages")}  # top-level package -> its folder names


def _running_package() -> tuple[str, str]:
    """(real path of the running ``nsa_runner/__init__.py``, the real folder that holds ``nsa_runner``)."""
    import nsa_runner

    pkg_init = os.path.realpath(nsa_runner.__file__)
    return pkg_init, os.path.dirname(os.path.dirname(pkg_init))


def own_dist_paths() -> frozenset[str]:
    """The real paths of the metadata folders (dist-info / egg-info) of the distribution that holds
    the running ``nsa_runner``: only their entry points can be built-in (round 12 B2).

    A folder is ours when its Name normalises to ``nsa-run`` AND its own list of installed files
    (RECORD / SOURCES.txt, ``dist.files``) names what this process runs: ``nsa_runner/__init__.py``
    resolving to the running one (a regular install; the checkout's egg-info), or the editable
    finder module that this process loaded and that maps ``nsa_runner`` to the running folder, or a
    ``.pth`` naming the folder that holds it. Round 13 B4: a folder merely *beside* nsa_runner
    (``locate_file`` of any egg-info in the same site folder) or a ``direct_url.json`` saying
    "editable of the checkout" counted, and both are files a plugin writes. (Built-in-ness also
    needs the entry point's module to be one of nsa-run's own files: ``own_module_file``.)"""
    if _OWN:
        return _OWN[0]
    pkg_init, root = _running_package()
    found = set()
    for dist in distributions():  # read safely: a FIFO / device / huge METADATA is never ours (round 17 U-6)
        try:
            if _norm(dist.metadata["Name"] or "") != BUILTIN_DIST:
                continue
            where = str(getattr(dist, "_path", "") or "")
            if where and _lists_running_package(dist, pkg_init, root):
                found.add(os.path.realpath(where))
        except Exception:  # noqa: BLE001 - unreadable metadata is never ours
            continue
    _OWN.append(frozenset(found))
    return _OWN[0]


def _lists_running_package(dist: md.Distribution, pkg_init: str, root: str) -> bool:
    """Whether ``dist``'s installed-files list names the running nsa_runner (see ``own_dist_paths``)."""
    pkg_dir = os.path.dirname(pkg_init)
    for f in (dist.files or [])[:100_000]:
        rel = str(f).replace("\\", "/")
        base = rel.rsplit("/", 1)[-1]
        if rel.endswith("nsa_runner/__init__.py"):
            if os.path.realpath(str(dist.locate_file(f))) == pkg_init:
                return True
        elif base.startswith("__editable__") and base.endswith(".py"):
            mod = sys.modules.get(base[:-3])  # loaded by its .pth at start-up: it is what imports us
            mapping = getattr(mod, "MAPPING", None)
            if mod is not None and isinstance(mapping, dict) and isinstance(mapping.get("nsa_runner"), str) \
                    and os.path.realpath(mapping["nsa_runner"]) == pkg_dir \
                    and os.path.realpath(str(getattr(mod, "__file__", ""))) == \
                    os.path.realpath(str(dist.locate_file(f))):
                return True
        elif base.endswith(".pth"):
            try:  # never a blocking open (round 19 B19-2: a FIFO there hung every command): a FIFO, a
                # device, a file over 1 MiB is not ours
                data = _distfiles.read_regular_file(str(dist.locate_file(f)), 1 << 20)
            except (_distfiles.UnreadableDistFile, OSError, ValueError):
                continue
            if data is None:
                continue
            lines = data.decode("utf-8", errors="replace").splitlines()
            if any(ln.strip() and not ln.startswith(("#", "import")) and os.path.realpath(ln.strip()) == root
                   for ln in lines):
                return True
    return False


_OWN_DIRS: list[dict[str, str]] = []


def _own_package_dirs() -> dict[str, str]:
    """nsa-run's own top-level packages -> their real folders, as this process imports them, each
    only where it sits beside the running ``nsa_runner`` (a wheel: ``nsa_core``, ``nsa_run_stages``
    next to it; the checkout: ``nsa_core``, ``stages``). Found with ``find_spec`` of the top-level
    name: nothing is imported."""
    if _OWN_DIRS:
        return _OWN_DIRS[0]
    pkg_init, root = _running_package()
    out = {"nsa_runner": os.path.dirname(pkg_init)}
    for top, folders in OWN_PACKAGES.items():
        if top in out:
            continue
        try:
            spec = importlib.util.find_spec(top)
            locs = list(spec.submodule_search_locations or []) if spec is not None else []
        except (ImportError, ValueError, AttributeError):
            continue
        if len(locs) == 1 and os.path.realpath(locs[0]) in {os.path.realpath(os.path.join(root, f)) for f in folders}:
            out[top] = os.path.realpath(locs[0])
    _OWN_DIRS.append(out)
    return out


def own_module_file(value: str) -> str:
    """The real path of the module file that entry point ``value`` ("pkg.mod:attr") names when it is
    one of nsa-run's own (inside the running nsa_runner / nsa_core / nsa_run_stages folders), else ''.
    Nothing is imported. A plugin can declare our modules (then it runs our code), never have its own
    module count as ours (round 13 B4)."""
    module = str(value).partition(":")[0].strip()
    parts = module.split(".")
    if not module or not all(p.isidentifier() for p in parts):
        return ""
    base = _own_package_dirs().get(parts[0])
    if not base:
        return ""
    stem = os.path.join(base, *parts[1:])
    for cand in (stem + ".py", os.path.join(stem, "__init__.py")):
        real = os.path.realpath(cand)
        if real.startswith(base + os.sep) and os.path.isfile(real):
            return real
    return ""


def is_builtin_dist(dist: str, dist_path: str, value: str | None = None) -> bool:
    """Whether an entry point ``value`` of distribution ``dist`` whose metadata folder is ``dist_path``
    is one of nsa-run's own (built-in): its metadata folder is the running nsa-run's
    (``own_dist_paths``: where it lives and what it lists, not the Name its METADATA claims) and the
    module it names is one of nsa-run's own files (``own_module_file``: a plugin's code never is).
    ``value=None`` asks about the distribution only."""
    if _norm(dist) != BUILTIN_DIST or not dist_path:
        return False
    try:
        if os.path.realpath(dist_path) not in own_dist_paths():
            return False
        return value is None or bool(own_module_file(value))
    except (OSError, ValueError):
        return False


@dataclass
class StageEntry:
    """One entry point of the group: the loaded stage, or why it could not be loaded."""

    name: str  # the stage name (entry-point name while the stage cannot be loaded)
    value: str  # "module:attr"
    dist: str  # distribution name that declares it
    dist_version: str
    stage: StageInfo | Stage | None = None  # what the discovery child saw (a Stage when built in-process)
    error: str = ""  # one line: why it is unusable
    traceback: str = ""
    dist_path: str = ""  # the distribution's metadata folder (dist-info / egg-info): decides built-in-ness

    @property
    def builtin(self) -> bool:
        return is_builtin_dist(self.dist, self.dist_path, self.value)

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


@dataclass(frozen=True)
class OptionInfo:
    """A stage option as the discovery child described it (its ``parse`` stays in the child)."""

    flag: str
    default: Any = None
    help: str = ""
    choices: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


@dataclass
class StageInfo:
    """A stage as the discovery child described it: what the CLI needs, no plugin code."""

    name: str
    order: int
    requires: tuple[str, ...] = ()
    description: str = ""
    options: tuple[OptionInfo, ...] = ()
    timeout_s: float = 900.0
    key: str = field(default="", repr=False)  # the entry point (for parse_options)
    preload: bool = True  # Stage.preload: its process may be a spare started ahead (executor._Spare)
    preload_flash: bool = False  # Stage.preload_flash: that spare also imports FA-4's CUDA-free part


# a stage name is a plain word: it names a log file, a history folder and a CLI argument, and is
# shown in rich tables (no '/', no spaces, no markup brackets)
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
FLAG_RE = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_-]{0,62}")  # 64 characters at most


STAGE_ATTRS = ("name", "order", "timeout_s", "description", "requires", "options")


def _said(value: Any, limit: int = 200) -> str:
    """A declared value as a problem names it: its repr, clipped (round 15 B-R2: a problem quoted the
    plugin's value whole); a container too large to show is named by its size."""
    if isinstance(value, (list, tuple, dict, set)) and len(value) > 1000:
        return f"a {type(value).__name__} of {len(value)} entries"
    try:
        return clip(repr(value), limit)
    except Exception:  # noqa: BLE001 - (the child's values are plain; a Stage built in-process may not be)
        return f"a {type(value).__name__}"


def _problems(info: dict, ep_name: str) -> list[str]:
    """What is wrong with a stage's description (plain values: ``STAGE_ATTRS``, options as dicts
    ``{"flag", "default", "help", "choices"}``); empty when it can run.

    The discovery child checks what it read from the stage (each attribute read once: a property
    cannot show one value to the check and another to the runner), and the CLI checks the child's
    record again: the child ran plugin code, so what it sends is never trusted as it is."""
    problems = []
    name = info.get("name")
    if not name:
        problems.append("has no name")
    elif not isinstance(name, str) or not NAME_RE.fullmatch(name):
        problems.append(f"name must be letters, digits, '.', '_' or '-' (at most 64, starting with a letter or "
                        f"digit), got {_said(name)}")
    elif name != ep_name:
        problems.append(f"is named {name!r} but registered as {ep_name!r}")
    order = info.get("order")
    if isinstance(order, bool) or not isinstance(order, int):
        problems.append(f"order must be an int, got {_said(order, 100)}")
    elif abs(order) > MAX_ORDER:  # 10**4000 squeezed the list table to two columns
        problems.append(f"order must be an int between -{MAX_ORDER} and {MAX_ORDER}, got {_said(order, 40)}")
    t = info.get("timeout_s")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
        problems.append(f"timeout_s must be a positive number of seconds, got {_said(t)}")
    if not isinstance(info.get("description"), str):
        problems.append(f"description must be a string, got {type(info.get('description')).__name__}")
    requires = info.get("requires")
    if not isinstance(requires, (tuple, list)):
        problems.append(f"requires must be a tuple of strings, got {_said(requires)}")
    elif len(requires) > MAX_REQUIRES:  # counted before anything is read of its entries (round 15 B-R2)
        problems.append(f"requires has {len(requires)} entries (at most {MAX_REQUIRES}, each one of "
                        f"{', '.join(KNOWN_REQUIREMENTS)})")
    elif not all(isinstance(r, str) for r in requires):
        problems.append(f"requires must be a tuple of strings, got {_said(requires)}")
    else:
        unknown = [r for r in requires if r not in KNOWN_REQUIREMENTS]
        if unknown:
            problems.append(f"unknown requirement(s) {_said(unknown)} (known: {', '.join(KNOWN_REQUIREMENTS)})")
    options = info.get("options")
    if not isinstance(options, (tuple, list)) or any(not isinstance(o, dict) for o in options):
        problems.append("options must be a tuple of nsa_runner.Option instances")
        return problems
    if len(options) > MAX_OPTIONS:  # 20 000 options made `list NAME` print 2 MB
        problems.append(f"declares {len(options)} options (at most {MAX_OPTIONS})")
        return problems
    flags = [o.get("flag") for o in options]
    dests = [f.lstrip("-").replace("-", "_") for f in flags if isinstance(f, str)]  # Option.dest
    if any(not isinstance(f, str) or not f.startswith("--") for f in flags) or len(set(map(str, flags))) != len(flags):
        problems.append(f"option flags must start with '--' and be unique, got {_said(flags)}")
    elif any(not FLAG_RE.fullmatch(f) for f in flags):  # `--x=y` could never be given: `--x=...` splits at '='
        problems.append(f"option flags must be '--' then letters, digits, '-' or '_' (starting with a letter or "
                        f"digit), got {_said([f for f in flags if not FLAG_RE.fullmatch(f)])}")
    elif len(set(dests)) != len(dests):  # --a-b and --a_b fill one ctx.options key: one would be lost
        problems.append(f"option flags {_said(flags)} name the same ctx.options key twice ('-' and '_' are one)")
    elif any(f in RESERVED_FLAGS for f in flags):
        problems.append(f"option flags {[f for f in flags if f in RESERVED_FLAGS]} are reserved by nsa-run")
    elif any(not isinstance(o.get("help"), str) or not isinstance(o.get("choices"), (list, tuple))
             or not all(isinstance(c, str) for c in o.get("choices")) for o in options):
        problems.append("option help must be a string and choices strings")
    elif any(len(o["choices"]) > MAX_CHOICES for o in options):
        problems.append(f"option(s) {', '.join(o['flag'] for o in options if len(o['choices']) > MAX_CHOICES)} "
                        f"declare more than {MAX_CHOICES} choices")
    else:
        deep = [o["flag"] for o in options if too_deep(o.get("default"))]
        if deep:
            problems.append(f"option default(s) of {', '.join(deep)} nest lists / dicts more than {MAX_DEPTH} deep")
        bad = [o["flag"] for o in options if o["flag"] not in deep and not _json_ok(o.get("default"))]
        if bad:
            problems.append(f"option default(s) of {', '.join(bad)} must be JSON values (numbers, strings, "
                            "lists, null)")
        sizes = {o["flag"]: len(json.dumps(o.get("default"))) for o in options if o["flag"] not in bad + deep}
        if sum(sizes.values()) > DEFAULTS_CHARS:  # a 3 MB default was recorded whole in the manifest (a 250 MB
            # one blocks the --out): the stage is broken, its default is never clipped (the stage would get that)
            big = sorted(sizes, key=sizes.get, reverse=True)[:3]
            problems.append(f"option defaults are {sum(sizes.values())} characters as JSON (at most {DEFAULTS_CHARS}; "
                            f"the largest: {', '.join(f'{f} {sizes[f]}' for f in big)})")
    return problems


class OptionError(ValueError):
    """A stage option on the command line that cannot be used: ``.hint`` says what would."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.hint = hint


def parse_args(stage_name: str, options: tuple[Option, ...], args: list[str],
               before: Any = None) -> dict[str, Any]:
    """Parse ``--flag value`` / ``--flag=value`` against a stage's options; defaults filled in.
    ``before(flag)`` (when given) is called before each option's own ``parse`` runs."""
    opts = {o.flag: o for o in options}
    values: dict[str, Any] = {o.dest: o.default for o in options}
    known = ", ".join(opts) or "none"
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise OptionError(f"unexpected argument {shown(arg)} for stage {stage_name}", f"its options: {known}")
        flag, eq, text = arg.partition("=")
        if flag not in opts:
            raise OptionError(f"unknown option {flag} for stage {stage_name}", f"its options: {known}")
        if not eq:
            if i + 1 >= len(args):
                raise OptionError(f"option {flag} of stage {stage_name} needs a value")
            i += 1
            text = args[i]
        if before is not None:
            before(flag)
        try:
            values[opts[flag].dest] = opts[flag].convert(text)
        except (ValueError, TypeError) as e:
            raise OptionError(f"invalid value {shown(text)} for {flag} of stage {stage_name}: {e}") from None
        i += 1
    return values


def _json_ok(v: Any) -> bool:
    if too_deep(v):
        return False
    try:
        json.dumps(v, allow_nan=False)
        return True
    except (TypeError, ValueError, RecursionError):
        return False


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests lists / tuples / dicts more than ``limit`` deep (walked without
    recursion). Round 14 R4: a default nested 900 deep passed as JSON, then pickling the stage's
    context in the runner raised RecursionError: the run was left unfinished."""
    stack = [(value, 0)]
    seen = 0
    while stack:
        x, depth = stack.pop()
        if isinstance(x, (list, tuple, dict)):
            if depth >= limit:
                return True
            items = list(x.values()) if isinstance(x, dict) else list(x)
            seen += len(items)
            if seen > 1_000_000:  # (a value this large is refused by its size anyway)
                return True
            stack.extend((y, depth + 1) for y in items)
    return False


def describe_stage(obj: Any, ep: md.EntryPoint, args: list[str] | None = None) -> dict:
    """(In the discovery child) a loaded entry point -> ``{"stage": {...}}`` or ``{"error": ...}``;
    with ``args``, also the parsed option values (``"parsed"``) or ``"option_error"``."""
    try:
        stage = obj() if isinstance(obj, type) else obj
    except Exception as e:  # noqa: BLE001
        return {"error": f"{ep.value}: constructing the stage raised {type(e).__name__}: {e}",
                "traceback": traceback.format_exc()}
    if not isinstance(stage, Stage):
        return {"error": f"{ep.value} is a {type(stage).__name__}, not an nsa_runner.Stage subclass"}
    try:  # every attribute read once: what is checked is what the runner gets
        info = {k: getattr(stage, k) for k in STAGE_ATTRS}
        info["preload"] = getattr(stage, "preload", True) is True  # anything but True: no spare
        info["preload_flash"] = getattr(stage, "preload_flash", False) is True
        options = info["options"]
        if isinstance(options, (tuple, list)) and all(isinstance(o, Option) for o in options):
            options = tuple(options)
            info["options"] = [{"flag": o.flag, "default": o.default, "help": str(o.help or ""),
                                "choices": [str(c) for c in o.choices]} for o in options]
        else:
            info["options"] = None  # _problems names it
        problems = _problems(info, ep.name)
    except Exception as e:  # noqa: BLE001 - a hostile attribute (e.g. a property that raises)
        problems = [f"attributes cannot be read: {type(e).__name__}: {e}"]
    if problems:
        return {"error": f"{ep.value}: stage " + "; ".join(problems)}
    info["requires"], info["timeout_s"] = list(info["requires"]), float(info["timeout_s"])
    # its display texts sent clipped (the runner clips them again): a plugin's megabytes never travel
    info["description"] = clip(info["description"], DESCRIPTION_CHARS)
    info["options"] = [dict(o, help=clip(o["help"], HELP_CHARS), choices=[clip(c, CHOICE_CHARS) for c in o["choices"]])
                       for o in info["options"]]
    out: dict[str, Any] = {"stage": info}
    if args is not None:
        parsing: list[str] = []

        def before(flag: str) -> None:  # the parent names this option's parse if it hangs or ends the process
            parsing[:] = [flag]
            note({"parsing": {"stage": info["name"], "option": flag}})

        try:
            values = parse_args(info["name"], options, list(args), before)
        except OptionError as e:
            out["option_error"], out["option_hint"] = str(e), e.hint
        except BaseException as e:  # noqa: BLE001 - the option's parse is the plugin's code (round 17 U-7: its
            # own KeyboardInterrupt ended this child and was reported as the import "killed ... (SIGINT)"); this
            # child is in a session of its own: a Ctrl-C at the terminal reaches the CLI, which stops it
            if not parsing:
                raise
            out["option_error"] = f"stage {info['name']}: option {parsing[0]}: its parse raised {_why(e)}"
            out["option_hint"] = f"the option's parse is the plugin's code ({ep.value}): fix or reinstall the plugin"
        else:
            bad = [k for k, v in values.items() if not _json_ok(v)]
            if bad:
                out["option_error"] = (f"stage {info['name']}: option value(s) for {', '.join(bad)} are not JSON "
                                       f"values nested at most {MAX_DEPTH} deep (the plugin's parse returned them)")
                out["option_hint"] = ""
            else:
                out["parsed"] = values
    return out


DESCRIBE_STAGE = "nsa_runner.registry:describe_stage"


DISCOVERY_TIMEOUT_ENV = "NSA_RUN_DISCOVERY_TIMEOUT"


def discovery_timeout() -> float:
    """Seconds one entry point's import may take (``NSA_RUN_DISCOVERY_TIMEOUT``, default 60). Raises
    ValueError naming the variable and (the start of) its value when it is set but not a positive,
    finite number: the CLI refuses it with one line, exit 2 (it used to fall back to 60 s silently)."""
    return env_seconds(DISCOVERY_TIMEOUT_ENV, DISCOVERY_TIMEOUT_S)


def _timeout() -> float:
    """The discovery limit where nothing can report a bad value (a stage's child loading an
    implementation): the CLI has refused a bad one already (``resolve_machine``); the default here."""
    try:
        return discovery_timeout()
    except ValueError:
        return DISCOVERY_TIMEOUT_S


DISCOVERY_TIMEOUT_S = 60.0  # one entry point's import (a plugin may import torch on a loaded machine)
STARTUP_S = 120.0  # the child's own start-up, before it imports any plugin
# a new child per plugin whose import ends or hangs the child, MAX_CHILDREN times; then (round 15 B-R5: the
# entry points not reached yet vanished: a working stage was an "unknown stage") children that import each
# of the rest in a fork of its own (one that ends or hangs is named, the others still found), MAX_CHILDREN
# of them; then one that imports nothing and lists what is left as broken, saying why
MAX_CHILDREN = 32
ISOLATE_GRACE_S = 30.0  # an isolating child names a hang itself after the limit: it gets this much longer


TEMP_FULL_HINT = ("free some space (and files: inodes) in that folder, or set TMPDIR to another folder with room, "
                  "then rerun")


def _temp_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


class TempFolderFull(OSError):
    """The system temp folder (``TMPDIR``) has no space, inodes or quota left for what nsa-run needs
    there (round 13 A-B3: it was reported as an unexpected OSError or as a broken plugin). ``str()``
    is one line naming the folder; ``TEMP_FULL_HINT`` says what to do."""

    def __init__(self, folder: str, e: OSError | None, what: str):
        code = e.errno if isinstance(e, OSError) and e.errno else errno.ENOSPC
        self.folder, self.what, self.why = folder, what, _full_why(folder, code)
        # the whole line as strerror too: code that shows ``e.strerror`` (a run's "incomplete: ...") names the folder
        super().__init__(code, f"the temp folder {folder} is full ({self.why}): {what}")

    def __str__(self) -> str:
        return self.strerror


def _full_why(folder: str, code: int) -> str:
    if code == errno.EDQUOT:
        return "disk quota exceeded"
    try:
        st = os.statvfs(folder)
    except OSError:
        return "no space left"
    if st.f_files and st.f_ffree == 0:
        return "no inodes left: too many files"
    return "no space left" if st.f_bfree == 0 or st.f_bavail == 0 else "no space or inodes left"


def _folder_full(folder: str) -> bool:
    """Whether ``folder`` cannot take one more file and a page of data (checked by writing one)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".nsa-run-probe-", dir=folder)
    except OSError as e:
        return _temp_full(e)
    try:
        os.write(fd, b"\0" * 8192)
        return False
    except OSError as e:
        return _temp_full(e)
    finally:
        os.close(fd)
        try:
            os.unlink(probe)
        except OSError:
            pass


def temp_full_exit(e: TempFolderFull) -> NoReturn:
    """(The CLI, before a run starts) raised to ``cli.main``, which says ``error: the temp folder ...
    is full (...)`` and the hint, exit 2 (no import of the terminal code here: registry sits below it)."""
    raise e


def temp_folder() -> str:
    """The system temp folder, as nsa-run uses it (``TMPDIR``, else /tmp ...)."""
    return tempfile.gettempdir()


def _describe_end(proc: subprocess.Popen, timed_out: bool, limit: float, ended: int | None = None,
                  what: str = "", flooded: bool = False) -> str:
    """How the discovery child ended while importing an entry point (or, ``what``, while running that: "the
    parse of option --x"); ``flooded``: stopped at ``_python.OUTPUT_CAP``."""
    if flooded:
        return _python.flooded(what or "its import")
    if timed_out:
        return f"{what or 'its import'} did not finish within {limit:g}s (hangs?); stopped"
    rc = ended if ended is not None else proc.returncode
    if rc is not None and rc < 0:
        from nsa_runner._worker import signal_name

        return f"{what or 'importing it'} killed the discovery process ({signal_name(rc)})"
    return f"{what or 'importing it'} ended the discovery process (exit code {rc}, e.g. os._exit or sys.exit in C)"


def _end_words(rc: int | None) -> str:
    """How the discovery child ended, as "the discovery process ..." goes on: "ended (exit code 1)", "was killed
    (SIGKILL)"."""
    if rc is not None and rc < 0:
        from nsa_runner._worker import signal_name

        return f"was killed ({signal_name(rc)})"
    return f"ended (exit code {rc})"


def _blame_threads(records: dict[str, dict], leavers: dict[str, dict], end: str, later: str | None) -> int:
    """Name as broken the entry points (``records``, described already) whose imports left threads running when
    the discovery child ended (``end``, ``_end_words``) during the later import of ``later`` (None: between
    imports), that import being fine in a process of its own (round 21 B21-3: a watchdog thread a plugin's import
    left, ``threading.Timer(2, os._exit, [1])``, ended the child in the next plugin's import, and that healthy
    plugin was blamed). Those that left Python threads when any did (a thread started from C, e.g. torch's, is
    weaker evidence), each with its evidence. Returns how many were named."""
    def count(info: dict, key: str) -> int:
        n = info.get(key)
        return n if type(n) is int and n > 0 else 0

    python = {k: v for k, v in leavers.items() if count(v, "python_n")}
    blamed = python or leavers
    where = (f"during a later import ({clip(later, 200)}, which imports fine in a process of its own)"
             if later is not None else "after its import, between two imports")
    for k, info in blamed.items():
        old = records[k]
        names = [re.sub(r"[^ -~]", "?", clip(str(x), 40)) for x in info.get("python") or [] if isinstance(x, str)]
        said = (f" (Python: {', '.join(names[:5])})" if names else
                "" if count(info, "python_n") else " (started from C: no Python thread)")
        others = [str(records[o].get("value", "?")) for o in blamed if o != k]
        also = f"; so did {', '.join(clip(o, 200) for o in others[:5])}" if others else ""
        why = (f"{old.get('value', '?')}: its import left {count(info, 'n') or 1} thread(s) running{said}; the "
               f"discovery process {end} while they ran, {where}{also}")
        if old.get("error"):
            why += f"; and {old['error']}"
        records[k] = {f: old.get(f, "?") for f in ("key", "name", "value", "dist", "version")} | {
            "dist_path": str(old.get("dist_path") or ""), "error": why, "traceback": str(old.get("traceback") or "")}
    return len(blamed)


DISCOVERY_FAILED = "\t".join(("?", "invalid:discovery", "nsa_runner._discover"))  # the record of a failed pass


def builtin_entries(group: str) -> dict[str, str]:
    """nsa-run's own entry points of ``group``: {entry key: real path of its metadata folder}, read
    from the running nsa-run's metadata folders (``own_dist_paths``), each naming one of its own
    module files (``own_module_file``). Nothing is imported."""
    out: dict[str, str] = {}
    for path in sorted(own_dist_paths()):
        try:
            dist = SafeDistribution(Path(path))
            name = dist.metadata["Name"] or "?"
            for ep in dist.entry_points:
                if ep.group == group and own_module_file(ep.value):
                    out[entry_key(name, ep)] = path
        except Exception:  # noqa: BLE001 - unreadable: then nothing is built-in (as own_dist_paths says)
            continue
    return out


def discover_group(group: str, describe: str, *, only: str | None = None,
                   parse: dict | None = None) -> list[dict]:
    """Every entry point of ``group`` described (``_discover_pass``): nsa-run's own first, in a child
    process of their own that imports no plugin, then the plugins' in another (round 14 R6: described
    after the plugins' imports in one child, a plugin that set ``Sanity.requires = ("cuda",)`` switched
    sanity off, one that wrapped json.dumps made it vanish). A record of the plugins' pass never stands
    for a built-in: one with a built-in's key is dropped, one claiming nsa-run's metadata folder loses it.
    The CLI's stdout is out of its children's reach meanwhile (``_discover.stdout_parked``, round 16 A9)."""
    with stdout_parked():
        if only is not None:  # one entry point: no other is imported
            return _discover_pass(group, describe, only=only, parse=parse)
        own = builtin_entries(group)
        if not own:
            return _discover_pass(group, describe, parse=parse)
        first = _discover_pass(group, describe, parse=parse, keys=sorted(own), paths=sorted(set(own.values())))
        rest = [r for r in _discover_pass(group, describe, parse=parse, skip=set(own)) if r.get("key") not in own]
    for r in rest:
        claims = is_builtin_dist(str(r.get("dist", "?")), str(r.get("dist_path") or ""), str(r.get("value", "")))
        if claims and r.get("key") != DISCOVERY_FAILED:
            r["dist_path"] = ""  # (a plugin's forged record: its own entry point, never nsa-run's)
    return first + rest


def _discover_pass(group: str, describe: str, *, only: str | None = None, parse: dict | None = None,
                   keys: list[str] | None = None, paths: list[str] | None = None,
                   skip: set[str] | None = None, isolate: bool = False) -> list[dict]:
    """Import every entry point of ``group`` in a child process; one record per entry point:
    ``{"key", "name", "value", "dist", "version"}`` plus what ``describe`` ("module:function",
    called in the child as ``describe(obj, ep, args)``) returned, or ``"error"`` (and
    ``"traceback"``). A child that dies or hangs (``NSA_RUN_DISCOVERY_TIMEOUT`` seconds per entry
    point, default 60) marks the entry point it was importing as broken; a new child goes on
    with the rest. One child serves every entry point in the normal case.

    Round 23 B23-1: an import that fails after another plugin's import ran in the same process is imported again
    in a fresh process before it is blamed (what an earlier import changed in the process, e.g. ``time.time``
    rebound to a raising function, is not the later plugin's fault; putting back one kind of state after another
    never ends): once the pass is through, one child imports each such entry point in a fork of its own
    (``isolate``: each imported first in a process of its own), whose record stands. Only failures cost a process
    more. (An import that ENDS the child is the one blamed, as before, unless threads earlier imports left ran.)
    """
    records: dict[str, dict] = {}
    order: list[str] = []
    skip = set(skip or ())
    limit = _timeout()
    failed = 0  # entry points whose import ended or hung a child of this pass
    # round 21 B21-3: an entry point during whose import the child ended while threads earlier imports of that
    # child left were running -> {"leavers": {key: their "threads" line}, "end": how it ended}: imported again,
    # first, in the next child; blamed only if it ends that one too, else the leavers are (``_blame_threads``)
    suspects: dict[str, dict] = {}
    again: list[str] = []  # failed (an exception) after another import of their child: imported again alone
    for attempt in range(2 * MAX_CHILDREN + 1):
        mode = ("normal" if attempt < MAX_CHILDREN and not isolate else "isolate" if attempt < 2 * MAX_CHILDREN
                else "list")
        threaded: dict[str, dict] = {}  # this child's imports that left threads running (``_discover.threads_left``)
        base = temp_folder()
        from nsa_runner.artifacts import TempFolder, mark_owned

        try:  # opened once, used through its descriptor (round 14 A BR-3d: a plugin's import swapped it for a
            # link: the child wrote its result outside through it, and `list` ended "Cannot call rmtree on a
            # symbolic link")
            holder = TempFolder(prefix=f"nsa-run-discover-{os.getpid()}-", what="plugin discovery")
        except OSError as e:
            if _temp_full(e):
                raise TempFolderFull(base, e, "nsa-run cannot make its plugin discovery folder there") from None
            raise
        res_fd = None
        try:
            tmp, dir_fd = holder.path, holder.fd
            result = holder.name("result.jsonl")  # the child's name for it: through this process's descriptor
            try:  # every file of the pass made here: the child only appends (it needs no inode of its own)
                mark_owned(tmp)
                holder.write("result.jsonl", b"")
                holder.write("child.log", b"")
                # read through this descriptor, never the name again (round 16 A6: a plugin's import put a
                # symlink at the name; the child's lines went on in this file, unseen, and the pass was
                # blamed on nsa-run instead of that plugin)
                res_fd = _open_in(dir_fd, "result.jsonl")
            except OSError as e:
                if _temp_full(e):
                    raise TempFolderFull(base, e, "nsa-run cannot make its plugin discovery files there") from None
                raise
            nonce = uuid.uuid4().hex  # the child's "done" carries it: a plugin's stray lines cannot end the pass
            req = {"group": group, "describe": describe, "sys_path": list(sys.path), "skip": sorted(skip),
                   "only": only, "parse": parse, "nonce": nonce, "keys": keys, "paths": paths,
                   "folder": [tmp, holder._stat.st_dev, holder._stat.st_ino], "mode": mode, "limit": limit,
                   "max_hangs": MAX_CHILDREN,
                   "not_tried": f"not imported: {failed} plugin imports before it ended or hung the discovery "
                                f"process (nsa-run tries no more in one discovery: they are listed as broken); fix "
                                "or uninstall them, then rerun"}
            from nsa_runner._worker import COOKIE_ENV, PARENT_ENV, Watchdog, hold_pid

            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [_pkg_parent(), env.get("PYTHONPATH", "")]))
            # as for a stage: a cookie in the environment finds what a plugin started (setsid included),
            # the child dies with this process (PR_SET_PDEATHSIG) and a watchdog cleans up after kill -9
            cookie = uuid.uuid4().hex
            env[COOKIE_ENV], env[PARENT_ENV] = cookie, str(os.getpid())
            logfd = os.open("child.log", os.O_WRONLY | os.O_APPEND | _NOFOLLOW, dir_fd=dir_fd)
            out_fd = os.dup(logfd)  # its size is watched: a plugin printing without end at import (round 24 U24-5)
            with open(logfd, "ab") as logf:
                proc = hold_pid(subprocess.Popen(_python.python_m("nsa_runner._discover", result),
                                                 stdin=subprocess.PIPE, stdout=logf, stderr=subprocess.STDOUT,
                                                 env=env, start_new_session=True))
            guard = Watchdog(cookie, proc.pid, tmp, env)
            try:
                proc.stdin.write(json.dumps(req).encode())
                proc.stdin.close()
            except OSError:
                pass
            loading, done, timed_out, talked, ended, flooded = None, False, False, False, None, False
            loading_path, parsing = "", None  # parsing: (stage, option) whose parse runs (``describe_stage``)
            pos, last = 0, time.monotonic()
            try:
                while True:
                    exited = proc.poll() is not None
                    pos, lines = _read_new(res_fd, pos)
                    for line in lines:
                        last, talked = time.monotonic(), True
                        if isinstance(line.get("loading"), str):
                            loading, loading_path = line["loading"], str(line.get("dist_path") or "")
                            parsing = None
                        elif isinstance(line.get("parsing"), dict) and loading is not None:
                            what = line["parsing"]
                            parsing = tuple(re.sub(r"[^A-Za-z0-9._-]", "_", clip(str(what.get(k, "?")), 60))
                                            for k in ("stage", "option"))  # (a plain word, as the child checked)
                        elif isinstance(line.get("threads"), dict) and isinstance(line["threads"].get("key"), str):
                            threaded[line["threads"]["key"]] = line["threads"]
                        elif isinstance(line.get("entry"), dict) and isinstance(line["entry"].get("key"), str):
                            rec = line["entry"]
                            own_end = rec.pop("ended", None) is True  # (an isolating child: this import ended its fork)
                            if rec.pop("retry", None) is True and mode == "normal" and only is None \
                                    and rec["key"] not in again:
                                again.append(rec["key"])
                            records[rec["key"]] = rec
                            order.append(rec["key"])
                            skip.add(rec["key"])
                            loading, parsing = None, None
                            held = suspects.pop(rec["key"], None)
                            if held is not None and mode != "list" and not own_end:  # it imports fine alone
                                failed += _blame_threads(records, held["leavers"], held["end"], str(rec.get("value")))
                        elif line.get("done") == nonce:
                            done = True
                        elif line.get("nonce") == nonce and type(line.get("ended")) is int:
                            ended = line["ended"]  # the importing child ended; its parent keeps its orphans
                    if done or exited or ended is not None:
                        break
                    if os.fstat(out_fd).st_size > _python.OUTPUT_CAP:  # would fill TMPDIR until the limit: stopped now
                        timed_out = flooded = True
                        break
                    # the child's own start-up (python, nsa_runner) may take long on a loaded machine
                    waited = time.monotonic() - last
                    wait = limit + ISOLATE_GRACE_S if mode == "isolate" else limit  # (it names hangs itself)
                    if waited > (wait if talked else max(wait, STARTUP_S)):
                        timed_out = True
                        break
                    time.sleep(0.02)
            finally:
                _stop(proc, cookie)
                guard.done()
                os.close(out_fd)
            swapped = holder.problem()
            if swapped is not None and not any(tmp in str(records.get(k, {}).get("error") or "") for k in order):
                # the child names the entry point whose import did it; where it could not: said here
                key = loading if (loading is not None and not done) else DISCOVERY_FAILED
                records[key] = {"key": key, "name": "invalid:discovery", "value": "nsa_runner._discover",
                                "dist": "nsa-run", "version": "?", "traceback": "",
                                "dist_path": next(iter(sorted(own_dist_paths())), ""), "error": swapped}
                if key == loading:
                    dist, ep_name, value = (loading.split("\t") + ["?", "?", "?"])[:3]
                    records[key].update(name=ep_name, value=value, dist=dist, dist_path=loading_path,
                                        error=f"{value}: {swapped}")
                    skip.add(loading)
                order.append(key)
                if key == DISCOVERY_FAILED or only is not None:
                    break
                continue
            if done:
                break
            rc = ended if ended is not None else proc.returncode
            if rc == EXIT_TEMP_FULL and not timed_out and _folder_full(holder.base):  # the child could not write its
                raise TempFolderFull(base, None, "the plugin discovery process cannot write its result there")
            leavers = {k: v for k, v in threaded.items() if k != loading and k in records}
            if mode == "normal" and not timed_out and leavers and (loading is None or loading not in suspects):
                # it ended while threads earlier imports left were running (round 21 B21-3): no import to blame on
                # that evidence alone
                end = _end_words(rc)
                if loading is None:  # between imports: theirs
                    failed += _blame_threads(records, leavers, end, None)
                else:  # imported again, first thing in the next child (no extra child in the normal case)
                    suspects[loading] = {"leavers": leavers, "end": end}
                continue
            if loading is None:  # died outside any plugin's import: nothing to blame, nothing to retry
                tail = _tail(dir_fd, "child.log")
                key = DISCOVERY_FAILED
                records[key] = {"key": key, "name": "invalid:discovery", "value": "nsa_runner._discover",
                                "dist": "nsa-run", "version": "?", "traceback": tail,
                                "dist_path": next(iter(sorted(own_dist_paths())), ""),
                                "error": "the discovery process failed: "
                                         + _describe_end(proc, timed_out, limit, ended,
                                                         flooded=flooded).replace("importing it ", "")}
                order.append(key)
                break
            dist, ep_name, value = (loading.split("\t") + ["?", "?", "?"])[:3]
            records[loading] = {"key": loading, "name": ep_name, "value": value, "dist": dist, "version": "?",
                                "dist_path": loading_path,
                                "error": f"{value}: {_describe_end(proc, timed_out, limit, ended, flooded=flooded)}",
                                "traceback": _tail(dir_fd, "child.log")}
            if parsing is not None:  # imported and described: an option's parse hung or ended it (round 17 U-7)
                stage_name, flag = parsing
                said = _describe_end(proc, timed_out, limit, ended, what="its parse", flooded=flooded)
                records[loading]["error"] = f"{value}: stage {stage_name}: option {flag}: {said}"
                records[loading]["option_error"] = f"stage {stage_name}: option {flag}: {said}"
                records[loading]["option_hint"] = (f"the option's parse is the plugin's code ({value}): fix or "
                                                   "reinstall the plugin")
            order.append(loading)
            skip.add(loading)
            suspects.pop(loading, None)  # (ended a process of its own too: its own)
            failed += 1
            if only is not None or mode == "list":
                break
        finally:
            if res_fd is not None:
                os.close(res_fd)
            holder.close()  # never through a link, never raising (a swapped folder: said above)
    again = [k for k in again if k in records and records[k].get("error")]
    if again:  # their failure came after another import in their process: theirs only if it repeats alone
        for rec in _discover_pass(group, describe, parse=parse, keys=again, isolate=True):
            if rec.get("key") in again:
                records[rec["key"]] = rec
    return [records[k] for k in dict.fromkeys(order)]


def _pkg_parent() -> str:
    import nsa_runner

    return os.path.dirname(os.path.dirname(os.path.abspath(nsa_runner.__file__)))


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _open_in(dir_fd: int, name: str) -> int:
    """``name`` in the folder open as ``dir_fd``, for reading: a regular file only (never through a
    symlink, never a FIFO's wait). Raises OSError."""
    import stat

    fd = os.open(name, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0), dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileNotFoundError(name)
    return fd


def _read_new(fd: int, pos: int) -> tuple[int, list[dict]]:
    """Complete JSON lines appended to the file open as ``fd`` since byte ``pos``."""
    chunks, at = [], pos
    try:
        while chunk := os.pread(fd, 1 << 20, at):
            chunks.append(chunk)
            at += len(chunk)
    except OSError:
        return pos, []
    data = b"".join(chunks)
    end = data.rfind(b"\n") + 1
    out = []
    for raw in data[:end].splitlines():
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):  # (a line a plugin wrote, nested thousands deep)
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return pos + end, out


def _tail(dir_fd: int, name: str, n: int = 4000) -> str:
    try:
        with open(_open_in(dir_fd, name), "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - n))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _stop(proc: subprocess.Popen, cookie: str) -> None:
    """The discovery child and anything its plugins started: gone, as a tree (its process group,
    its descendants, every process carrying its cookie: ``setsid`` grandchildren included)."""
    from nsa_runner._worker import kill_processes

    kill_processes(cookie, proc, grace_s=0.0)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def invalid_name(text: str) -> str:
    """The name a broken entry whose entry-point name is not a plain word is listed and recorded
    under: ``invalid:`` and the name made plain, clipped (round 14 R1: a 500 000-character entry
    point name was recorded and listed whole)."""
    return "invalid:" + re.sub(r"[^A-Za-z0-9._-]", "_", clip(text, 40))


def _entry_of(rec: dict) -> StageEntry:
    """A discovery record as a StageEntry; a record that does not describe a usable stage (the child
    ran plugin code: its records are checked again here) is a broken entry, never a crash."""
    ep_name = str(rec.get("name") or "?")
    shown = ep_name if NAME_RE.fullmatch(ep_name) else invalid_name(ep_name)
    value = str(rec.get("value", "?"))
    # the plugin's metadata texts clipped before anything records them (round 14 R1)
    entry = StageEntry(shown, clip(value, META_CHARS), clip(str(rec.get("dist", "?")), META_CHARS),
                       clip(str(rec.get("version", "?")), META_CHARS), dist_path=str(rec.get("dist_path") or ""))
    info = rec.get("stage")
    if not rec.get("error") and isinstance(info, dict) and len(value) > META_CHARS:
        # the runner imports a usable stage by its value: never a clipped one
        rec = dict(rec, error=f"{entry.value}: the entry point's value is {len(value)} characters "
                              f"(at most {META_CHARS})")
    if rec.get("error") or not isinstance(info, dict):
        # one line, clipped (round 12 B4: a 100 000-line import error was printed whole by `list` (15 MB) and
        # in the run table of `stage`); the traceback keeps the rest
        entry.error = clip(" ".join(str(rec.get("error") or "the discovery process described it wrongly").split()),
                           ERROR_CHARS)
        entry.traceback = str(rec.get("traceback") or "")
        return entry
    problems = _problems(info, ep_name)
    if problems:
        entry.error = clip(" ".join((f"{entry.value}: stage " + "; ".join(problems)).split()), ERROR_CHARS)
        return entry
    entry.stage = StageInfo(
        name=info["name"], order=info["order"], requires=tuple(info["requires"]),
        description=clip(info["description"], DESCRIPTION_CHARS),
        options=tuple(OptionInfo(o["flag"], o["default"], clip(o["help"], HELP_CHARS),
                                 tuple(clip(c, CHOICE_CHARS) for c in o["choices"])) for o in info["options"]),
        timeout_s=float(info["timeout_s"]), key=rec["key"], preload=info.get("preload", True) is True,
        preload_flash=info.get("preload_flash", False) is True)
    return entry


def discover() -> list[StageEntry]:
    """Every stage of the entry-point group, sorted by (order, name); broken ones first.

    Imported in a child process (``discover_group``). Two plugin entries with the same name become
    ONE broken entry ("duplicate", naming both): which one would run must never depend on install
    order, and one name is one record in the table, --json, the manifest, summary and junit. A
    plugin that takes a built-in stage's name is broken and the built-in stays (a plugin never
    switches off one of nsa-run's own stages).
    """
    try:
        entries = [_entry_of(r) for r in discover_group(GROUP, DESCRIBE_STAGE)]
    except TempFolderFull as e:  # nothing to blame on a plugin: one line, exit 2 (round 13 A-B3)
        temp_full_exit(e)
    by_name: dict[str, list[StageEntry]] = {}
    for e in entries:
        by_name.setdefault(e.name, []).append(e)
    for name, group in by_name.items():
        if len(group) > 1:
            builtin = [e for e in group if e.builtin]
            if len(builtin) == 1:
                for e in group:
                    if e is not builtin[0]:
                        e.error = (f"stage name {name!r} is taken by the built-in stage ({builtin[0].value}); "
                                   f"{e.value} ({e.source}) is left out: rename it")
                        e.stage = None
                        # its own name in lists and manifests: the built-in's record stays the built-in's
                        e.name = invalid_name(f"{e.dist}.{name}")
                continue
            where = ", ".join(f"{e.value} ({e.source})" for e in group)
            # ONE entry for the name (round 12 B1): two entries of one name gave the table and --json
            # two ERROR rows ("2 failed") while the manifest, summary and junit (keyed by name) had one
            keep = group[0]
            keep.error = f"duplicate stage name {name!r}: declared by {where}"
            keep.stage = None
            keep.traceback = ""
            dropped = {id(e) for e in group[1:]}
            entries = [e for e in entries if id(e) not in dropped]
    # whatever else shares a name (broken entries renamed alike): one record per name, every source named
    entries = _one_per_name(entries)
    return sorted(entries, key=lambda e: (e.stage is not None, e.order or 0, e.name))


def _one_per_name(entries: list[StageEntry]) -> list[StageEntry]:
    """``entries`` with at most one entry per name: a later entry of a name already taken is folded into
    the first (which becomes broken, naming both) — the manifest, summary and junit key stages by name."""
    first: dict[str, StageEntry] = {}
    out: list[StageEntry] = []
    for e in entries:
        kept = first.get(e.name)
        if kept is None:
            first[e.name] = e
            out.append(e)
            continue
        if kept.stage is not None or not kept.error.startswith("duplicate stage name"):
            why = kept.error or "a usable stage"
            kept.error = (f"duplicate stage name {kept.name!r}: declared by {kept.value} ({kept.source}: {why}), "
                          f"{e.value} ({e.source}: {e.error or 'a usable stage'})")
        else:
            kept.error += f", {e.value} ({e.source})"
        kept.stage = None
    return out


def parse_options(entry: StageEntry, args: list[str]) -> dict[str, Any]:
    """The values of ``entry``'s options for command-line ``args``, parsed by the stage's own
    ``Option.parse`` in a child process (defaults filled in). Raises OptionError."""
    info = entry.stage
    if not args:
        return {o.dest: o.default for o in entry.options}
    key = getattr(info, "key", "")
    if not key:  # a Stage built in-process (embedded use)
        return parse_args(entry.name, tuple(entry.options), list(args))
    try:
        recs = discover_group(GROUP, DESCRIBE_STAGE, only=key, parse={"key": key, "args": list(args)})
    except TempFolderFull as e:  # said as it is (exit 2 through OptionError), not as the stage's options
        raise OptionError(str(e), TEMP_FULL_HINT) from None
    rec = recs[0] if recs else {"error": "the stage was not found again"}
    if isinstance(rec.get("parsed"), dict) and set(rec["parsed"]) == {o.dest for o in entry.options}:
        deep = [k for k, v in rec["parsed"].items() if too_deep(v)]  # checked again: the child ran plugin code
        if deep:
            raise OptionError(f"stage {entry.name}: option value(s) for {', '.join(deep)} nest lists / dicts more "
                              f"than {MAX_DEPTH} deep (the plugin's parse returned them)")
        return rec["parsed"]
    if "option_error" in rec:
        raise OptionError(rec["option_error"], rec.get("option_hint") or "")
    raise OptionError(f"stage {entry.name}: its options could not be parsed: {rec.get('error', '?')}")


# ---------------------------------------------------------------------------------------------
# requirements


@dataclass(frozen=True)
class Machine:
    """What this machine offers, as far as stage requirements are concerned."""

    cuda: bool
    triton: bool
    device: str  # the device the run uses: "cuda" or "cpu"


# files importlib.metadata reads whole of EVERY installed distribution in every process of nsa-run (the CLI,
# the discovery children, every stage): ``import torch`` reads each one's entry_points.txt (torch's device-
# backend hook), and a folder whose name gives no distribution name has its METADATA / PKG-INFO read there
# too. nsa-run's own reads of the others go through ``nsa_core._distfiles`` (never blocking, bounded):
# a package that is no plugin never matters, one that may declare stages is listed as broken (round 17 U-6)
METADATA_FILES = ("entry_points.txt", "METADATA", "PKG-INFO")
MAX_METADATA_BYTES = 64 << 20


def installed_metadata_problem() -> str:
    """One line naming an installed distribution's metadata file that ``import torch`` would hang on (a
    FIFO), never end on (``/dev/zero``), exhaust memory with, or fail on (an entry_points.txt it cannot
    parse: ``entry_points_problem``); "" when there is none. (A METADATA that nsa-run alone reads is not
    refused here: discovery passes over or names that distribution, the rest runs.)"""
    return _special_metadata_file() or entry_points_problem()


def entry_points_problem() -> str:
    """One line naming the first entry_points.txt that importlib.metadata cannot parse (a line without "=",
    not UTF-8), among the distributions ``importlib.metadata.entry_points()`` parses: "" when none. Round 19
    B19-3: ``import torch`` parses every distribution's entry points (its device-backend hook), so one such
    file of any package, plugin or not, failed every stage of every run with torch's "Only a single
    TORCH_LIBRARY ..." naming nothing. The same distributions in the same order as that function (one per
    normalised name, the first on sys.path), each read through the safe reader, parsed by importlib. With
    torch's autoload off (``TORCH_DEVICE_BACKEND_AUTOLOAD`` not "1") torch reads none of these files, so
    there is nothing to say here: a plugin's unreadable file is then named by discovery, that plugin broken
    (CI on c0709ca: this check ran regardless, and exit 2 blamed torch for a file torch would not read)."""
    if not torch_backend_autoload():
        return ""
    seen: set[str] = set()
    backends = []  # (dist, entry point) of group torch.backends, in the order torch's import loads them
    for dist in distributions():
        try:
            name = dist._normalized_name  # (importlib's key: a name-less folder's METADATA is read for it)
            if name in seen:
                continue
            seen.add(name)
            eps = dist.entry_points  # parsed as importlib does, or raises as it does
        except Exception as e:  # noqa: BLE001 - what importlib raises on it, torch's import raises too
            return _entry_points_why(dist, e)
        backends += [(dist, ep) for ep in eps if ep.group == TORCH_BACKENDS_GROUP]
    if backends:  # (torch parses every file before it loads any backend)
        for dist, ep in backends:
            why = _torch_backend_why(dist, ep)
            if why:
                return why
    return ""


# torch's device-backend hook: ``import torch`` loads (imports, then calls) every entry point of this group
# unless the variable is set to anything but "1" (torch's own test: os.getenv(name, "1") == "1")
TORCH_BACKENDS_GROUP = "torch.backends"
TORCH_AUTOLOAD_ENV = "TORCH_DEVICE_BACKEND_AUTOLOAD"


def torch_backend_autoload() -> bool:
    """Whether ``import torch`` loads the ``torch.backends`` entry points here, as torch decides it."""
    return os.environ.get(TORCH_AUTOLOAD_ENV, "1") == "1"


def torch_backend_said(dist: md.Distribution, ep: md.EntryPoint) -> str:
    """A ``[torch.backends]`` entry point as every message names it: ``folder/entry_points.txt: [torch.backends]
    name = value`` (the entry shown as its repr, clipped, when not printable)."""
    folder = str(getattr(dist, "_path", "?")).rstrip("/")
    text = f"{ep.name} = {ep.value}"
    said = text if text.isprintable() and len(text) <= 200 else shown(text, 200)
    return f"{folder}/entry_points.txt: [{TORCH_BACKENDS_GROUP}] {said}"


def _torch_backend_why(dist: md.Distribution, ep: md.EntryPoint) -> str:
    """The line ``entry_points_problem`` gives for a ``torch.backends`` entry point ``ep`` of ``dist`` whose
    module ``import torch`` cannot import ("" when it can, or when that cannot be told without importing).
    Round 20 B20-6: the stale dist-info of an uninstalled device backend (``tb = missing_tb:init``) made
    torch's import raise "Failed to load the backend extension: tb" in every stage (the second import in the
    worker then "Only a single TORCH_LIBRARY ..."), naming nothing, while ``list`` showed every stage
    runnable. Nothing is imported here (this runs at every command start, and an import runs installed
    code): the top-level package is looked up with ``find_spec``, and the full dotted module only when its
    parent package is imported already (``find_spec`` of a dotted name imports its parents)."""
    head = torch_backend_said(dist, ep)
    tail = f"import torch fails with it (uninstall that distribution, or set {TORCH_AUTOLOAD_ENV}=0)"
    match = ep.pattern.match(ep.value)  # what EntryPoint.load() matches (None: it raises AttributeError)
    module = match.group("module") if match else ""
    if not module or not all(module.split(".")):
        return f"{head}: names no module (module:attribute): {tail}"
    top, _, rest = module.partition(".")
    name = module if rest and module.rpartition(".")[0] in sys.modules else top
    try:
        found = importlib.util.find_spec(name) is not None
    except Exception:  # noqa: BLE001 - a finder that cannot say: torch's import will tell
        found = True
    return "" if found else f"{head}: module {name} not found: {tail}"


def _entry_points_why(dist: md.Distribution, e: Exception) -> str:
    """The line ``entry_points_problem`` gives for distribution ``dist`` whose entry points raised ``e``."""
    folder = str(getattr(dist, "_path", "?")).rstrip("/")  # (a folder inside a zip ends with "/")
    path = f"{folder}/entry_points.txt"
    if isinstance(e, _distfiles.UnreadableDistFile):
        why = str(e)
        return f"{why}: import torch fails with it" if why.startswith(path) else \
            f"{folder}: {why}: import torch fails with it"
    if isinstance(e, UnicodeDecodeError):
        raw = getattr(dist, "raw", {})
        if raw.get("entry_points.txt") is None:  # the name-less folder's METADATA, not its entry points
            return f"{folder}: its metadata is not UTF-8 ({_why(e)}): import torch fails with it"
        return (f"{path} cannot be parsed (not UTF-8: byte 0x{e.object[e.start]:02x} at position {e.start}): "
                "import torch fails with it")
    text = getattr(dist, "raw", {}).get("entry_points.txt")
    line = _line_without_equals(text.decode("utf-8", errors="replace")) if isinstance(text, bytes) else None
    if line is not None:
        return f"{path} cannot be parsed (line {line[0]} {shown(line[1])} has no '='): import torch fails with it"
    if not isinstance(text, bytes):
        return f"{folder}: its metadata cannot be read ({' '.join(_why(e).split())[:300]}): import torch fails with it"
    return f"{path} cannot be parsed ({' '.join(_why(e).split())[:300]}): import torch fails with it"


def _line_without_equals(text: str) -> tuple[int, str] | None:
    """(number, text) of the first entry line of an entry_points.txt that has no "=" (a line of a section,
    neither blank nor a comment: what importlib.metadata's ``Pair.parse`` fails on)."""
    section = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line
        elif section is not None and "=" not in line:
            return n, line
    return None


def _special_metadata_file() -> str:
    """One line naming an installed distribution's metadata file ``import torch`` reads that is no regular
    file or is huge (``METADATA_FILES``); "" when there is none. Only ``stat`` is used here: nothing is
    opened."""
    import stat as st_

    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            named = bool(os.path.splitext(name)[0].partition("-")[0])  # (else importlib reads its METADATA for it)
            for meta in METADATA_FILES if not named else METADATA_FILES[:1]:
                path = os.path.join(entry or ".", name, meta)
                try:
                    mode = os.stat(path)
                except OSError:  # missing, a dangling link, a dist-info that is a file: read as absent
                    continue
                if not st_.S_ISREG(mode.st_mode):
                    return f"{path} is {_distfiles.file_kind(mode.st_mode)}, not a regular file"
                if mode.st_size > MAX_METADATA_BYTES:
                    return f"{path} is {mode.st_size / 2**20:.0f} MiB (more than {MAX_METADATA_BYTES >> 20} MiB)"
    return ""


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
