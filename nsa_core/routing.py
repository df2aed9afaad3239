"""Backend per NSA branch for this machine, and why (DESIGN §3; docs/routing.md).

    from nsa_core import routing
    r = routing.decide("cuda")                    # or decide("cpu"), decide(dev, overrides=...)
    r.backend("win")          -> "flash" | "sdpa" | ...      (r.backend("win", S=8192) uses the threshold)
    r.reason("win")           -> "varlen is >= 1.2x faster than sdpa from S=4096 on ... (fa2-probe run abc, ...)"
    r.to_json()               -> the dict the runner writes as routing.json

The decision uses only facts (device, GPU name / capability, torch version, whether Triton,
``nsa_core.selection.attention`` and each flash kernel can be imported) and *measured* thresholds: the
smallest sequence length at which a flash path is >= 1.2x faster than the SDPA path, written by
the ``fa2-probe`` stage into a JSON file (format in docs/routing.md, ``load_thresholds``).
Without a local measurement for this GPU + torch, the thresholds shipped in the package
(``data/shipped_thresholds.json``, measured on an H100, docs/benchmarks.md) apply on CUDA GPUs
they cover, so a fresh GPU machine already takes the fast paths at long S; a local fa2-probe
run replaces them. Where neither applies, the compressed and sliding branches stay on SDPA:
flash kernels are 5-100x slower than SDPA on small shapes on some machines, so "installed"
is not a reason to use one.

Overrides are explicit: ``decide(..., overrides={"win": "sdpa"})`` or ONE JSON file
(``{"schema_version": 1, "backends": {...}, "thresholds": "path"}``); both are recorded in
``to_json()["overrides"]``. There are no environment flags.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import importlib.util
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsa_core.config import BRANCHES

SCHEMA_VERSION = 1  # routing.json
THRESHOLDS_SCHEMA_VERSION = 1  # the thresholds file
OVERRIDES_SCHEMA_VERSION = 1  # the overrides file

BACKENDS = {
    "cmp": ("reference", "sdpa", "flash"),
    "slc": ("reference", "sdpa", "triton"),
    "win": ("reference", "sdpa", "flash"),
}
SPEEDUP_REQUIRED = 1.2  # a flash path must be this much faster than SDPA to be chosen


def default_thresholds_path() -> Path:
    """The per-user thresholds file (DESIGN §7): ``<user data dir>/routing/thresholds.json`` from
    ``platformdirs`` (Linux: ``$XDG_DATA_HOME/nsa-run/...``, default ``~/.local/share/nsa-run/...``),
    never inside the installed package. An explicit path (``decide(thresholds=...)``, fa2-probe
    ``--thresholds PATH``) replaces it."""
    from platformdirs import user_data_path

    return user_data_path("nsa-run", appauthor=False) / "routing" / "thresholds.json"


# Default thresholds file (docs/routing.md): per user, resolved once at import.
DEFAULT_THRESHOLDS = default_thresholds_path()
# Thresholds shipped in the package (measured by fa2-probe on an H100, docs/benchmarks.md): used
# when no local thresholds file has an entry for this machine (see _with_shipped).
SHIPPED_THRESHOLDS = Path(__file__).resolve().parent / "data" / "shipped_thresholds.json"


# ---------------------------------------------------------------------------------------------
# thresholds file


def _fail(path, msg: str) -> ValueError:
    return ValueError(f"thresholds file {path}: {msg}")


def validate_thresholds(data: Any, path: str | os.PathLike = "<thresholds>") -> dict:
    """Check the structure of a thresholds document (docs/routing.md); return it. ValueError if bad."""
    if not isinstance(data, dict):
        raise _fail(path, f"expected a JSON object at the top, got {type(data).__name__}")
    v = data.get("schema_version")
    if v != THRESHOLDS_SCHEMA_VERSION:
        raise _fail(path, f"schema_version {v!r} is not supported (this nsa_core reads {THRESHOLDS_SCHEMA_VERSION})")
    entries = data.get("entries")
    if not isinstance(entries, list):
        raise _fail(path, "'entries' must be a list")
    for n, e in enumerate(entries):
        where = f"entries[{n}]"
        if not isinstance(e, dict):
            raise _fail(path, f"{where} must be an object")
        for key in ("gpu", "capability", "torch", "measured", "source_run"):
            if not isinstance(e.get(key), str) or not e.get(key):
                raise _fail(path, f"{where}.{key} must be a non-empty string")
        try:
            _dt.date.fromisoformat(e["measured"][:10])
        except ValueError:
            raise _fail(path, f"{where}.measured {e['measured']!r} is not an ISO date (YYYY-MM-DD)") from None
        br = e.get("branches")
        if not isinstance(br, dict) or not br:
            raise _fail(path, f"{where}.branches must be a non-empty object {{branch: {{path: {{min_len}}}}}}")
        for b, paths in br.items():
            if b not in ("cmp", "win"):
                raise _fail(path, f"{where}.branches: unknown branch {b!r} (flash thresholds exist for 'cmp', 'win')")
            if not isinstance(paths, dict) or not paths:
                raise _fail(path, f"{where}.branches.{b} must be a non-empty object {{path: {{min_len}}}}")
            for p, rec in paths.items():
                if not isinstance(rec, dict) or "min_len" not in rec:
                    raise _fail(path, f"{where}.branches.{b}.{p} must be an object with 'min_len'")
                m = rec["min_len"]
                if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m <= 0):
                    raise _fail(path, f"{where}.branches.{b}.{p}.min_len must be a positive int or null (never), "
                                      f"got {m!r}")
                sp = rec.get("speedups")
                if sp is not None and not (isinstance(sp, dict) and all(
                        k.isdigit() and int(k) > 0 and isinstance(x, (int, float)) and not isinstance(x, bool)
                        and math.isfinite(x) for k, x in sp.items())):
                    raise _fail(path, f"{where}.branches.{b}.{p}.speedups must be an object "
                                      f"{{\"<S>\": <finite number>}}, got {str(sp)[:80]!r}")
    return data


def load_thresholds(path: str | os.PathLike) -> dict:
    """Read and validate a thresholds file. ValueError naming the file and the problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _fail(path, "no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise _fail(path, f"cannot read: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise _fail(path, f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    return validate_thresholds(data, path)


def merge_thresholds(existing: dict | None, entry: dict) -> dict:
    """Return a thresholds document with ``entry`` replacing the one for the same GPU/capability/torch."""
    doc = {"schema_version": THRESHOLDS_SCHEMA_VERSION, "entries": []}
    if existing:
        doc["entries"] = [e for e in existing["entries"] if _key(e) != _key(entry)]
    doc["entries"].append(entry)
    return validate_thresholds(doc, "<merged>")


def _key(e: dict) -> tuple:
    return e.get("gpu"), e.get("capability"), e.get("torch")


# ---------------------------------------------------------------------------------------------
# facts about this machine


def _module_state(name: str, do_import: bool = True) -> tuple[bool, str]:
    """(importable, reason). Guarded: an import error is a reason, not a crash.

    ``do_import=False`` only locates the module (on CPU, importing triton before the runner set
    TRITON_INTERPRET=1 would be a side effect; nothing there needs the import).
    """
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as e:
        return False, f"{name}: {e}"
    if spec is None:
        return False, f"{name} is not installed"
    if not do_import:
        return True, f"{name} found (not imported: device is not CUDA)"
    try:
        importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - any import failure is a fact to report
        return False, f"{name} fails to import: {type(e).__name__}: {e}"
    return True, f"{name} imports"


def machine_facts(device: str = "cpu") -> dict:
    """The facts routing decides from (JSON-able)."""
    import torch

    dev = torch.device(device)
    facts: dict[str, Any] = {"device": dev.type, "torch": torch.__version__, "cuda_runtime": torch.version.cuda}
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"routing: device {device!r} requested but torch.cuda.is_available() is False")
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        cap = torch.cuda.get_device_capability(idx)
        facts.update(gpu=torch.cuda.get_device_name(idx), capability=f"{cap[0]}.{cap[1]}")
    else:
        facts.update(gpu=None, capability=None)
    cuda = dev.type == "cuda"
    ok, why = _module_state("triton", do_import=cuda)
    facts["triton"] = {"present": ok, "reason": why}
    if ok:
        from importlib.metadata import PackageNotFoundError, version

        try:
            facts["triton"]["version"] = version("triton")
        except PackageNotFoundError:
            facts["triton"]["version"] = "?"
    ok, why = _module_state("nsa_core.selection.attention", do_import=cuda)
    facts["triton_sel"] = {"present": ok, "reason": why}
    facts["flash_paths"] = _flash_paths(dev.type)
    return facts


def _flash_paths(device_type: str) -> dict:
    """{path: {"present": bool, "reason": str}} from nsa_core.flash.adapters (cheap checks, no kernel calls)."""
    try:
        from nsa_core.flash import adapters
    except Exception as e:  # noqa: BLE001
        return {"(nsa_core.flash)": {"present": False, "reason": f"nsa_core.flash fails to import: {e}"}}
    return adapters.available_paths(device_type)


# ---------------------------------------------------------------------------------------------
# overrides


def _load_overrides(overrides) -> tuple[dict, dict]:
    """-> (backends {branch: backend}, record for routing.json). ValueError on bad input."""
    if overrides is None:
        return {}, {"source": None}
    if isinstance(overrides, (str, os.PathLike)):
        path = Path(overrides)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ValueError(f"routing overrides file {path}: no such file") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"routing overrides file {path}: cannot read: {e}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"routing overrides file {path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(data, dict) or data.get("schema_version") != OVERRIDES_SCHEMA_VERSION:
            raise ValueError(f"routing overrides file {path}: expected an object with "
                             f"schema_version {OVERRIDES_SCHEMA_VERSION}")
        src = str(path)
        extra = set(data) - {"schema_version", "backends", "thresholds"}
        if extra:
            raise ValueError(f"routing overrides file {path}: unknown keys {sorted(extra)}")
        thr = data.get("thresholds")
        if thr is not None and not isinstance(thr, str):
            raise ValueError(f"routing overrides file {path}: 'thresholds' must be a path string")
        if thr is not None and not os.path.isabs(thr):
            thr = str((path.parent / thr).resolve())
        backends = data.get("backends", {})
    elif isinstance(overrides, dict):
        src = "argument"
        if "backends" in overrides or "thresholds" in overrides:
            extra = set(overrides) - {"backends", "thresholds", "schema_version"}
            if extra:
                raise ValueError(f"routing overrides: unknown keys {sorted(extra)}")
            backends, thr = overrides.get("backends", {}), overrides.get("thresholds")
        else:
            backends, thr = overrides, None
    else:
        raise ValueError(f"routing overrides must be a dict or a path, got {type(overrides).__name__}")
    if not isinstance(backends, dict):
        raise ValueError(f"routing overrides ({src}): 'backends' must be an object {{branch: backend}}")
    for b, be in backends.items():
        if b not in BACKENDS:
            raise ValueError(f"routing overrides ({src}): unknown branch {b!r}; expected one of {BRANCHES}")
        if be not in BACKENDS[b]:
            raise ValueError(f"routing overrides ({src}): backend {be!r} is not valid for branch {b!r}; "
                             f"expected one of {BACKENDS[b]}")
    return dict(backends), {"source": src, "backends": dict(backends), "thresholds": thr}


# ---------------------------------------------------------------------------------------------
# the decision


@dataclass
class Choice:
    backend: str
    reason: str
    path: str | None = None  # flash path (flash backend) or None
    min_len: int | None = None  # flash only from this S on (None: always / not applicable)
    # flash path by key length: ((from S, path), ...) ascending; the first is (min_len, path)
    ladder: tuple[tuple[int, str], ...] = ()


@dataclass
class Routing:
    """The backend per branch, why, and the facts it came from."""

    choices: dict[str, Choice]
    facts: dict
    thresholds: dict = field(default_factory=dict)  # {"source", "entry" or None, "note"}
    overrides: dict = field(default_factory=dict)

    def _choice(self, branch: str) -> Choice:
        if branch not in self.choices:
            raise ValueError(f"unknown branch {branch!r}; expected one of {BRANCHES}")
        return self.choices[branch]

    def backend(self, branch: str, S: int | None = None) -> str:
        """Backend for ``branch``; with the key length ``S``, flash only where it measured faster."""
        c = self._choice(branch)
        if c.backend == "flash" and c.min_len is not None and S is not None and S < c.min_len:
            return "sdpa"
        return c.backend

    def reason(self, branch: str) -> str:
        return self._choice(branch).reason

    def path(self, branch: str, S: int | None = None) -> str | None:
        """The flash path for ``branch``; with the key length ``S``, the one measured fastest there
        (the last ladder step at or below S; below the first step the branch runs sdpa anyway)."""
        c = self._choice(branch)
        if S is not None and c.ladder:
            steps = [p for s0, p in c.ladder if s0 <= S]
            if steps:
                return steps[-1]
        return c.path

    def to_json(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "branches": {b: {"backend": c.backend, "reason": c.reason, "flash_path": c.path,
                             "flash_min_len": c.min_len,
                             "flash_ladder": [list(x) for x in c.ladder]} for b, c in self.choices.items()},
            "facts": self.facts,
            "thresholds": self.thresholds,
            "overrides": self.overrides,
            "speedup_required": SPEEDUP_REQUIRED,
            "selection_scoring": _scoring_choice(self.facts),
        }


def _scoring_choice(facts: dict) -> dict:
    """Selection scoring + top-n with backend "auto" (functional.select_backend decides per call)."""
    if facts["device"] != "cuda":
        return {"backend": "reference", "reason": f"device {facts['device']}: the fused Triton scoring kernel "
                                                  "runs on CUDA only (torch block_scores + topn_blocks)"}
    if not facts["triton"]["present"]:
        return {"backend": "reference", "reason": f"{facts['triton']['reason']} (install: pip install triton)"}
    return {"backend": "triton", "reason": "CUDA + triton: fused scoring + top-n kernel (nsa_core.selection.scoring); "
                                           "the torch reference for calls it does not support (h > 64, dk > 256)"}


def _thresholds_for(facts: dict, path: str | os.PathLike | None, explicit: bool) -> dict:
    """Find this machine's entry. Explicit path: must load (ValueError otherwise). Default: optional."""
    p = Path(path) if path is not None else DEFAULT_THRESHOLDS
    rec: dict[str, Any] = {"source": str(p), "entry": None, "note": ""}
    if not explicit and not p.exists():
        rec["note"] = f"no thresholds file at the default location {p}; run `nsa-run stage fa2-probe` on a GPU"
        return rec
    doc = load_thresholds(p)  # ValueError for a bad file, explicit or default: never silently ignored
    if facts["gpu"] is None:
        rec["note"] = "no GPU: thresholds do not apply"
        return rec
    same_gpu = [e for e in doc["entries"] if e["gpu"] == facts["gpu"] and e["capability"] == facts["capability"]]
    match = [e for e in same_gpu if e["torch"] == facts["torch"]]
    if match:
        rec["entry"] = match[-1]
        rec["note"] = f"entry for {facts['gpu']} (sm {facts['capability']}), torch {facts['torch']}"
    elif same_gpu:
        rec["note"] = (f"thresholds for {facts['gpu']} exist only for torch "
                       f"{sorted({e['torch'] for e in same_gpu})}, not {facts['torch']}: re-run fa2-probe")
    else:
        rec["note"] = f"no entry for {facts['gpu']} (sm {facts['capability']}) in {p}: run fa2-probe on it"
    return rec


def _decide_slc(facts: dict) -> Choice:
    if facts["device"] != "cuda":
        return Choice("sdpa", f"device {facts['device']}: the Triton selection kernel runs on CUDA only")
    if not facts["triton"]["present"]:
        return Choice("sdpa", f"{facts['triton']['reason']} (install: pip install triton)")
    if not facts["triton_sel"]["present"]:
        return Choice("sdpa", f"Triton selection kernel unavailable: {facts['triton_sel']['reason']}")
    return Choice("triton", f"CUDA {facts['gpu']} with triton {facts['triton'].get('version', '?')}: "
                            "group-centric Triton selection kernel (paper §3.4)")


def _decide_flash(branch: str, facts: dict, thr: dict) -> Choice:
    if facts["device"] != "cuda":
        return Choice("sdpa", f"device {facts['device']}: no flash kernel off CUDA")
    paths = facts["flash_paths"]
    usable = [p for p, st in paths.items() if st.get("present") and branch in st.get("branches", ())]
    if not usable:
        why = "; ".join(f"{p}: {st.get('reason', '?')}" for p, st in paths.items())
        return Choice("sdpa", f"no flash path for {branch} on this machine ({why})")
    entry = thr.get("entry")
    if entry is None:
        return Choice("sdpa", f"flash paths {usable} present but not measured here ({thr.get('note')}); "
                              "SDPA until fa2-probe shows flash is faster")
    src = f"fa2-probe run {entry['source_run']}, {entry['measured'][:10]}"
    if entry.get("shipped"):
        src = (f"shipped defaults (measured on {entry['gpu']}, torch {entry['torch']}, {src}); "
               f"{thr.get('shipped_match', '')}; run fa2-probe here to refine")
    measured = {p: entry["branches"].get(branch, {}).get(p) for p in usable}
    measured = {p: r for p, r in measured.items() if r is not None}
    if not measured:
        return Choice("sdpa", f"thresholds entry has no {branch} measurement for {usable} ({src})")
    wins = {p: r for p, r in measured.items() if r["min_len"] is not None}
    if not wins:
        never = ", ".join(f"{p} (up to S={r.get('max_measured', '?')})" for p, r in measured.items())
        return Choice("sdpa", f"flash never >= {SPEEDUP_REQUIRED}x faster than sdpa in the measured range: "
                              f"{never} ({src})")
    ladder = flash_ladder(wins)
    (S0, best), later = ladder[0], ladder[1:]
    then = "".join(f", {p} from S={s0}" for s0, p in later)
    how = " (the fastest at the longest measured S, from where it pays off; the fastest below)" if later else ""
    return Choice("flash", f"{best} >= {SPEEDUP_REQUIRED}x faster than sdpa from S={S0}{then}{how} on "
                           f"{facts['gpu']} ({src}); sdpa below", path=best, min_len=S0, ladder=tuple(ladder))


def flash_ladder(wins: dict) -> list[tuple[int, str]]:
    """[(from S, path)] over the paths that stay >= SPEEDUP_REQUIRED x faster than sdpa from their
    ``min_len`` on. Built from the longest measured S down: the path with the largest speedup
    there runs for as long as it pays off (down to its ``min_len``); below that, the fastest of
    those still paying off, and so on. Speedups: the entry's per-S ``speedups`` (fa2-probe since
    2026-11-25), else ``speedup_at_max``. Why a ladder: on the H100 sdpa-flash paid off first for
    cmp (from 8K) and FA-4 was 1.6x faster than it at 64K. Why from the top, switching only where
    a path stops paying off: the short-S timings are sub-millisecond and noisy (FA-2 and FA-4
    traded places at every other S up to 8K), so the fastest-at-each-S would flip-flop."""
    def speed(p, S):
        v = (wins[p].get("speedups") or {}).get(str(S))
        return float(v) if v is not None else float(wins[p].get("speedup_at_max") or 0.0)

    points = {int(r["min_len"]) for r in wins.values()}
    points |= {int(x) for r in wins.values() for x in (r.get("speedups") or {})}
    points |= {int(r["max_measured"]) for r in wins.values() if isinstance(r.get("max_measured"), int)}
    steps: list[list] = []
    for S in sorted(points, reverse=True):
        cands = [p for p in wins if wins[p]["min_len"] <= S]
        if not cands:
            break
        if steps and steps[-1][1] in cands:
            steps[-1][0] = S  # the current path still pays off here
        else:
            steps.append([S, max(cands, key=lambda p: speed(p, S))])  # ties: the first listed
    return [(S, p) for S, p in reversed(steps)]


def load_shipped() -> dict:
    """The thresholds document shipped in the package (``SHIPPED_THRESHOLDS``), validated."""
    return load_thresholds(SHIPPED_THRESHOLDS)


def _cap(text) -> tuple[int, int]:
    try:
        major, minor = str(text).split(".")
        return int(major), int(minor)
    except ValueError:
        return (0, 0)


def shipped_entry(facts: dict, doc: dict | None = None) -> tuple[dict | None, str]:
    """(entry, how it matched) from the shipped thresholds for this machine, or (None, why not).

    Match order: same GPU, capability and torch; same GPU and capability (another torch); any
    CUDA GPU of capability >= the entry's ``applies_from_capability`` (the flash / cuDNN SDPA
    kernels the entry measured exist there; the lengths are the H100's, so a local fa2-probe
    run refines them). Never on a non-CUDA device.
    """
    if facts.get("device") != "cuda" or facts.get("gpu") is None:
        return None, "no GPU: shipped thresholds do not apply"
    entries = (doc or load_shipped())["entries"]
    gpu, cap, tv = facts["gpu"], facts["capability"], facts["torch"]
    for e in entries:
        if (e["gpu"], e["capability"], e["torch"]) == (gpu, cap, tv):
            return e, f"measured on this GPU and torch ({gpu}, torch {tv})"
    for e in entries:
        if (e["gpu"], e["capability"]) == (gpu, cap):
            return e, f"measured on this GPU with torch {e['torch']}, applied to torch {tv}"
    ok = [e for e in entries if e.get("applies_from_capability") and _cap(cap) >= _cap(e["applies_from_capability"])]
    if ok:
        e = max(ok, key=lambda e: _cap(e["capability"]))
        return e, (f"measured on {e['gpu']} (sm {e['capability']}), applied to {gpu} (sm {cap}) as a default "
                   f"for GPUs from sm {e['applies_from_capability']}")
    return None, f"no shipped thresholds apply to {gpu} (sm {cap})"


def _with_shipped(facts: dict, thr: dict) -> dict:
    """No local entry for this machine -> the shipped entry (recorded as such in routing.json)."""
    if thr.get("entry") is not None or facts.get("device") != "cuda":
        return thr
    entry, how = shipped_entry(facts)
    if entry is None:
        thr["note"] = f"{thr.get('note', '')}; {how}"
        return thr
    return {**thr, "entry": entry, "source": str(SHIPPED_THRESHOLDS), "local_source": thr.get("source"),
            "shipped_match": how,
            "note": f"shipped defaults: {how} (local: {thr.get('note', '')})"}


_CACHE: dict = {}


def cached_decide(device: str = "cpu") -> Routing:
    """decide(device) with the default thresholds, memoised per device for this process.

    Used by ``nsa_core.flash.pick`` to pick the measured-best path when none is pinned.
    """
    if device not in _CACHE:
        _CACHE[device] = decide(device)
    return _CACHE[device]


def decide(device: str = "cpu", overrides: dict | str | os.PathLike | None = None, *,
           thresholds: str | os.PathLike | None = None) -> Routing:
    """Decide the backend per branch for ``device`` ("cpu", "cuda", "cuda:1").

    overrides: ``{branch: backend}``, ``{"backends": {...}, "thresholds": path}``, or the path
    of ONE JSON file with that content plus ``"schema_version": 1``. ``thresholds``: explicit
    thresholds file (else the overrides' one, else DEFAULT_THRESHOLDS when it exists).
    Raises ValueError for an unknown branch/backend, a bad overrides or thresholds file.
    """
    forced, orec = _load_overrides(overrides)
    facts = machine_facts(device)
    tpath = thresholds if thresholds is not None else orec.get("thresholds")
    thr = _with_shipped(facts, _thresholds_for(facts, tpath, explicit=tpath is not None))
    choices = {
        "cmp": _decide_flash("cmp", facts, thr),
        "slc": _decide_slc(facts),
        "win": _decide_flash("win", facts, thr),
    }
    for b, be in forced.items():
        auto = choices[b]
        choices[b] = Choice(be, f"override ({orec['source']}); automatic choice was {auto.backend}: {auto.reason}",
                            path=auto.path if be == "flash" else None)
    return Routing(choices, facts, thr, orec)
