"""``manifest.json`` of one run folder (DESIGN §6), rewritten atomically after every stage.

``{"schema_version": 1, "run_id", "started", "finished", "argv", "host", "device", "profile",
"interrupted", "stages": [{"name", "status", "duration_s", "reason", "files", ...}, ...],
"history": [...]}``. ``history`` keeps the entries replaced when ``nsa-run stage X`` reruns a
stage in an existing run folder, with where its old files were moved.

Several nsa-run processes may write one manifest at once (``stage X`` and ``stage Y`` into one
run, ``stage X`` during a oneshot): every change is made under a file lock (``filelock``, the
hidden ``.manifest.lock`` of the run folder) on a fresh read of the file, so no record is lost.
Each change also writes ``.manifest.json.good``, the same bytes: a manifest.json that is not that copy
was written by something that did not hold the lock (a stage), and is kept aside and undone
(``RunManifest._read_on_disk``).

A rerun is transactional: ``set_aside`` moves the earlier result's files to ``history/`` but keeps
its entry in ``stages`` and notes the move in ``pending``; only ``record`` of the new result
retires it to ``history``. An interrupted rerun (``restore``) or one whose runner died
(``recover``, at the next ``open``) puts the earlier files and entry back.
"""

from __future__ import annotations

import copy
import errno
import fcntl
import hashlib
import json
import os
import platform
import re
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from nsa_runner import artifacts
from nsa_runner._text import env_seconds
from nsa_runner.artifacts import (
    MANIFEST_NAME,
    MANIFEST_SCHEMA_VERSION,
    ManifestError,
    UnsafeFileError,
    _runner_name,
    create_run_folder,
    declared_type_problem,
    entry_forms,
    file_kind,
    load_manifest,
    now_iso,
    owner_lock_held,
    pid_alive,
    process_started,
    read_limited,
    run_died_fact,
    runner_dirs_problem,
    stage_allowed,
    stage_owns,
    to_json_text,
    write_json,
)

LOCK_NAME = ".manifest.lock"
LOCK_TIMEOUT_S = 120.0  # a manifest change holds the lock for milliseconds; NSA_RUN_LOCK_TIMEOUT overrides
LOCK_TIMEOUT_ENV = "NSA_RUN_LOCK_TIMEOUT"
LOCK_NOTICE_S = 2.0  # after this long, say once what the runner waits for
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# what manifest.json may hold (round 14 B R8: a stage declaring 70 000 long file names made it 263 MiB,
# more than its own reader accepts, ``artifacts.MAX_READ_BYTES``: every later command refused the run
# folder). One stage's record takes at most RECORD_MAX_BYTES; a record never brings the manifest within
# ROOM_BYTES of the readers' limit (what the run's closing updates, later reruns' pending notes need);
# no write ever passes the limit itself (``ManifestTooLarge``, nothing written)
RECORD_MAX_BYTES = 16 << 20
ROOM_BYTES = 4 << 20
_CUT_TEXT = 1000  # a too-large record's text fields (reason, hint, ...) keep this many characters


class ManifestTooLarge(ManifestError):
    """A change that would make manifest.json larger than its readers accept: not written."""

    def __init__(self, message: str, size: int):
        super().__init__(message)
        self.size = size


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _cut(entry: dict, why: str) -> dict:
    """The record of a stage whose own record is too large for manifest.json: an ERROR saying so
    (what it was, how large, why), without its declared files, metrics, traceback or log tail."""
    files = entry.get("files") if isinstance(entry.get("files"), list) else []
    metrics = entry.get("metrics") if isinstance(entry.get("metrics"), dict) else {}
    was = f"{entry.get('status')}: {entry.get('reason') or ''}".strip().rstrip(":")
    if len(was) > 200:
        was = was[:200] + "..."
    reason = (f"the stage's record is too large for manifest.json ({why}; {len(files)} declared file "
              f"name(s), {len(metrics)} metric(s)): not recorded, its declared files stay in the run folder "
              f"unrecorded (it was {was})")
    out = {}
    for k, v in entry.items():
        if k in ("files", "metrics", "traceback", "log_tail", "strict_fail"):
            continue
        if isinstance(v, str) and k != "name" and len(v) > _CUT_TEXT:
            v = v[:_CUT_TEXT] + "..."
        elif isinstance(v, (dict, list)) and len(to_json_text(v)) > 64 * _CUT_TEXT:
            v = type(v)()
        out[k] = v
    out.update(status="ERROR", reason=reason, hint="declare fewer or shorter file names, or fewer metrics "
               "(one file can hold many rows)", files=[], metrics={})
    return out


def _as_recorded(obj: Any, entry: dict) -> None:
    """A stage record object (``executor.StageRecord``) made to say what its manifest entry says."""
    try:
        obj.status = type(obj.status)(entry["status"])
        obj.reason, obj.hint = entry["reason"], entry.get("hint", "")
        obj.files, obj.metrics = [], {}
        obj.traceback = obj.log_tail = ""
    except (AttributeError, ValueError, TypeError):
        pass


def _overwritten_entry(entry: dict, aside: str) -> dict:
    """The record of a stage that was running when manifest.json was overwritten (``_overwritten``): an
    ERROR saying so, what the stage itself said kept in its reason, its files and metrics kept."""
    was = f"{entry.get('status')}: {entry.get('reason') or ''}".strip().rstrip(":")
    if len(was) > 200:
        was = was[:200] + "..."
    return {**entry, "status": "ERROR",
            "reason": f"manifest.json was overwritten during this stage (what was there is kept as {aside}; "
                      f"the manifest was written again from nsa-run's records; the stage said {was})",
            "hint": f"a stage must not write manifest.json; look at {aside} and rerun the stage"}


_UNREADABLE_SHOWN = 20  # refused declared names a reason lists one by one (then how many more)


def _unreadable_refused(run_dir: Path, entry: dict) -> dict | None:
    """``entry`` without its declared names that lead to nothing the run's readers can read (a FIFO,
    a device, a socket, a regular file over ``artifacts.MAX_READ_BYTES``: ``declared_type_problem``,
    looked at by type and size, never opened), the stage's ERROR naming each and what it is (a FAIL,
    ERROR or TIMEOUT keeps its status, the note added); None when there is none. Such a name was
    recorded as written: the stage PASSed, report.html was not written and every later ``report`` /
    ``compare`` of the run exited 2 on it (round 15 A2)."""
    files = entry.get("files")
    if not isinstance(files, list) or not files:
        return None
    refused = {}
    for rel in files:
        if isinstance(rel, str) and rel not in refused:
            why = declared_type_problem(run_dir, rel)
            if why is not None:
                refused[rel] = why
    if not refused:
        return None
    whys = list(refused.values())
    shown = "; ".join(w if len(w) <= 600 else w[:600] + "..." for w in whys[:_UNREADABLE_SHOWN])
    if len(whys) > _UNREADABLE_SHOWN:
        shown += f"; and {len(whys) - _UNREADABLE_SHOWN} more"
    note = f"declared file(s) no reader of the run can read, not recorded: {shown}"
    out = {**entry, "files": [f for f in files if not (isinstance(f, str) and f in refused)]}
    if out.get("status") in ("PASS", "SKIP"):
        out["status"] = "ERROR"
        out.pop("strict_fail", None)
        if not out.get("hint"):
            out["hint"] = ("declare regular files (or folders) of at most "
                           f"{artifacts.MAX_READ_BYTES >> 20} MiB: a FIFO, device or socket is read by no report")
    reason = entry.get("reason") if isinstance(entry.get("reason"), str) else ""
    out["reason"] = f"{reason}; {note}" if reason.strip() else note
    return out


def _as_checked(obj: Any, entry: dict) -> None:
    """A stage record object made to say the status, reason, hint and files its manifest entry says."""
    _as_said(obj, entry)
    try:
        obj.files = list(entry["files"])
        if entry["status"] != "SKIP" and hasattr(obj, "strict_fail"):
            obj.strict_fail = False
    except (AttributeError, KeyError, TypeError):
        pass


def _as_said(obj: Any, entry: dict) -> None:
    """A stage record object made to say the status, reason and hint its manifest entry says."""
    try:
        obj.status = type(obj.status)(entry["status"])
        obj.reason, obj.hint = entry["reason"], entry.get("hint", "")
    except (AttributeError, ValueError, TypeError):
        pass


def lock_timeout() -> float:
    """Seconds a manifest change waits for the run folder's lock (``NSA_RUN_LOCK_TIMEOUT``, default
    120). Raises ValueError naming the variable when it is not a positive, finite number."""
    return env_seconds(LOCK_TIMEOUT_ENV, LOCK_TIMEOUT_S)


def lock_holders(path: Path) -> str:
    """Who holds the lock file ``path``, for people: ``pid 123 (flock x sleep 300)``. The kernel's
    lock table (/proc/locks) names the process that took the lock; when that one is gone (a
    child inherited the descriptor, e.g. ``flock FILE sleep``), the processes that have the file
    open are named instead. '' when nothing can be found (another host, no /proc)."""
    import psutil

    def show(p: psutil.Process) -> str:
        try:
            cmd = " ".join(p.cmdline()) or p.name()
        except psutil.Error:
            cmd = "?"
        cmd = _CONTROL.sub("?", cmd)  # one line: a command line may hold newlines or escape sequences
        return f"pid {p.pid} ({cmd[:120]})"

    try:
        st = os.stat(path)
    except OSError:
        return ""
    pids = []
    try:
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                if "->" in parts:  # a waiter, not a holder
                    continue
                dev_ino = next((x for x in parts if x.count(":") == 2), "")
                if dev_ino.rsplit(":", 1)[-1] == str(st.st_ino) and parts[4:5] and parts[4].isdigit():
                    pids.append(int(parts[4]))
    except (OSError, IndexError):
        pass
    found = []
    for pid in dict.fromkeys(pids):
        try:
            if pid != os.getpid():
                found.append(show(psutil.Process(pid)))
        except psutil.Error:
            pass
    if not found:
        for p in psutil.process_iter():
            try:
                if p.pid != os.getpid() and any(os.path.samefile(f.path, path) for f in p.open_files()
                                                if os.path.basename(f.path) == path.name):
                    found.append(show(p))
            except (psutil.Error, OSError):
                continue
    return ", ".join(found[:4])


def host_info() -> dict:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "cpu_count": os.cpu_count(),
    }


def _me() -> dict:
    return {"pid": os.getpid(), "pid_started": process_started(), "hostname": socket.gethostname()}


# the owner of a stage running in a run folder (``pending``) holds ``.manifest.lock.<token>`` there
# (flock, exclusive) for as long as it lives: the kernel lets go of it when the process dies, however
# it dies, whatever PID namespace or host name it has (round 14 A BR-2: a live rerun in another PID
# namespace was taken for dead by its pid and undone while it ran; a dead one under another host name
# counted as alive for good). Its name and inode are in the owner's note: ``_dead`` tries the lock
_OWNER_LOCKS: dict[str, int] = {}  # path -> descriptor holding the lock (this process's life)


def _owner_lock(dir: Path, token: str) -> dict:
    """``{"lock": name, "lock_ino": inode}`` of this process's lock in ``dir`` (made and locked on first
    use, held until ``_let_go``), or {} where none can be made: the owner is then judged by its pid."""
    path = os.path.join(dir, f"{LOCK_NAME}.{token}")
    fd = _OWNER_LOCKS.get(path)
    try:
        if fd is None:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0), 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                return {}
            _OWNER_LOCKS[path] = fd
        return {"lock": os.path.basename(path), "lock_ino": os.fstat(fd).st_ino}
    except OSError:
        return {}


def _let_go(dir: Path, token: str) -> None:
    """This process's owner lock in ``dir``: released and removed (its stages there are recorded)."""
    path = os.path.join(dir, f"{LOCK_NAME}.{token}")
    fd = _OWNER_LOCKS.pop(path, None)
    if fd is not None:
        try:
            os.unlink(path)
        except OSError:
            pass
        os.close(fd)


def _lock_held(dir: Path | None, owner: dict) -> bool | None:
    """Whether the owner lock ``owner`` names in ``dir`` is held (its process lives); None when that
    cannot be told (no lock noted, the file gone or replaced): the owner is judged by its pid then.
    (``artifacts.owner_lock_held``: ``report``'s runner-died / still-running lines ask the same.)"""
    return owner_lock_held(dir, owner)


def _drop_lock(dir: Path, owner: dict) -> None:
    """Remove the lock file of a dead owner (nothing holds it)."""
    if _lock_held(dir, owner) is False:
        try:
            os.unlink(os.path.join(dir, owner["lock"]))
        except OSError:
            pass


def _dead(owner: dict, dir: Path | None = None) -> bool:
    """Whether the process that wrote ``owner`` (``RunManifest._owner()``) is gone: its lock in the run
    folder ``dir`` is free; without one (an older nsa-run's note), only known on the same host, by pid."""
    held = _lock_held(dir, owner)
    if held is not None:
        return not held
    if owner.get("hostname") != socket.gethostname():
        return False
    return not pid_alive(owner.get("pid"), owner.get("pid_started"))


class UnsafeLockFile(OSError):
    """The lock file is not a file of its own (another name of it, a hard link, lies elsewhere)."""


def _lock_file_problem(st: os.stat_result) -> str | None:
    if not stat.S_ISREG(st.st_mode):
        return file_kind(st.st_mode)
    if st.st_nlink > 1:  # locking truncates the file: another name of it (a hard link) would lose its data
        return f"a hard link ({st.st_nlink} names: the same file is also named elsewhere)"
    return None


class _RunLock(FileLock):
    """``FileLock`` that never truncates a lock file with more than one name. filelock truncates the
    file once it holds the lock (``O_NOFOLLOW`` keeps a symlink out, not a hard link): a
    ``.manifest.lock`` hard-linked to a file outside the run folder lost that file's data. The
    file the descriptor holds is checked before that step (no race with the check before opening)."""

    def _finalize_locked_fd(self, fd: int) -> None:  # filelock >= 3.18: runs with the lock held
        try:
            problem = _lock_file_problem(os.fstat(fd))
        except OSError:
            problem = None  # filelock's own step reports it
        if problem is not None:
            try:
                import fcntl

                fcntl.flock(fd, fcntl.LOCK_UN)
            except (ImportError, OSError):
                pass
            mark = getattr(self, "_mark_descriptor_released", None)
            if mark is not None:
                mark()
            os.close(fd)
            raise UnsafeLockFile(0, problem, self.lock_file)
        super()._finalize_locked_fd(fd)


def _refuse_unsafe(path: Path, problem: str) -> ManifestError:
    return ManifestError(f"its lock file {path} is {problem}; nsa-run never locks (and so truncates) it: remove "
                         f"it (nsa-run makes a new one) and rerun")


# the user's interrupts: Ctrl-C, SIGTERM (a CI cancel), SIGHUP (a closed terminal), Ctrl-\ (SIGQUIT, a terminal key
# too: its default action killed the runner mid-rerun, the earlier result left set aside; round 27 U27-6)
INTERRUPTS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
LOCK_POLL_S = 0.05


def _unbroken(swap) -> None:
    """``swap()`` (handlers set one by one) with the interrupt signals blocked, so that no handler runs half-way.
    ``signal.signal`` runs the handlers of signals already pending: one that came as a swap began raised out of it
    with some handlers swapped and others not. Out of ``_Deferred.start`` that left SIGINT on the hold handler for
    good (the _Deferred lost, never ended); out of ``end``, the later signals; a Ctrl-C was then swallowed (found
    with stop 40's three-signals race). Blocked, a signal waits in the kernel and is handled as the block ends,
    by the handler then in place. Raises only where nothing is swapped yet (a signal pending before the block) or
    after the whole swap (one pending as it ends)."""
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None:  # not POSIX: as before
        swap()
        return
    old = mask(signal.SIG_BLOCK, INTERRUPTS)
    try:
        swap()
    finally:
        mask(signal.SIG_SETMASK, old)


class _Deferred:
    """Ctrl-C, SIGTERM and SIGHUP held from ``start`` to ``end``, then handed to the handlers that
    were there (in the order they came): an interrupt lands after, never inside. Nothing changes
    for a signal that is ignored, or outside the main thread (no handler runs there)."""

    def __init__(self):
        self.held: list[int] = []
        self.previous: dict = {}

    def _hold(self, signum, frame) -> None:
        self.held.append(signum)

    def start(self) -> _Deferred:
        if threading.current_thread() is threading.main_thread():
            def swap() -> None:
                for sig in INTERRUPTS:
                    if signal.getsignal(sig) not in (signal.SIG_IGN, None):
                        self.previous[sig] = signal.signal(sig, self._hold)
            try:
                _unbroken(swap)
            except ValueError:  # an embedding without signal support
                pass
        return self

    def end(self, deliver: bool = True) -> None:
        previous, self.previous = self.previous, {}

        def swap() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        _unbroken(swap)
        if deliver:
            held, self.held = list(dict.fromkeys(self.held)), []
            for sig in held:
                signal.raise_signal(sig)  # the handler that was there: raises, notes or ends, as it would have


@contextmanager
def signals_deferred(deliver: bool = True):
    """Ctrl-C, SIGTERM and SIGHUP are held while the block runs and delivered once it ends
    (``_Deferred``): for short steps that must not be cut in two. ``deliver=False``: they are only
    noted (the list yielded), for a run already stopping on an interrupt (a second Ctrl-C must not
    cut its records)."""
    d = _Deferred().start()
    try:
        yield d.held
    finally:
        d.end(deliver)


def _acquire(lock: FileLock, timeout: float, path: Path, keep: bool = False) -> _Deferred | None:
    """``lock.acquire`` within ``timeout`` seconds (Timeout after), signal-safe: each try of the lock
    runs with signals deferred, the waits between tries stay interruptible. An interrupt that landed
    inside filelock's acquire, between the ``flock`` and the moment it keeps the descriptor, left the
    lock held by this process and known to nothing: every later change of the manifest waited for
    its own process, then "held by another process ... end that process" (round 13 A-B6). The
    caller releases the lock (``_release``) on every way out once this was called. ``keep``: the
    signals stay deferred once the lock is taken (returned: ``end()`` it after the release).

    A lock file someone replaced (a folder, a FIFO, a link to a device, a hard link to another
    file) is named: ManifestError "its lock file PATH is a folder ...: remove it". Any other OSError
    (a full disk) keeps its errno and carries the lock file's path."""
    try:
        st = os.lstat(path)
    except OSError:
        st = None
    if st is not None and not stat.S_ISLNK(st.st_mode):  # a symlink: named below (O_NOFOLLOW)
        problem = _lock_file_problem(st)
        if problem is not None:
            raise _refuse_unsafe(path, problem)
    deadline = time.monotonic() + max(timeout, 0.0)
    while True:
        deferred = _Deferred().start()
        try:
            lock.acquire(blocking=False)
        except Timeout:
            deferred.end()
        except UnsafeLockFile as e:
            deferred.end()
            raise _refuse_unsafe(path, e.strerror) from None
        except OSError as e:
            deferred.end()
            what = e.strerror or str(e)
            if path.is_symlink() or (os.path.lexists(path) and not path.is_file()):
                kind = ("a link" if path.is_symlink() else "a folder" if path.is_dir()
                        else "not a regular file")
                raise ManifestError(f"its lock file {path} is {kind} ({what}); remove it "
                                    f"(nsa-run makes a new one) and rerun") from None
            raise OSError(e.errno, f"{what} ({path})", str(path)) from None
        except BaseException:
            deferred.end()
            raise
        else:
            if keep:
                return deferred
            deferred.end()
            return None
        left = deadline - time.monotonic()
        if left <= 0:
            raise Timeout(str(path))
        time.sleep(min(LOCK_POLL_S, left))


def _release(lock: FileLock) -> None:
    """Give the lock back whole (signals deferred: one landing inside filelock's release could leave
    the descriptor locked), however often it was taken; nothing when it is not held."""
    with signals_deferred():
        if lock.is_locked:
            lock.release(force=True)


class SetAsideIncomplete(OSError):
    """A failed ``set_aside`` could not put every file it moved back (the message names them)."""


class ManifestBusy(ManifestError):
    """Another nsa-run holds the manifest lock for too long, or runs the same stage in this folder."""



def _move_entry(src: Path, target: Path) -> None:
    """Move the entry ``src`` itself (a file, a folder, a link never followed, a FIFO...) to ``target``, both
    inside the run folder: by a rename only, whole or not at all. ``shutil.move`` fell back to a copy and a
    delete when the rename was refused (a read-only or immutable folder), and its delete removed part of the
    earlier result in place before it failed (round 49 B49b-1)."""
    try:
        os.rename(src, target)
    except OSError as e:
        raise OSError(e.errno, f"{e.strerror or e}: {src} cannot be moved to {target} (moved by a rename only, "
                               "nothing was copied or removed)") from None


class _Reserved:
    """A temp file next to ``path``, made before it is needed: writing ``path`` through it later
    (atomically, as ``write_json``) takes no new inode."""

    def __init__(self, path: Path):
        self.path = path
        fd, self.tmp = tempfile.mkstemp(prefix=f".{MANIFEST_NAME}.", suffix=".tmp", dir=path.parent)
        self.f = os.fdopen(fd, "wb")

    def write(self, data: dict) -> None:
        self.write_bytes(to_json_text(data).encode("utf-8"))

    def write_bytes(self, text: bytes) -> None:
        self.fill(text)
        self.commit()

    def fill(self, text: bytes) -> None:
        f = self.f
        f.seek(0)
        f.truncate()
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
        os.chmod(self.tmp, 0o644)

    def commit(self) -> None:
        os.replace(self.tmp, self.path)
        self.tmp = None

    def close(self) -> None:
        try:
            self.f.close()
        except OSError:
            pass
        if self.tmp is not None:
            try:
                os.unlink(self.tmp)
            except OSError:
                pass
            self.tmp = None


def _disk_full(e: OSError) -> bool:
    return e.errno in (errno.ENOSPC, errno.EDQUOT)


# The last manifest written under the run folder's lock, byte for byte: every change writes it just
# before manifest.json (``_put_pair``). A stage (plugin code, the run folder its cwd) can write
# manifest.json; a manifest.json that is not this copy was written by something that did not hold the
# lock: a stage that turned an earlier FAIL into PASS or dropped a record as valid JSON (round 16 A3),
# put a folder there (A4), or wrote garbage while another nsa-run recorded a stage into the folder
# (A7: rewritten from the process's own stale copy, that record was lost). The next change under the
# lock keeps what is there aside and puts this copy back: every writer's records, none of the stage's.
GOOD_NAME = f".{MANIFEST_NAME}.good"
# in every manifest written under the lock: {"n": how many writes so far, "over": digest of the
# manifest.json bytes the write replaced}: a writer killed between its two renames left the good
# copy one write ahead of manifest.json (its "over" is manifest.json's digest: taken, nobody blamed)
SEAL_KEY = "written"
_ASIDE_NUMBERED = 999  # manifest.json.corrupt-1 .. -999 tried first, then random names


def _digest(text: bytes) -> str:
    return hashlib.sha256(text).hexdigest()[:32]


def _seal_n(data: dict) -> int:
    seal = data.get(SEAL_KEY)
    n = seal.get("n") if isinstance(seal, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0


def _exact(path: Path) -> tuple[bytes, dict]:
    """The bytes of the manifest file ``path`` and what they hold (checked as ``load_manifest`` checks),
    one version of it. FileNotFoundError when nothing is there; ManifestError when it is no regular
    file (a link, a folder, a FIFO: never followed nor opened), cannot be read or holds no manifest."""
    for _ in range(3):
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            what = "a symlink" if stat.S_ISLNK(st.st_mode) else file_kind(st.st_mode)
            raise ManifestError(f"{path}: is {what}, not a regular file")
        try:
            before = read_limited(path)
            data = load_manifest(path)
            after = read_limited(path)
        except FileNotFoundError:
            raise ManifestError(f"{path}: removed while it was read") from None
        except (OSError, UnsafeFileError) as e:
            raise ManifestError(f"{path}: cannot read: {e}") from None
        if before == after:
            return before, dict(data)
    raise ManifestError(f"{path}: changed while it was read")


def _prepared(dir: Path, text: bytes) -> str:
    """A temp file in ``dir`` holding ``text`` (written, synced), ready for an atomic rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{MANIFEST_NAME}.", suffix=".tmp", dir=dir)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return tmp


def _clear_good(dir: Path) -> None:
    """A folder at the good copy's name (no rename replaces one) moved aside; best effort."""
    good = Path(dir) / GOOD_NAME
    try:
        if stat.S_ISDIR(os.lstat(good).st_mode):
            os.rename(good, Path(dir) / f"{GOOD_NAME}-{uuid.uuid4().hex[:12]}.aside")
    except OSError:
        pass


def _put_pair(dir: Path, data: dict, reserved: tuple[_Reserved, _Reserved] | None = None) -> None:
    """``data`` written as the good copy (``GOOD_NAME``), then as manifest.json, each atomically. When the
    second write fails (a full disk), the good copy is made manifest.json's again (a hard link: no new
    data block), so that nothing changed; a kill between the two leaves the good copy one write ahead,
    which the next change takes (``RunManifest._read_on_disk``). ``reserved``: (good's, manifest's)
    temp files made earlier (``_Reserved``): both filled, then both renamed."""
    dir = Path(dir)
    _clear_good(dir)
    if reserved is not None:
        text = to_json_text(data).encode("utf-8")
        good, man = reserved
        good.fill(text)
        man.fill(text)
        good.commit()
        man.commit()
        return
    write_json(dir / GOOD_NAME, data)
    try:
        write_json(dir / MANIFEST_NAME, data)
    except BaseException:
        tmp = dir / f".{MANIFEST_NAME}.{uuid.uuid4().hex[:12]}.tmp"
        try:
            os.link(dir / MANIFEST_NAME, tmp, follow_symlinks=False)
            os.replace(tmp, dir / GOOD_NAME)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        raise


def _resolves_under(path: Path, root: Path) -> bool:
    """``path``, links followed, is ``root`` or inside it (links followed too)."""
    try:
        return path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):  # a link loop
        return False


def _busy(name: str, dir: Path, note: dict, then: str) -> str:
    """Why stage ``name`` is not run: the live note ``note`` of manifest.json's pending. A note whose owner names no
    process (hand-edited, or written by something else) is said as such, never as "nsa-run pid None" (round 50
    U50b-1): its owner cannot be checked, so it counts as running."""
    from nsa_runner._text import shown

    owner = note.get("owner") if isinstance(note.get("owner"), dict) else {}
    pid = owner.get("pid")
    if isinstance(pid, int) and not isinstance(pid, bool):
        return f"stage {name} is already running in {dir} (nsa-run pid {pid}); {then}"
    return (f"stage {name} is noted as running in {dir}/manifest.json's pending by an owner that names no process "
            f"(owner {shown(str(note.get('owner')), 120)}); if no nsa-run is running there, remove that note")


class HistoryNotOwn(ManifestError):
    """The run folder's ``history`` (or a folder in it a rerun moves from or to) is not a real folder
    of the run folder: a link (e.g. one a rerun's attempt made to a folder outside), or no folder.
    Nothing is moved from or to it."""


def _real_folders(root: Path, rel: str | os.PathLike) -> tuple[str | None, bool]:
    """Walk ``root``/``rel`` one name at a time with ``os.lstat`` (no link followed): (why a name on
    the way is not a real folder, or None; whether the whole path exists)."""
    here = root
    for part in Path(rel).parts:
        here = here / part
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            return None, False
        if stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(here)
            except OSError:
                target = "?"
            return f"{here} is a symlink (to {target}), not a folder of the run folder's own history", True
        if not stat.S_ISDIR(st.st_mode):
            what = "a file" if stat.S_ISREG(st.st_mode) else file_kind(st.st_mode)
            return f"{here} is {what}, not a folder", True
    return None, True


def _ancestors(name: str):
    """The folders ``name`` (a normalised relative name) lies in, innermost first."""
    i = name.rfind(os.sep)
    while i > 0:
        name = name[:i]
        yield name
        i = name.rfind(os.sep)


class _Taken:
    """The names the other stages' entries list, each in its ``entry_forms``, indexed so that whether a
    name overlaps one of them (the same entry, or one inside the other: ``entries_overlap``) is a few
    look-ups (comparing every pair of two stages' names was quadratic: 3000 + 3000 files took minutes)."""

    def __init__(self, run_dir: Path, others):
        self.exact: dict[str, str] = {}
        self.holds: dict[str, str] = {}  # a folder some other name lies inside -> that name
        for o in others:
            for f in entry_forms(run_dir, o):
                f = os.path.normpath(f)
                self.exact.setdefault(f, o)
                for a in _ancestors(f):
                    self.holds.setdefault(a, o)

    def __bool__(self) -> bool:
        return bool(self.exact)

    def hit(self, forms) -> str | None:
        """The other stage's name that ``forms`` (one name's ``entry_forms``) overlaps, or None."""
        for x in forms:
            x = os.path.normpath(x)
            o = self.exact.get(x) or self.holds.get(x)
            if o is None:
                o = next((self.exact[a] for a in _ancestors(x) if a in self.exact), None)
            if o is not None:
                return o
        return None


class RunManifest:
    """The manifest of one run folder. Every change goes through ``update`` (lock, re-read, write)."""

    def __init__(self, dir: Path, data: dict):
        self.dir = Path(dir).resolve()  # absolute: stages run with it as cwd and get it as ctx.dir
        self.data = data
        self.token = uuid.uuid4().hex[:12]  # this process's updates / pending entries
        # a stage this process was running when manifest.json was overwritten -> the name it was kept as
        self._overwrote: dict[str, str] = {}
        # the manifest as this process last found or wrote it (one edited by hand before it looked is
        # taken as found), and the digest of manifest.json's bytes as it last read or wrote them
        self._seen = copy.deepcopy(dict(data)) if isinstance(data, dict) else None
        self._on_disk: str | None = None
        # the stage entries this process recorded, as written: kept whatever the file says (``_keep_mine``)
        self._mine: dict[str, dict] = {}
        # (``abandon``) the stages whose earlier result is back in place while manifest.json's pending still
        # names its move (the manifest could not be written: a full disk)
        self.back_unnoted: list[str] = []

    @property
    def path(self) -> Path:
        return self.dir / MANIFEST_NAME

    def _owner(self) -> dict:
        """This process's note as the owner of a stage it runs here: who, and its lock (``_owner_lock``)."""
        return {**_me(), **_owner_lock(self.dir, self.token)}

    @contextmanager
    def _locked(self, whole: bool = False):
        """The run folder's lock. Held for milliseconds by a manifest change: when another process
        holds it longer, one line says which lock and who holds it, and after ``lock_timeout()``
        ManifestBusy names them (the CLI exits 2, nothing changed).

        Taking and giving back the lock is signal-safe (``_acquire``, ``_release``); ``whole``: a
        Ctrl-C / TERM / HUP from the moment the lock is taken until it is given back lands after
        (a change of the manifest is made whole or not at all: a stage's record was lost when the
        signal came as its lock was taken). The wait for another process's lock stays interruptible."""
        path = self.dir / LOCK_NAME
        try:
            total = lock_timeout()
        except ValueError as e:
            raise ManifestBusy(str(e)) from None
        lock = _RunLock(str(path))
        deferred = None
        try:  # released on every way out, an interrupt right after the lock was taken included
            try:
                deferred = _acquire(lock, min(LOCK_NOTICE_S, total), path, keep=whole)
            except Timeout:
                holder = lock_holders(path)
                self._say(f"waiting for the run folder's lock {path} (held by {holder or 'another process'}); "
                          f"giving up after {total:g}s ({LOCK_TIMEOUT_ENV})")
                try:
                    deferred = _acquire(lock, max(total - LOCK_NOTICE_S, 0), path, keep=whole)
                except Timeout:
                    holder = lock_holders(path) or holder or "another process"
                    raise ManifestBusy(f"{path}: held by {holder} for more than {total:g}s; end that process "
                                       f"(or set {LOCK_TIMEOUT_ENV} higher) and rerun") from None
            yield
        finally:
            try:
                _release(lock)
            finally:
                if deferred is not None:
                    deferred.end()

    @staticmethod
    def _say(text: str) -> None:
        """One line on stderr (a live progress display shows it above itself); control characters
        of a hostile path or command line are replaced."""
        try:
            print(_CONTROL.sub("?", text), file=sys.stderr, flush=True)
        except (OSError, ValueError, AttributeError):
            pass

    def _read_fresh(self) -> dict:
        """``_read_on_disk``, this process's own records kept (``_keep_mine``)."""
        return self._keep_mine(self._read_on_disk())

    def _keep_mine(self, data: dict) -> dict:
        """``data`` with the stage entries this process recorded itself as it wrote them: one changed or
        gone (not moved to ``history`` by a rerun) was changed by something that did not hold the lock, and
        consistently with the good copy (a stage that forged both files): what is at manifest.json is kept
        aside, the entries put back, the stages this process runs recorded as ERROR saying so (``record``)."""
        if not self._mine or not isinstance(data.get("stages"), list):
            return data
        stages = data["stages"]
        history = data.get("history") if isinstance(data.get("history"), list) else []
        wrong = []
        for name, mine in self._mine.items():
            cur = next((s for s in stages if isinstance(s, dict) and s.get("name") == name), None)
            if cur == mine or any(isinstance(h, dict) and {k: v for k, v in h.items() if k != "moved_to"} == mine
                                  for h in history):
                continue
            wrong.append(name)
        if not wrong:
            return data
        why = (f"{self.path}: the record(s) of {', '.join(wrong)} nsa-run made are not what it wrote")
        aside = self._keep_aside(why)
        for name in wrong:
            mine = copy.deepcopy(self._mine[name])
            for i, s in enumerate(stages):
                if isinstance(s, dict) and s.get("name") == name:
                    stages[i] = mine
                    break
            else:
                stages.append(mine)
        self._put_back_manifest(None, data)
        self._blame(aside, why, "its own records")
        return data

    def _blame(self, aside: str | None, why: str, source: str) -> None:
        """The stages this process is running: recorded as ERROR (``record``); one line on stderr."""
        kept = aside or "nothing (it could not be kept)"
        for p in self.data.get("pending") or []:
            if isinstance(p, dict) and p.get("token") == self.token and isinstance(p.get("stage"), str):
                self._overwrote.setdefault(p["stage"], kept)
        self._say(f"warning: {why}; something that did not hold the run folder's lock wrote it. nsa-run kept "
                  f"what was there as {kept} and wrote the manifest again from {source}")

    def _read_on_disk(self) -> dict:
        """The manifest as on disk (the caller holds the lock); this process's copy before its first write.

        Taken only when it is what the last change under the lock wrote (its good copy, ``GOOD_NAME``),
        or what this process found itself (e.g. edited by hand before it looked; never one older than
        the good copy). Anything else at manifest.json (garbage, other valid JSON, a folder, a link,
        nothing) was put there by something that did not hold the lock: ``_changed``."""
        try:
            good: tuple[bytes, dict] | None = _exact(self.dir / GOOD_NAME)
        except (OSError, ManifestError):
            good = None  # a run folder of an earlier nsa-run (or the copy removed): the manifest alone
        try:
            raw, data = _exact(self.path)
        except FileNotFoundError:
            if good is None:
                return self.data  # not written yet
            return self._changed(f"{self.path}: removed", good)
        except ManifestError as e:
            return self._changed(str(e), good)
        digest = _digest(raw)
        if good is None or raw == good[0]:
            self._on_disk = digest
            return data
        seal = good[1].get(SEAL_KEY)
        if isinstance(seal, dict) and seal.get("over") == digest:  # its writer was killed between the renames
            self._on_disk = digest
            return good[1]
        if data == self._seen and (SEAL_KEY not in data or _seal_n(data) >= _seal_n(good[1])):
            self._on_disk = digest
            return data
        return self._changed(f"{self.path}: not the manifest nsa-run last wrote under the run folder's lock", good)

    def _changed(self, why: str, good: tuple[bytes, dict] | None) -> dict:
        """manifest.json is not what the last change under the lock wrote (``_read_fresh``): a stage wrote
        over it (garbage: round 14 A U5; valid JSON, a FAIL turned PASS or a record dropped: round 16 A3),
        replaced it by a folder, a link or nothing (A4). What is there is kept aside as
        ``manifest.json.corrupt-<n>`` (named on stderr; moved, whatever it is) and the good copy is put back
        in its place at once (a hard link: no new data block, so a full disk loses nothing): every nsa-run's
        records, another process's recorded meanwhile included (A7). Without a good copy (a run folder of an
        earlier nsa-run), from this process's own records. The stages this process is running are recorded
        as ERROR saying so (``record``). Raises a ManifestError when nothing can be put back."""
        if good is not None:
            restore, text = good[1], good[0]
            source = "the last manifest written under the run folder's lock (every nsa-run's records)"
        elif isinstance(self.data, dict) and isinstance(self.data.get("stages"), list):
            restore, text = copy.deepcopy(dict(self.data)), None
            source = "its own records"
        else:
            raise ManifestError(why)
        aside = self._keep_aside(why)
        self._put_back_manifest(text, restore)
        self._blame(aside, why, source)
        return copy.deepcopy(dict(restore))

    def _keep_aside(self, why: str) -> str | None:
        """Whatever is at manifest.json moved to the first free ``manifest.json.corrupt-<n>`` (then a random
        name: a stage may take them all): a regular file hard-linked (its name keeps it until the good copy
        replaces it, atomically), anything else renamed. None when nothing is there or a regular file
        cannot be kept (it is then written over); ManifestError when anything else cannot be moved."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return None
        regular = stat.S_ISREG(st.st_mode)
        names = [f"{MANIFEST_NAME}.corrupt-{n}" for n in range(1, _ASIDE_NUMBERED + 1)]
        problem: OSError | None = None
        for i in range(_ASIDE_NUMBERED + 3):
            name = names[i] if i < len(names) else f"{MANIFEST_NAME}.corrupt-{uuid.uuid4().hex}"
            target = self.dir / name
            if os.path.lexists(target):
                continue
            try:
                if regular:
                    try:
                        os.link(self.path, target, follow_symlinks=False)  # never over an existing name
                    except FileExistsError:
                        continue
                    except OSError:
                        os.rename(self.path, target)  # no hard links here
                else:
                    os.rename(self.path, target)
                return name
            except FileNotFoundError:
                return None  # gone meanwhile
            except OSError as e:
                problem = e
                break
        if regular:
            return None
        raise ManifestError(f"{why}; it could not be moved aside ({problem or 'no free name'}); move it away "
                            f"and rerun")

    def _put_back_manifest(self, text: bytes | None, restore: dict) -> None:
        """manifest.json made ``text`` (the good copy's bytes: linked from it) or ``restore`` written."""
        good = self.dir / GOOD_NAME
        if text is not None:
            tmp = self.dir / f".{MANIFEST_NAME}.{uuid.uuid4().hex[:12]}.tmp"
            try:
                os.link(good, tmp, follow_symlinks=False)
                if read_limited(tmp) == text:  # the copy that was read (not one swapped in since)
                    os.replace(tmp, self.path)
                    self._on_disk = _digest(text)
                    try:  # the copy on an inode of its own again: a stage writing manifest.json in place
                        t = _prepared(self.dir, text)  # must not change it too (best effort: a full disk)
                        try:
                            os.replace(t, good)
                        except OSError:
                            os.unlink(t)
                    except OSError:
                        pass
                    return
            except (OSError, UnsafeFileError):
                pass
            finally:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        else:
            text = to_json_text(restore).encode("utf-8")
        t = _prepared(self.dir, text)
        try:
            os.replace(t, self.path)
        except BaseException:
            try:
                os.unlink(t)
            except OSError:
                pass
            raise
        self._on_disk = _digest(text)

    def update(self, change: Callable[[dict], Any], room: int = 0) -> Any:
        """Apply ``change(data)`` to a fresh read of the manifest under the lock, then write it.
        ``ManifestTooLarge`` (nothing written) when the result would leave less than ``room`` bytes
        under what the manifest's readers accept (``artifacts.MAX_READ_BYTES``)."""
        with self._locked(whole=True):
            data = self._read_fresh()
            result = change(data)
            self._write(data, room)
            self.data = data
            return result

    def _write(self, data: dict, room: int = 0, reserved: tuple[_Reserved, _Reserved] | None = None) -> None:
        """``data`` written (the caller holds the lock) as manifest.json and its good copy, sealed
        (``SEAL_KEY``: one more write, over the bytes this process last read or wrote there)."""
        before = data.get(SEAL_KEY, None)
        had = SEAL_KEY in data
        data[SEAL_KEY] = {"n": _seal_n(data) + 1, "over": self._on_disk}
        text = to_json_text(data).encode("utf-8")
        limit = artifacts.MAX_READ_BYTES
        if len(text) > limit - room:
            if had:
                data[SEAL_KEY] = before
            else:
                del data[SEAL_KEY]
            raise ManifestTooLarge(f"{self.path}: would be {_mib(len(text))}, more than the {_mib(limit - room)} "
                                   f"it may take (its readers accept {_mib(limit)}); not written", len(text))
        _put_pair(self.dir, data, reserved)
        self._on_disk = _digest(text)
        self._seen = json.loads(text)

    @staticmethod
    def _initial(run_id: str, argv: list[str], run_facts: dict) -> dict:
        return {
            "schema_version": MANIFEST_SCHEMA_VERSION,
            "run_id": run_id,
            "started": now_iso(),
            "finished": None,
            "argv": list(argv),
            "host": host_info(),
            **run_facts,
            "interrupted": False,
            "runner": _me(),
            "stages": [],
            "history": [],
        }

    @classmethod
    def create(cls, dir: Path, run_id: str, argv: list[str], **run_facts: Any) -> RunManifest:
        """The manifest of an existing, empty folder ``dir`` (the CLI uses ``new``)."""
        m = cls(dir, cls._initial(run_id, argv, run_facts))
        m.write()
        return m

    @classmethod
    def new(cls, out: Path, run_id: str, argv: list[str], *, only_first: bool = False,
            **run_facts: Any) -> RunManifest | None:
        """A new run folder under ``out`` holding its manifest from the moment it exists
        (``artifacts.create_run_folder``). None with ``only_first`` when another run took the name."""
        data = cls._initial(run_id, argv, run_facts)
        data[SEAL_KEY] = {"n": 1, "over": None}
        text = to_json_text(data).encode("utf-8")
        folder = create_run_folder(Path(out), run_id, lambda tmp: _put_pair(tmp, data), only_first=only_first)
        if folder is None:
            return None
        m = cls(folder, json.loads(text))
        m._on_disk = _digest(text)
        m._note_runner_lock()
        return m

    def _note_runner_lock(self) -> None:
        """The new run's ``runner`` note gets this process's owner lock (``_owner_lock``, held until
        ``finish``): ``report``'s runner-died / still-running lines try it, whatever this process's PID
        namespace or host name (round 14 A BR-2b: they judged by host name + pid). Best effort: without
        it (the lock cannot be made, the manifest not written now) the runner is judged by its pid."""
        lock = {k: v for k, v in self._owner().items() if k in ("lock", "lock_ino")}
        if not lock:
            return

        def change(data: dict) -> None:
            runner = data.get("runner")
            if isinstance(runner, dict) and runner.get("pid") == os.getpid():
                runner.update(lock)

        try:
            self.update(change)
        except (OSError, ManifestError):
            pass

    @classmethod
    def open(cls, dir: Path, argv: list[str]) -> RunManifest:
        """An existing run folder (``nsa-run stage X`` into it). Raises ManifestError if unusable.

        Reruns whose runner died (``pending`` of a process that is gone) are put back first. A
        folder whose ``logs`` or ``history`` is a symlink is unusable (reruns write and move there)."""
        m = cls(dir, load_manifest(Path(dir) / MANIFEST_NAME))
        problem = runner_dirs_problem(m.dir)
        if problem:
            raise ManifestError(problem)
        m.recover()

        def add(data: dict) -> None:
            # a run whose runner died before finishing it stays "runner died / unfinished" (its later stages never
            # ran): this command's finish would hide it otherwise (round 17 A-R1: a `stage pb` into a kill -9'd
            # oneshot's folder left a complete-looking, green oneshot)
            if (data.get("finished") is None and not data.get("interrupted") and not data.get("died")
                    and artifacts.owner_alive(data.get("runner"), m.dir) is False):  # as runner_died judges
                data["died"] = run_died_fact(data)
            data.setdefault("history", [])
            data.setdefault("updates", []).append({"argv": list(argv), "started": now_iso(), "token": m.token})

        m.update(add)
        return m

    @property
    def stages(self) -> list[dict]:
        return self.data["stages"]

    def entry(self, name: str) -> dict | None:
        return next((s for s in self.stages if s.get("name") == name), None)

    # ---- transactional reruns ---------------------------------------------------------------

    def _history_dir(self, name: str, tag: str = "") -> Path:
        stamp = now_iso().replace(":", "").replace("+", "p")
        dest = self.dir / "history" / f"{name}-{stamp}{tag}"
        n = 1
        while os.path.lexists(dest):  # a dangling link there (a stage's leftover) is taken too: never reused
            n += 1
            dest = self.dir / "history" / f"{name}-{stamp}{tag}.{n}"
        return dest

    @staticmethod
    def _others(data: dict, name: str) -> set[str]:
        """The files the other stages' current entries list (never moved for stage ``name``)."""
        return {os.path.normpath(f) for s in data.get("stages", []) if s.get("name") != name
                for f in s.get("files") or [] if isinstance(f, str)}

    def _move_owned(self, name: str, entry: dict, src_root: Path, dst_root: Path,
                    others: set[str] = frozenset(), done: list[tuple[Path, Path]] | None = None,
                    failed: list[str] | None = None) -> None:
        """Move the files and log ``entry`` lists for stage ``name`` from ``src_root`` to ``dst_root``;
        each move made is appended to ``done`` as (from, to), so that a failure can be undone.
        ``failed``: a move refused (a read-only or immutable entry, not a full disk) is noted there, with why,
        and the others go on; without it the first refusal raises."""
        files = entry.get("files") if isinstance(entry.get("files"), list) else []
        # another stage's names as written and as the entries they lead to (links among folders followed)
        taken = _Taken(self.dir, others)
        dst_rel = dst_root.relative_to(self.dir)  # a folder of history/: never reached through a link
        for rel, is_log in [(f, False) for f in files] + [(entry.get("log") or "", True)]:
            # never anything outside the run folder, nor a shared name (logs, history, manifest),
            # nor a file another stage's entry lists (also through a link: `self/a.txt`, self -> .);
            # a link at a recorded name that leads outside is the name's entry all the same: moved as the link
            if not rel or not (stage_owns(self.dir, name, rel, log=is_log)
                               or (not is_log and self._link_out_at(name, rel, src_root))):
                continue
            if taken and taken.hit(entry_forms(self.dir, rel)) is not None:
                continue
            src = src_root / rel
            if not _resolves_under(src.parent, src_root):  # a linked folder on the way (history/x/logs -> /elsewhere)
                continue
            # any kind of entry: a file, a folder, a link (moved as a link, never followed), a FIFO, a
            # device node (a put-back passed over a FIFO an interrupted attempt left, and lost v1)
            if os.path.lexists(src):
                target = dst_root / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                problem, _ = _real_folders(self.dir, dst_rel / Path(rel).parent)
                if problem:  # history/ or a folder in it is a link: never moved through it
                    raise HistoryNotOwn(problem)
                if os.path.lexists(target):  # a half-written file of an abandoned attempt
                    continue
                # noted BEFORE the move: a signal's handler runs the moment os.rename returns (inside
                # shutil.move), so a note made after it was missed and the undo left the file in
                # history/ unrecorded; ``_move_back`` passes over a noted move that did not happen
                if done is not None:
                    done.append((src, target))
                try:
                    _move_entry(src, target)
                except OSError as e:
                    if failed is None or _disk_full(e):
                        raise
                    failed.append(f"{rel}: {e.strerror or e}")

    def _link_out_at(self, name: str, rel: object, root: Path) -> bool:
        """Whether the recorded name ``rel`` of stage ``name`` holds, under ``root``, a link itself (lexically a name
        of the stage's inside the run folder, its folders the run folder's own) that leads outside the run folder.
        Round 50 B50b-1: the user swapped a recorded ``a.txt`` / ``d`` for links to a shared file or folder; the
        set-aside left them (``stage_owns`` refuses what resolves outside), and the attempt wrote through them into
        the shared file. The link is moved aside as itself, never followed."""
        if not isinstance(rel, str) or self._textual_problem(name, rel, False) is not None:
            return False
        path = root / rel
        return os.path.islink(path) and _resolves_under(path.parent, self.dir) and not _resolves_under(path, self.dir)

    @staticmethod
    def _move_back(done: list[tuple[Path, Path]], dest: Path | None) -> list[str]:
        """Undo the moves ``done`` (last first) and remove the folders left empty under ``dest``; the
        names that could not go back (where they are now) are returned. A rename within the run
        folder needs no new inode: it works on the disk that was too full to go on."""
        left = []
        for src, target in reversed(done):
            try:
                if not os.path.lexists(target):  # noted, then interrupted before the move: nothing to undo
                    continue
                if os.path.lexists(src):  # something took the name meanwhile: never overwritten
                    raise FileExistsError(src)
                os.rename(target, src)
            except OSError:
                left.append(f"{src} (now {target})")
        if dest is not None and dest.is_dir() and not dest.is_symlink():
            for d in sorted([dest, *dest.rglob("*")], key=lambda p: -len(p.parts)):
                try:
                    d.rmdir()
                except OSError:
                    pass
        return left

    def set_aside(self, name: str) -> Path | None:
        """Before rerunning stage ``name``: move its earlier files and log to ``history/<name>-<time>/``.

        The earlier entry stays in ``stages`` until the new result is recorded; ``pending`` notes
        the move (with this process), so ``restore`` / ``recover`` can put it back. Nothing is
        deleted. Returns the history folder, or None when the stage had no earlier result.
        Raises ManifestBusy when another live nsa-run is running this stage in this folder.

        Write-ahead: ``pending`` (with ``moved_to`` and ``setting_aside``) is in manifest.json BEFORE
        anything moves, so a kill -9 (or a signal) at any point of the moves leaves a note the next
        nsa-run into this folder puts back from (``recover``); once every move is made, a second
        write drops ``setting_aside``. (The moves were made before the manifest recorded them: a
        signal or kill there left the earlier file in history/ with nothing recording the move.)

        All or nothing: when a move, a folder of history or the manifest's own write fails (a disk
        out of space or inodes), or a signal comes, the files already moved go back and the note
        is dropped before the error is raised. Whatever cannot go back is named in the error
        (``SetAsideIncomplete``), and its note stays in ``pending`` for the next nsa-run.
        """
        had_lock = os.path.join(self.dir, f"{LOCK_NAME}.{self.token}") in _OWNER_LOCKS
        try:
            return self._set_aside(name)
        except BaseException:  # refused or undone: the owner lock this call made goes when no note names it (round
            # 49 B49b-1: a refused rerun left ``.manifest.lock.<token>`` behind, though nsa-run exited normally); one
            # held before (a oneshot's runner note, its other stages' claims) stays
            if not had_lock and not any(isinstance(p, dict) and p.get("token") == self.token
                                        for p in (self.data or {}).get("pending") or []):
                _let_go(self.dir, self.token)
            raise

    def _set_aside(self, name: str) -> Path | None:
        done: list[tuple[Path, Path]] = []
        dest: Path | None = None
        noted = False
        with self._locked():
            data = self._read_fresh()
            for p in data.get("pending", []):
                if p.get("stage") == name and not _dead(p.get("owner") or {}, self.dir):
                    raise ManifestBusy(_busy(name, self.dir, p, "wait for it to finish"))
            old = next((s for s in data["stages"] if s.get("name") == name), None)
            pending = {"stage": name, "token": self.token, "owner": self._owner(), "since": now_iso()}
            problem = self._history_problem() if old is not None else None
            if problem:  # the earlier files would be moved through it (out of the run folder)
                raise HistoryNotOwn(problem)
            if old is None:
                data.setdefault("pending", []).append(pending)
                self._write(data)
                self.data = data
                return None
            reserved = None
            try:
                # the last write's temp files (the good copy's, the manifest's), made first: on a disk
                # out of inodes the note is always dropped again (or the set-aside refused before
                # anything was noted)
                reserved = (_Reserved(self.dir / GOOD_NAME), _Reserved(self.path))
                dest = self._history_dir(name)
                pending["moved_to"] = str(dest.relative_to(self.dir))
                pending["setting_aside"] = True
                data.setdefault("pending", []).append(pending)
                self._write(data)  # the intent, before the first move
                noted = True
                self.data = data
                self._move_owned(name, old, self.dir, dest, self._others(data, name), done)
                del pending["setting_aside"]
                self._write(data, reserved=reserved)
                return dest
            except BaseException as e:  # undo the moves, then drop the note
                left = self._move_back(done, dest) if dest is not None else []
                if noted and not left:
                    try:
                        data["pending"] = [p for p in data.get("pending", []) if p is not pending]
                        self.data = data
                        if reserved is not None and reserved[1].tmp is not None and reserved[0].tmp is not None:
                            self._write(data, reserved=reserved)
                        else:
                            self._write(data)
                    except (OSError, KeyboardInterrupt):  # kept: the next nsa-run finds nothing to put back
                        pass
                if left and isinstance(e, OSError):
                    raise SetAsideIncomplete(e.errno, f"{e.strerror or e}; these could not be put back: "
                                                      f"{', '.join(left)}") from None
                raise
            finally:
                if reserved is not None:
                    reserved[0].close()
                    reserved[1].close()

    def mark_running(self, name: str) -> Path | None:
        """Before running stage ``name`` (a oneshot's stage, or ``stage X`` after ``set_aside``): note
        in ``pending`` that this process runs it, so a concurrent ``stage X`` into this folder is
        refused. Raises ManifestBusy when another live nsa-run is running it here.

        When the folder already holds a result of ``name`` this process has not set aside (another
        nsa-run's ``stage X`` into a oneshot's folder, finished before the oneshot came to X: round 23
        B23-7, the oneshot's X then overwrote it, no history, no word), this run of it is a rerun there:
        that result is set aside as ``stage X`` sets it aside (history/, put back if this run does not
        finish) and its history folder returned."""
        recorded = False

        def change(data: dict) -> None:
            nonlocal recorded
            for p in data.get("pending", []):
                if p.get("stage") != name:
                    continue
                if p.get("token") == self.token:
                    return
                if not _dead(p.get("owner") or {}, self.dir):
                    raise ManifestBusy(_busy(name, self.dir, p, "not run again here"))
            if any(s.get("name") == name for s in data.get("stages", [])):
                recorded = True  # set aside below, under a lock of its own (the checks made again there)
                return
            data.setdefault("pending", []).append({"stage": name, "token": self.token, "owner": self._owner(),
                                                   "since": now_iso()})

        self.update(change)
        return self.set_aside(name) if recorded else None

    def _take_pending(self, data: dict, name: str, token: str | None = None) -> dict | None:
        for i, p in enumerate(data.get("pending", [])):
            if p.get("stage") == name and (token is None or p.get("token") == token):
                return data["pending"].pop(i)
        return None

    def _put_back(self, data: dict, pending: dict, attempt: dict | None, tag: str) -> list[str]:
        """Undo a ``set_aside``: whatever the attempt left (its files, its log) goes to history, the
        earlier files come back, the earlier entry stays current.

        Whatever kind of entry the attempt left at a name the earlier result needs (a file, a FIFO,
        a device node, a link, a file where a folder of the name was, a folder where a file was) is
        moved out of the way into the attempt's history folder, as itself: a link is never followed.
        Returns what could not be put back (each name with where it waits and why): the caller then
        keeps ``pending``, so that nothing is cleared while something is not back. A full disk
        (ENOSPC, EDQUOT) raises instead (the manifest is then not written: ``pending`` stays)."""
        name = pending["stage"]
        old = next((s for s in data["stages"] if s.get("name") == name), None)
        where = pending.get("moved_to") if old is not None else None
        # history/ (the attempt goes there) and the set-aside folder (the earlier files come from
        # there), links never followed: the stage (plugin code) ran since the set-aside, and one
        # that swapped either for a link to a folder outside had the put-back move an outside file
        # in and write the attempt outside, or drop the note silently over the attempt's files
        problem = self._history_problem(where or None)
        if problem:
            raise HistoryNotOwn(f"{problem}: the earlier {name} result set aside in {where or 'history/'} "
                                "cannot be put back through it (manifest.json's pending keeps the move); "
                                "put the run folder's own folder back in its place")
        moved = self.dir / where if where else None
        if moved is not None and not os.path.lexists(moved):  # nothing was moved there
            moved = None
        # a runner that died while setting aside (the write-ahead note still says so): no attempt
        # ran, whatever holds a name in the run folder is the earlier result itself (not yet moved,
        # or the source of a copy across file systems that did not finish): it stays
        aside_only = bool(pending.get("setting_aside")) and attempt is None
        leftovers = dict(attempt or {})
        leftovers.setdefault("log", f"logs/{name}.log")
        if aside_only:
            leftovers = {"files": [], "log": ""}
        elif old is not None:
            # Idempotent: a name the recorded entry owns is the attempt's only while the earlier copy
            # still waits in the set-aside folder; once that copy is back (an earlier put-back whose
            # manifest write failed, e.g. on a full disk), the file in place IS the recorded result.
            owned = set(old.get("files") or []) | ({old["log"]} if old.get("log") else set())

            def waiting(rel: str) -> bool:  # (a link on the way in history/: not proven back, so waiting)
                if moved is None or not isinstance(rel, str) or Path(rel).is_absolute() or ".." in Path(rel).parts:
                    return False
                problem, there = _real_folders(moved, Path(rel).parent)
                return problem is not None or (there and os.path.lexists(moved / rel))

            leftovers["files"] = sorted({f for f in leftovers.get("files") or [] if f not in owned or waiting(f)}
                                        | {f for f in old.get("files") or [] if waiting(f)})
            if leftovers["log"] in owned and not waiting(leftovers["log"]):
                leftovers["log"] = ""
        dest = self._history_dir(name, tag)
        others = self._others(data, name)
        left: list[str] = []
        stuck: list[str] = []  # the attempt's entries that cannot move aside (round 49 B49b-1: a read-only folder)
        try:
            # each of them stays where it is, whole; one the earlier result needs keeps that name from coming back
            # (``_bring_back`` names it, the note stays for the next nsa-run), the others are said here
            self._move_owned(name, leftovers, self.dir, dest, others, failed=stuck)
            if moved is not None:
                left = self._bring_back(name, old, moved, dest, others, keep_present=aside_only)
        except OSError as e:  # a full disk: named with its path (the callers print strerror alone)
            if e.filename and str(e.filename) not in (e.strerror or ""):
                raise OSError(e.errno, f"{e.strerror or e} ({e.filename})", e.filename) from None
            raise
        if stuck:
            self._say(f"warning: what the {name} attempt left could not all be moved aside into "
                      f"{dest.relative_to(self.dir)}; it stays in place: {'; '.join(stuck)}")
        if attempt is not None:
            data["history"].append({**attempt, "moved_to": str(dest.relative_to(self.dir))})
        if moved is not None:
            for d in sorted([moved, *moved.rglob("*")], key=lambda p: -len(p.parts)):  # empty folders left
                try:
                    d.rmdir()
                except OSError:
                    pass
        return left

    def _bring_back(self, name: str, entry: dict, moved: Path, dest: Path, others: set[str],
                    keep_present: bool = False) -> list[str]:
        """Move the files and log of ``entry`` that wait in ``moved`` back to their names in the run
        folder, making way for each (``_make_way``); what cannot come back is returned, named.
        ``keep_present``: a name that exists in the run folder keeps what it holds (the copy in
        ``moved`` stays there)."""
        files = entry.get("files") if isinstance(entry.get("files"), list) else []
        taken = _Taken(self.dir, others)
        where = moved.relative_to(self.dir).as_posix()
        left = []
        for rel, is_log in [(f, False) for f in files] + [(entry.get("log") or "", True)]:
            if not rel or not isinstance(rel, str) or Path(rel).is_absolute() or ".." in Path(rel).parts:
                continue  # never set aside (outside the run folder)
            src = moved / rel
            # the folders on its way in history/, links never followed (one swapped for a link out
            # of the run folder brought an outside file in)
            link, there = _real_folders(moved, Path(rel).parent)
            if link is None and (not there or not os.path.lexists(src)):
                continue  # not set aside (another stage's, outside), or back already
            shown = rel.encode("utf-8", "backslashreplace").decode("utf-8")
            if link is not None:
                left.append(f"{shown} (waits in {where}/{shown}: {link})")
                continue
            if keep_present and os.path.lexists(self.dir / rel):
                continue
            try:
                problem = self._textual_problem(name, rel, is_log)
                if problem is None:
                    hit = taken.hit(entry_forms(self.dir, rel)) if taken else None
                    if hit is not None:
                        problem = f"stage entry {hit} of another stage is in the way"
                if problem is None:
                    self._make_way(rel, dest)
                    if not stage_owns(self.dir, name, rel, log=is_log):
                        problem = "its folder does not lead to a folder of the run folder"
                if problem is None:
                    _move_entry(src, self.dir / rel)
            except OSError as e:
                if _disk_full(e):
                    raise
                problem = f"{e.strerror or e}" + (f" ({e.filename})" if e.filename else "")
            if problem is not None:
                left.append(f"{shown} (waits in {where}/{shown}: {problem})")
        return left

    @staticmethod
    def _textual_problem(name: str, rel: str, is_log: bool) -> str | None:
        """Why ``rel`` (a name the recorded entry lists) is no name of this stage's, as text."""
        pure = Path(rel)
        if pure.is_absolute() or ".." in pure.parts or not pure.parts:
            return "not a name inside the run folder"
        if is_log:
            return None if rel == f"logs/{name}.log" else "not this stage's log"
        if _runner_name(pure.parts[0], stage_allowed(name)):
            return "a name the runner owns"
        return None

    def _make_way(self, rel: str, dest: Path) -> None:
        """Make ``rel`` free to take back: each folder on its way must be a folder (or a link to a
        folder of the run folder); anything else there (a file, a FIFO, a device node, a link out or
        to nothing), and whatever now holds the name itself, is what the failed attempt made: it is
        moved, as itself (never followed), to the same name under ``dest`` (its history folder)."""
        parts = Path(rel).parts
        here = self.dir
        for i, part in enumerate(parts):
            here = here / part
            last = i == len(parts) - 1
            try:
                st = os.lstat(here)
            except FileNotFoundError:
                if not last:
                    os.mkdir(here)
                continue
            if not last:
                if stat.S_ISDIR(st.st_mode):
                    continue
                if stat.S_ISLNK(st.st_mode) and here.is_dir() and _resolves_under(here, self.dir):
                    continue  # a link to a folder of the run folder: as the earlier result had it
                if i == 0 and part in ("logs", "history"):  # the runner's own: never moved for a stage
                    raise OSError(errno.ENOTDIR, "not the run folder's own folder", str(here))
            away = dest / Path(*parts[: i + 1])
            n = 1
            while os.path.lexists(away):
                n += 1
                away = dest / Path(*parts[:i], f"{part}.{n}")
            away.parent.mkdir(parents=True, exist_ok=True)
            os.rename(here, away)
            if not last:
                os.mkdir(here)

    def _history_problem(self, folder: str | None = None) -> str | None:
        """Why ``history`` (and ``folder``, a folder ``history/<x>`` a rerun moved the earlier files
        to) is not a real folder of this run folder, each name checked with ``os.lstat`` (never
        followed); None when it is, or is not there (nothing was moved there yet)."""
        rel = folder or "history"
        parts = Path(rel).parts
        if Path(rel).is_absolute() or ".." in parts or not parts or parts[0] != "history":
            return f"{rel!r} is not a folder under the run folder's history/"
        problem, _ = _real_folders(self.dir, rel)
        return problem

    def restore(self, name: str, attempt: dict) -> bool:
        """An interrupted rerun of ``name``: its record ``attempt`` goes to history and the earlier
        result is put back. False (and nothing set aside any more) when there was no earlier
        result: the caller then records ``attempt`` as usual."""
        left: list[str] = []
        refused: list[str] = []

        def change(data: dict) -> bool:
            left.clear()
            refused.clear()
            pending = self._take_pending(data, name, self.token)
            if pending is None or not pending.get("moved_to"):
                return False
            try:
                left.extend(self._put_back(data, pending, attempt, "-interrupted"))
            except HistoryNotOwn as e:  # nothing moved through it; the attempt's files stay where they are
                refused.append(str(e))
            if left or refused:  # never cleared while something is not back
                data.setdefault("pending", []).append(pending)
            return True

        put = self.update(change)
        self._say_not_back(name, left)
        if refused:
            self._say(f"warning: the earlier {name} result of {self.dir} could not be put back: {refused[0]}; "
                      "nothing was moved through it (the interrupted attempt's files stay where it left them)")
        return put

    def _say_not_back(self, name: str, left: list[str]) -> None:
        """One line naming what of stage ``name``'s earlier result could not be put back, and where."""
        if left:
            self._say(f"warning: the earlier {name} result of {self.dir} could not all be put back: "
                      f"{'; '.join(left)}. manifest.json's pending keeps the move: the next nsa-run stage / "
                      f"oneshot into this --out puts it back once what is in the way is moved")

    def recover(self) -> list[str]:
        """Put back the earlier results of reruns whose nsa-run died (kill -9, power loss)."""
        stale = [p for p in self.data.get("pending", [])
                 if isinstance(p, dict) and _dead(p.get("owner") or {}, self.dir)]
        if not stale:
            return []

        left: dict[str, list[str]] = {}

        def change(data: dict) -> list[str]:
            done = []
            left.clear()
            for p in list(data.get("pending", [])):
                if isinstance(p, dict) and _dead(p.get("owner") or {}, self.dir):
                    data["pending"].remove(p)
                    not_back = self._put_back(data, p, None, "-abandoned")
                    if not_back:  # kept: the next nsa-run tries again
                        data["pending"].append(p)
                        left[p.get("stage")] = not_back
                    else:
                        done.append(p.get("stage"))
                        _drop_lock(self.dir, p.get("owner") or {})
            return done

        done = self.update(change)
        for name, not_back in left.items():
            self._say_not_back(name, not_back)
        return done

    @classmethod
    def recover_folder(cls, dir: Path, data: dict) -> list[str]:
        """``recover`` for any run folder of ``--out`` (not only the latest, which ``stage`` opens): a
        rerun killed before a newer run folder appeared is put back at the next ``stage`` / ``oneshot``.
        Best effort: a folder that cannot be recovered now is left as it is (and reported as
        unfinished); nothing here stops the new run."""
        if not any(isinstance(p, dict) and _dead(p.get("owner") or {}, Path(dir)) for p in data.get("pending") or []):
            return []
        if runner_dirs_problem(dir):
            return []
        try:
            return cls(dir, data).recover()
        except (OSError, ManifestError):
            return []

    def abandon(self) -> list[str]:
        """Best effort after a runner error (e.g. a full disk): put back what this process set aside.
        Returns ``history/...`` of each earlier result that could not be put back now: its move stays
        recorded in ``pending``, and the next nsa-run into this folder puts it back (``recover``)."""
        mine = [p for p in self.data.get("pending", []) if p.get("token") == self.token]
        left = []
        for note in mine:
            name = note.get("stage")
            try:
                def change(data: dict, name=name) -> list[str]:
                    p = self._take_pending(data, name, self.token)
                    if p is not None and p.get("moved_to"):  # else nothing was set aside: nothing to put back
                        not_back = self._put_back(data, p, None, "-abandoned")
                        if not_back:
                            data.setdefault("pending", []).append(p)
                        return not_back
                    return []

                not_back = self.update(change)
                if not_back:
                    self._say_not_back(name, not_back)
                    left.append(f"{name}: {note['moved_to']}")
            except (OSError, ManifestError):
                # the put-back may have moved the files before the manifest's write failed: named by what is
                # there (round 19 A U-4: a set-aside folder already put back and removed was named as waiting)
                if note.get("moved_to") and os.path.lexists(self.dir / note["moved_to"]):
                    left.append(f"{name}: {note['moved_to']}")
                elif note.get("moved_to"):
                    self.back_unnoted.append(name)
        if not left:  # nothing of this process's pending here any more: its owner lock goes
            _let_go(self.dir, self.token)
        return left

    # ---- records ----------------------------------------------------------------------------

    def record(self, entry: dict | Any) -> None:
        """Add or replace (same name, same position) a stage entry; a rerun's earlier entry moves
        to ``history`` now (its files were set aside before the stage ran).

        ``entry``: a dict, or a record object with ``to_dict()`` (``executor.StageRecord``). A record
        larger than RECORD_MAX_BYTES, or one that would bring the manifest within ROOM_BYTES of what
        its readers accept, is recorded as the stage's ERROR saying so, without its files and metrics
        (``_cut``; the object, when given, is made to say the same): the run folder stays usable
        (round 14 B R8). Should even that not fit, ``ManifestTooLarge`` (nothing written). Declared
        names leading to a FIFO, device, socket or oversize file are dropped first, the stage's ERROR
        naming each (``_unreadable_refused``; the object too): every reader refused them (round 15 A2)."""
        obj = None
        if not isinstance(entry, dict):
            obj, entry = entry, entry.to_dict()
        checked = _unreadable_refused(self.dir, entry)  # no FIFO, device, socket, oversize file recorded
        if checked is not None:
            entry = checked
            if obj is not None:
                _as_checked(obj, entry)
        size = len(to_json_text(entry).encode("utf-8"))
        cut = None
        if size > RECORD_MAX_BYTES:
            cut = _cut(entry, f"{_mib(size)}, more than the {_mib(RECORD_MAX_BYTES)} one stage's record may take")

        said: list[dict] = []
        final: list[dict] = []

        def change(data: dict, entry: dict) -> None:
            aside = self._overwrote.pop(entry["name"], None)  # found overwritten by this very update's read
            if aside is not None:
                entry = _overwritten_entry(entry, aside)
                said.append(entry)
            final[:] = [entry]
            stages = data["stages"]
            pending = self._take_pending(data, entry["name"], self.token)
            for i, s in enumerate(stages):
                if s.get("name") == entry["name"]:
                    if pending is not None and pending.get("moved_to"):
                        data["history"].append({**s, "moved_to": pending["moved_to"]})
                    stages[i] = entry
                    break
            else:
                stages.append(entry)

        if cut is None:
            try:
                self.update(lambda data: change(data, entry), room=ROOM_BYTES)
            except ManifestTooLarge as e:
                cut = _cut(entry, f"{_mib(size)}: with it manifest.json would be {_mib(e.size)}, more than the "
                                  f"{_mib(artifacts.MAX_READ_BYTES - ROOM_BYTES)} it may take")
        if cut is not None:
            self.update(lambda data: change(data, cut))
            if obj is not None:
                _as_recorded(obj, cut)
        if final:  # as written (JSON): what ``_keep_mine`` keeps
            self._mine[final[0]["name"]] = json.loads(to_json_text(final[0]))
        if said and obj is not None:
            _as_said(obj, said[-1])

    def set_fields(self, **fields: Any) -> None:
        self.update(lambda data: data.update(fields))

    def finish(self, interrupted: bool = False) -> None:
        def change(data: dict) -> None:
            mine = [u for u in data.get("updates", []) if isinstance(u, dict) and u.get("token") == self.token]
            if mine:
                mine[-1]["finished"] = now_iso()
            data["finished"] = now_iso()
            data["interrupted"] = bool(interrupted or data.get("interrupted"))
            # this process's claims of stages that moved nothing aside (``mark_running``): the run is leaving, so
            # none of them runs any more. An interrupt between a claim and its stage's start left it behind: the
            # run read "runner died: the nsa-run running stage pc is gone" though it exited 130 (round 18 A-R6)
            if isinstance(data.get("pending"), list):
                data["pending"] = [p for p in data["pending"] if not (
                    isinstance(p, dict) and p.get("token") == self.token and "moved_to" not in p)]
            return any(isinstance(p, dict) and p.get("token") == self.token for p in data.get("pending") or [])

        if not self.update(change):  # nothing of this process's left running here: its owner lock goes
            _let_go(self.dir, self.token)

    def write(self) -> None:
        """Write this process's view as is (under the lock; prefer ``update``)."""
        with self._locked(whole=True):
            self._write(self.data)
