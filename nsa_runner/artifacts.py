"""Artifacts (DESIGN §6): atomic writers, the run id, run folders and ``manifest.json``.

Public for stage authors::

    from nsa_runner.artifacts import write_text, write_json, write_csv, write_bytes

Every writer is atomic: the data goes to a temporary file in the destination folder, is
flushed to disk, then renamed over the destination (``os.replace``). A reader never sees a
half-written file, and a crash mid-write leaves the previous version in place.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import errno
import hashlib
import io
import json
import math
import os
import re
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from nsa_runner._text import shown
from nsa_runner.stage import Status

STATUSES = tuple(s.value for s in Status)  # DESIGN §5: PASS FAIL SKIP ERROR TIMEOUT

MANIFEST_NAME = "manifest.json"
MANIFEST_SCHEMA_VERSION = 1
PROJECT_ROOT = Path(__file__).resolve().parent.parent  # the checkout nsa_runner was imported from


# ---------------------------------------------------------------------------------------------
# atomic writers


def _atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (e.g. a PNG); parent folders are created."""
    if not isinstance(data, (bytes, bytearray)):
        raise ValueError(f"write_bytes: expected bytes, got {type(data).__name__}")
    return _atomic_write_bytes(path, bytes(data))


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; parent folders are created. Returns the path."""
    if not isinstance(text, str):
        raise ValueError(f"write_text: expected str, got {type(text).__name__}")
    return _atomic_write_bytes(path, text.encode("utf-8", errors="backslashreplace"))  # lone surrogates


def _json_default(obj: Any) -> Any:
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if hasattr(obj, "tolist") and callable(obj.tolist) and getattr(obj, "ndim", 0) != 0:  # numpy arrays / tensors
        return obj.tolist()  # before .item(): a 2-element one raised there (round 17, noticed fixing U-2)
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        return obj.item()
    if hasattr(obj, "tolist") and callable(obj.tolist):
        return obj.tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"write_json: {type(obj).__name__} is not JSON serialisable")


def to_json_text(obj: Any) -> str:
    """The exact text ``write_json`` writes (indented, NaN rejected, trailing newline)."""
    return json.dumps(obj, indent=2, default=_json_default, allow_nan=False) + "\n"


class JsonTextError(ValueError):
    """Text that ``json_loads`` cannot use; the message says why, in words (no file named)."""


def _not_json(token: str) -> Any:
    raise JsonTextError(f"{token} is not a JSON number (nsa-run never writes one)")


def _finite_float(token: str) -> float:
    """A JSON number too large for a float (``1e400``) reads as inf, which cannot be written back."""
    value = float(token)
    if not math.isfinite(value):
        shown = token if len(token) <= 40 else f"{token[:40]}... ({len(token)} characters)"
        raise JsonTextError(f"the number {shown} is out of a float's range (nsa-run never writes one)")
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    """An object whose keys are each written once: ``{"status": "FAIL", "status": "PASS"}`` is ambiguous (JSON
    readers keep either one; Python the last: a hand edit read as PASS, round 17 A U-f)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise JsonTextError(f"the key {shown(twice)} is written twice in one object")
    return out


def json_loads(text: str, *, finite: bool = False) -> Any:
    """``json.loads`` where every way the text can be unusable is a ``JsonTextError`` saying what:
    bad syntax, nesting too deep, an integer longer than Python converts (4300 digits: a bare
    ``ValueError`` that reached the user as "unexpected"); with ``finite``, also ``NaN`` /
    ``Infinity`` and numbers beyond a float's range such as ``1e400`` (what this runner reads back
    and writes again, like manifest.json, must be strict JSON: a NaN there made the next ``stage``
    command fail writing it)."""
    try:
        # a key written twice refused in every file nsa-run reads (round 18 A-R4: a baseline read last-wins)
        return json.loads(text, object_pairs_hook=_no_duplicates,
                          **({"parse_constant": _not_json, "parse_float": _finite_float} if finite else {}))
    except JsonTextError:
        raise
    except RecursionError:
        raise JsonTextError("nested too deeply") from None
    except json.JSONDecodeError as e:
        raise JsonTextError(f"{e.msg} at line {e.lineno} column {e.colno}") from None
    except ValueError as e:  # int("9" * 5000): the interpreter's limit on integer digits
        limit = "an integer with more digits than Python reads" if "digits" in str(e) else str(e)
        raise JsonTextError(limit) from None


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON atomically. NaN/Inf are rejected (ValueError): JSON has none.

    Enums, paths, dataclasses, objects with ``to_dict()`` and numpy/torch scalars are converted.
    """
    return _atomic_write_bytes(path, to_json_text(obj).encode("utf-8"))


def write_csv(path: str | os.PathLike, table: Any) -> Path:
    """Write a pandas DataFrame (or a list of dicts) as CSV atomically, without the index."""
    import pandas as pd

    if isinstance(table, list):
        table = pd.DataFrame(table)
    if not isinstance(table, pd.DataFrame):
        raise ValueError(
            f"write_csv: expected a pandas DataFrame or a list of dicts, got {type(table).__name__}"
        )
    buf = io.StringIO()
    table.to_csv(buf, index=False)
    return _atomic_write_bytes(path, buf.getvalue().encode("utf-8", errors="backslashreplace"))


# ---------------------------------------------------------------------------------------------
# guarded reading: every reader of a run folder goes through read_limited


MAX_READ_BYTES = 256 << 20  # no artifact the runner reads is near this; /dev/zero or a 10 GB file is refused


class UnsafeFileError(ValueError):
    """A file a reader refuses before reading: not a regular file (FIFO, device, folder) or too big."""


def entry_kind(mode: int) -> str:
    """What a folder entry is, in words: "a file" for a regular one, else ``file_kind``'s words."""
    return "a file" if stat.S_ISREG(mode) else file_kind(mode)


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words ("a FIFO", "a folder", ...)."""
    for test, word in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return word
    return "not a regular file"


def not_a_file_words(path: str | os.PathLike) -> str:
    """Why ``path`` (a name nsa-run reads, e.g. a run folder's manifest.json) is no regular file, in words:
    "no manifest.json", "manifest.json is a FIFO, not a regular file", "manifest.json is a link to a character
    device, not a regular file" (round 19 A U-2: a FIFO there was reported as "no manifest.json")."""
    name = os.path.basename(os.fspath(path))
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"{name} is a link to nothing" if os.path.islink(path) else f"no {name}"
    except OSError as e:
        return f"{name} cannot be looked at ({e.strerror or e})"
    if stat.S_ISREG(st.st_mode):
        return f"{name} is there"
    link = "a link to " if os.path.islink(path) else ""
    return f"{name} is {link}{file_kind(st.st_mode)}, not a regular file"


def read_limited(path: str | os.PathLike, limit: int | None = None) -> bytes:
    """The bytes of ``path``, refused by type and size before reading (``UnsafeFileError``).

    A FIFO, a device (e.g. a symlink to /dev/zero), a socket or a folder is refused by its type;
    a file larger than ``limit`` by its size. The file is opened non-blocking (a FIFO swapped in
    after the check cannot hang the open) and checked again on the open descriptor. OSError
    (missing, no permission) passes through.
    """
    path = Path(path)
    limit = MAX_READ_BYTES if limit is None else limit
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFileError(f"{path}: is {file_kind(st.st_mode)}, not a regular file; refused")
    if st.st_size > limit:
        raise UnsafeFileError(f"{path}: {st.st_size / 2**20:.0f} MiB, more than the {limit / 2**20:.0f} MiB "
                              f"this reader accepts; refused")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        return read_fd_limited(fd, path, limit)
    finally:
        os.close(fd)


def read_fd_limited(fd: int, name: str | os.PathLike, limit: int | None = None) -> bytes:
    """The bytes of the open descriptor ``fd`` (``name`` in the messages): a regular file only, checked on
    the descriptor, and no more than ``limit`` bytes as read (``UnsafeFileError`` otherwise)."""
    limit = MAX_READ_BYTES if limit is None else limit
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeFileError(f"{name}: is {file_kind(st.st_mode)}, not a regular file; refused")
    chunks, size = [], 0
    while chunk := os.read(fd, 1 << 20):
        size += len(chunk)
        if size > limit:
            raise UnsafeFileError(f"{name}: grew past the {limit / 2**20:.0f} MiB this reader accepts; refused")
        chunks.append(chunk)
    return b"".join(chunks)


def read_text_limited(path: str | os.PathLike, limit: int | None = None, errors: str = "strict") -> str:
    """``read_limited`` decoded as UTF-8 (UnicodeDecodeError with ``errors="strict"``)."""
    return read_limited(path, limit).decode("utf-8", errors=errors)


# ---------------------------------------------------------------------------------------------
# run id


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=60)


def _short_hash(*chunks: bytes, n: int = 10) -> str:
    h = hashlib.sha256()
    for c in chunks:
        h.update(len(c).to_bytes(8, "little"))
        h.update(c)
    return h.hexdigest()[:n]


def _source_hash(root: Path) -> str:
    """Hash of the project's Python sources (for a stable id outside git)."""
    chunks: list[bytes] = []
    for pkg in ("nsa_core", "nsa_runner", "stages", "nsa_run_stages"):  # stages/ installs as nsa_run_stages
        base = root / pkg
        if not base.is_dir():
            continue
        for f in sorted(base.rglob("*.py")):
            chunks.append(f.relative_to(root).as_posix().encode())
            chunks.append(f.read_bytes())
    return _short_hash(*chunks, n=12)


def run_id(root: str | os.PathLike | None = None) -> str:
    """The run id of the code under test (DESIGN §6).

    - clean git tree: the short commit sha, e.g. ``ddc72b1``;
    - uncommitted changes: ``<sha>-dirty-<hash>``, the hash covering ``git diff HEAD`` and the
      untracked, not ignored files (names and contents). Ignored files (e.g. ``artifacts/``)
      never count, so running never changes the id;
    - outside git: ``nogit-<hash of the project's .py sources>`` (stable while the code is).
    """
    root = Path(root) if root is not None else PROJECT_ROOT
    try:
        head = _git(root, "rev-parse", "--short", "HEAD")
    except (OSError, subprocess.SubprocessError):
        head = None
    if head is None or head.returncode != 0:
        return f"nogit-{_source_hash(root)}"
    sha = head.stdout.decode().strip()
    status = _git(root, "status", "--porcelain", "--untracked-files=all")
    if status.returncode == 0 and not status.stdout.strip():
        return sha
    diff = _git(root, "diff", "HEAD", "--binary", "--no-color", "--no-ext-diff")
    chunks = [diff.stdout]
    top = Path(_git(root, "rev-parse", "--show-toplevel").stdout.decode().strip() or root)
    untracked = _git(root, "ls-files", "--others", "--exclude-standard", "-z", "--full-name", ":/")
    for name in sorted(n for n in untracked.stdout.decode(errors="surrogateescape").split("\0") if n):
        chunks.append(name.encode(errors="surrogateescape"))
        try:
            chunks.append((top / name).read_bytes())
        except OSError:  # vanished or unreadable: its name still counts
            chunks.append(b"<unreadable>")
    return f"{sha}-dirty-{_short_hash(*chunks, n=10)}"


# ---------------------------------------------------------------------------------------------
# run folders and the manifest


class ManifestError(ValueError):
    """manifest.json exists but cannot be used (unreadable, not JSON, wrong schema)."""


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).astimezone().isoformat(timespec="seconds")


def load_manifest(path: str | os.PathLike) -> dict:
    """Read and validate a manifest.json (a file or a run folder). Raises ManifestError."""
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_NAME
    try:
        # finite: nsa-run writes manifests without NaN / Infinity and rewrites them on every update
        data = json_loads(read_text_limited(path), finite=True)
    except FileNotFoundError:
        raise ManifestError(f"{path}: no manifest.json") from None
    except UnsafeFileError as e:
        raise ManifestError(str(e)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ManifestError(f"{path}: cannot read: {e}") from None
    except JsonTextError as e:
        what = "not usable JSON" if str(e) == "nested too deeply" else "not valid JSON"
        raise ManifestError(f"{path}: {what} ({e})") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: expected a JSON object, got {type(data).__name__}")
    version = data.get("schema_version")
    if type(version) is not int or version != MANIFEST_SCHEMA_VERSION:  # (true == 1 and 1.0 == 1 in Python)
        raise ManifestError(
            f"{path}: schema_version {version!r} is not supported"
            f" (this nsa-run reads {MANIFEST_SCHEMA_VERSION})"
        )
    stages = data.get("stages")
    if not isinstance(stages, list) or not all(isinstance(s, dict) and "name" in s and "status" in s
                                               for s in stages):
        raise ManifestError(f"{path}: 'stages' must be a list of objects with 'name' and 'status'")
    history = data.get("history", [])
    if not isinstance(history, list) or not all(isinstance(s, dict) for s in history):
        raise ManifestError(f"{path}: 'history' must be a list of objects")
    for where, entries in (("stages", stages), ("history", history)):
        for i, s in enumerate(entries):
            if not isinstance(s.get("name", ""), str):
                raise ManifestError(f"{path}: {where}[{i}] 'name' must be a string, got {s['name']!r}")
            if s.get("status") not in STATUSES:  # DESIGN §5: exactly these words, upper case
                raise ManifestError(f"{path}: {where}[{i}] ({s.get('name')!r}): status {s.get('status')!r}"
                                    f" is not one of {', '.join(STATUSES)}")
    seen: dict[str, int] = {}
    for i, s in enumerate(stages):  # one current entry per stage (a rerun replaces it, history keeps the rest)
        if s["name"] in seen:
            raise ManifestError(f"{path}: stage {s['name']!r} is listed twice in 'stages' (entries {seen[s['name']]}"
                                f" and {i}): a manifest holds one current entry per stage; earlier results belong"
                                f" in 'history'")
        seen[s["name"]] = i
    if not isinstance(data.get("run_id"), str):
        raise ManifestError(f"{path}: 'run_id' missing or not a string")
    for key, types in _TOP_TYPES.items():
        if key in data and not _is(data[key], types):
            raise ManifestError(f"{path}: {key!r} must be {_names(types)}, got {type(data[key]).__name__}")
    # after the type check above: a truthy non-list (-1, 1e308, true) was iterated here first and ended
    # "unexpected: TypeError: 'int' object is not iterable" (round 20 A A20-R2)
    for key in ("argv", "planned"):  # summary.md / report.html join them
        if not all(isinstance(a, str) for a in data.get(key) or []):
            raise ManifestError(f"{path}: {key!r} must be a list of strings")
    for where, entries in (("stages", stages), ("history", history)):
        for i, s in enumerate(entries):
            for key, types in _ENTRY_TYPES.items():
                if key in s and not _is(s[key], types):
                    raise ManifestError(f"{path}: {where}[{i}] ({s['name']!r}): {key!r} must be {_names(types)},"
                                        f" got {type(s[key]).__name__}")
            if isinstance(s.get("duration_s"), _NUMBER) and not _seconds(s["duration_s"]):
                # round 17 A U-f: a negative one was shown as is; round 31 B31-5: a 4000-digit integer ended report
                # in "OverflowError (unexpected ...)", naming no file, and NaN / inf were shown
                d = s["duration_s"]
                got = (f"an integer of {len(str(abs(d)))} digits" if isinstance(d, int) and abs(d) >= 10**15
                       else repr(d))
                raise ManifestError(f"{path}: {where}[{i}] ({s['name']!r}): 'duration_s' must be a finite, "
                                    f"non-negative number of seconds, got {got}")
            if not all(isinstance(f, str) for f in s.get("files") or []):
                raise ManifestError(f"{path}: {where}[{i}] ({s['name']!r}): 'files' must be a list of strings")
    for i, p in enumerate(data.get("pending") or []):
        problem = _pending_problem(p)
        if problem:
            raise ManifestError(f"{path}: pending[{i}]: {problem}")
    # the run's own nsa-run, checked like a pending note's owner: whether an unfinished run's runner lives or died
    # is judged by it (round 19 A U-6: null, 5, [], {} read as a finished run, "3 passed", no UNFINISHED line)
    if "runner" in data:
        problem = _owner_problem(data["runner"], "runner", required=True)
        if problem:
            raise ManifestError(f"{path}: {problem}")
    return LoadedManifest(data, folder=path.parent)


class LoadedManifest(dict):
    """A manifest read from its run folder (``load_manifest``): the dict, knowing ``folder``, where
    its owners' locks are (``owner_alive``: whether the runner that wrote it still lives)."""

    def __init__(self, data: dict, folder: Path | None = None):
        super().__init__(data)
        self.folder = folder


def _pending_problem(p: Any) -> str:
    """What is wrong with one ``pending`` note (a stage some nsa-run runs or reruns here), "" if nothing.

    Reruns act on these notes (which stage is busy, whose process, where the earlier files went),
    so a hand-edited note is checked like the rest: ``moved_to`` must be a folder under history/."""
    if not isinstance(p, dict):
        return f"must be an object, got {type(p).__name__}"
    if not isinstance(p.get("stage"), str):
        return f"'stage' must be a string, got {type(p.get('stage')).__name__}"
    for key in ("token", "since", "moved_to"):
        if key in p and not isinstance(p[key], str):
            return f"{key!r} must be a string, got {type(p[key]).__name__}"
    problem = _owner_problem(p.get("owner", {}), "owner")
    if problem:
        return problem
    moved = p.get("moved_to")
    if moved is not None:
        parts = Path(moved).parts
        if Path(moved).is_absolute() or ".." in parts or len(parts) < 2 or parts[0] != "history":
            return f"'moved_to' must be a folder under history/, got {moved!r}"
    return ""


def _owner_problem(owner: Any, key: str, required: bool = False) -> str:
    """What is wrong with an nsa-run's note of itself (a ``pending`` note's ``owner``, the manifest's ``runner``),
    "" if nothing. ``required``: an empty object is wrong too (the runner is always noted with its pid)."""
    if not isinstance(owner, dict):
        return f"{key!r} must be an object, got {type(owner).__name__}"
    if (owner or required) and not _is(owner.get("pid"), (int,)) or not _is(owner.get("hostname", ""), (str,)) \
            or not _is(owner.get("pid_started"), (int, float, type(None))):
        return f"{key!r} must hold pid (an integer), hostname (a string) and pid_started (a number or null)"
    return ""


# the types of the manifest fields readers use (a hand-edited or foreign manifest is checked, not trusted)
_NUMBER = (int, float)
_TOP_TYPES = {"host": (dict,), "argv": (list,), "device": (str,), "profile": (str,), "started": (str,),
              "finished": (str, type(None)), "interrupted": (bool,), "updates": (list,), "pending": (list,),
              "exit_code": (int,), "incomplete": (str, type(None)), "died": (str, type(None)),
              "planned": (list,)}
_ENTRY_TYPES = {"files": (list,), "reason": (str,), "hint": (str,), "log": (str,), "metrics": (dict,),
                "options": (dict,), "duration_s": _NUMBER, "traceback": (str,), "log_tail": (str,),
                "order": (int, type(None)), "source": (str,), "device": (str,), "profile": (str,),
                "started": (str,), "finished": (str,), "moved_to": (str,), "interrupted": (bool,)}


def _seconds(value: int | float) -> bool:
    """A duration a report can show: finite, not negative, below 10**15 s (float() of a longer integer overflows)."""
    import math

    return (abs(value) < 10**15 if isinstance(value, int) else math.isfinite(value)) and value >= 0


def _is(value: Any, types: tuple) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def _names(types: tuple) -> str:
    words = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number",
             bool: "true or false", type(None): "null"}
    return " or ".join(dict.fromkeys(words[t] for t in types))


# names the runner owns in a run folder: shared by every stage, so never a stage's own file
RUNNER_OWNED = (MANIFEST_NAME, "logs", "history")
# files the runner writes over the whole run (and its lock); only the built-in summary stage,
# which writes the three summaries itself, may declare those
RUNNER_WRITTEN = (".manifest.lock", "summary.md", "summary.json", "junit.xml", "report.html")
SUMMARY_STAGE_FILES = ("summary.md", "summary.json", "junit.xml")


def _runner_name(part: str, allowed: tuple[str, ...]) -> bool:
    if part in allowed:
        return False
    return (part in RUNNER_OWNED or part in RUNNER_WRITTEN or part.startswith(INCOMING_PREFIX)
            or part.startswith(f".{MANIFEST_NAME}.") or part.startswith(".manifest.lock"))


def declared_file_problem(run_dir: str | os.PathLike, rel: Any,
                          allowed: tuple[str, ...] = ()) -> tuple[str, str] | None:
    """``(kind, why)`` when ``rel`` cannot be a file a stage declares in ``run_dir``, else None.

    A declared name is relative, never climbs (``..``), resolves (symlinks included) strictly
    inside the run folder (else kind ``"outside"``), and is not one of the runner's shared names
    (``manifest.json``, ``logs``, ``history`` or anything under them; kind ``"shared"``): a rerun
    moves a stage's declared files to history, so anything else would let one stage take what is
    not its own.

    A name written as a folder (``a.csv/``, ``a.csv/.``, ``a.csv//``) must name a folder (kind
    ``"folder"`` else): ``Path`` drops the trailing ``/``, so ``a.csv/`` for the file ``a.csv`` was
    found and recorded as written, and every reader (``compare``, junit, the report, a link)
    skipped it without a word (round 14 A BR-1).
    """
    if not isinstance(rel, str) or not rel.strip() or "\0" in rel:
        return "outside", f"{rel!r} is not a relative file name"
    pure = Path(rel)
    if pure.is_absolute():
        return "outside", f"{rel} is an absolute path"
    if ".." in pure.parts:
        return "outside", f"{rel} holds '..' (a declared name never climbs, even back inside)"
    if not pure.parts:
        return "shared", f"{rel} is the run folder itself"
    if _runner_name(pure.parts[0], allowed):
        return "shared", f"{rel} is the run folder's shared {pure.parts[0]}"
    if rel.endswith(("/", "/.")) and not os.path.isdir(os.path.join(run_dir, rel)):  # as written: ENOTDIR
        return "folder", f"{rel} is written as a folder (a trailing '/') but {pure} is not one"
    root = Path(run_dir).resolve()
    try:
        resolved = (root / pure).resolve()
    except (OSError, RuntimeError) as e:  # e.g. a symlink loop
        return "outside", f"{rel} cannot be resolved ({e})"
    if root not in resolved.parents:
        return "outside", f"{rel} resolves outside the run folder (to {resolved})"
    inner = resolved.relative_to(root).parts[0]
    if _runner_name(inner, allowed):
        return "shared", f"{rel} points into the run folder's shared {inner}"
    return None


def declared_type_problem(run_dir: str | os.PathLike, rel: Any, limit: int | None = None) -> str | None:
    """Why what the declared name ``rel`` leads to in ``run_dir`` is nothing the run's readers can
    read, else None (also when it is missing: said elsewhere). Looked at by ``lstat`` (and ``stat``
    through a link, which ``declared_file_problem`` keeps inside the run folder), never opened: a
    FIFO, a character or block device, a socket (named by type), or a regular file larger than
    ``limit`` (``MAX_READ_BYTES``, what every reader accepts). A folder is accepted (a declared
    folder, BR-1's ``d/`` or plain ``d``; its readers pass over what is no file inside it).

    Such a name passed the record-time check: the stage PASSed, report.html was not written and
    every later ``report`` / ``compare`` of the run exited 2 naming it (round 15 A2)."""
    if not isinstance(rel, str) or not rel or "\0" in rel:
        return None
    limit = MAX_READ_BYTES if limit is None else limit
    path = os.path.join(run_dir, rel)
    try:
        st = os.lstat(path)
        via = ""
        if stat.S_ISLNK(st.st_mode):
            st, via = os.stat(path), f" (through the link {rel} -> {os.readlink(path)})"
    except (OSError, ValueError):  # missing, a dangling link, a name the system refuses: named elsewhere
        return None
    if stat.S_ISDIR(st.st_mode):
        return None
    if not stat.S_ISREG(st.st_mode):
        return f"{rel} is {file_kind(st.st_mode)}{via}, not a regular file"
    if st.st_size > limit:
        return (f"{rel} is {st.st_size / 2**20:.0f} MiB{via}, more than the {limit / 2**20:.0f} MiB the run's "
                f"readers accept")
    return None


def outside_problem(run_dir: str | os.PathLike, rel: Any) -> str | None:
    """Why ``rel`` (a name a manifest or a reader gives) does not name something strictly inside
    ``run_dir``: not a relative name, absolute, climbing with ``..``, or resolving (symlinks
    followed) outside; None when it is inside. The readers (``report``, ``compare``) apply the
    check the runner applies to a stage's declared files, before reading anything."""
    if not isinstance(rel, str) or not rel.strip() or "\0" in rel:
        return f"{rel!r} is not a relative file name"
    pure = Path(rel)
    if pure.is_absolute():
        return f"{rel} is an absolute path"
    if ".." in pure.parts:
        return f"{rel} climbs out with '..'"
    if not pure.parts:
        return f"{rel} is the run folder itself"
    try:
        root = Path(run_dir).resolve()
        resolved = (root / pure).resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop, a name too long
        return f"{rel} cannot be resolved ({getattr(e, 'strerror', None) or e})"
    if root not in resolved.parents:
        return f"{rel} resolves outside the run folder (to {resolved})"
    return None


def runner_dirs_problem(run_dir: str | os.PathLike) -> str | None:
    """Why the run folder's ``logs`` / ``history`` cannot be written into (a symlink, e.g. to a
    folder outside the run, or not a folder), else None: logs are written and reruns move files
    there, so either one pointing elsewhere would write or move outside the run folder."""
    for name in ("logs", "history"):
        p = Path(run_dir) / name
        if p.is_symlink():
            return f"{p} is a symlink (to {os.readlink(p)}), not the run folder's own {name} folder"
        if os.path.lexists(p) and not p.is_dir():
            return f"{p} is not a folder"
    return None


def open_log(run_dir: str | os.PathLike, rel: str) -> int:
    """A descriptor to append to a stage's log ``rel`` (``logs/<stage>.log``) in ``run_dir``:
    never through a symlink (the file or its folder), never a FIFO or device (a stage may plant
    one for a later stage's log). Raises UnsafeFileError naming the problem."""
    problem = runner_dirs_problem(run_dir)
    if problem:
        raise UnsafeFileError(problem)
    path = Path(run_dir) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):  # a symlink / a FIFO nobody reads
            raise UnsafeFileError(f"{rel} is a symlink or a FIFO, not a log file; refused") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:  # a hard link would append to another file
        os.close(fd)
        what = file_kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else f"a hard link ({st.st_nlink} names)"
        raise UnsafeFileError(f"{rel} is {what}, not a log file; refused")
    os.set_blocking(fd, True)
    return fd


def names_overlap(a: str, b: str) -> bool:
    """Whether two declared names are the same file or one lies inside the other (``sub`` and
    ``sub/f.txt``), as text: ``entries_overlap`` also sees through links among the folders."""
    na, nb = os.path.normpath(a), os.path.normpath(b)
    return na == nb or nb.startswith(na + os.sep) or na.startswith(nb + os.sep)


def entry_name(run_dir: str | os.PathLike, rel: str) -> str:
    """The run-folder-relative name of the entry ``rel`` names, links among its folders followed
    (the entry itself not: a rerun moves a link as a link). ``self/a.txt`` with ``self -> .`` is
    ``a.txt``: compared as text, another stage's ``a.txt`` and it "differed", and a rerun moved the
    other stage's result. The normalised text when it does not resolve inside the run folder."""
    text = os.path.normpath(rel)
    try:
        root = Path(run_dir).resolve()
        p = root / rel
        full = p.parent.resolve() / p.name if p.name else p.resolve()
        return full.relative_to(root).as_posix()
    except (OSError, RuntimeError, ValueError):
        return text


def entry_forms(run_dir: str | os.PathLike, rel: str) -> set[str]:
    """``rel`` as written (normalised) and as the entry it leads to (``entry_name``)."""
    return {os.path.normpath(rel), entry_name(run_dir, rel)}


def entries_overlap(a: set[str], b: set[str]) -> bool:
    """Whether two names, each given by its ``entry_forms``, are the same entry or one lies in the
    other: moving either one into history would move (part of) the other."""
    return any(names_overlap(x, y) for x in a for y in b)


def stage_allowed(name: str, builtin: bool = True) -> tuple[str, ...]:
    """The runner-written names stage ``name`` may declare (the built-in summary stage's summaries)."""
    return SUMMARY_STAGE_FILES if builtin and name == "summary" else ()


def stage_owns(run_dir: str | os.PathLike, name: str, rel: Any, *, log: bool = False) -> bool:
    """Whether a rerun may move ``rel`` (a file or the log of stage ``name``, as a manifest lists
    it) into history: only what ``declared_file_problem`` accepts, or the stage's own log
    ``logs/<name>.log`` resolving inside the run folder. A manifest may be hand-edited or older
    than these checks, so its names are checked again right before anything moves."""
    if not log:
        return declared_file_problem(run_dir, rel, stage_allowed(name)) is None
    if rel != f"logs/{name}.log" or ".." in Path(rel).parts:
        return False
    root = Path(run_dir).resolve()
    try:
        return (root / "logs") in (root / rel).resolve().parents
    except (OSError, RuntimeError):
        return False


_SUFFIX = re.compile(r"^(?P<base>.+?)(?:\.(?P<n>\d+))?$")


def run_folders(out: Path, rid: str) -> list[Path]:
    """Existing folders of run id ``rid`` under ``out``: ``rid``, ``rid.2``, ``rid.3`` ... in order."""
    found = []
    if not out.is_dir():
        return found
    for p in out.iterdir():
        m = _SUFFIX.match(p.name)
        if p.is_dir() and m and m.group("base") == rid:
            found.append((int(m.group("n") or 1), p))
    return [p for _, p in sorted(found)]


def new_run_folder(out: Path, rid: str) -> Path:
    """A fresh, empty folder for a new run: ``<out>/<rid>``, or ``<rid>.2``, ``.3`` ... when taken.

    An existing folder is never reused or emptied: a rerun cannot destroy earlier results.
    (``create_run_folder`` is what the CLI uses: it never shows a folder without its manifest.)
    """
    out.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        p = out / (rid if n == 1 else f"{rid}.{n}")
        try:
            p.mkdir()
            return p
        except FileExistsError:
            n += 1


INCOMING_PREFIX = ".incoming-"


def create_run_folder(out: Path, rid: str, fill, *, only_first: bool = False) -> Path | None:
    """A new run folder that appears complete or not at all (any number of runs at once).

    ``fill(folder)`` writes the first files (the manifest) into a private folder
    ``<out>/.incoming-<rid>-<pid>-<random>``, which is then renamed to the first free name
    ``<rid>``, ``<rid>.2`` ... A rename onto a folder that another run created meanwhile fails
    (it is not empty) and the next number is tried. So a run never sees another's folder before
    its manifest exists, and a crash (full disk, kill -9) leaves only an ``.incoming-`` folder,
    which ``clean_stale`` removes at the next start. With ``only_first`` the only name tried is
    the next after the existing ones at the time of the call; None when another run took it (a
    folder appeared there). A name taken by something that is not a run folder (a user's file, a
    dangling link) is passed over in both modes: with ``only_first`` it was taken before the call,
    so returning None for it made ``nsa-run stage`` ask again forever (a busy loop).
    """
    out.mkdir(parents=True, exist_ok=True)
    # the name to try first, as the folders are at the call (round 36 B36-4: read after ``fill``, a run folder another
    # ``stage`` made meanwhile moved this one to ``<rid>.2``: six ``stage`` commands at once split across two runs)
    n = 1 + max([_folder_number(p) for p in run_folders(out, rid)], default=0)
    tmp = Path(tempfile.mkdtemp(prefix=f"{INCOMING_PREFIX}{rid}-{os.getpid()}-", dir=out))
    try:
        mark_owned(tmp)
        fill(tmp)
        (tmp / OWNED_MARKER).unlink()  # the run folder itself carries no marker
        release_owned(tmp)
        while True:
            target = out / (rid if n == 1 else f"{rid}.{n}")
            taken_by_folder = True
            if not os.path.lexists(target):
                try:
                    os.rename(tmp, target)
                    return target
                except OSError as e:
                    if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                        raise
            else:  # a file or a link that is no run folder: never one, passed over
                taken_by_folder = os.path.isdir(target)
            if only_first and taken_by_folder:
                shutil.rmtree(tmp, ignore_errors=True)
                return None
            n += 1
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        release_owned(tmp)
        raise


def _folder_number(p: Path) -> int:
    m = _SUFFIX.match(p.name)
    return int(m.group("n") or 1) if m else 1


def pid_alive(pid: Any, started: Any = None) -> bool:
    """Whether process ``pid`` (created at ``started``, psutil's create_time, when given) still runs."""
    import psutil

    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(proc.create_time() - float(started)) < 1.0
    except (psutil.Error, TypeError, ValueError):
        return False


# the owner of a stage running in a run folder (``pending``), and a run's runner, hold
# ``.manifest.lock.<token>`` there (flock, exclusive) for as long as they live (``manifest._owner_lock``);
# its name and inode are in the owner's note. The kernel lets go of it when the process dies, however it
# dies, whatever PID namespace or host name it has (round 14 A BR-2 for reruns, BR-2b for ``report``)
OWNER_LOCK_NAME = re.compile(r"\.manifest\.lock\.[0-9a-f]{1,64}")


def owner_lock_held(dir: str | os.PathLike | None, owner: Any) -> bool | None:
    """Whether the owner lock ``owner`` names in run folder ``dir`` is held (its process lives); None
    when that cannot be told (no lock noted, the file gone or replaced)."""
    import fcntl

    if not isinstance(owner, dict):
        return None
    name, ino = owner.get("lock"), owner.get("lock_ino")
    if dir is None or not isinstance(name, str) or not OWNER_LOCK_NAME.fullmatch(name) or type(ino) is not int:
        return None
    try:
        fd = os.open(os.path.join(dir, name), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_ino != ino:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return None
        return False
    finally:
        os.close(fd)


def owner_alive(owner: Any, dir: str | os.PathLike | None = None) -> bool | None:
    """Whether the nsa-run of ``owner`` (a ``pending`` note's owner, a manifest's ``runner``) still
    lives: its lock in the run folder ``dir`` is held (True) or free (False), whatever its PID namespace
    or host name; where no lock tells (an older nsa-run's note, no folder known), by pid on the same
    host; None when nothing can be known (another host, no lock)."""
    import socket

    held = owner_lock_held(dir, owner)
    if held is not None:
        return held
    if not isinstance(owner, dict) or owner.get("hostname") != socket.gethostname():
        return None
    return pid_alive(owner.get("pid"), owner.get("pid_started"))


def _folder_of(m: dict, dir: str | os.PathLike | None) -> str | os.PathLike | None:
    return dir if dir is not None else getattr(m, "folder", None)


def set_aside_copy(m: dict, stage: str, name: str, dir: str | os.PathLike | None = None) -> str | None:
    """While a rerun (at work, or its runner dead) has ``stage``'s recorded files set aside in history/ (``pending``'s
    ``moved_to``, the folder in place): the run-relative name of ``name``'s set-aside copy, or "" where the recorded
    result has none (the file in place, if any, is the new attempt's, which the manifest does not record). None when
    the stage's files are not set aside (or the move had not reached ``name``): the file in place is the recorded one.
    The readers (``Run.recorded``), summary.md and report.html read and link through it (round 33 B33-6, round 34
    B34-5: a dead attempt's files were read and linked as the run's)."""
    folder = _folder_of(m, dir)
    if folder is None:
        return None
    for p in m.get("pending") or []:
        moved = p.get("moved_to") if isinstance(p, dict) and p.get("stage") == stage else None
        if not (isinstance(moved, str) and moved and outside_problem(folder, moved) is None
                and os.path.isdir(os.path.join(folder, moved))):
            continue
        rel = f"{moved}/{name}"
        if outside_problem(folder, rel) is None and os.path.lexists(os.path.join(folder, rel)):
            return rel
        return None if p.get("setting_aside") is True else ""  # (mid-move: not moved yet, still in place)
    return None


def runner_died(m: dict, dir: str | os.PathLike | None = None) -> str | None:
    """One line when the nsa-run that wrote manifest ``m`` (of run folder ``dir``; ``load_manifest``'s
    knows its own) died without finishing (``kill -9``, a closed terminal, power loss): its runner is
    gone while the manifest says the run never finished, or a stage it was running is still marked
    running. Gone: its lock in the run folder is free (``owner_alive``), else (no lock noted) its pid on
    this host. None when the run finished, is still running, or nothing can be known."""
    folder = _folder_of(m, dir)

    def dead(owner: Any) -> bool:
        return owner_alive(owner, folder) is False

    running = [p for p in m.get("pending") or [] if isinstance(p, dict) and dead(p.get("owner"))]
    state = planned_state(m)
    if running:
        names = ", ".join(str(p.get("stage")) for p in running)
        said = [_left_by(p, m, folder) for p in running]
        what = said[0] if len(set(said)) == 1 else "; ".join(
            f"{p.get('stage')}: {w}" for p, w in zip(running, said, strict=True))
        return (f"runner died / unfinished: the nsa-run running stage {names} is gone ({what})"
                + (f"; {state}" if state else ""))
    state = state or "stages after the last one listed did not run"
    if m.get("finished") is None and not m.get("interrupted") and dead(m.get("runner")):
        return f"runner died / unfinished: {run_died_fact(m)}; {state}"
    if isinstance(m.get("died"), str) and m["died"]:  # noted by a later ``stage`` into the run (``RunManifest.open``)
        return f"runner died / unfinished: {m['died']}; {state}"
    return None


def _left_by(note: dict, m: dict, folder: str | os.PathLike | None) -> str:
    """What a dead nsa-run's ``pending`` note left of its stage, as the files say: a rerun whose earlier result
    was set aside (it waits in that folder, or is back in place: the folder is gone, e.g. put back before a full
    disk kept the manifest from saying so, round 19 A U-4), or a stage with no result."""
    moved, name = note.get("moved_to"), note.get("stage")
    recorded = any(isinstance(s, dict) and s.get("name") == name for s in m.get("stages") or [])
    if isinstance(moved, str) and moved and recorded and folder is not None:
        if os.path.lexists(os.path.join(folder, moved)):
            return f"its earlier result waits in {moved}: the next nsa-run stage / oneshot into this --out puts it back"
        return "its earlier result is in place"
    return "its result is missing"


def run_died_fact(m: dict) -> str:
    """What ``runner_died`` says of a run whose runner died before finishing it (``RunManifest.open`` keeps it as
    ``died``; what the run then lacks is said from its records each time, ``planned_state``)."""
    runner = m.get("runner") if isinstance(m.get("runner"), dict) else {}
    return f"nsa-run pid {runner.get('pid')} is gone and never finished the run"


# ``executor.interrupt_reason``'s record, as an nsa-run before round 19 wrote it (no "interrupted" flag on the record)
_STOPPED = re.compile(r"interrupted \([^)]*\): the stage was stopped")


def stopped_by_interrupt(rec: dict) -> bool:
    """Whether stage record ``rec`` is the runner's interrupt of the stage: its ``interrupted`` flag (the executor
    writes it on every ERROR record), or, on an ERROR record of an older nsa-run (no flag), the interrupt's own
    reason. A stage's own ERROR whose reason reads like an interrupt is never taken for one (round 19 review)."""
    if rec.get("status") != "ERROR":
        return False
    if "interrupted" in rec:
        return rec["interrupted"] is True
    return bool(_STOPPED.match(str(rec.get("reason") or "")))


def planned_state(m: dict) -> str | None:
    """What of the stages the run planned (``planned``, noted by ``executor.execute``) lacks its own result now:
    those stopped by an interrupt (their record is the interrupt's ERROR), those with no record; or that every one
    has its own result. None when the run noted no plan (an older nsa-run). Said from the records each time, so a
    later ``stage X`` into the run counts (round 18 A: the lines were judged once, or by the record's presence)."""
    planned = m.get("planned")
    if not isinstance(planned, list) or not all(isinstance(n, str) for n in planned):
        return None
    recs = {s.get("name"): s for s in m.get("stages") or [] if isinstance(s, dict)}

    def names(ns: list[str]) -> str:
        return ", ".join(ns[:10]) + (f" and {len(ns) - 10} more" if len(ns) > 10 else "")

    stopped = [n for n in planned if n in recs and stopped_by_interrupt(recs[n])]
    missing = [n for n in planned if n not in recs]
    parts = ([f"stopped by an interrupt: {names(stopped)}"] if stopped else []) + (
        [f"{len(missing)} planned stage(s) have no result: {names(missing)}"] if missing else [])
    return "; ".join(parts) if parts else "every planned stage has its own result"


def still_running(m: dict, dir: str | os.PathLike | None = None) -> str | None:
    """One line when an nsa-run is still running (part of) the run of manifest ``m`` (of run folder
    ``dir``; ``load_manifest``'s knows its own): a stage it runs (``pending``), or the run it never
    finished; alive: its lock in the run folder is held (``owner_alive``), whatever its PID namespace
    or host name. ``report`` of such a run prints it before the counts, which are then of the stages
    finished so far (not a verdict)."""
    folder = _folder_of(m, dir)

    def live(owner: Any) -> bool:
        return owner_alive(owner, folder) is True

    busy = [p for p in m.get("pending") or [] if isinstance(p, dict) and live(p.get("owner"))]
    if busy:
        return (f"nsa-run pid {busy[0]['owner'].get('pid')} is still running stage "
                f"{', '.join(str(p.get('stage')) for p in busy)} in this run folder")
    if m.get("finished") is None and not m.get("interrupted") and live(m.get("runner")):
        return f"nsa-run pid {m['runner'].get('pid')} is still running this run"
    return None


def unfinished(m: dict, dir: str | os.PathLike | None = None) -> str | None:
    """One line when the run of manifest ``m`` did not finish: the runner stopped it itself
    (``incomplete``: a full disk, a lock held too long) or the runner died (``runner_died``);
    None otherwise. ``report`` prints it, report.html and summary.md show it."""
    if isinstance(m.get("incomplete"), str) and m["incomplete"]:
        return f"incomplete: {m['incomplete']}"
    return runner_died(m, dir)


def fd_path(fd: int) -> str | None:
    """A name for what this runner's descriptor ``fd`` is open on that no rename, symlink or FIFO put at
    the original name can redirect: ``/proc/<runner pid>/fd/<fd>`` (Linux: opening it, or a name under
    it, reaches the very folder or file the runner opened, from the runner's children too). None where
    there is none (no /proc, or a runner its children may not look into)."""
    proc = f"/proc/{os.getpid()}"
    try:
        if os.stat(proc).st_uid != os.geteuid():  # a non-dumpable runner: its children cannot open it
            return None
        name = f"{proc}/fd/{fd}"
        return name if os.path.samestat(os.stat(name), os.fstat(fd)) else None
    except OSError:
        return None


def empty_folder(dir_fd: int, depth: int = 0) -> None:
    """Remove what lies in the folder open as ``dir_fd``, never following a symlink; never raises."""
    if depth > 64:
        return
    try:
        names = os.listdir(dir_fd)
    except OSError:
        return
    for name in names:
        try:
            if stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0), dir_fd=dir_fd)
                try:
                    empty_folder(sub, depth + 1)
                finally:
                    os.close(sub)
                os.rmdir(name, dir_fd=dir_fd)
            else:
                os.unlink(name, dir_fd=dir_fd)
        except OSError:
            pass


class TempFolder:
    """A temp folder of nsa-run's own (a stage's: its job, the ``started`` marker, its result; plugin
    discovery's, round 14 A BR-3d), opened once when it is made (round 14 A BR-3): a stage (a plugin's
    import) may rename it and put a symlink, a file or another folder at its name. The runner reads
    and writes there only through the open folder (never through the name), the child is given the
    folder as ``/proc/<runner pid>/fd/<n>`` (``fd_path``) so its result never goes through a link
    either, ``problem()`` names what was done to it (the stage is ERROR), and ``close()`` removes
    what is the runner's and nothing else, never raising (a folder that was no folder any more
    stopped the whole run: "Cannot call rmtree on a symbolic link")."""

    def __init__(self, prefix: str, what: str = "the stage", dir: str | None = None):
        self.what = what  # whose folder, for the messages: "the stage", "plugin discovery"
        self.path = tempfile.mkdtemp(prefix=prefix, dir=dir)
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            shutil.rmtree(self.path, ignore_errors=True)
            raise
        self._stat = os.fstat(self.fd)
        self.base = fd_path(self.fd) or self.path

    def name(self, entry: str) -> str:
        """``entry``'s name for the worker (through the runner's descriptor where there is one)."""
        return os.path.join(self.base, entry)

    def write(self, entry: str, data: bytes) -> None:
        fd = os.open(entry, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600, dir_fd=self.fd)
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    def exists(self, entry: str) -> bool:
        try:
            os.stat(entry, dir_fd=self.fd, follow_symlinks=False)
            return True
        except OSError:
            return False

    def read(self, entry: str) -> bytes:
        """``entry``'s bytes: a regular file only (never a symlink's target, never a FIFO's wait)."""
        fd = os.open(entry, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0), dir_fd=self.fd)
        try:
            return read_fd_limited(fd, entry)
        finally:
            os.close(fd)

    def problem(self) -> str | None:
        """What the stage did to the folder's name (removed it, put a symlink or something else
        there), or None while the name is still this folder."""
        try:
            st = self._lstat_settled()
        except FileNotFoundError:
            return f"nsa-run's temp folder of {self.what}, {self.path}, was removed while {self._while}"
        except OSError as e:
            return f"nsa-run's temp folder of {self.what}, {self.path}, cannot be looked at ({e.strerror or e})"
        if os.path.samestat(st, self._stat):
            return None
        if stat.S_ISLNK(st.st_mode):
            try:
                what = f"a symlink (to {os.readlink(self.path)})"
            except OSError:
                what = "a symlink"
        elif stat.S_ISDIR(st.st_mode):
            what = "another folder"
        elif stat.S_ISREG(st.st_mode):
            what = "a file"
        else:
            what = file_kind(st.st_mode)
        return (f"nsa-run's temp folder of {self.what}, {self.path}, was replaced by {what} while "
                f"{self._while} (nothing was read through it)")

    SETTLE_S = 1.0  # a name found missing is looked at again for this long: a swap is a remove, then a put

    def _lstat_settled(self) -> os.stat_result:
        """lstat of the folder's name; when nothing is there, looked at again for up to SETTLE_S, since a
        stage swapping the folder (``mv D D.real; ln -s X D``) leaves the name empty in between, and the
        error should say what the stage put there, not the moment between (raises FileNotFoundError when
        it stays empty)."""
        deadline = time.monotonic() + self.SETTLE_S
        while True:
            try:
                return os.lstat(self.path)
            except FileNotFoundError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)

    @property
    def _while(self) -> str:
        return "the stage ran" if self.what == "the stage" else f"{self.what} ran"

    def close(self) -> None:
        """Remove the folder and what is in it; when its name no longer leads to it (a stage moved it),
        empty it through its descriptor, remove it where it lies now, and remove what was put at its
        name (a symlink is unlinked, never followed). Never raises; a second call does nothing (its
        descriptor is forgotten before it is closed: a number closed twice is EBADF, or another file's)."""
        if self.fd < 0:
            return
        try:
            if self.problem() is None:
                shutil.rmtree(self.path, ignore_errors=True)
                return
            empty_folder(self.fd)
            try:  # where the stage moved it (Linux): removed there when it is still this, empty, folder
                where = os.readlink(f"/proc/self/fd/{self.fd}")
                if os.path.samestat(os.lstat(where), self._stat):
                    os.rmdir(where)
            except OSError:
                pass
            try:  # what the stage put at the runner's own name
                if stat.S_ISDIR(os.lstat(self.path).st_mode):
                    shutil.rmtree(self.path, ignore_errors=True)
                else:
                    os.unlink(self.path)
            except OSError:
                pass
        finally:
            fd, self.fd = self.fd, -1
            os.close(fd)
            release_owned(self.path)  # (its marker's lock, when it was marked: ``mark_owned``)


def process_started(pid: int | None = None) -> float:
    import psutil

    return psutil.Process(pid or os.getpid()).create_time()


_STALE_NAME = re.compile(r"^(?:\.incoming-.+|nsa-run-.+)-(?P<pid>\d+)-[a-z0-9_]{8}$")  # tempfile's 8 chars
OWNED_MARKER = ".nsa-run-owned"

# round 16 A11: the folders this process marked (``mark_owned``) -> (descriptor holding the marker's
# flock, its st_dev, st_ino). The lock is what tells another nsa-run's ``clean_stale`` that the folder's
# maker lives, whatever PID namespace either runs in (its pid alone said "gone" to an nsa-run in another
# namespace sharing $TMPDIR, which removed a live run's stage and spare folders). Held until the folder
# is removed (``release_owned``; or, for a folder removed by its name elsewhere, until the next
# ``mark_owned`` sees its marker gone) or this process ends (the kernel lets go of it however it dies).
_OWNED: dict[str, tuple[int, int, int]] = {}
_OWNED_GUARD = threading.Lock()  # (a reaper thread removes a finished stage's folder while the next one is made)


def mark_owned(folder: str | os.PathLike) -> None:
    """Mark a temporary folder this nsa-run made (``clean_stale`` removes only marked folders) and hold
    the marker's flock while the folder is ours (``clean_stale`` leaves a folder whose marker is locked).
    The marker is made under a fresh name (O_EXCL, never through a link, relative to the folder's
    descriptor), locked, then renamed into place: it never appears unlocked, and nothing a running
    stage put at the marker's name (a symlink to an outside file) is written through (round 16 A6's
    rule for every file nsa-run writes in a temp folder). Raises OSError."""
    import fcntl
    import uuid

    _sweep_owned()
    dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    try:
        fresh = f"{OWNED_MARKER}.{uuid.uuid4().hex}"
        fd = os.open(fresh, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0),
                     0o644, dir_fd=dfd)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nothing else holds it
            except OSError:  # a file system without flock: the pid alone says (as before round 16)
                pass
            os.write(fd, f"{os.getpid()}\n".encode())
            os.rename(fresh, OWNED_MARKER, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(fresh, dir_fd=dfd)
            except OSError:
                pass
            raise
        st = os.fstat(fd)
        with _OWNED_GUARD:
            old = _OWNED.pop(os.path.abspath(folder), None)
            _OWNED[os.path.abspath(folder)] = (fd, st.st_dev, st.st_ino)
        if old is not None:
            os.close(old[0])
    finally:
        os.close(dfd)


def release_owned(folder: str | os.PathLike) -> None:
    """Let go of the lock ``mark_owned`` holds for ``folder`` (removed, or no longer a temp folder)."""
    with _OWNED_GUARD:
        held = _OWNED.pop(os.path.abspath(folder), None)
    if held is not None:
        os.close(held[0])


def _sweep_owned() -> None:
    """Let go of the locks of marked folders whose marker is gone (removed by name, not through
    ``release_owned``: the spare's folder, a run folder made from an ``.incoming-`` one)."""
    with _OWNED_GUARD:
        items = list(_OWNED.items())
    for folder, (fd, dev, ino) in items:
        try:
            st = os.lstat(os.path.join(folder, OWNED_MARKER))
            if (st.st_dev, st.st_ino) == (dev, ino):
                continue
        except OSError:
            pass
        with _OWNED_GUARD:
            if _OWNED.get(folder) != (fd, dev, ino):
                continue
            del _OWNED[folder]
        os.close(fd)


def _maker_gone(folder: Path, pid: int) -> bool:
    """Whether temp folder ``folder`` is marked by nsa-run ``pid`` (``mark_owned``) and that nsa-run is
    gone: nothing holds the marker's lock AND no process ``pid`` runs here. The lock decides where it
    can: a live maker holds it in any PID namespace, where ``pid`` may be nobody's, or another's
    (round 16 A11); the pid is asked too for a marker no lock can tell about (a file system without
    flock, an nsa-run from before round 16)."""
    import fcntl

    nofollow = getattr(os, "O_NOFOLLOW", 0)
    try:
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | nofollow)
    except OSError:
        return False
    try:
        fd = os.open(OWNED_MARKER, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | nofollow, dir_fd=dfd)
    except OSError:
        return False
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            return False
        if read_fd_limited(fd, OWNED_MARKER, limit=64).decode("ascii", "replace").strip() != str(pid):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its maker holds it: alive, whatever its pid says here
        except OSError:
            pass  # no flock here: the pid alone tells
        return not pid_alive(pid)
    except (OSError, ValueError):
        return False
    finally:
        os.close(fd)


def clean_stale(out: Path | None = None) -> list[Path]:
    """Remove what a killed nsa-run left: ``.incoming-`` folders under ``out`` and stage temp
    folders ``nsa-run-<stage>-<pid>-*`` in the system temp dir, whose maker is gone (``_maker_gone``:
    its marker's lock free, and its pid not running here)."""
    removed = []
    places = [Path(tempfile.gettempdir())] + ([out] if out is not None else [])
    for place in places:
        try:
            children = list(place.iterdir())
        except OSError:
            continue
        for p in children:
            m = _STALE_NAME.match(p.name)
            if not m or (place != out and not p.name.startswith("nsa-run-")):
                continue
            if place == out and not p.name.startswith(INCOMING_PREFIX):
                continue
            try:
                if not p.is_dir() or p.is_symlink() or p.stat().st_uid != os.getuid():
                    continue
            except OSError:
                continue
            if _maker_gone(p, int(m.group("pid"))):  # only what an nsa-run made and marked
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    return removed


def check_writable(out: Path) -> None:
    """Raise OSError (with the reason) if ``out`` cannot be created or written to."""
    out.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".nsa-run-probe-", dir=out)
    os.close(fd)
    os.unlink(probe)
