"""Child-process side of the executor: ``python -m nsa_runner._worker JOB RESULT``.

JOB is a pickle written by the parent: ``{"spec": "module:attr", "ctx": RunContext dict,
"sys_path": [...]}``. The worker imports the stage, runs it with the context, and writes
``{"result": StageResult dict, "traceback": str|None}`` as JSON to RESULT (atomically). Its
stdout/stderr are the stage log. A crash (signal, abort) leaves no RESULT: the parent reports
that from the exit status and the log tail; faulthandler puts the Python stack in the log.

Process hygiene (issue 16): the worker runs in its own session and carries a cookie
(``NSA_RUN_STAGE_COOKIE``) in its environment, inherited by everything it starts, even a
``setsid`` grandchild that left its process group. ``stage_processes`` finds them all (psutil: the
tree below the worker, plus every process of this user carrying the cookie) and
``kill_processes`` ends them, SIGTERM then SIGKILL. The worker dies with its runner
(``PR_SET_PDEATHSIG`` on Linux), and ``python -m nsa_runner._worker --watchdog`` (a process of its
own per stage) kills the cookie's processes and removes the stage's temp folder when the runner
dies without saying it is done (kill -9).

``python -m nsa_runner._worker --spare FD`` (the default; ``NSA_RUN_SPARE_WORKER=0`` turns it off;
issue 13): a worker started while the previous stage runs. It imports torch, triton and (on a CUDA
run) FA-4 when installed, then waits on the Unix socket FD for its job: the JOB and RESULT paths,
the run folder and, as an SCM_RIGHTS file descriptor, the stage's log, which becomes its stdout /
stderr. From there it is the worker above. It dies with its runner
(``PR_SET_PDEATHSIG``) and ends quietly when the socket closes without a job.
"""

from __future__ import annotations

import ctypes
import faulthandler
import fcntl
import importlib
import importlib.util
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback

from nsa_runner import _stdlib_put
from nsa_runner._python import python_m
from nsa_runner._text import clip, described, type_name, visible
from nsa_runner.artifacts import write_json
from nsa_runner.context import RunContext
from nsa_runner.stage import MalformedResult, Stage, StageResult, Status

COOKIE_ENV = "NSA_RUN_STAGE_COOKIE"
DEADLINE_ENV = "NSA_RUN_STAGE_DEADLINE"  # "<monotonic moment of the runner's stop> <timeout s>", in the stage's env
PARENT_ENV = "NSA_RUN_PARENT_PID"
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def signal_name(rc: int) -> str:
    """A negative exit status (``Popen.returncode``) as the signal's name: ``SIGSEGV``, or ``signal 99``."""
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def _prctl(option: int, arg: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def become_subreaper() -> None:
    """Linux: orphaned descendants (a daemon that double-forked, cleared its environment and left
    the session) are re-parented to this process instead of init, so they stay in its process tree
    (``stage_processes`` finds them without the cookie) while it lives: see ``linger``."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)


def describe_exit(rc: int) -> str:
    """How a stage process ended without a result (``rc`` as ``Popen.returncode``: -N for a signal)."""
    if rc < 0:
        return f"process died with {signal_name(rc)}"
    return f"process exited with code {rc} without a result"


def keep_orphans() -> int | None:
    """Fork: the work goes on in the child (None is returned there); this process, a child
    subreaper (``become_subreaper`` first), waits for it and returns its exit status (-N for a
    signal), then keeps what it left running in its tree (``linger``) until the runner kills it.

    The work is a plugin's code: it may kill its own process (a segfault, ``os._exit``) right after
    starting a daemon that cleared its environment and left the session. When that process was the
    subreaper itself, the daemon went to init with no cookie and outlived the stage (and ``nsa-run
    list``): now its parent, this process, lives on and the daemon is re-parented here."""
    parent = os.getpid()
    told_r, told_w = os.pipe()  # the work says there it wrote its result (``_tell_result``; not inherited)
    pid = os.fork()
    if pid == 0:
        os.close(told_r)
        _TOLD[:] = [told_w]
        signal.signal(RUNNER_GONE, signal.SIG_DFL)  # the keeper's word only: the stage's own code may use it
        if _prctl(PR_SET_PDEATHSIG, signal.SIGKILL) and os.getppid() != parent:  # the keeper is gone already
            os._exit(1)
        # a process group of its own (round 14 BR-4): a stage's ``kill -9 0`` / ``os.killpg(0, 9)`` (its
        # group) killed the keeper too, and a daemon that cleared its environment went to init; now it
        # reaches the stage's group only, the keeper lives on and the daemon comes to it
        # (``kill_processes`` signals the stage's groups as well as the worker's)
        try:
            os.setpgid(0, 0)
        except OSError:
            pass
        return None
    # the runner stops a stage with SIGTERM first, then SIGKILL after a grace period: the keeper
    # ignores the SIGTERM (dying of it would SIGKILL the stage at once through its parent-death
    # signal, and a stage cleaning up on SIGTERM never got its grace period); SIGKILL still ends it
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    os.close(told_w)
    os.set_blocking(told_r, False)
    _TOLD[:] = [told_r]
    while True:
        try:
            return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        except InterruptedError:
            continue
        except ChildProcessError:
            return 1


_TOLD: list[int] = []  # keep_orphans' pipe: the work's end (it tells), the keeper's end (it reads)


def _tell_result() -> None:
    """(The work.) Its result is written: the keeper writes none of its own."""
    for fd in _TOLD:
        try:
            os.write(fd, b"r")
        except OSError:
            pass


def _result_told() -> bool:
    """(The keeper, once the work ended.) Whether the work said it wrote its result. The result file
    alone cannot tell: the runner removes the temp folder as soon as it has read it, and a keeper that
    found it gone wrote a crash result into the folder being removed ("Directory not empty": the run
    stopped "incomplete")."""
    for fd in _TOLD:
        try:
            return os.read(fd, 1) == b"r"
        except OSError:  # nothing said (a descendant of the work holds its end open)
            return False
    return False


def _end_as(rc: int) -> None:
    """The keeper could not write the crash's result: it kills what the stage left running and ends
    the way the stage's process did (the same signal, or exit code), so that the runner's ERROR
    names the crash ("process died with SIGSEGV"), not the keeper's own exit."""
    import psutil

    try:
        for p in psutil.Process().children(recursive=True):
            try:
                p.kill()
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    if rc < 0:
        try:
            signal.signal(-rc, signal.SIG_DFL)
            faulthandler.disable()
            os.kill(os.getpid(), -rc)
            time.sleep(1.0)
        except (OSError, ValueError):
            pass
    os._exit(rc if 0 <= rc < 256 else 1)


def linger(max_s: float = 3600.0) -> None:
    """Once a stage (or a plugin import) is done: wait while any descendant still lives, reaping
    zombies, so that the runner's tree kill still finds every one of them (``become_subreaper``).
    The runner kills this process and its tree as soon as the result is there.

    The children are read from ``/proc/<pid>/task/*/children`` (one consistent list: a fork chain's
    live process is always in it, or its successor is), and "none lives" is believed only when a
    second read, with nothing reaped between, shows no new child: a fork chain whose every process
    forks its successor and exits within a millisecond (round 15 A4) was missed by psutil's slower
    look, this process ended, and the chain went to init and outlived the run."""
    def live(pids: list[int]) -> bool:
        return any(_proc_state(pid) not in ("", "Z", "X") for pid in pids)

    deadline = time.monotonic() + max_s
    me = os.getpid()
    while time.monotonic() < deadline:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        first = _children_of(me)
        if first is None:
            return
        if not live(first):
            again = _children_of(me) or []
            if set(again) <= set(first) and not live(again):
                return
            continue
        time.sleep(0.05)


def stage_processes(cookie: str, root: int | None = None, key: str = COOKIE_ENV) -> list:
    """Every live process of a stage: ``root`` and its descendants, and every process of this user
    whose environment carries ``cookie`` as ``key`` (a daemonised grandchild is no descendant any more;
    ``key``: the stage's cookie, or an adapter's own inside it: ``_contained``)."""
    import psutil

    found: dict[int, psutil.Process] = {}
    if root is not None:
        try:
            r = psutil.Process(root)
            found[r.pid] = r
            found.update((c.pid, c) for c in r.children(recursive=True))
        except psutil.Error:
            pass
    me, uid = os.getpid(), os.getuid()
    for p in psutil.process_iter(["uids"]):
        try:
            if p.pid in found or p.pid == me or p.info["uids"] is None or p.info["uids"].real != uid:
                continue
            if p.environ().get(key) == cookie:
                found[p.pid] = p
        except psutil.Error:
            continue
    return [p for pid, p in found.items() if pid != me]


def _proc_state(pid: int) -> str:
    """A process's state letter (``R``, ``S``, ``T``, ``Z``...), "" when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0].decode()
    except (OSError, IndexError):
        pass
    import psutil

    try:
        return {psutil.STATUS_ZOMBIE: "Z", psutil.STATUS_STOPPED: "T", psutil.STATUS_DEAD: "X"}.get(
            psutil.Process(pid).status(), "R")
    except psutil.Error:
        return ""


def _children_of(pid: int) -> list[int] | None:
    """The direct children of ``pid`` (zombies included), None when it is gone. Linux: read from
    ``/proc/<pid>/task/<tid>/children`` (microseconds: a process that lives a few ms is still seen
    there); elsewhere psutil."""
    try:
        out: list[int] = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out += [int(x) for x in f.read().split()]
        return out
    except (OSError, ValueError):  # gone, not Linux, or no ``children`` file (CONFIG_PROC_CHILDREN)
        if os.path.isdir("/proc/self") and not os.path.exists(f"/proc/{pid}"):
            return None
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children()]
    except psutil.Error:
        return None


def hold_pid(proc: subprocess.Popen) -> subprocess.Popen:
    """``proc`` (just started, so not reaped: its pid is its own) with a pidfd of it kept (``proc.nsa_pidfd``, closed
    with the object) where the system has them: ``StageTree`` signals it, its tree and its group only while it is
    still this process, never a process that got its pid after it was reaped (a stage's fork storm cycled the pids
    within a second: the runner, freezing a worker it had reaped already, stopped another nsa-run that had the pid
    next, with its spare worker; found in CI beside a round 15 comet test)."""
    import weakref

    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # not Linux, or an old kernel: the returncode check alone
        fd = None
    proc.nsa_pidfd = fd
    if fd is not None:
        weakref.finalize(proc, os.close, fd)
    return proc


def _still_ours(proc: subprocess.Popen) -> bool:
    """``proc`` not reaped yet (its pid still names it; a zombie counts: its pid is held)."""
    if proc.returncode is not None:
        return False
    fd = getattr(proc, "nsa_pidfd", None)
    if fd is None:
        return True
    try:
        signal.pidfd_send_signal(fd, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    return True


# how long the keeper's children are killed before the tree kill goes on without them (``StageTree.drain``)
DRAIN_S = 5.0


class StageTree:
    """The processes of one stage, found as ``stage_processes`` finds them (the tree below the worker
    ``root``, and every process of this user carrying ``cookie``) and never forgotten: each process
    found is kept as (pid, create time) — psutil refuses to signal a pid that was reused.

    ``freeze`` stops them all (SIGSTOP, looked at again until nothing new shows: a stopped process
    neither forks nor writes); ``kill`` ends them. The executor freezes a finished stage before it
    reads its result and checks its files, and kills it (SIGKILL) beside the next stage (round 15
    A1: a stage's TERM-ignoring helper, alive for the 3 s grace beside the next stage, forged that
    stage's result)."""

    def __init__(self, cookie: str, root: int | subprocess.Popen | None):
        """``root``: the worker, as the Popen that started it (``hold_pid``: acted on only while it is that
        process), or a pid (the watchdog's: the worker is not its child)."""
        import psutil

        self._psutil = psutil
        self._proc = root if isinstance(root, subprocess.Popen) else None
        self.cookie, self.root = cookie, (root.pid if self._proc is not None else root)
        self.known: dict[tuple[int, float], psutil.Process] = {}

    def _root(self) -> int | None:
        """The worker's pid while it still names the worker (``_still_ours``), else None from then on."""
        if self.root is not None and self._proc is not None and not _still_ours(self._proc):
            self.root = None
        return self.root

    def _tell(self, pids) -> None:
        """(Round 16 A2.) The runner's watchdog of this stage (``Watchdog``, where this process has one) is
        told of each process before it is stopped, and a watchdog the stage killed is replaced first: a
        kill -9 of the runner while the tree is frozen (the stage's processes die by their parent-death
        signal, a stopped daemon that left the session and cleared its environment goes to init) left
        that daemon stopped for good with nothing that knew it."""
        guard = _GUARDS.get(self.cookie)
        if guard is not None:
            guard.tell(pids)

    def live(self) -> list:
        out = []
        for p in self.known.values():
            try:
                if p.is_running() and p.status() != self._psutil.STATUS_ZOMBIE:
                    out.append(p)
            except self._psutil.Error:
                pass
        return out

    def look(self) -> bool:
        """Find the stage's processes again; True when one not known before was found."""
        found = stage_processes(self.cookie, self._root())
        for p in self.live():
            try:
                found += p.children(recursive=True)
            except self._psutil.Error:
                pass
        new = False
        for p in found:
            try:
                key = (p.pid, p.create_time())
            except self._psutil.Error:
                continue
            if key not in self.known and p.pid != os.getpid():
                self.known[key] = p
                new = True
        return new

    @staticmethod
    def send(procs: list, sig: int) -> None:
        for p in procs:
            try:
                p.send_signal(sig)
            except Exception:  # noqa: BLE001 - psutil.Error: gone, or a pid reused (never signalled)
                pass

    def groups(self, procs: list) -> list[int]:
        """The worker's process group and those of the stage's processes (the stage's work runs in a
        group of its own: ``keep_orphans``), never this process's own group."""
        root = self._root()
        out = [] if root is None else [root]
        for p in procs:
            try:
                out.append(os.getpgid(p.pid))
            except OSError:
                pass
        own = os.getpgrp()
        return [g for g in dict.fromkeys(out) if g > 1 and g != own]

    def freeze(self) -> None:
        """SIGSTOP every process of the stage: the worker's tree first (``stop_tree``: fast enough for a
        fork chain), then what the looks find (the cookie's processes too), looked at again until no
        new one shows (20 rounds at most). SIGSTOP cannot be caught nor ignored."""
        self._tell(())  # a watchdog the stage killed as it returned: replaced before anything is stopped
        self.stop_tree()
        for _ in range(20):
            new = self.look()
            procs = self.live()
            self._tell([p.pid for p in procs])
            self.send(procs, signal.SIGSTOP)
            self.stop_tree()
            if not new:
                return

    def stop_tree(self, limit_s: float = 2.0) -> None:
        """SIGSTOP the worker and every process below it, walked through ``/proc/<pid>/task/*/children``
        (microseconds a process), again until every one is stopped (``limit_s`` at most). A fork chain
        whose every process forks its successor and exits within a millisecond (round 15 A4, a
        "comet") is never found alive by the looks (psutil, tens of ms), and ran on beside the next
        stage; its successors come to the worker (a child subreaper: ``become_subreaper``), and a
        stopped process forks no more. The stopped worker reaps nothing: a pid read below it is not
        reused before it is signalled; the worker itself is acted on only while it is the worker (``_root``)."""
        root = self._root()
        if root is None:
            return
        deadline = time.monotonic() + limit_s
        dead: set[int] = set()  # zombies seen while the worker stayed stopped (not read again: thousands)
        while time.monotonic() < deadline:
            state = _proc_state(root)
            if state in ("", "Z", "X"):
                return
            if state not in ("T", "t"):
                dead.clear()  # the worker runs: it may reap, a pid may be reused
            running = [] if state in ("T", "t") else [root]
            stack, seen = [root], {root}
            while stack:
                for kid in _children_of(stack.pop()) or []:
                    if kid in seen or kid in dead:
                        continue
                    seen.add(kid)
                    kid_state = _proc_state(kid)
                    if kid_state in ("", "Z", "X"):
                        dead.add(kid)
                        continue
                    if kid_state not in ("T", "t"):
                        running.append(kid)
                    stack.append(kid)
            if not running or self._root() is None:  # (after the reads: they were the worker's, its pid held)
                return
            self._tell(running)
            for pid in running:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except OSError:
                    pass

    def drain(self, limit_s: float = DRAIN_S) -> None:
        """SIGKILL the worker's children, the worker (a child subreaper: ``become_subreaper``) stopped
        and kept alive, until none lives (``limit_s`` at most): each one killed hands its own children
        to the worker, killed at the next round. A fork chain whose every process forks its successor
        and exits within milliseconds (round 15 A4, a "comet": env cleared, ``setsid``) is never found
        alive by ``freeze``'s slower looks, and once the worker died it went to init and outlived the
        run; read from ``/proc/<worker>/task/*/children`` it is seen each time, and it cannot leave the
        worker's tree while the worker lives. The stopped worker reaps nothing: a pid read there is
        not reused before it is signalled. Where the worker is gone already (the stage killed it) or
        cannot be a subreaper (not Linux), this does nothing: the cookie and the looks remain; so too once the
        worker is reaped (``_root``: its pid may be another process's)."""
        root = self._root()
        if root is None:
            return
        deadline = time.monotonic() + limit_s
        signalled: set[int] = set()
        dead: set[int] = set()  # zombies seen while the worker stayed stopped (not read again: thousands)
        while time.monotonic() < deadline:
            state = _proc_state(root)
            if state in ("", "Z", "X"):
                return
            if self._root() is None:
                return
            if state != "T":  # continued by someone (a stage's process): stopped again, never reaping
                dead.clear()
                try:
                    os.kill(root, signal.SIGSTOP)
                except OSError:
                    return
            kids = _children_of(root)
            if kids is None:
                return
            live = []
            for pid in kids:
                if pid not in dead:
                    if _proc_state(pid) in ("", "Z", "X"):
                        dead.add(pid)
                    else:
                        live.append(pid)
            if not live or self._root() is None:  # (after the reads: they were the worker's children)
                return
            fresh = [pid for pid in live if pid not in signalled]
            for pid in live:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            signalled.update(live)
            if not fresh:  # only ones already killed, still leaving (a CUDA context being freed)
                time.sleep(0.002)

    def kill(self, grace_s: float, term: bool = True) -> None:
        """SIGTERM every process of the stage (and the process groups of the worker and of the stage's
        processes), wait up to ``grace_s``, then SIGKILL what is left (``term=False``: SIGKILL at
        once). Before the SIGKILL, the worker's children are drained (``drain``) while it lives.

        Once SIGTERM ends the worker (the subreaper), a TERM-ignoring daemon that cleared its
        environment is re-parented to init and carries no cookie: only the earlier look still knows
        it, so its SIGKILL comes from there, as does that of any child such a survivor forks
        meanwhile (its descendants are looked at too)."""
        phases = ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)) if term else ((signal.SIGKILL, 5.0),)
        for sig, wait in phases:
            self.freeze()
            if sig == signal.SIGKILL:
                self.drain()
            procs = self.live()
            if not procs:
                return
            for group in self.groups(procs):
                try:
                    os.killpg(group, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            self.send(procs, sig)
            self.send(procs, signal.SIGCONT)  # a stopped process acts on SIGTERM only once it runs again
            if wait > 0:
                self._psutil.wait_procs(procs, timeout=wait)


def freeze_processes(cookie: str, root: int | subprocess.Popen | None) -> StageTree:
    """Stop every process of the stage now (``StageTree.freeze``); ``.kill(...)`` ends them later."""
    tree = StageTree(cookie, root)
    tree.freeze()
    return tree


def kill_processes(cookie: str, root: int | subprocess.Popen | None, grace_s: float) -> None:
    """SIGTERM every process of the stage (and the process groups of the worker and of the stage's
    processes), wait up to ``grace_s``, then SIGKILL what is left (``StageTree.kill``: the tree is
    known before anything is signalled, frozen before each signal, the worker's children drained
    before the SIGKILL)."""
    StageTree(cookie, root).kill(grace_s)


def _above_std(fd: int) -> int:
    """``fd`` moved to 3 or above (close-on-exec): were fd 0-2 closed, ``os.pipe`` returns one of
    them, and a child started with stdin/stdout/stderr=DEVNULL gets /dev/null in the pipe's place."""
    if fd > 2:
        return fd
    import fcntl

    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    finally:
        os.close(fd)


RUNNER_ENV = "NSA_RUN_WATCHDOG_RUNNER"  # the watchdog's runner (its pid), in the watchdog's environment
_GUARDS: dict[str, Watchdog] = {}  # this process's live watchdogs by cookie (``StageTree._tell``)


def _start_time(pid: int) -> int | None:
    """A process's start time (clock ticks since boot, ``/proc/<pid>/stat``: with the pid, it names the
    process, never a later one given the same pid); None when it is gone or not Linux."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rpartition(b")")[2].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _write_lines(fd: int, lines: list[bytes]) -> None:
    """Write lines to a non-blocking pipe in whole chunks of at most PIPE_BUF (4096) bytes (each one
    written whole or not at all); what does not fit is left out (the watchdog looks for itself too)."""
    chunk = b""
    for line in [*lines, b""]:
        if chunk and (not line or len(chunk) + len(line) > 4096):
            try:
                os.write(fd, chunk)
            except OSError:  # full (a stopped watchdog), or its reader gone
                return
            chunk = b""
        chunk += line


# the watchdog's own process group in the runner's session (``Watchdog``); Python 3.10 has no
# ``process_group``: a session of its own there (not continued by the kernel when the runner dies)
_OWN_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}


class Watchdog:
    """``python -m nsa_runner._worker --watchdog`` (runner side; the executor and plugin discovery use
    it): kills the stage and removes its temp folder if
    this runner dies (kill -9) before ``done()``. Its own process group: a terminal's Ctrl-C or Ctrl-Z
    and a kill of the runner's process group do not reach it.

    A stopped watchdog (SIGSTOP: a stage may stop its own) counts as a dead one (round 13 A-B1: it
    stayed stopped for good, and a kill -9 of the runner left the stage's processes running): while
    the runner lives, ``alive()`` continues it; when the runner dies, the kernel continues it. The
    watchdog stays in the runner's session, in a process group of its own whose only tie outside is
    the runner, so the runner's death orphans that group, and an orphaned group with a stopped member
    gets SIGHUP (ignored) then SIGCONT: the watchdog wakes up to the runner's death and does its job,
    even when a stage stopped it and killed the runner in one go. (Not when the runner's parent, the
    watchdog's new one, is a subreaper of the same session: then ``alive()`` alone covers it.)"""

    def __init__(self, cookie: str, worker_pid: int, tmpdir: str, env: dict[str, str]):
        self._args = (cookie, worker_pid, tmpdir, env)
        self.proc = None
        self.w: int | None = None
        self._told: dict[tuple[int, int], bytes] = {}  # (pid, start) -> its line (``tell``); told again to a new one
        self._start(cookie, worker_pid, tmpdir, env)
        _GUARDS[cookie] = self

    def tell(self, pids) -> None:
        """(Round 16 A2; ``StageTree`` calls it before it stops a process.) The watchdog is kept alive
        (``alive``) and told of each process (pid and start time, read from ``/proc``): were the runner
        killed now, it kills them even once they left the stage's tree (a daemon that cleared its
        environment and left the session goes to init when the stage's processes die with the runner).
        A killed watchdog's successor is told them all at its start."""
        self.alive()
        lines = []
        for pid in pids:
            start = _start_time(pid)
            if start is not None and (pid, start) not in self._told:
                self._told[pid, start] = line = b"p%d %d\n" % (pid, start)
                lines.append(line)
        if lines and self.w is not None:
            _write_lines(self.w, lines)

    def alive(self) -> None:
        """(The runner, while the stage runs.) A watchdog that died (a kill -9 of it; it ignores
        SIGTERM / SIGHUP / SIGINT) is reaped and a new one started: a runner killed afterwards left
        the stage's processes running, with nothing watching. A stopped one (SIGSTOP) is continued,
        one a tracer holds is killed and replaced (round 13 A-B1)."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            if self._stopped(proc) != "traced":
                return
            self._kill(proc)  # held by a tracer (a debugger): SIGCONT does not wake it; a new one then
        w, self.w = self.w, None  # (forgotten first, as in ``done``)
        if w is not None:
            try:
                os.close(w)
            except OSError:
                pass
        self.proc = None
        self._start(*self._args)

    def _stopped(self, proc: subprocess.Popen) -> str:
        """"stopped" (and continued now: SIGCONT), "traced" (stopped by a tracer), or "" (running)."""
        try:
            with open(f"/proc/{proc.pid}/stat", "rb") as f:
                state = f.read().rpartition(b")")[2].split()[0]
        except (OSError, IndexError):  # not Linux: psutil (slower, but it reads the same)
            try:
                import psutil

                state = {psutil.STATUS_STOPPED: b"T", psutil.STATUS_TRACING_STOP: b"t"}.get(
                    psutil.Process(proc.pid).status(), b"R")
            except Exception:  # noqa: BLE001 - gone (reaped at the next poll) or unknown: nothing to do
                return ""
        if state == b"T":
            try:
                proc.send_signal(signal.SIGCONT)
            except OSError:
                pass
            return "stopped"
        return "traced" if state == b"t" else ""

    def _start(self, cookie: str, worker_pid: int, tmpdir: str, env: dict[str, str]) -> None:
        r, self.w = (_above_std(fd) for fd in os.pipe())
        os.set_blocking(self.w, False)  # never held up by a stopped watchdog (``tell``)
        _write_lines(self.w, list(self._told.values()))  # a killed one's successor knows what it knew
        try:
            env = {k: v for k, v in env.items() if k not in (COOKIE_ENV, PARENT_ENV)}
            env[RUNNER_ENV] = str(os.getpid())  # the process it watches (``watchdog``: a pidfd of it)
            self.proc = subprocess.Popen(
                python_m("nsa_runner._worker", "--watchdog", str(r), cookie, str(worker_pid), tmpdir),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(r,),
                env=env, **_OWN_GROUP)
        except OSError:  # no watchdog: the parent-death signal still stops the worker itself
            os.close(self.w)
            self.w = None
        finally:
            os.close(r)

    def done(self) -> None:
        """The runner is done with the stage: the watchdog is killed (SIGKILL, a stopped one too) and
        reaped; it never outlives this call. An interrupt (Ctrl-C, SIGTERM) meanwhile is raised once it
        is reaped. (Before round 16 the runner wrote a "done" byte into the watchdog's pipe: a stage
        that reopened the pipe through ``/proc/<runner>/fd/N`` could send it too, and hold the pipe open.)"""
        if _GUARDS.get(self._args[0]) is self:
            del _GUARDS[self._args[0]]
        proc = self.proc
        try:
            w, self.w = self.w, None  # forgotten before it is closed: an interrupt between the two made the
            if w is not None:  # next ``done`` close the number again (EBADF, or another file's descriptor)
                os.close(w)
            if proc is not None:
                self._kill(proc)
        finally:
            if proc is None or proc.returncode is not None:
                self.proc = None

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        """SIGKILL and reap the watchdog; an interrupt arriving meanwhile waits until it is reaped."""
        interrupted = None
        while True:
            try:
                try:
                    proc.kill()
                except OSError:
                    pass
                proc.wait()
                break
            except KeyboardInterrupt as e:
                interrupted = interrupted or e
        if interrupted is not None:
            raise interrupted


RUNNER_GONE = signal.SIGUSR2  # the kernel's word to the worker that its runner died (``_die_with_parent``)


def _die_with_parent() -> None:
    """Linux: the kernel signals this process (``RUNNER_GONE``) when the runner that started it dies; it then kills
    its whole tree and ends (``_runner_gone``)."""
    signal.signal(RUNNER_GONE, _runner_gone)
    if not _prctl(PR_SET_PDEATHSIG, RUNNER_GONE):  # not Linux: the watchdog alone covers runner death
        signal.signal(RUNNER_GONE, signal.SIG_DFL)
        return
    parent = os.environ.get(PARENT_ENV)
    if parent and parent.isdigit() and os.getppid() != int(parent):  # the runner died before prctl
        os._exit(1)


def _runner_gone(signum, frame) -> None:
    """The runner died (kill -9): every process below this one is stopped and killed, then this one ends.

    Once the runner had died the worker died at once by SIGKILL (its old parent-death signal), and a daemon the
    stage had started in a session of its own with its environment cleared went to init: only the watchdog's last
    look knew it, and a stage that stopped its watchdog and killed the runner within a look (0.5 s) left it
    running ("Open after stop 41"). The worker is a child subreaper: such a daemon is always in its tree while it
    lives, and now it lives until that tree is gone. (A ``RUNNER_GONE`` sent by anyone while the runner lives is
    ignored.)"""
    parent = os.environ.get(PARENT_ENV)
    if parent and parent.isdigit() and os.getppid() == int(parent):
        return
    kill_tree(os.getpid())
    os._exit(1)


def kill_tree(root: int, limit_s: float = 5.0) -> None:
    """SIGKILL every live process below ``root`` (this process, a child subreaper: orphans of the tree come back to
    it), each round stopping them all first (a forking one forks no more), reaping what died, until none is left
    (``limit_s`` at most)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        found, stack = [], [root]
        while stack:
            for kid in _children_of(stack.pop()) or []:
                if _proc_state(kid) not in ("", "Z", "X"):
                    found.append(kid)
                stack.append(kid)
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in found:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        while True:  # the dead among this process's own children
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid = 0
            if pid == 0:
                break
        if not found:
            return
        time.sleep(0.002)


def _ignore_stops() -> None:
    """The watchdog ignores SIGTERM, SIGHUP and SIGINT (as the keeper does): only SIGKILL ends it. A
    terminal's Ctrl-C is the runner's to handle; a TERM or HUP that killed it left the stage's
    processes running when the runner was killed (kill -9) afterwards."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)


def _runner_pidfd(runner: int) -> int | None:
    """A pidfd of the runner (Linux 5.3+): readable once it has ended, whoever holds its pipe's ends."""
    try:
        fd = os.pidfd_open(runner)
    except (AttributeError, OSError):
        return None
    if os.getppid() != runner:  # it died before: the pid may name another process now
        os.close(fd)
        return None
    return fd


TOLD_MAX = 200_000  # the watchdog's memory stays bounded whatever a stage writes into its pipe


def _told(data: bytes, told: set[tuple[int, int]]) -> bytes:
    """The runner's lines ``p<pid> <start time>`` in ``data`` into ``told`` (a set: a line the stage wrote
    into the pipe can add a process, never take one away); the unfinished rest is returned."""
    *lines, rest = data.split(b"\n")
    for line in lines:
        pid, _, start = line[1:].partition(b" ")
        if line[:1] == b"p" and pid.isdigit() and start.isdigit() and len(told) < TOLD_MAX:
            told.add((int(pid), int(start)))
    return rest[-64:]


def watchdog(argv: list[str]) -> int:
    """``--watchdog FD COOKIE WORKER_PID TMPDIR``: wait for the runner (``$NSA_RUN_WATCHDOG_RUNNER``, its
    parent) to die, then kill the stage's processes and remove its temp folder. The runner, done with the
    stage, kills this process (``Watchdog.done``).

    Round 16 A1: the runner's death was read from EOF on the pipe FD alone, and a stage (or a plugin's
    import) that reopened the runner's end through ``/proc/<runner>/fd/N`` and handed it to a child kept
    the pipe open: after a kill -9 of the runner, the stage's processes and this watchdog lived on (and a
    survivor holding the run's owner lock made the dead run "RUNNING"). Now the runner itself is watched:
    a pidfd of it (readable once it has ended), and its pid as this process's parent. The pipe brings the
    processes the runner stopped (``Watchdog.tell``), killed here too."""
    import select

    import psutil

    fd, cookie, worker, tmpdir = int(argv[0]), argv[1], int(argv[2]), argv[3]
    _ignore_stops()
    runner = os.environ.get(RUNNER_ENV, "")
    runner_pid = int(runner) if runner.isdigit() else os.getppid()
    pidfd = _runner_pidfd(runner_pid)
    os.set_blocking(fd, False)
    # the worker's tree, seen at once and every half second: a descendant without the cookie (a daemon
    # that cleared its environment) is still known when the runner and the worker die at once
    seen: dict[int, psutil.Process] = {}
    told: set[tuple[int, int]] = set()
    rest, pipe_open = b"", True
    while True:
        try:
            seen.update((c.pid, c) for c in psutil.Process(worker).children(recursive=True))
        except psutil.Error:
            pass
        if os.getppid() != runner_pid:
            break
        watched = ([fd] if pipe_open else []) + ([pidfd] if pidfd is not None else [])
        try:
            ready = select.select(watched, [], [], 0.5)[0]
        except (OSError, ValueError):
            ready = []
            time.sleep(0.5)
        if fd in ready:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                data = None
            except OSError:
                data = b""
            if data == b"":  # every writer closed it: the runner died (or one that cannot say so: no pidfd)
                if pidfd is None:
                    break
                pipe_open = False
            elif data:
                rest = _told(rest + data, told)
        if pidfd is not None and pidfd in ready:
            break
    while pipe_open:  # what the runner told before it died (it may have stopped processes meanwhile)
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        rest = _told(rest + data, told)
    for pid, start in told:  # stopped by the runner: killed at once (a stopped process has no cleanup)
        if pid != os.getpid() and _start_time(pid) == start:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    kill_processes(cookie, worker, grace_s=2.0)
    for p in seen.values():  # psutil checks the pid still names the same process (creation time)
        try:
            p.kill()
        except psutil.Error:
            pass
    shutil.rmtree(tmpdir, ignore_errors=True)
    return 0


def _load(spec: str) -> Stage:
    module, _, attr = spec.partition(":")
    obj = importlib.import_module(module)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    stage = obj() if isinstance(obj, type) else obj
    if not isinstance(stage, Stage):
        raise TypeError(f"{spec} is a {type(stage).__name__}, not an nsa_runner.Stage")
    return stage


FIRST_LINE_CHARS = 2000  # a stage's exception in its reason: the first line of its text (its class name: NAME_CHARS)


def _described(e: BaseException) -> str:
    """``TYPE: first line`` of a stage's exception, each part clipped, never raising: a class name of
    30 MB (a metaclass, ``type("E" * n, ...)``) made the stage's ERROR "result too large" with its own
    reason lost, and a ``__str__`` that raises killed the worker in its own error path."""
    return described(e, FIRST_LINE_CHARS, marked=True, unreadable="(its text could not be read: str() of it raised)")


def _shown(value: object) -> str:
    """A field of a stage's result in the worker's closing log line: text under the one text rule (what
    ``_text.CONTROL`` matches written visibly as its escapes, ``\\x1b]0;pwn\\x07``, as env.txt does: a flash import
    error's raw ESC / OSC / BEL / U+009B in the reason reached the log, ``cat`` of it retitled the terminal;
    round 20 B U-1), another value by its type (its ``repr`` may raise: the runner names the wrong type)."""
    if type(value) is not str:
        return f"({type_name(value)})"
    return visible(value)


def _traceback_text() -> str:
    """``traceback.format_exc()`` of the exception being handled, never raising: a class refusing its
    ``__qualname__`` / ``__module__`` (a metaclass) made it raise in the worker's ``except`` clause, and
    the worker died without a result (the stage's ERROR "exited with code 1 without a result")."""
    try:
        return traceback.format_exc()
    except Exception as e:  # noqa: BLE001 - a hostile exception class
        return f"(the traceback could not be formatted: {_described(e)})\n"


def _error(message: str, tb: str | None, files: object = ()) -> dict:
    """The stage's ERROR ``message``, with the stage's declared ``files`` when they are a list of text
    (the runner checks them as any stage's)."""
    kept = list(files) if isinstance(files, list) and all(type(f) is str for f in files) else []
    return {"result": StageResult(Status.ERROR, message, files=kept).to_dict(), "traceback": tb}


def _out_of_torch_import(e: BaseException) -> bool:
    """Whether the stage's exception came out of ``import torch`` (torch is not imported in this process and a frame
    of its traceback is torch's own ``__init__.py``, the installed torch's found by its spec, not a file whose path
    merely ends so: round 23 B23-5, a plugin package named ``mytorch``). The runner then asks a fresh process what
    ``import torch`` says (``executor._torch_said``, off the stage's clock): round 22 B22-2, a device backend whose
    init failed in the stage's process only left torch's second-import error, naming nothing."""
    try:
        if "torch" in sys.modules:
            return False
        spec = importlib.util.find_spec("torch")
        origin = spec.origin if spec is not None else None
        if not origin:
            return False
        own = os.path.realpath(origin)
        seen = 0
        while e is not None and seen < 8:  # the exception and what it chained from (torch re-raises)
            for frame in traceback.extract_tb(e.__traceback__):
                if os.path.realpath(frame.filename) == own:
                    return True
            e, seen = e.__cause__ or e.__context__, seen + 1
    except Exception:  # noqa: BLE001 - only a better message: the stage's ERROR stands
        pass
    return False


_GETPID = os.getpid  # as at nsa-run's import: a stage may leave os.getpid patched (round 24 B24-2)
# the standard library's functions before any plugin code (a spare's torch import with its device backends, the
# stage's import and run): put back once the stage has ended, before the worker writes its result (round 24 B24-2)
_STDLIB = _stdlib_put.snapshot()


_LIMITS = (sys.getrecursionlimit(), _stdlib_put.limits())
_TIMERS = (signal.alarm, signal.setitimer, faulthandler.cancel_dump_traceback_later)  # as before any stage code
_SET_HANDLER = signal.signal
# once the stage has ended, these end the worker no more: a timer a stage's thread arms after run() returned (round
# 28 U28-4: "process died with SIGALRM", the PASS lost) or a CPU-time limit set just above what the stage used (round
# 27 U27-2: SIGXCPU); the worker's own code uses none of them
_LATE_SIGNALS = tuple(getattr(signal, n) for n in ("SIGALRM", "SIGVTALRM", "SIGPROF", "SIGXCPU") if hasattr(signal, n))


# descriptors held for the worker's own result writing while the stage runs, given back after it (round 26 U26-2: a
# stage leaking descriptors up to its limit lost its PASS: "Too many open files" at the worker's import and write)
_RESERVED_FDS = 4


def _reserve_fds() -> list[tuple[int, tuple[int, int]]]:
    """``_RESERVED_FDS`` descriptors on /dev/null, each with its file's (dev, ino)."""
    out = []
    try:
        for _ in range(_RESERVED_FDS):
            fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            st = os.fstat(fd)
            out.append((fd, (st.st_dev, st.st_ino)))
    except OSError:
        pass
    return out


def _release_fds(held: list[tuple[int, tuple[int, int]]]) -> None:
    """``_reserve_fds``'s descriptors closed, each only where it is still /dev/null (the stage may have closed it and
    the number been reused). Never raises."""
    for fd, ident in held:
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == ident:
                os.close(fd)
        except OSError:
            continue


def _put_back(imports: dict, held: list) -> list[str]:
    """What the stage's code left changed that the worker's own result writing needs, put back: the standard
    library (``_stdlib_put``), the recursion limit and the resource limits where it changed them (round 25 U25-3:
    ``sys.setrecursionlimit(60)`` or a 100-byte RLIMIT_FSIZE lost a PASS; round 27 B27-4: a lowered RLIMIT_AS),
    ``imports``, sys.path / meta_path / path_hooks as before the stage's import, exactly (round 26 U26-1: the
    worker's own imports after the stage failed), and timers it left armed are cancelled (round 27 B27-3: an alarm
    armed as it returned fired while the result was written; the timer and CPU-limit signals ignored from then on:
    ``_LATE_SIGNALS``); ``held``, the descriptors kept for the result, given
    back. Names what. Never raises."""
    left = []
    for sig in _LATE_SIGNALS:  # first: a timer armed from here on (a stage's thread) cannot end the worker
        try:
            _SET_HANDLER(sig, signal.SIG_IGN)
        except (OSError, ValueError):
            pass
    try:  # the stage has returned: nothing of it is waited for any more (the worker arms no timer itself)
        if _TIMERS[0](0):
            left.append("signal.alarm")
        for which in ("ITIMER_REAL", "ITIMER_VIRTUAL", "ITIMER_PROF"):
            if _TIMERS[1](getattr(signal, which), 0)[0]:
                left.append(f"signal.setitimer({which})")
        _TIMERS[2]()
    except Exception:  # noqa: BLE001
        pass
    left += _stdlib_put.put_back(_STDLIB)
    left += _stdlib_put.put_back_import_state(imports, keep_added=False)
    _release_fds(held)
    try:
        depth, limits = _LIMITS
        if sys.getrecursionlimit() < depth:
            sys.setrecursionlimit(depth)
            left.append("sys.setrecursionlimit")
        left += _stdlib_put.put_back_limits(limits)
    except Exception:  # noqa: BLE001
        pass
    return left


def _forked_copy_ends(stage_pid: int, e: BaseException | None) -> None:
    """A copy of the stage's process that the stage forked and that came back into the worker (a helper ending
    with ``sys.exit`` where ``os._exit`` was meant, one whose work raised or that fell through) ends as it would
    in plain Python, never reporting as the stage (round 23 B23-6: its ``sys.exit(0)`` was recorded as the stage's
    ERROR and the stage's own result lost): SystemExit's code, 1 after its traceback for an exception, else 0."""
    if _GETPID() == stage_pid:
        return
    code = 0
    try:
        if isinstance(e, SystemExit):
            if isinstance(e.code, int):
                code = e.code & 0xFF
            elif e.code is not None:
                code = 1
                print(e.code, file=sys.stderr)
        elif e is not None:
            code = 1
            traceback.print_exception(e)
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - it ends all the same
        pass
    os._exit(code)


def _result_out(result: StageResult) -> dict:
    """A stage's own result as what the worker writes (``StageResult.to_dict``: text read as plain str,
    NaN / inf metrics as text, round 17 U-2 / U-3); a field that cannot be read at all is the stage's
    ERROR naming it, its declared files kept where they could be read."""
    from nsa_runner.artifacts import _json_default

    try:
        return {"result": result.to_dict(default=_json_default), "traceback": None}
    except MalformedResult as e:
        what = "; ".join(f"status must be one of {', '.join(s.value for s in Status)} ({_described(exc)})"
                         if field == "status" and isinstance(exc, ValueError)
                         else f"{field} could not be read ({_described(exc)})" for field, exc in e.problems)
        return _error(f"the stage's StageResult is malformed: {what}", None, e.partial.get("files"))


def _not_json(out: dict, e: BaseException) -> dict:
    """The stage's ERROR for a result with no JSON form (an object, a cycle, a huge int in its metrics):
    what it was (status, reason, clipped) said, its declared files kept (round 17 U-2: a FAIL's evidence
    was dropped)."""
    result = out["result"]
    was = f"{_shown(result.get('status'))}: {_shown(result.get('reason'))}".strip().rstrip(":")
    tb = out.get("traceback")
    return _error(f"stage result is not JSON-serialisable ({_described(e)}); it was {clip(was, 200)}",
                  tb if type(tb) is str else None, result.get("files"))


def _keep_log_fds() -> dict[int, int]:
    """Copies (above fd 2) of the log the worker's stdout / stderr write to: a stage may close them
    (``os.close(1)``, a daemonising library); the worker then died writing its closing log line and
    a stage that returned PASS was recorded as ERROR "exited with code 1 without a result"."""
    kept = {}
    for fd in (1, 2):
        try:
            kept[fd] = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
        except OSError:
            pass
    return kept


def _reopen_log_fds(kept: dict[int, int]) -> None:
    """Put the log back on fd 1 / 2 where the stage closed it (never over a file it opened there),
    and a fresh ``sys.stdout`` / ``sys.stderr`` where it closed the stream object."""
    for fd, copy in kept.items():
        try:
            os.fstat(fd)
        except OSError:
            try:
                os.dup2(copy, fd)
            except OSError:
                continue
        name = "stdout" if fd == 1 else "stderr"
        stream = getattr(sys, name)
        if stream is None or getattr(stream, "closed", False):
            setattr(sys, name, open(fd, "w", closefd=False, errors="backslashreplace", buffering=1))


_WAS_SPARE = False  # this worker was started ahead (--spare)
STARTED = "started"  # beside the job file: written when the stage begins (executor.run_one reads it)
PROFILE_ENV = "NSA_RUN_CPROFILE_DIR"  # a developer's aid (issue 13): where a stage's time goes


def _profiler():
    """A cProfile.Profile for the stage's run when ``NSA_RUN_CPROFILE_DIR`` names a folder, else None."""
    if not os.environ.get(PROFILE_ENV):
        return None
    import cProfile

    return cProfile.Profile()


def _dump_profile(prof, stage: str, t0: float) -> None:
    """``DIR/<stage>.prof`` (pstats) and ``DIR/<stage>.txt``: the process's age when the stage began
    (its imports) and the 40 functions of most cumulative time. Never the stage's failure."""
    import io
    import pstats

    try:
        folder = os.environ[PROFILE_ENV]
        os.makedirs(folder, exist_ok=True)
        prof.dump_stats(os.path.join(folder, f"{stage}.prof"))
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(40)
        try:
            import psutil

            age = time.time() - psutil.Process().create_time() - (time.monotonic() - t0)
        except Exception:  # noqa: BLE001
            age = float("nan")
        with open(os.path.join(folder, f"{stage}.txt"), "w") as f:
            f.write(f"process age at the stage's start: {age:.2f} s (a spare: {_WAS_SPARE})\n" + buf.getvalue())
    except Exception as e:  # noqa: BLE001
        try:
            print(f"# profile not written: {_described(e)}", file=sys.stderr)
        except Exception:  # noqa: BLE001 - the log is gone: never the stage's failure
            pass


def _preloads(flash: bool = True, fla: bool = False) -> list[str]:
    """What a spare imports ahead: torch, triton and, on a CUDA run, the CUDA-free part of FA-4's import
    where FA-4 is installed and the stage asks (``Stage.preload_flash``: sanity, fa2-probe, prefill-bench
    and decode-bench each paid ~6 s for it on the H100 host), and the torch parts fla's import pulls in
    where fla is installed and the stage asks (``Stage.preload_fla``). Found without importing anything.
    Should a preload ever initialise CUDA, the spare execs a plain worker for its stage (``_spare``)."""
    names = ["torch", "triton"]
    if os.environ.get("TRITON_INTERPRET") == "1":  # a CPU run
        return names
    if flash:
        try:
            from nsa_core.flash.detect import detect

            if detect("fa4", do_import=False).get("present"):
                # the parts of FA-4's import that touch no GPU: torch._dynamo (~4.6 s on the H100 host, whose
                # image has no bytecode for it) and the CuTe DSL; flash_attn.cute itself (quack) initialises
                # CUDA, and a worker that did cannot fork its stage ("Cannot re-initialize CUDA in forked
                # subprocess": every stage after the first ERRORed on the H100, 2026-11-25)
                names += ["torch._dynamo", "cutlass"]
        except Exception:  # noqa: BLE001 - nothing to preload then
            pass
    try:  # fla's own import is not preloaded (it may query the GPU); the torch parts it imports are
        if fla and importlib.util.find_spec("fla") is not None:
            names += ["torch._inductor.compile_fx", "functorch.compile"]
    except (ImportError, ValueError):
        pass
    return names


def _spare(fd: int, flash: bool = False, fla: bool = False) -> list[str] | None:
    """``--spare FD``: import torch, triton and FA-4 when present (``_preloads``: the seconds every
    stage's process pays on a GPU machine), then wait
    for the job on the socket FD -> [JOB, RESULT] with the log as stdout / stderr and the run folder
    as the working directory; None when the runner closed the socket without one."""
    sock = socket.socket(fileno=fd)
    for name in _preloads(flash, fla):  # no CUDA context: it would touch the GPU a stage is timing
        try:
            importlib.import_module(name)  # the preload; a failure shows again in the stage's own import
        except BaseException:  # noqa: BLE001 - never the spare's end: the stage reports it
            pass
    try:
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 1)
    except OSError:
        return None
    finally:
        sock.close()
    if not msg or len(fds) != 1:
        for f in fds:
            os.close(f)
        return None
    job = json.loads(msg.decode())
    global _WAS_SPARE
    _WAS_SPARE = True
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fds[0], 1)
    os.dup2(fds[0], 2)
    os.close(fds[0])
    try:  # what the preload printed (a warning of an import) heads the stage's log
        with open(job["preload_log"], "rb") as f:
            os.write(1, f.read(1 << 16))
    except (OSError, KeyError):
        pass
    os.chdir(job["cwd"])
    torch = sys.modules.get("torch")
    try:
        cuda_started = torch is not None and bool(torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001
        cuda_started = True
    if cuda_started:  # a preload initialised CUDA: this process cannot fork its stage; a plain worker can
        os.execv(sys.executable, python_m("nsa_runner._worker", job["job"], job["result"]))
    return [job["job"], job["result"]]


# room a stage's result leaves in its record (``manifest.RECORD_MAX_BYTES``) for what the runner adds
RESULT_MARGIN = 1 << 20


def _bounded(out: dict) -> dict:
    """``out`` when its result fits in a stage's record in manifest.json, else the stage's ERROR saying
    so (round 14 B R8: 70 000 long declared file names made manifest.json larger than its own reader
    accepts, and the run folder unusable). TypeError / ValueError: not JSON (the caller's to name)."""
    from nsa_runner.artifacts import to_json_text
    from nsa_runner.manifest import RECORD_MAX_BYTES

    result = out["result"]
    size = len(to_json_text(result).encode("utf-8"))
    limit = RECORD_MAX_BYTES - RESULT_MARGIN
    if size <= limit:
        return out
    files = result.get("files") if isinstance(result.get("files"), list) else []
    metrics = result.get("metrics") if isinstance(result.get("metrics"), dict) else {}
    was = f"{result.get('status')}: {result.get('reason') or ''}".strip().rstrip(":")
    was = was if len(was) <= 200 else was[:200] + "..."
    reason = (f"the stage's result is too large for manifest.json ({size / 2**20:.1f} MiB, more than the "
              f"{limit / 2**20:.1f} MiB one stage's record may take; {len(files)} declared file name(s), "
              f"{len(metrics)} metric(s)): not recorded, its declared files stay in the run folder unrecorded "
              f"(it was {was})")
    hint = "declare fewer or shorter file names, or fewer metrics (one file can hold many rows)"
    return {"result": StageResult(Status.ERROR, reason, hint=hint).to_dict(), "traceback": out.get("traceback")}


# the stage's process, when its start could not be marked nor its result written (``_not_started``)
EXIT_NOT_STARTED = 229


def _not_started(e: OSError, job_path: str, result_path: str, stage: str) -> None:
    """The ``started`` marker cannot be written (a temp folder out of inodes or space, most often):
    the runner would not see the stage begin, give it its worker's start-up grace on top of its
    timeout (``executor.PRELOAD_GRACE_S``) and record "did not begin" (round 14 A BR-5: a 5 s stage
    ran 125 s). The stage is not run: its ERROR names the temp folder, in its result where one can be
    written, else in its log and this process's exit status (the runner then finds the folder full
    and names it)."""
    import errno

    folder = os.path.dirname(job_path)
    why = e.strerror or str(e)
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        try:
            st = os.statvfs(folder)
            if e.errno == errno.ENOSPC and st.f_files and st.f_ffree == 0:
                why = "no inodes left: too many files"
        except OSError:
            pass
        reason = (f"the temp folder {os.path.dirname(folder)} is full ({why}): stage {stage} was not run "
                  f"(its start could not be marked in {folder})")
        hint = ("free some space (and files: inodes) in that folder, or set TMPDIR to another folder with room, "
                "then rerun")
    else:
        reason = f"stage {stage} was not run: its start could not be marked in its temp folder {folder} ({why})"
        hint = ""
    try:
        print(f"# {reason}", flush=True)
    except (OSError, ValueError):
        pass
    try:
        write_json(result_path, {"result": StageResult(Status.ERROR, reason, hint=hint).to_dict(), "traceback": None})
        _tell_result()
    except OSError:
        os._exit(EXIT_NOT_STARTED)
    linger()
    os._exit(0)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--watchdog" and len(argv) == 5:
        _ignore_stops()
        return watchdog(argv[1:])
    _die_with_parent()
    if argv and argv[0] == "--spare" and 2 <= len(argv) <= 4:  # --spare FD [flash] [fla]
        argv = _spare(int(argv[1]), flash="flash" in argv[2:], fla="fla" in argv[2:])
        if argv is None:
            return 0
    for stream in (sys.stdout, sys.stderr):  # a stage's text may hold lone surrogates: never a crash
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError):
            pass
    if len(argv) != 2:
        print("usage: python -m nsa_runner._worker JOB RESULT", file=sys.stderr)
        return 2
    job_path, result_path = argv
    # the stage's own temp folder (removed by the runner on every way out): env-pairing's flash probe puts its files
    # there, never left in TMPDIR when the stage is stopped (round 24 B24-5; ``envinfo.STAGE_TMP_ENV``)
    os.environ["NSA_RUN_STAGE_TMP"] = os.path.dirname(os.path.abspath(job_path))
    become_subreaper()  # orphans of the stage stay in this tree: killed with it
    rc = keep_orphans()  # the stage runs in a child: its orphans stay here even when it kills itself
    if rc is not None:
        # a crash (signal, os._exit): the runner's usual ERROR
        if not _result_told() and not os.path.exists(result_path):
            told = describe_exit(rc)
            if rc == EXIT_NOT_STARTED and not os.path.exists(os.path.join(os.path.dirname(job_path), STARTED)):
                told = "the stage was not run: its start could not be marked in its temp folder (its log says why)"
            try:
                write_json(result_path, _error(told, None))
            except OSError:  # no result can be written (a full disk, the temp folder gone)
                _end_as(rc)
        linger()
        return 0
    faulthandler.enable()
    with open(job_path, "rb") as f:
        job = pickle.load(f)
    sys.path[:] = list(job["sys_path"]) + [p for p in sys.path if p not in job["sys_path"]]
    ctx = RunContext.from_dict(job["ctx"])
    print(f"# nsa-run stage {ctx.stage} ({job['spec']}) pid {os.getpid()} device={ctx.device} "
          f"profile={ctx.profile} options={ctx.options}", flush=True)
    log_fds = _keep_log_fds()
    try:  # the stage begins now: the runner's clock for its timeout and duration starts here (a spare's
        # imports before this are not the stage's: round 13 A-B5, a quick stage TIMEOUTed behind them)
        # it carries the moment (the system's monotonic clock, the runner's too): the runner's poll sees the
        # marker up to a poll later, and a clock started then recorded a quick stage shorter than the time
        # it measured itself (CI on c0709ca: env-pairing's parts 1.150 s, its duration 1.118 s)
        # (written whole under another name, then renamed: the runner never reads a half-written marker)
        t0 = time.monotonic()
        if isinstance(job.get("timeout_s"), (int, float)):  # the moment the runner stops the stage: a plugin
            # adapter's own process is stopped before it (``_contained``), the stage's other rows written
            os.environ[DEADLINE_ENV] = f"{t0 + job['timeout_s']!r} {float(job['timeout_s'])!r}"
        marker = os.path.join(os.path.dirname(job_path), STARTED)
        with open(marker + ".part", "wb") as f:
            f.write(repr(t0).encode("ascii"))
        os.replace(marker + ".part", marker)
    except OSError as e:  # never run unseen by the runner's clock (round 14 A BR-5)
        _not_started(e, job_path, result_path, ctx.stage)
    prof = _profiler()
    stage_pid = os.getpid()  # a copy the stage forks that comes back here is not the stage (_forked_copy_ends)
    from_torch = False
    left: list[str] = []  # standard-library functions and limits the stage's code left changed (put back)
    imports, held = _stdlib_put.import_state(), _reserve_fds()
    try:
        stage = _load(job["spec"])
        result = stage.run(ctx) if prof is None else prof.runcall(stage.run, ctx)
        left = _put_back(imports, held)
        _forked_copy_ends(stage_pid, None)
        if not isinstance(result, StageResult):
            out = _error(f"run() returned {type_name(result)}, expected a StageResult", None)
        else:
            out = _result_out(result)
    except SystemExit as e:
        left = _put_back(imports, held)
        _forked_copy_ends(stage_pid, e)
        try:
            code = clip(repr(e.code), FIRST_LINE_CHARS)
        except Exception:  # noqa: BLE001 - an exit code whose repr raises
            code = "..."
        out = _error(f"stage called sys.exit({code})", _traceback_text())
    except Exception as e:  # noqa: BLE001 - any exception is the stage's ERROR, with traceback
        left = _put_back(imports, held)
        _forked_copy_ends(stage_pid, e)
        from_torch = _out_of_torch_import(e)
        tb = _traceback_text()
        _reopen_log_fds(log_fds)
        try:
            sys.stderr.write(tb)
        except (OSError, ValueError):
            pass
        out = _error(_described(e), tb)
    _reopen_log_fds(log_fds)
    if left:  # said in the log: what the stage's code changed that nsa-run's own code needs
        try:
            print(f"# note: the stage's code left {', '.join(left[:20])} changed; put back", flush=True)
        except Exception:  # noqa: BLE001 - the log is gone: the result still counts
            pass
    if prof is not None:
        _dump_profile(prof, ctx.stage, t0)
    try:
        out = _bounded(out)
    except Exception as e:  # noqa: BLE001 - no JSON form (an object in metrics, a cycle, a huge int)
        out = _bounded(_not_json(out, e))
    if from_torch and out["result"].get("status") == Status.ERROR.value:
        out["torch_import_failed"] = True  # the runner asks a fresh process what import torch says
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        print(f"# stage {ctx.stage}: {_shown(out['result']['status'])} after {time.monotonic() - t0:.1f}s "
              f"{_shown(out['result']['reason'])}", flush=True)
    except Exception:  # noqa: BLE001 - the log is gone (a stage that closed sys.stdout): the result still counts
        pass
    try:
        write_json(result_path, out)
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001 - an object whose JSON form changed since _bounded
        write_json(result_path, _bounded(_not_json(out, e)))
    _tell_result()
    linger()  # what the stage left running stays in this tree until the runner kills it
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
