"""Executor: each stage in its own process, with a timeout (DESIGN §5 "Isolation").

The child is ``python -P -m nsa_runner._worker JOB RESULT`` (``_python.python_m``: nothing of the run
folder, its working directory, on ``sys.path``) in a new session (its own process
group), cwd = the run folder, stdout+stderr -> ``logs/<stage>.log``. Outcomes:

- the child wrote a result            -> that StageResult (declared files are checked)
- it ran past its timeout             -> TIMEOUT; the stage's processes are killed as a tree
- it died (signal, abort, exit != 0)  -> ERROR with the signal / exit code and the log tail
- Ctrl-C in the parent                -> the child's group is killed, the stage is recorded as
                                         ERROR "interrupted", and KeyboardInterrupt propagates

A stage whose requirements are unmet is recorded as SKIP without spawning anything.

Whatever way the stage ends (PASS too), nothing it started outlives it: every process carrying
its cookie, ``setsid`` grandchildren included, is killed (``_worker.kill_processes``); a second
Ctrl-C during the grace period goes straight to SIGKILL; a watchdog process and the parent-death
signal stop the stage if this runner is killed (``_worker`` docstring).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import site
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nsa_runner
from nsa_runner._python import python_m
from nsa_runner._worker import (
    COOKIE_ENV,
    PARENT_ENV,
    STARTED,
    _proc_state,
    describe_exit,
    freeze_processes,
    hold_pid,
    kill_processes,
    signal_name,
)
from nsa_runner._worker import Watchdog as _Watchdog
from nsa_runner.artifacts import (
    OWNED_MARKER,
    ManifestError,
    TempFolder,
    UnsafeFileError,
    declared_file_problem,
    empty_folder,
    entry_forms,
    fd_path,
    load_manifest,
    mark_owned,
    now_iso,
    open_log,
    stage_allowed,
)
from nsa_runner.context import RunContext
from nsa_runner.manifest import ManifestBusy, RunManifest, _Deferred, signals_deferred
from nsa_runner.registry import (
    Machine,
    StageEntry,
    TempFolderFull,
    _folder_full,
    _temp_full,
    discovery_timeout,
    skip_reason,
    strict_counts_skip,
    unmet,
)
from nsa_runner.stage import StageResult, Status

LOG_TAIL_LINES = 40
POLL_S = 0.1
KILL_GRACE_S = 3.0

# what a stage or plugin says is recorded up to these sizes (round 13 B-B13: a 280 MB import error,
# kept whole, made a 267 MiB manifest.json its own reader refuses, and every later command into that
# --out exited 2): the start and the end are kept, with what was left out named between them
REASON_CHARS = 16_000  # reason, hint
TRACEBACK_CHARS = 64_000  # traceback, log tail
METRIC_TEXT_CHARS = 64_000  # each string (or key) in metrics
METRICS_BYTES = 8 << 20  # a stage's metrics as JSON


def clipped(text: Any, limit: int) -> str:
    """``text`` kept whole up to ``limit`` characters; longer, its first quarter and its end, with
    "… [N characters clipped by nsa-run] …" between them, ``limit`` characters in all (clipping
    again changes nothing)."""
    text = text if isinstance(text, str) else str(text)
    if len(text) <= limit:
        return text
    head = limit // 4
    tail = max(0, limit - head - 80)  # 80: room for the marker
    removed = len(text) - head - tail
    return f"{text[:head]} … [{removed} characters clipped by nsa-run] … {text[len(text) - tail:] if tail else ''}"


def _clipped_metrics(value: Any, depth: int = 0) -> Any:
    """``value`` (a stage's metrics, from JSON) with every string and key clipped (``clipped``)."""
    if depth > 200:
        raise ValueError("nested more than 200 deep")
    if isinstance(value, str):
        return clipped(value, METRIC_TEXT_CHARS)
    if isinstance(value, dict):
        return {clipped(k, METRIC_TEXT_CHARS): _clipped_metrics(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_clipped_metrics(v, depth + 1) for v in value]
    return value


def bounded_metrics(metrics: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """(metrics with every text clipped, "") or, when they are still more than ``METRICS_BYTES`` as
    JSON (or nested too deep), ({}, why they were not recorded)."""
    try:
        out = _clipped_metrics(metrics)
        size = len(json.dumps(out, indent=2))  # as artifacts.write_json writes it (ASCII: characters are bytes)
    except (ValueError, TypeError, RecursionError) as e:
        return {}, f"the stage's metrics were not recorded: {clipped(e, 200)}"
    if size > METRICS_BYTES:
        return {}, (f"the stage's metrics were not recorded: {size / 2**20:.0f} MiB as JSON, more than the "
                    f"{METRICS_BYTES >> 20} MiB nsa-run records")
    return out, ""


@dataclass
class StageRecord:
    """The outcome of one stage as it goes into the manifest."""

    name: str
    order: int | None
    source: str
    status: Status
    reason: str = ""
    hint: str = ""
    files: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0
    started: str = ""
    finished: str = ""
    log: str = ""
    traceback: str = ""
    log_tail: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    strict_fail: bool = False  # a SKIP that --strict counts as a failure
    # an ERROR that is the runner's interrupt of the stage (Ctrl-C, SIGTERM, SIGHUP), never the stage's own: written
    # on every ERROR record (``artifacts.planned_state`` reads it; an ERROR without it is an older nsa-run's)
    interrupted: bool = False
    device: str = ""
    profile: str = ""

    def to_dict(self) -> dict:
        d = {
            "name": self.name,
            "order": self.order,
            "source": self.source,
            "status": self.status.value,
            "duration_s": round(self.duration_s, 3),
            "reason": clipped(self.reason, REASON_CHARS),
            "hint": clipped(self.hint, REASON_CHARS),
            "files": list(self.files),
            "log": self.log,
            "started": self.started,
            "finished": self.finished,
            "device": self.device,
            "profile": self.profile,
            "options": {k: _jsonable(v) for k, v in self.options.items()},
            "metrics": self.metrics,
        }
        if self.status is Status.SKIP:
            d["strict_fail"] = self.strict_fail
        if self.status is Status.ERROR:
            d["interrupted"] = self.interrupted
        if self.traceback:
            d["traceback"] = clipped(self.traceback, TRACEBACK_CHARS)
        if self.log_tail:
            d["log_tail"] = clipped(self.log_tail, TRACEBACK_CHARS)
        return d


def visible(text: str) -> str:
    """What of ``text`` a reader sees: escape sequences, control, format (zero-width, BOM, bidi)
    and separator characters removed. A SKIP reason of only ``\x1b[0m`` or U+200B said nothing."""
    import unicodedata

    from nsa_runner._text import CONTROL

    return "".join(ch for ch in CONTROL.sub("", str(text)) if unicodedata.category(ch)[0] not in "CZ")


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return str(v)


class Observer:
    """Progress callbacks (the CLI renders them with rich); the default does nothing."""

    def on_start(self, entry: StageEntry) -> None: ...

    def on_tick(self, entry: StageEntry, elapsed: float, last_line: str) -> None: ...

    def on_finish(self, entry: StageEntry, record: StageRecord) -> None: ...

    def on_set_aside(self, entry: StageEntry, moved: Path) -> None: ...


def tail(path: Path, lines: int = LOG_TAIL_LINES, max_bytes: int = 64_000) -> str:
    """The last ``lines`` lines of a stage's log: read only from a regular file (a stage may swap
    its log for a FIFO or a device: opened non-blocking, checked on the descriptor, at most
    ``max_bytes``), "" otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError:
        return ""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return ""
        os.lseek(fd, max(0, st.st_size - max_bytes), os.SEEK_SET)
        chunks, got = [], 0
        while got < max_bytes:
            chunk = os.read(fd, max_bytes - got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        data = b"".join(chunks)
    except OSError:
        return ""
    finally:
        os.close(fd)
    return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-lines:])


def _last_line(path: Path) -> str:
    t = tail(path, lines=1, max_bytes=4096).strip()
    return t[-120:]


def _child_env(device: str, cookie: str = "") -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env[COOKIE_ENV] = cookie  # inherited by everything the stage starts: found and killed with it
    env[PARENT_ENV] = str(os.getpid())
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"  # must be set before anything imports triton
    # the child must import the same nsa_runner as this process, even from a plain checkout
    pkg_parent = str(Path(nsa_runner.__file__).resolve().parent.parent)
    site_dirs = set(site.getsitepackages() + [site.getusersitepackages()])
    # PYTHONPATH's relative entries as this process means them: in the worker (cwd = the run folder)
    # ``.`` was the run folder, where a stage may plant an ``nsa_runner/`` package (round 16 A10)
    paths = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if pkg_parent not in site_dirs:
        paths.insert(0, pkg_parent)
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _worker_sys_path(run_dir: Path) -> list[str]:
    """This process's ``sys.path`` for a worker: relative entries made absolute (the worker's cwd is the
    run folder), the run folder and what is inside it left out: a stage writes there, and a package it
    planted was imported by every later worker (round 16 A10)."""
    inside = os.path.realpath(run_dir)
    out = []
    for p in sys.path:
        full = os.path.realpath(p or os.curdir)
        if full == inside or full.startswith(inside.rstrip(os.sep) + os.sep):
            continue
        out.append(p if os.path.isabs(p) else os.path.abspath(p or os.curdir))
    return out


# the signals this process's own handlers received (``note_signal``: the CLI's SIGINT / SIGTERM / SIGHUP
# handlers call it before they raise): an interrupt of the runner's real classes raised where none was
# received is not the runner's stop but the code's own (round 14 R2 follow-up: an adapter raising the
# real ``Terminated`` was taken for the runner's termination; ``impls.stops``)
RECEIVED: list[int] = []


def note_signal(signum: int) -> None:
    """Say that this process received ``signum`` (its handler runs): ``received()`` is then true."""
    RECEIVED.append(signum)


def received_count() -> int:
    """How many interrupting signals this process's own handlers received so far (``note_signal``)."""
    return len(RECEIVED)


def received() -> bool:
    """Did this process's own handler receive an interrupting signal (``note_signal``)?"""
    return bool(RECEIVED)


class Terminated(KeyboardInterrupt):
    """A SIGTERM / SIGHUP / SIGQUIT the CLI turned into an interrupt: stops the run like Ctrl-C does, and
    the stage's reason names the signal (a cancelled CI job is not a Ctrl-C)."""

    def __init__(self, signum: int):
        super().__init__(signal_name(-signum))
        self.signum = signum


def interrupt_reason(e: BaseException | None) -> str:
    if isinstance(e, Terminated):
        return f"interrupted ({signal_name(-e.signum)}): the stage was stopped"
    return "interrupted (Ctrl-C): the stage was stopped"


def _stop_stage(proc: subprocess.Popen, cookie: str, grace_s: float = KILL_GRACE_S,
                watch: _LogWatch | None = None) -> KeyboardInterrupt | None:
    """Kill the stage as a tree (``_worker.kill_processes``: the worker, its descendants, its
    process group and anything carrying its cookie, ``setsid`` grandchildren included), SIGTERM
    first. A Ctrl-C (or SIGTERM) during the grace period goes straight to SIGKILL, and so does a log
    passing its limit (``watch``: a SIGTERM-ignoring stage printing through the grace wrote 2.4 GB past
    a 20 MiB limit, round 24 B24-3). Returns whether an interrupt came: the first such interrupt (the
    caller re-raises it unless it is already handling an interrupt)."""
    interrupted = None
    done = threading.Event()
    guard = None
    if watch is not None and grace_s > 0:
        def flood_guard() -> None:
            while not done.wait(POLL_S):
                if watch.over() is not None:
                    try:
                        kill_processes(cookie, proc, 0.0)
                    except Exception:  # noqa: BLE001 - the grace's own SIGKILL still comes
                        pass
                    return
        guard = threading.Thread(target=flood_guard, name=f"nsa-run-log-guard-{proc.pid}", daemon=True)
        try:
            guard.start()
        except RuntimeError:
            guard = None
    try:
        while True:
            try:
                kill_processes(cookie, proc, 0.0 if interrupted else grace_s)
                break
            except KeyboardInterrupt as e:
                interrupted = interrupted or e
    finally:
        done.set()
        if guard is not None:
            guard.join()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    return interrupted


def _describe_exit(rc: int) -> str:
    return describe_exit(rc)


def _runner_names_left(run_dir: Path, stage: str) -> str | None:
    """What the stage left at the run folder's ``logs`` / ``history`` (a file, a FIFO, a symlink: names nsa-run keeps
    for its own folders) or at a name in ``logs/`` (a FIFO, a folder, a symlink, a hard link where a stage's log
    goes), moved aside to ``<name>.left-by-<stage>`` beside it (nothing deleted), in words; None when all is as it
    should be (round 27 B27-6: a ``history`` file left by a PASSing stage made the next stage ERROR "log cannot be
    written" and every later ``stage`` into the folder exit 2, the culprit never named; round 28 U28-6: the same for
    ``logs/<other>.log``)."""
    from nsa_runner.artifacts import entry_kind

    said = []

    def aside(p: Path, shown: str, what: str, why: str) -> None:
        try:
            dest, n = p.with_name(f"{p.name}.left-by-{stage}"), 1
            while os.path.lexists(dest):
                n += 1
                dest = p.with_name(f"{p.name}.left-by-{stage}.{n}")
            os.rename(p, dest)
            said.append(f"the stage left {shown} in the run folder as {what} ({why}): moved to "
                        f"{dest.relative_to(run_dir)}")
        except OSError as e:
            said.append(f"the stage left {shown} in the run folder as {what}, and it could not be moved aside "
                        f"({e.strerror or e})")

    for name in ("logs", "history"):
        p = Path(run_dir) / name
        try:
            if not (p.is_symlink() or (os.path.lexists(p) and not p.is_dir())):
                continue
            what = "a symlink" if p.is_symlink() else entry_kind(os.lstat(p).st_mode)
        except OSError:
            continue
        aside(p, name, what, "a name nsa-run keeps for its own folder")
    logs = Path(run_dir) / "logs"
    try:
        entries = list(os.scandir(logs)) if logs.is_dir() and not logs.is_symlink() else []
    except OSError:
        entries = []
    for e in entries[:10000]:  # (a stage's logs only: a few)
        try:
            if ".left-by-" in e.name:
                continue
            st = e.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                continue
            what = ("a symlink" if e.is_symlink() else "a hard link (a second name of another file)"
                    if stat.S_ISREG(st.st_mode) else entry_kind(st.st_mode))  # (round 29 B29-2: a hard link)
        except OSError:
            continue
        aside(Path(e.path), f"logs/{e.name}", what, "where nsa-run writes a stage's log")
    return "; ".join(said) or None


def _check_files(run_dir: Path, result: StageResult,
                 allowed: tuple[str, ...] = ()) -> tuple[list[str], list[tuple[str, str]], list[str], list[str]]:
    """Declared files that are (missing; refused, with why: outside the run folder or not a plain relative
    name; shared names of the run folder; written as a folder but no folder: ``a.csv/``).

    A declared file must stay inside the run folder (no ``..``, no absolute path, no symlink
    out) and not be a shared name such as ``logs`` (``artifacts.declared_file_problem``): a
    rerun moves a stage's declared files into history.
    """
    missing, refused, shared, folder = [], [], [], []
    for rel in result.files:
        if not_text(rel):
            continue  # named by _apply_result (not_text), never looked up
        problem = declared_file_problem(run_dir, rel, allowed)
        if problem is None:
            if not os.path.lexists(Path(run_dir) / rel):
                missing.append(rel)
        elif problem[0] == "shared":
            shared.append(rel)
        elif problem[0] == "folder":
            folder.append(rel)
        else:
            refused.append((str(rel), problem[1]))
    return missing, refused, shared, folder


def not_text(rel: object) -> bool:
    """A declared name that is not UTF-8 text (a lone surrogate: a file named with the byte 0xff,
    ``a\\udcff.txt``): every report, link and summary of it would break or name another file."""
    if not isinstance(rel, str):
        return False
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def shown_name(rel: str) -> str:
    """``rel`` with what is not UTF-8 text escaped (``a\\udcff.txt``), for a reason or a message."""
    return rel.encode("utf-8", "backslashreplace").decode("utf-8")


SPARE_ENV = "NSA_RUN_SPARE_WORKER"

# what a stage may write to its log (MiB; the cap on a declared file too): past it the stage is stopped,
# ERROR, and its log cut there (a stage printing in a loop filled the disk under the run folder)
LOG_LIMIT_ENV, LOG_LIMIT_MIB = "NSA_RUN_LOG_LIMIT_MIB", 256.0
LOG_LIMIT_MOST_MIB = 2**20


def log_limit() -> int:
    """The bytes a stage may write to its log: ``NSA_RUN_LOG_LIMIT_MIB`` (MiB, default 256). Raises
    ValueError naming the variable and its value for anything but a positive number (the CLI refuses it
    up front in one line, exit 2)."""
    from nsa_runner._text import env_positive, env_said

    mib = env_positive(LOG_LIMIT_ENV, LOG_LIMIT_MIB, "MiB")
    if mib < 1:  # a log needs room for nsa-run's own lines (its header): 1e-300 was a 1-byte limit, every stage
        # ERROR on that header (round 24 U24-1, round 25 U25-7)
        raise ValueError(f"{env_said(LOG_LIMIT_ENV, os.environ.get(LOG_LIMIT_ENV, ''))} is below 1 MiB: a stage's "
                         "log needs room for nsa-run's own lines")
    if mib > LOG_LIMIT_MOST_MIB:  # (1e308 MiB overflowed to inf in bytes, round 24 B24-1; taken as 1 TiB without a
        # word until round 32 U32-3)
        raise ValueError(f"{env_said(LOG_LIMIT_ENV, os.environ.get(LOG_LIMIT_ENV, ''))} is above "
                         f"{LOG_LIMIT_MOST_MIB} MiB (1 TiB): no log is meant to grow that big")
    return int(mib * 2**20)


class _LogWatch:
    """How much a stage wrote to its log, looked at on a descriptor of its own (a stage that renames or
    removes the log's name still writes to this file)."""

    def __init__(self, log_fd: int, rel: str):
        try:
            self.limit = log_limit()
        except ValueError:  # a value the CLI did not refuse first (the API): the default
            self.limit = int(LOG_LIMIT_MIB * 2**20)
        self.rel = rel
        self.fd = os.dup(log_fd)
        self.start = os.fstat(self.fd).st_size  # a log appended to (the stage's earlier lines) counts from here

    def over(self) -> str | None:
        """The stage's ERROR reason once its log has grown past the limit, else None."""
        try:
            grown = os.fstat(self.fd).st_size - self.start
        except OSError:
            return None
        if grown <= self.limit:
            return None
        return (f"its log passed {self.limit / 2**20:g} MiB ({self.rel}): nsa-run stopped the stage and cut the "
                "log there")

    def cut(self) -> None:
        """The log cut at the limit, a last line saying so (what a stopped stage wrote after it is dropped)."""
        try:
            os.ftruncate(self.fd, self.start + self.limit)
            os.write(self.fd, f"\n[nsa-run: this log was cut at {self.limit / 2**20:g} MiB "
                              f"({LOG_LIMIT_ENV}); the stage was stopped]\n".encode())
        except OSError:  # a full disk: the stage is ERROR all the same
            pass

    def close(self) -> None:
        os.close(self.fd)


# a stage's clock starts when its worker begins it (the ``started`` file beside its job); until then a
# spare may still be importing: at most this long on top of the stage's timeout
PRELOAD_GRACE_S = 120.0


def spare_on() -> bool:
    """Whether stages' processes are started ahead as spares (``NSA_RUN_SPARE_WORKER``: unset or blank
    is on; 1/true/yes/on and 0/false/no/off, any case). Raises ValueError naming the variable and (the
    start of) its value for anything else (round 14 U4: ``false`` / ``off`` / ``no`` left the spare on,
    only ``0`` turned it off): the CLI refuses it in one line, exit 2, as NSA_RUN_LOCK_TIMEOUT."""
    from nsa_runner._text import env_switch

    return env_switch(SPARE_ENV, True)


def _spare_for(entry: StageEntry) -> bool:
    """Whether ``entry``'s process is started ahead as a spare: on unless ``NSA_RUN_SPARE_WORKER`` says
    off (``spare_on``; a value the CLI did not refuse first counts as off here, never as on), for a stage
    that loaded and does not say ``preload = False`` (a plugin's odd value: no spare)."""
    try:
        on = spare_on()
    except ValueError:
        on = False
    return on and entry.stage is not None and getattr(entry.stage, "preload", True) is True


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_fd_path, _empty = fd_path, empty_folder  # (artifacts: discovery's folder uses them too)


def _remove_marker_last(path: str) -> None:
    """Remove nsa-run's temp folder ``path`` (links in it unlinked, never followed), its ownership marker
    (``artifacts.OWNED_MARKER``) last: a removal cut short (the runner killed) leaves a folder
    ``clean_stale`` still knows as nsa-run's. ``shutil.rmtree`` took the marker among the first of a
    stage's 30 000 files, was cut short by a signal, and the rest stayed in the temp folder for good
    (round 16 A8). Never raises."""
    try:
        with os.scandir(path) as it:
            entries = [e for e in it if e.name != OWNED_MARKER]
    except OSError:
        entries = []
    for e in entries:
        try:
            if e.is_dir(follow_symlinks=False):
                shutil.rmtree(e.path, ignore_errors=True)
            else:
                os.unlink(e.path)
        except OSError:
            pass
    shutil.rmtree(path, ignore_errors=True)  # the marker, then the folder


def _started_at(folder: TempFolder, launched: float) -> float:
    """When the stage began, as its worker's "started" marker says (``time.monotonic()``, the same clock in
    every process): the runner's poll sees the marker up to ``POLL_S`` later. Now, when the marker says
    nothing usable (not a number, before the worker's launch or after now: the stage's own code may have
    written it; a time within that span only moves the stage's start within its own worker's life)."""
    now = time.monotonic()
    try:
        said = float(folder.read(STARTED)[:64].decode("ascii"))
    except (OSError, ValueError, UnicodeDecodeError):
        return now
    return said if launched <= said <= now else now


class _TempFolder(TempFolder):
    """A stage's temp folder (``artifacts.TempFolder``), its marker removed last (``_remove_marker_last``)."""

    def close(self) -> None:
        if self.fd < 0:  # closed already
            return
        if self.problem() is not None:  # moved or replaced by the stage: emptied through its descriptor
            super().close()
            return
        try:
            _remove_marker_last(self.path)
        finally:
            fd, self.fd = self.fd, -1  # forgotten before it is closed: never closed twice (round 19 A19-R1)
            os.close(fd)


class _UntilRecorded:
    """The runner's interrupts (``manifest.INTERRUPTS``) held from a stage's end until its record is
    written (``manifest._Deferred``), across ``run_one`` (the result read and checked, the temp folder
    removed) and ``execute`` (the spare that ran it closed, the record). A signal there cut the steps in
    two: the stage went unrecorded (a finished PASS / FAIL too), a rerun was not put back, the temp
    folder was left without its marker (round 16 A8). ``end``: what came meanwhile is delivered (the
    run's interrupt, once the record is there) or, for a run stopping already, only noted."""

    def __init__(self) -> None:
        self._held: _Deferred | None = None

    def begin(self) -> None:
        if self._held is None:
            self._held = _Deferred().start()

    def end(self, deliver: bool = True) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.end(deliver)
RESULT = "result.json"  # the worker's result, beside its job (``_worker.main``)


def _running(pid: int) -> bool:
    """Whether process ``pid`` is alive and running: not stopped (SIGSTOP), held by a tracer, a zombie
    or gone."""
    if _proc_state(pid) not in ("R", "S", "D", "I"):  # T stopped, t traced, Z / X ended, "" gone
        return False
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"TracerPid:"):
                    return int(line.split()[1]) == 0
    except (OSError, ValueError, IndexError):  # not Linux: the state above is what there is
        pass
    return True


class _Spare:
    """A stage worker started ahead of its stage (the default; ``NSA_RUN_SPARE_WORKER=0`` turns it
    off; issue 13): it imports torch, triton (and FA-4: ``_worker._preloads``) while the previous stage
    runs, then ``hand`` gives it the next stage's job and log (``_worker --spare``). Its own cookie
    and session, like any worker; it dies with the runner (PR_SET_PDEATHSIG) and ends when its
    socket closes unused (``close``)."""

    def __init__(self, device: str, run_dir: Path, flash: bool = False, fla: bool = False):
        self.cookie = uuid.uuid4().hex
        self.tmp: str | None = None
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.proc: subprocess.Popen | None = None
        # what the preload prints, kept open by the runner: the spare reads it back through the runner's
        # descriptor (``_fd_path``), never through its name, which a running stage may replace by a symlink
        # (an outside file was copied into the next stage's log) or a FIFO (the spare hung on it, and the
        # next stage "did not begin within 125s"): round 14 A BR-3b/c
        self.pre_fd: int | None = None
        try:  # a temp folder out of space or inodes: no spare (it only saves time; round 13 A-B3)
            self.tmp = tempfile.mkdtemp(prefix=f"nsa-run-spare-{os.getpid()}-")
            mark_owned(self.tmp)
            self.preload_log = Path(self.tmp) / "preload.log"
            self.pre_fd = os.open(self.preload_log, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
            self.proc = hold_pid(subprocess.Popen(
                python_m("nsa_runner._worker", "--spare", str(child.fileno()),
                         *(["flash"] if flash else []), *(["fla"] if fla else [])),
                stdin=subprocess.DEVNULL, stdout=self.pre_fd, stderr=subprocess.STDOUT, cwd=run_dir,
                env=_child_env(device, self.cookie), start_new_session=True, pass_fds=(child.fileno(),)))
        except OSError:
            self.close()
        finally:
            child.close()

    def hand(self, job: Path, result: Path, log_fd: int, cwd: Path) -> subprocess.Popen | None:
        """Give this worker its stage; None when it cannot take one (it ended, the socket broke, or it is
        not running: stopped, traced; then it is ended and the stage gets a fresh worker)."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        if not _running(self.proc.pid):
            # a stage may SIGSTOP (or trace) the spare meant for the next one: handed the job, it never
            # began, and the next stage ended TIMEOUT "did not begin within 123s" (round 16 A5)
            self.close()
            return None
        job_msg = {"job": str(job), "result": str(result), "cwd": str(cwd)}
        preload = _fd_path(self.pre_fd) if self.pre_fd is not None else None
        if preload is not None:  # else the preload's output is not copied (never read through its name)
            job_msg["preload_log"] = preload
        msg = json.dumps(job_msg).encode()
        try:
            socket.send_fds(self.sock, [msg], [log_fd])
        except OSError:
            return None
        self.sock.close()
        proc, self.proc = self.proc, None  # the stage's process now: run_one ends it
        return proc

    def close(self) -> None:
        """End an unused spare (nothing of it left running) and remove its folder."""
        self.sock.close()
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                kill_processes(self.cookie, proc, 0.0)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        fd, self.pre_fd = self.pre_fd, None  # forgotten before it is closed (``Watchdog.done``: round 19 A19-R1)
        if fd is not None:
            os.close(fd)
        if self.tmp is not None:
            _remove_marker_last(self.tmp)  # a symlink put in its place: left (never followed)


class _Reaper:
    """The tree kill of a stage that finished (its result is written). The stage's processes are
    frozen first, here (``_worker.freeze_processes``: SIGSTOP, looked at again until nothing new
    shows), before the runner reads the result, checks the declared files and starts the next stage:
    nothing of the stage acts any more (round 15 A1: a TERM-ignoring helper, alive for the 3 s grace
    beside the next stage, forged that stage's result.json, turned a declared file into a folder after
    the check, overwrote the next stage's file). The stage's watchdog is checked (and replaced when the
    stage killed it: round 15 A3) once the tree is frozen and while it is killed.

    The kill itself (SIGKILL at once: the stage has returned, a frozen process has nothing to clean
    up; the worker's children drained while it lives, ``StageTree.drain``) runs in a thread of the
    runner: the worker's exit (the kernel freeing its CUDA context: ~0.6 s per stage on the H100, 4.9 s
    of a quick oneshot's 66 s, cProfile 2026-11-26) overlaps the next stage instead of holding it up.
    Then the stage's watchdog is ended, so a runner killed meanwhile still leaves nothing running.
    ``execute`` waits for each reaper (``join``: on an Event the thread sets at its very end, waited for
    again after an interrupt, round 15 A5) before the stage after next and before it returns, whatever
    way it leaves: nothing outlives the run."""

    def __init__(self, proc: subprocess.Popen, cookie: str, guard, folder: _TempFolder | None = None):
        self._proc, self._cookie, self._guard = proc, cookie, guard
        # the stage's temp folder: removed once nothing of the stage can write there AND the runner has read the
        # result in it (``release``): the thread's removal raced the runner's read of result.json (a record
        # "exited with code 0 without a result" whenever the runner was slower than the kill, seen once the
        # runner asked a fresh torch import first, round 23 B23-5)
        self._folder = folder
        self._released = threading.Event()
        self._threaded = True
        self._finished = threading.Event()
        self._tree = None
        try:
            self._tree = freeze_processes(cookie, proc)
        except Exception:  # noqa: BLE001 - psutil missing or broken: the thread kills as before
            pass
        self._watch()
        self._thread = threading.Thread(target=self._run, name=f"nsa-run-reaper-{proc.pid}", daemon=False)
        try:
            self._thread.start()
        except RuntimeError:  # no thread can be started: the kill is done here, before the next stage
            self._threaded = False  # (the folder is then removed at ``release``)
            self._run()

    def _watch(self) -> None:
        """The stage's watchdog alive (a killed one replaced, a stopped one continued) while its
        processes are still there: a runner killed meanwhile leaves nothing running."""
        try:
            if self._guard is not None:
                self._guard.alive()
        except Exception:  # noqa: BLE001 - no new watchdog can be started: the parent-death signal remains
            pass

    def _run(self) -> None:
        try:
            if self._tree is not None:
                self._tree.kill(0.0, term=False)
                self._watch()
                self._proc.wait(timeout=10)
            else:
                _stop_stage(self._proc, self._cookie)
        except Exception:  # noqa: BLE001 - never a thread's traceback on the terminal: the worker is killed plainly
            try:
                self._proc.kill()
                self._proc.wait(timeout=10)
            except Exception:  # noqa: BLE001 - gone already
                pass
        finally:
            try:
                _done(self._guard)
            except Exception:  # noqa: BLE001 - Watchdog.done kills it itself when it does not end
                pass
            try:
                if self._folder is not None and self._threaded:
                    self._released.wait()
                    self._folder.close()
            finally:
                self._finished.set()

    def release(self) -> None:
        """The runner is done with the stage's temp folder (its result read and recorded): it may go. Called on
        every way out of ``_run_one`` once the stage was handed over (its ``finally``)."""
        self._released.set()
        if not self._threaded and self._folder is not None:
            self._folder.close()

    def join(self) -> None:
        """Wait until the stage's processes and its watchdog are gone. An interrupt (Ctrl-C, SIGTERM)
        meanwhile is raised once the reaper has finished, never before: ``Thread.join`` interrupted by
        a signal handler marks the thread stopped (CPython 3.11, bpo-45274), and nothing waited for it
        any more (the runner exited 130 with the stage's processes alive)."""
        interrupted: KeyboardInterrupt | None = None
        # the wait itself runs with the runner's interrupts held (noted, raised after): a handler raising inside the
        # Event's Condition left its lock broken, and the next wait raised "RuntimeError: release unlocked lock"
        # (round 48 B48a-2: a burst right after a rerun's PASS, exit 2, a lock token file left)
        while True:
            try:
                held = _Deferred().start()
                break
            except KeyboardInterrupt as e:
                interrupted = interrupted or e
        try:
            while True:
                try:
                    if self._finished.wait(POLL_S):
                        break
                except KeyboardInterrupt as e:  # (a handler of another signal that raises: waited for all the same)
                    interrupted = interrupted or e
        finally:
            try:
                held.end()
            except KeyboardInterrupt as e:
                interrupted = interrupted or e
        if interrupted is not None:
            raise interrupted


def _join_all(reapers: list[_Reaper], quiet: bool = False) -> None:
    """Wait for every reaper (an interrupt meanwhile is raised once all are done; ``quiet``: dropped,
    the run is leaving already)."""
    interrupted: KeyboardInterrupt | None = None
    while reapers:
        try:
            reapers[0].join()
        except KeyboardInterrupt as e:
            interrupted = interrupted or e
        reapers.pop(0)
    if interrupted is not None and not quiet:
        raise interrupted


def run_one(entry: StageEntry, ctx: RunContext, machine: Machine, timeout_s: float,
            observer: Observer | None = None, spare: _Spare | None = None,
            reapers: list[_Reaper] | None = None, until: _UntilRecorded | None = None) -> StageRecord:
    """Run (or skip, or record as broken) one stage; never raises except KeyboardInterrupt.

    Calls ``observer.on_start`` / ``on_tick`` while a stage process runs; ``execute`` calls
    ``on_finish`` for every record, including skips and broken plugins. ``reapers`` (execute's):
    a stage that finished with its result is killed as a tree in a ``_Reaper`` appended there (the
    caller joins it); without it, before this returns. ``until`` (execute's): begun at the stage's
    end, whatever way it ends (the runner's interrupts held from there), ended by the caller once the
    stage is recorded; without it, ended here (an interrupt meanwhile: ``_FinishedThenInterrupted``).
    """
    if until is not None:
        return _run_one(entry, ctx, machine, timeout_s, observer, spare, reapers, until)
    own = _UntilRecorded()
    try:
        rec = _run_one(entry, ctx, machine, timeout_s, observer, spare, reapers, own)
    except BaseException:
        own.end(deliver=False)
        raise
    try:
        own.end()
    except KeyboardInterrupt as e:
        raise _FinishedThenInterrupted(rec, e) from None
    return rec


def _run_one(entry: StageEntry, ctx: RunContext, machine: Machine, timeout_s: float, observer: Observer | None,
             spare: _Spare | None, reapers: list[_Reaper] | None, until: _UntilRecorded) -> StageRecord:
    observer = observer or Observer()
    rec = StageRecord(entry.name, entry.order, entry.source, Status.ERROR, started=now_iso(),
                      options=dict(ctx.options), device=ctx.device, profile=ctx.profile)
    if entry.stage is None:  # a plugin that failed to load: the run fails, the CLI goes on
        rec.reason, rec.traceback = clipped(entry.error, REASON_CHARS), clipped(entry.traceback, TRACEBACK_CHARS)
        rec.finished = now_iso()
        until.begin()
        return rec
    missing = unmet(entry.stage, machine)
    if missing:
        rec.status = Status.SKIP
        rec.reason, rec.hint = skip_reason(entry.stage, machine)
        rec.strict_fail = strict_counts_skip(entry.stage, machine, by_requirement=True)
        rec.finished = now_iso()
        until.begin()
        return rec

    run_dir = ctx.dir
    log_rel = f"logs/{entry.name}.log"
    log_path = run_dir / log_rel
    try:  # never through a symlink, a FIFO or a hard link (a stage may plant one for a later stage's log)
        log_fd = open_log(run_dir, log_rel)
    except (UnsafeFileError, OSError) as e:
        rec.reason = f"the stage's log cannot be written: {getattr(e, 'strerror', None) or e}"
        rec.finished = now_iso()
        until.begin()
        return rec
    rec.log = log_rel
    waiting = _Deferred().start()  # (before the "started" line: round 48 B48a-4; see below)
    try:
        observer.on_start(entry)
    except BaseException:  # (an observer's error: the hold ends, held interrupts delivered over it, no log leaked)
        os.close(log_fd)
        waiting.end()
        raise
    t0 = time.monotonic()  # the worker's start; t_stage: the stage's (its timeout and duration count from there)
    t_stage: float | None = None
    cookie = uuid.uuid4().hex
    # From the stage's "started" line to the stage's stop, the runner's interrupts are noted, never raised where
    # they land: the wait looks at them each tick and raises the first through its own handler, at a point inside its
    # ``try`` with the others still held; the interrupt path below ends the hold inside its retry loop. Raised where
    # they landed, a signal escaped bare at every point found so far (stop 40's CI, stop 41's stress and round 47):
    # between the temp folder's making and its marker (the folder left behind, unmarked, never cleaned), between the
    # worker's start and the wait (the runner descheduled under load while its stage started and signalled it), at
    # the interrupt path's very first instruction (the second of a burst), and as the stop ended (the third). The
    # stage was then left to die with the runner or unrecorded, and a rerun's earlier result put back with no record
    # of the attempt ("no stage was running"). Before the worker runs, an error delivers what was held (no stage).
    # the runner's pid in the name: a folder whose runner is gone is removed at the next start
    try:
        folder = _TempFolder(prefix=f"nsa-run-{entry.name}-{os.getpid()}-")
    except BaseException as e:
        os.close(log_fd)
        waiting.end()
        if isinstance(e, OSError):
            raise _temp_error(e, entry.name) from None
        raise
    handed = False  # the stage (and its temp folder) went to a reaper
    reaper: _Reaper | None = None
    watch: _LogWatch | None = None
    try:
        try:
            try:
                watch = _LogWatch(log_fd, log_rel)
            except OSError as e:
                os.close(log_fd)
                raise _temp_error(e, entry.name) from None
            tmp = folder.path
            job, result_path = Path(folder.name("job.pkl")), Path(folder.name(RESULT))  # the worker's names
            try:
                mark_owned(tmp)
                folder.write("job.pkl", pickle.dumps({"spec": entry.value, "ctx": ctx.to_dict(),
                                                      "sys_path": _worker_sys_path(run_dir),
                                                      "timeout_s": timeout_s}))
            except OSError as e:
                os.close(log_fd)
                raise _temp_error(e, entry.name) from None
            proc = spare.hand(job, result_path, log_fd, run_dir) if spare is not None else None
            if proc is not None:  # a spare worker (imports done) takes the stage
                cookie = spare.cookie
                os.close(log_fd)
            env = _child_env(ctx.device, cookie)
            if proc is None:
                with os.fdopen(log_fd, "ab") as log:
                    proc = hold_pid(subprocess.Popen(
                        python_m("nsa_runner._worker", str(job), str(result_path)),
                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                        cwd=run_dir, env=env, start_new_session=True,
                    ))
        except BaseException:  # no worker: an interrupt held meanwhile is delivered (over this error)
            waiting.end()
            raise
        guard = None
        timed_out = False
        meddled: str | None = None  # what the stage did to its temp folder (round 14 A BR-3)
        flooded: str | None = None  # its log past the limit (``_LogWatch``)
        noted: list[int] = []  # signals that came while the finished stage was handed to its reaper
        try:
            guard = _Watchdog(cookie, proc.pid, tmp, env)
            # the worker writes its result, then lingers while anything the stage started lives
            # (``_worker.linger``): the result is the end of the stage, the tree is killed below
            while proc.poll() is None and not folder.exists(RESULT):
                if waiting.held:  # an interrupt: raised here, to the interrupt path below (the others still held)
                    _raise_held(waiting)
                meddled = folder.problem()
                if meddled is not None:  # the stage's ERROR: it is stopped now
                    break
                flooded = watch.over()
                if flooded is not None:  # the stage's ERROR: it is stopped now
                    break
                if t_stage is None and folder.exists(STARTED):  # the stage itself has begun
                    t_stage = _started_at(folder, t0)
                elapsed = time.monotonic() - (t_stage if t_stage is not None else t0)
                if elapsed > timeout_s + (0.0 if t_stage is not None else PRELOAD_GRACE_S):
                    timed_out = True
                    break
                observer.on_tick(entry, elapsed, _last_line(log_path))
                guard.alive()  # a killed watchdog is replaced, a stopped one continued: a runner death stays watched
                time.sleep(POLL_S)
            meddled = meddled or folder.problem()
            flooded = flooded or watch.over()
            # finished or timed out: nothing the stage started outlives it (setsid grandchildren too)
            if (not timed_out and meddled is None and flooded is None and reapers is not None
                    and folder.exists(RESULT)):
                with signals_deferred(deliver=False) as held:  # handed over whole; a signal is noted (late)
                    reaper = _Reaper(proc, cookie, guard, folder)
                    reapers.append(reaper)
                    guard = None  # the watchdog is the reaper's to end, once the tree is gone
                    # and the temp folder too: its descriptor's number, free again, would lead the
                    # lingering keeper's ``/proc/<runner>/fd/<n>/result.json`` into the next stage's
                    handed = True
                noted = list(held)
            else:  # (an interrupt meanwhile is held: it does not hurry this kill, it is raised once it is done)
                if waiting.held:
                    _raise_held(waiting)
                late = _stop_stage(proc, cookie, watch=watch)
                if waiting.held:
                    _raise_held(waiting)
                if late is not None:
                    raise late
        except KeyboardInterrupt as e:
            # a result already there when the interrupt came (looked at before anything is killed: a killed
            # worker writes one too) is the stage's own end: the stage had finished (its worker may have
            # exited before this loop's poll saw it) and is recorded from that result below, then the run
            # stops (it was recorded "interrupted": round 16 A8e).
            # the run is stopping: a second Ctrl-C / TERM only hurries the kill (SIGKILL at once),
            # never cuts this stage's stop and record short (it escaped as a bare KeyboardInterrupt:
            # the temp folder went while the worker still wrote, the stage unrecorded, round 13 A-B4).
            # Signals sent together (SIGTERM + SIGINT + SIGHUP) are raised one by one, the next at the first
            # Python call after the last: that is the look at the result just below, so it is already inside
            # a ``try`` (round 20 A20-R1 b: the second escaped from there, the stage left to its watchdog, a
            # rerun not put back; the first statement of this clause must call nothing outside a ``try``)
            hurry = False
            while True:
                try:
                    hurry = hurry or bool(waiting.held)  # more signals of a burst than the one raised
                    waiting.end(deliver=False)  # from here a signal raises, and only hurries the kill
                    waiting.held.clear()  # (acted on: never delivered again after the stop)
                    ended = not timed_out and meddled is None and folder.exists(RESULT) \
                        and folder.problem() is None
                    break
                except KeyboardInterrupt:
                    hurry = True
            while True:
                try:
                    _stop_stage(proc, cookie, 0.0 if hurry else KILL_GRACE_S, watch=watch)
                    _done(guard)
                    # from here to the record (the temp folder's removal, execute's) a signal is noted only. Begun
                    # inside this ``try``: begun after it, a signal that came as the stop ended (the third of
                    # three, late under load) raised at this call, a bare KeyboardInterrupt left run_one and the
                    # run's generic path put the earlier result back with no record of the attempt (stop 40's CI)
                    until.begin()
                    break
                except KeyboardInterrupt:
                    hurry = True
            if not ended:
                rec.duration_s = time.monotonic() - (t_stage if t_stage is not None else t0)
                rec.reason = interrupt_reason(e)
                cut = watch.over()
                if cut is not None:  # it printed past the limit while it was stopped: cut all the same
                    watch.cut()
                    rec.reason += f"; {cut}"
                rec.interrupted = True
                rec.log_tail = tail(log_path)
                rec.finished = now_iso()
                raise _Interrupted(rec) from None
            guard, interrupt = None, e  # ended above
        except BaseException:  # anything else escaping the wait (e.g. a test timeout): no orphaned stage
            waiting.end(deliver=False)
            _stop_stage(proc, cookie)
            _done(guard)
            raise
        else:
            interrupt = None
        late = interrupt
        try:  # a signal while the stage was handed over: the stage's result is still recorded (below)
            waiting.end()  # (held since: raised here, the run's interrupt once the stage is recorded)
            for sig in dict.fromkeys(noted):
                signal.raise_signal(sig)  # the runner's handler: an interrupt
        except KeyboardInterrupt as e:
            late = late or e
        # a stage's ERROR out of ``import torch``: what the import says in a fresh process, asked here, after the
        # stage ended (off its clock: round 23 B23-5, asked in the worker it turned a quick ERROR into TIMEOUT) and
        # before the record's deferral below (a Ctrl-C stops the asking)
        torch_said, asked_s = None, 0.0
        if late is None and not timed_out and meddled is None and flooded is None:
            t_ask = time.monotonic()
            try:
                torch_said = _torch_said(folder, ctx.device)
            except KeyboardInterrupt as e:
                late = e
            asked_s = time.monotonic() - t_ask
        try:  # an interrupt while the watchdog ends: the stage's result is still recorded (below)
            _done(guard)
        except KeyboardInterrupt as e:
            late = late or e
            try:  # the watchdog is reaped either way (Watchdog.done kills it on an interrupt)
                _done(guard)
            except KeyboardInterrupt:
                pass
        # the stage has ended: from here to its record (the result read and checked, the temp folder
        # removed, execute's spare closed and record written) the runner's interrupts wait (round 16 A8).
        # A signal at this very call is the run's interrupt after the record, like one a moment later (it
        # escaped bare: the finished stage unrecorded, as the interrupted one in stop 40's CI)
        while True:
            try:
                until.begin()
                break
            except KeyboardInterrupt as e:
                late = late or e
        rec.duration_s = time.monotonic() - (t_stage if t_stage is not None else t0) - asked_s
        late_flood = watch.over() if flooded is None else None  # past the limit while it was being stopped
        if flooded is not None or late_flood is not None:  # stopped: its log cut before its tail is read
            watch.cut()
        rec.finished = now_iso()
        if timed_out:
            rec.status = Status.TIMEOUT
            rec.reason = (f"no result after {timeout_s:g}s: the stage's processes were killed" if t_stage is not None
                          else f"the stage did not begin within {timeout_s + PRELOAD_GRACE_S:g}s (its worker was "
                               "still starting): its processes were killed")
            last = _last_line(log_path)
            if visible(last) and not last.startswith("[nsa-run: this log was cut"):  # where it was: the case /
                # implementation it ran last (round 17 B U-5); never nsa-run's own note (round 25 U25-5)
                rec.reason += f"; the last line of its log: {last}"
            # and its last progress line ("# ..."), where the code it ran printed after it (round 18 B U-c)
            progress = [ln.strip() for ln in tail(log_path, lines=200, max_bytes=65536).splitlines()
                        if ln.startswith("# ") and not ln.startswith("# nsa-run stage ")]
            if progress and progress[-1][-120:] != last.strip():
                rec.reason += f" (its last progress line: {progress[-1][-120:]})"
            rec.log_tail = tail(log_path)
        elif folder.exists(RESULT):
            try:
                data = folder.read(RESULT)
            except (OSError, UnsafeFileError) as e:
                rec.reason = f"unreadable stage result: {getattr(e, 'strerror', None) or e}"
                rec.log_tail = tail(log_path)
            else:
                _apply_result(rec, result_path, run_dir, machine, log_path, data=data)
                if torch_said is not None and rec.status is Status.ERROR:
                    rec.reason = clipped(f"{rec.reason} (import torch in a fresh process: {torch_said[0]})",
                                         REASON_CHARS)
                    rec.hint = clipped(torch_said[1], REASON_CHARS)
        elif meddled is None:
            rec.reason = _describe_exit(proc.returncode)
            if _folder_full(tmp):  # the worker could not write its result there (round 13 A-B3)
                rec.reason = TempFolderFull(tempfile.gettempdir(), None, f"stage {entry.name}'s result could not be "
                                            "written there").strerror
            rec.log_tail = tail(log_path)
        if meddled is not None:  # the runner's own folder: never the stage's to touch
            if rec.status is not Status.TIMEOUT:
                rec.status = Status.ERROR
            rec.reason = f"{rec.reason}; {meddled}" if visible(rec.reason) else meddled
            rec.log_tail = rec.log_tail or tail(log_path)
        if late_flood is not None:  # (a timed-out stage printing through the stop's grace: B24-3)
            if rec.status is not Status.TIMEOUT:
                rec.status = Status.ERROR
            rec.reason = f"{rec.reason}; {late_flood}" if visible(rec.reason) else late_flood
            rec.log_tail = tail(log_path)
        if flooded is not None:  # what the stopped stage's end says (killed, a result) is not its reason
            if rec.status is not Status.TIMEOUT:
                rec.status = Status.ERROR
            rec.reason = flooded if meddled is None else f"{flooded}; {meddled}"
            rec.hint = (f"have the stage print less (its files hold data, its log progress), or raise "
                        f"{LOG_LIMIT_ENV} (now {watch.limit / 2**20:g})")
            rec.log_tail = tail(log_path)
        left_there = _runner_names_left(run_dir, entry.name)
        if left_there is not None:  # the folder stays usable for every later command; the stage is named
            if rec.status is not Status.TIMEOUT:
                rec.status = Status.ERROR
            rec.reason = f"{rec.reason}; {left_there}" if visible(rec.reason) else left_there
    finally:
        waiting.end(deliver=False)  # (ended on every way here already; the hold never outlives the stage)
        until.begin()  # every way out: the removal is never cut in two (its marker last: _remove_marker_last)
        if watch is not None:
            watch.close()
        if reaper is not None:  # the reaper removes it once the stage's tree is gone (never waits forever)
            reaper.release()
        elif not handed:
            folder.close()
    if late is not None:
        raise _FinishedThenInterrupted(rec, late)
    return rec


def _torch_said(folder: _TempFolder, device: str) -> tuple[str, str] | None:
    """For a stage whose worker says its ERROR came out of ``import torch`` (``_worker._out_of_torch_import``):
    what ``python -m nsa_runner._torch_check --say`` (the CLI's own check, one JSON line) says in a fresh process,
    as (problem, hint); None when the stage did not say so, the import works there, or no answer came (within the
    discovery limit and a margin)."""
    try:
        payload = json.loads(folder.read(RESULT))
        if not (isinstance(payload, dict) and payload.get("torch_import_failed") is True):
            return None
    except (OSError, UnsafeFileError, ValueError):
        return None
    try:
        limit = discovery_timeout()
    except ValueError:
        limit = 60.0
    try:
        r = subprocess.run(python_m("nsa_runner._torch_check", "--say"), stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, errors="backslashreplace", env=_child_env(device),
                           timeout=limit + 30.0, start_new_session=True)
        facts = json.loads((r.stdout.strip().splitlines() or ["{}"])[-1])
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    if not (isinstance(facts, dict) and isinstance(facts.get("problem"), str) and visible(facts["problem"])):
        return None
    return facts["problem"], str(facts.get("hint") or "")


def _temp_error(e: OSError, stage: str) -> OSError:
    """A stage's temp files that cannot be made: a full temp folder (space, inodes, quota) is named as
    such (``TempFolderFull``: the runner's one line names the folder, never "the disk is full" of the
    run folder), anything else is raised as it is."""
    if _temp_full(e):
        return TempFolderFull(tempfile.gettempdir(), e, f"the files of stage {stage} cannot be made there")
    return e


def _raise_held(waiting: _Deferred) -> None:
    """The first interrupt noted while a stage ran, raised here by the handler it would have met (Ctrl-C's
    KeyboardInterrupt, the runner's ``Terminated``), the hold still on: the others stay noted (they hurry the
    stop). A handler that does not raise (embedded use) has handled it; one that is no function (a default
    action) is delivered as it would have been, the hold then on again."""
    for sig in list(dict.fromkeys(waiting.held)):
        handler = waiting.previous.get(sig)
        waiting.held.remove(sig)
        if callable(handler):
            handler(sig, None)
        else:
            waiting.end(deliver=False)
            signal.raise_signal(sig)
            waiting.start()


def _done(guard: _Watchdog | None) -> None:
    if guard is not None:
        guard.done()


class _Interrupted(KeyboardInterrupt):
    def __init__(self, record: StageRecord):
        super().__init__(record.name)
        self.record = record


class _FinishedThenInterrupted(KeyboardInterrupt):
    """The stage had finished (its record is complete) when an interrupt came: the record counts as
    the stage's result, then the run stops as interrupted."""

    def __init__(self, record: StageRecord, interrupt: KeyboardInterrupt):
        super().__init__(record.name)
        self.record = record
        self.interrupt = interrupt


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during ``execute``: ``records`` holds every stage recorded so far."""

    def __init__(self, records: list[StageRecord], waiting: list[str] | None = None):
        super().__init__("interrupted")
        self.records = records
        self.waiting = waiting or []  # ``history/...`` of earlier results that could not be put back yet


def _wrong_result_types(d: Any) -> list[str]:
    """What is of the wrong type in a stage result dict (what ``StageResult.to_dict`` wrote)."""
    if not isinstance(d, dict):
        return [f"expected an object, got {type(d).__name__}"]
    wrong = []
    for key in ("reason", "hint"):
        if not isinstance(d.get(key, ""), str):
            wrong.append(f"{key} must be a string, got {type(d[key]).__name__}")
    files = d.get("files", [])
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        got = type(files).__name__ if not isinstance(files, list) else "a list holding " + ", ".join(
            sorted({type(f).__name__ for f in files if not isinstance(f, str)}))
        wrong.append(f"files must be a list of strings, got {got}")
    if not isinstance(d.get("metrics", {}), dict):
        wrong.append(f"metrics must be an object, got {type(d['metrics']).__name__}")
    return wrong


def _apply_result(rec: StageRecord, result_path: Path, run_dir: Path, machine: Machine,
                  log_path: Path, data: bytes | None = None) -> None:
    """``rec`` from the worker's result: ``data`` (read by the runner) or else ``result_path``'s."""
    import json

    try:
        payload = json.loads(data if data is not None else result_path.read_text())
        wrong = _wrong_result_types(payload["result"])
        result = StageResult.from_dict(payload["result"]) if not wrong else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        rec.reason = f"unreadable stage result: {e}"
        rec.log_tail = tail(log_path)
        return
    if result is None:  # a plugin's StageResult with fields of the wrong type: the stage broke
        rec.reason = f"the stage's StageResult is malformed: {'; '.join(wrong)}"
        tb = payload.get("traceback")
        rec.traceback = clipped(tb, TRACEBACK_CHARS) if isinstance(tb, str) else ""
        rec.log_tail = tail(log_path)
        return
    rec.status, rec.reason = result.status, clipped(result.reason, REASON_CHARS)
    rec.hint = clipped(result.hint, REASON_CHARS)
    rec.files = list(result.files)
    rec.metrics, dropped_metrics = bounded_metrics(dict(result.metrics))
    rec.traceback = clipped(payload.get("traceback") or "", TRACEBACK_CHARS)
    if dropped_metrics:  # the stage's data, too much to record: the stage broke
        if rec.status in (Status.PASS, Status.SKIP):
            rec.status = Status.ERROR
        rec.reason = f"{rec.reason}; {dropped_metrics}" if visible(rec.reason) else dropped_metrics
    if rec.status is Status.SKIP and not visible(rec.reason):  # DESIGN §5: a skip always says why
        rec.status = Status.ERROR
        rec.reason = ("the stage returned SKIP without a reason: a skip must say why it could not run here "
                      "(and the fix, as hint=)")
        rec.log_tail = tail(log_path)
    elif rec.status is Status.ERROR and not visible(rec.reason):  # an ERROR says that the stage broke
        # (a FAIL keeps its status and its empty reason: DESIGN §5 asks a reason of a SKIP only, and a
        # FAIL is the stage's verdict "a check did not hold", not a stage that broke; its log tail is kept)
        rec.reason = ("the stage returned ERROR without a reason (its log has what it printed)")
        rec.log_tail = tail(log_path)
    if rec.status is Status.SKIP:
        rec.strict_fail = strict_counts_skip(None, machine, by_requirement=False)
    missing, refused, shared, folder = _check_files(run_dir, result, stage_allowed(rec.name,
                                                                                    rec.source == "built-in"))
    bad_text = [f for f in rec.files if not_text(f)]
    if missing or refused or shared or folder or bad_text:
        # a set: 20 000 missing names were quadratic
        dropped = set(missing) | {r for r, _ in refused} | set(shared) | set(folder) | set(bad_text)
        rec.files = [f for f in rec.files if isinstance(f, str) and f not in dropped]
        notes = []
        if bad_text:
            notes.append(f"declared file name(s) not UTF-8 text, not recorded: {', '.join(map(shown_name, bad_text))}")
        if missing:
            notes.append(f"declared file(s) missing: {', '.join(missing)}")
        if refused:  # each with why (round 27 U27-7: sub/../a.txt, inside and there, was called "missing or outside")
            notes.append(f"declared name(s) refused: {'; '.join(why for _, why in refused)}")
        if shared:
            notes.append(f"declared file(s) shared by every stage, not this stage's own: {', '.join(shared)}")
        if folder:
            notes.append(f"declared name(s) written as a folder (a trailing '/') that name no folder: "
                         f"{', '.join(folder)} (a file is declared without the '/')")
        note = "; ".join(notes)
        if rec.status in (Status.PASS, Status.SKIP):
            rec.status = Status.ERROR
        rec.reason = f"{rec.reason}; {note}" if rec.reason else note
    if rec.status is Status.PASS:
        _check_case_tables(rec, run_dir)
    if rec.status.failed and not rec.log_tail:
        rec.log_tail = tail(log_path)


def _check_case_tables(rec: StageRecord, run_dir: Path) -> None:
    """A PASS whose own declared case table has failed rows is the stage's FAIL, naming them: the stage's
    verdict and its evidence disagreed, and every output but junit.xml (a testcase per row) showed it green
    (round 17 U-1)."""
    from nsa_runner._text import clip
    from nsa_runner.results import FAILED
    from nsa_runner.results.junit import case_rows

    failed = [(case, st) for case, st, _ in case_rows(run_dir, {"files": rec.files}) if st in FAILED]
    if failed:
        first = ", ".join(f"{clip(shown_name(case), 100)} {st}" for case, st in failed[:3])
        note = (f"the stage returned PASS but {len(failed)} row(s) of its declared case table(s) did not pass "
                f"({first}{', ...' if len(failed) > 3 else ''})")
        rec.status = Status.FAIL
        rec.reason = f"{rec.reason}; {note}" if visible(rec.reason) else note


def _folders_above(name: str) -> list[str]:
    """The folders ``name`` (normalised) lies in, as ``artifacts.names_overlap`` sees them: ``a`` and
    ``a/b`` for ``a/b/c``."""
    return [name[:i] for i, ch in enumerate(name) if ch == os.sep and i > 0]


def _not_anothers(rec: StageRecord, manifest: RunManifest) -> None:
    """A stage never declares a file another stage of the run has recorded as its own (a rerun
    moves a stage's declared files to history): such names are dropped, the stage is ERROR."""
    try:
        stages = load_manifest(manifest.path)["stages"]
    except (ManifestError, OSError):
        stages = manifest.stages
    owner = {os.path.normpath(f): s["name"] for s in stages if s.get("name") != rec.name
             for f in s.get("files") or [] if isinstance(f, str)}
    # the same name, or one inside the other (a folder `sub` and another stage's `sub/f.txt`), as
    # written or through a link among the folders (`self/a.txt` with self -> . is stage a's a.txt):
    # looked up by name, each form's parent folders and each other name's parent folders (round 13
    # B-B14: every pair compared took 74 s for 8000 + 8000 files)
    exact: dict[str, int] = {}  # a form of another stage's name -> the first such name (its index)
    above: dict[str, int] = {}  # a folder above such a form -> the first such name
    names = list(owner)
    for i, o in enumerate(names):
        for y in entry_forms(manifest.dir, o):
            exact.setdefault(y, i)
            for folder in _folders_above(y):
                above.setdefault(folder, i)
    taken = {}
    for f in rec.files:
        if isinstance(f, str) and owner:
            hits = []
            for x in entry_forms(manifest.dir, f):
                hits += [exact[k] for k in (x, *_folders_above(x)) if k in exact]
                if x in above:
                    hits.append(above[x])
            if hits:
                taken[f] = names[min(hits)]
    if not taken:
        return
    rec.files = [f for f in rec.files if f not in taken]
    note = ("declared file(s) of another stage, not this stage's own: "
            + ", ".join(f"{f} (stage {owner[o]}: {o})" if os.path.normpath(f) != o else f"{f} (stage {owner[o]})"
                        for f, o in taken.items()))
    if rec.status in (Status.PASS, Status.SKIP):
        rec.status = Status.ERROR
    rec.reason = f"{rec.reason}; {note}" if rec.reason else note


@dataclass
class Settings:
    device: str
    profile: str
    timeout_s: float | None = None  # None: each stage's own timeout_s
    strict: bool = False


def execute(entries: Iterable[tuple[StageEntry, dict[str, Any]]], manifest: RunManifest,
            settings: Settings, machine: Machine, observer: Observer | None = None,
            records: list[StageRecord] | None = None) -> list[StageRecord]:
    """Run the stages in the given order, writing the manifest after each one.

    On Ctrl-C (KeyboardInterrupt) the running stage is stopped and recorded as ERROR
    "interrupted", the manifest is finished with ``interrupted: true`` (so it stays valid), and
    ``RunInterrupted`` (a KeyboardInterrupt carrying the records so far) is raised; also for one
    that comes after the last record (while the manifest is finished). Each record is appended to
    ``records`` (when given) as soon as it is made: a caller still has them when an interrupt
    lands between this function's end and its own next step.
    """
    observer = observer or Observer()
    records = [] if records is None else records
    run_id = manifest.data["run_id"]
    entries = list(entries)
    # the stages this run means to run, noted by the command that starts the run (a later ``stage X`` into it
    # keeps the oneshot's): an interrupted run's report names those with no record (``interrupted_line``)
    def plan(data: dict) -> None:
        if "planned" not in data and not data.get("stages"):
            data["planned"] = [e.name for e, _ in entries]

    manifest.update(plan)
    ready: _Spare | None = None  # the next stage's worker, its imports done while this stage runs
    reapers: list[_Reaper] = []  # finished stages' tree kills, each joined before the stage after next
    try:
        for i, (entry, options) in enumerate(entries):
            while len(reapers) > 1:  # the stage before the last one: its processes are gone before this one starts
                reapers[0].join()  # (waits to the end even when interrupted)
                reapers.pop(0)
            ctx = RunContext(manifest.dir, settings.device, settings.profile, options, run_id, entry.name)
            timeout = settings.timeout_s
            if timeout is None:
                timeout = float(entry.stage.timeout_s) if entry.stage is not None else 60.0
            try:  # marked as running in the manifest: a concurrent `stage X` into this folder is refused, and
                # a result of X another nsa-run recorded here meanwhile is set aside as a rerun's (round 23 B23-7)
                moved = manifest.mark_running(entry.name)
            except (ManifestError, OSError) as e:  # busy, or that result could not be set aside (all or nothing)
                reason = str(e) if isinstance(e, ManifestBusy) else (
                    f"the {entry.name} result another nsa-run recorded in this folder could not be set aside "
                    f"({getattr(e, 'strerror', None) or e}): not run again here")
                rec = StageRecord(entry.name, entry.order, entry.source, Status.ERROR, reason=reason,
                                  started=now_iso(), finished=now_iso(), device=settings.device,
                                  profile=settings.profile)
                records.append(rec)  # the other nsa-run's record stays the manifest's
                observer.on_finish(entry, rec)
                continue
            if moved is not None:
                observer.on_set_aside(entry, moved)
            this, ready = ready, None
            spare_next = i + 1 < len(entries) and _spare_for(entries[i + 1][0])
            if spare_next:
                nxt = entries[i + 1][0].stage
                ready = _Spare(settings.device, manifest.dir, flash=getattr(nxt, "preload_flash", False) is True,
                               fla=getattr(nxt, "preload_fla", False) is True)
            # the runner's interrupts held from the stage's end (run_one begins it, whatever way the stage
            # ends) until its record is written: the spare's close and the record are never cut off it
            until = _UntilRecorded()
            try:
                try:
                    rec = run_one(entry, ctx, machine, timeout, observer, spare=this, reapers=reapers, until=until)
                except _FinishedThenInterrupted as done:
                    rec = done.record
                    with signals_deferred(deliver=False):  # stopping already: a second signal cuts nothing
                        _not_anothers(rec, manifest)
                        records.append(rec)
                        manifest.record(rec)  # cut to an ERROR there when too large: rec then says so too
                        observer.on_finish(entry, rec)
                    raise done.interrupt from None
                except _Interrupted as intr:
                    rec = intr.record
                    with signals_deferred(deliver=False):
                        records.append(rec)
                        # a rerun that did not finish puts the earlier result back (its attempt goes to history)
                        if not manifest.restore(rec.name, rec.to_dict()):
                            manifest.record(rec)  # cut to an ERROR there when too large: rec then says so too
                        observer.on_finish(entry, rec)
                    raise
                finally:
                    until.begin()  # (begun already, unless run_one left on an error of its own)
                    if this is not None and this.proc is not None and ready is None and spare_next:
                        ready, this = this, None  # not taken (a skip): the next stage's
                    if this is not None:
                        this.close()  # taken: its folder; not taken: ended
                with signals_deferred():  # the stage's record is made whole
                    _not_anothers(rec, manifest)
                    records.append(rec)
                    manifest.record(rec)  # cut to an ERROR there when too large: rec then says so too
                    observer.on_finish(entry, rec)
            except BaseException:
                until.end(deliver=False)  # the run is stopping (recorded above) or leaving on an error
                raise
            until.end()  # a signal since the stage's end lands now, after its record: the run's interrupt
        # inside the try: a signal while the manifest is finished (after the last record) is an
        # interrupt of the run like any other (it escaped as a bare KeyboardInterrupt: exit 130
        # without a word, the closing summaries never written); the last stages' kills are waited
        # for first (an interrupt meanwhile: the run's interrupt, once they are done)
        _join_all(reapers)
        manifest.finish()
    except KeyboardInterrupt as e:
        waiting: list[str] = []
        with signals_deferred(deliver=False):  # one more Ctrl-C while the run is finished: noted only
            if not isinstance(e, _Interrupted):  # (a stage stopped while it ran: its own put-back, ``restore``)
                # a rerun's earlier result set aside for a stage that never started (the interrupt came before it:
                # its claim, its spare worker) goes back; it stayed in history/ with its pending note, the run then
                # read "runner died" though it exited 130 (round 20 A A20-R1)
                waiting = _abandon(manifest)
            manifest.finish(interrupted=True)
        raise RunInterrupted(records, waiting) from None
    finally:
        if ready is not None:
            ready.close()
        # nothing of any stage outlives the run: waited for on every way out (a Ctrl-C meanwhile: noted
        # only, the run is leaving already)
        _join_all(reapers, quiet=True)
    return records


def _abandon(manifest: RunManifest) -> list[str]:
    """``manifest.abandon()`` for a run stopping on an interrupt, best effort: what cannot be put back now stays in
    ``pending`` (the next nsa-run into the folder puts it back) and is returned (``history/...``)."""
    try:
        return manifest.abandon()
    except (OSError, ManifestError):
        return []


def exit_code(records: list[StageRecord], strict: bool) -> int:
    """0 nothing failed; 1 something failed (or, with --strict, a skip this machine should run)."""
    if any(r.status.failed for r in records):
        return 1
    if strict and any(r.status is Status.SKIP and r.strict_fail for r in records):
        return 1
    return 0
