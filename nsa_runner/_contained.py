"""A plugin adapter's own process, run from a stage's process and kept in bounds there (``run_contained``).

The stage runs the adapter's part in a fresh process (``stages._parity.in_own_process``) so that what an adapter does
to its process cannot reach nsa_core's rows. Two things it could still do through the operating system are bounded
here (red-team round 48):

- B48b-5, its output: the process writes into a pipe read here, and at most ``output_cap()`` bytes of it (1/8
  of the stage log's limit, at most half the room left) go on to the stage's log. Past that the adapter's
  processes are killed and it is named ("printed more than N MiB"): a flood of 300 MiB passed the stage log's
  cap and the whole stage was stopped naming no adapter.
- B48b-4, what it leaves running: once its process ends (or is stopped), every process it started is killed then,
  not at the stage's end. They are found by a cookie of the adapter's own in their environment, and, for a daemon
  that cleared its environment and left the session, as orphans re-parented to the stage's process (a child
  subreaper from the first adapter on). A ``setsid`` daemon rewrote the stage's CSV or an earlier stage's file while
  the stage ran on.

These bound a careless or a clumsy adapter. A program of the same user set on harming the run can still kill or
stop the stage's processes, or write into the run folder itself: only a sandbox (another user, namespaces) stops
that, and nsa-run has none (docs/reliability.md, round 48).
"""

from __future__ import annotations

import errno
import os
import select
import signal
import subprocess
import time
import uuid

from nsa_runner._worker import (
    DEADLINE_ENV,
    _children_of,
    _proc_state,
    become_subreaper,
    hold_pid,
    stage_processes,
)

ADAPTER_COOKIE_ENV = "NSA_RUN_ADAPTER_COOKIE"  # in the adapter's environment: what it starts is found by it
ADAPTER_LOG_SHARE = 8  # one adapter process's output reaches the stage's log up to 1/8 of its limit (32 MiB)
_LOOK_S = 0.2  # the output's wait between looks at whether the process has ended


def output_cap() -> int:
    """The bytes of one adapter process's output that reach the stage's log: 1/8 of the stage log's limit
    (``NSA_RUN_LOG_LIMIT_MIB``, 256 MiB by default), and never more than half of the room the log has left (its
    size now: fd 1), so that adapters' floods are stopped, and named, before the whole stage's log is, however many
    adapters flood (round 49 B49a-2: eight at 1/8 each passed the limit together)."""
    import stat

    from nsa_runner.executor import LOG_LIMIT_MIB, log_limit

    try:
        limit = log_limit()
    except ValueError:  # (refused by the CLI before any stage runs)
        limit = int(LOG_LIMIT_MIB * (1 << 20))
    try:
        st = os.fstat(1)
        used = st.st_size if stat.S_ISREG(st.st_mode) else 0
    except OSError:
        used = 0
    return max(0, min(limit // ADAPTER_LOG_SHARE, (limit - used) // 2))


def run_contained(argv: list[str], cwd: str, cap: int | None = None) -> tuple[int, str]:
    """Run ``argv`` in ``cwd`` (a session of its own, stdin from /dev/null), its stdout and stderr forwarded to this
    process's fd 1 up to ``cap`` bytes (``output_cap()``). Returns (its exit status as ``Popen.returncode``, "" or
    why it was stopped). However this ends (an interrupt included), the process and everything it started are
    killed before it returns."""
    cap = output_cap() if cap is None else cap
    stop_at, share = _stop_at()
    if stop_at is not None and time.monotonic() >= stop_at:  # never started to be stopped at once (round 50
        # B50a-4 / B50b-2: the adapter after a hung one was blamed, "had not ended 0 s after it began")
        return 0, "was not started: no time was left of the stage's timeout (one before it ran until its stop)"
    cookie = uuid.uuid4().hex
    become_subreaper()  # orphans of the adapter's daemons come here, not to the stage's keeper: killed below
    before = set(_children_of(os.getpid()) or [])
    env = {**os.environ, ADAPTER_COOKIE_ENV: cookie}
    proc = hold_pid(subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True))
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    forward = _Forward(cap)
    why = ""
    look = select.poll()  # (not select.select: a stage's process may hold more than FD_SETSIZE descriptors)
    look.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    try:
        while True:
            ready = look.poll(_LOOK_S * 1000)
            if ready and forward.take(fd) is False:  # the end of its output (every writer closed it): not its end
                look.unregister(fd)  # (one that closed its output and hung is stopped at its time like any other)
            if forward.over:
                why = (f"printed more than {_mib(cap)} of output (its share of the stage log's limit): stopped "
                       "there")
                break
            # ended, the pipe still held open by what it started: looked at every turn, output or not (a daemon
            # printing more often than a look held the stage to its timeout: round 49 B49b-2)
            if proc.poll() is not None:
                break
            if stop_at is not None and time.monotonic() > stop_at:  # hung, or stopped (round 49 U49a-1, U49b-1)
                why = (f"had not ended {share}: stopped there, so that the stage ends within its timeout with its "
                       "other rows")
                break
    finally:
        if proc.poll() is None:
            _kill_group(proc.pid)
            proc.kill()
        proc.wait()
        end_started(cookie, before)
        try:  # what is still in the pipe: its writers are gone now
            while forward.take(fd) and not forward.over:
                pass
        finally:
            proc.stdout.close()
            if forward.over:
                forward.write(f"\n[nsa-run: this adapter's output was cut here, past {_mib(cap)}]\n".encode())
    return proc.returncode, why


def _stop_at() -> tuple[float | None, str]:
    """When the adapter's process is stopped (the system's monotonic clock), and how that is said: before the
    stage's own timeout (``DEADLINE_ENV``, set by the worker), leaving the stage a tenth of it (5 s to 60 s) to
    end with its other rows. (None, "") outside a stage."""
    try:
        deadline, timeout = (float(x) for x in os.environ[DEADLINE_ENV].split())
    except (KeyError, ValueError):
        return None, ""
    stop_at = deadline - min(60.0, max(5.0, timeout / 10))
    left = max(0.0, stop_at - time.monotonic())
    return stop_at, f"{left:.0f} s after it began (the stage's timeout is {timeout:g} s)"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.3g} MiB"


class _Forward:
    """The adapter's output on its way to fd 1: what passes ``cap`` is dropped and marks it ``over``; a log that can
    take no more (a full disk) drops the rest silently, the adapter runs on."""

    def __init__(self, cap: int):
        self.cap, self.sent, self.over, self.broken = cap, 0, False, False

    def take(self, fd: int) -> bool | None:
        """Read what is there: True when something was, None when nothing is now, False at the output's end."""
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return None
        except OSError:
            return False
        if not chunk:
            return False
        room = self.cap - self.sent
        if len(chunk) > room:
            self.over = True
            chunk = chunk[:room]
        self.sent += len(chunk)
        self.write(chunk)
        return True

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self.broken:
            try:
                n = os.write(1, view)
            except InterruptedError:
                continue
            except OSError as e:  # a full disk, a closed log: the rest is dropped, never a crash of the stage
                self.broken = e.errno != errno.EAGAIN
                if not self.broken:
                    time.sleep(0.01)
                continue
            view = view[n:]


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def end_started(cookie: str, before: set[int], rounds: int = 20) -> None:
    """SIGKILL every process the adapter started: those carrying its ``cookie``, this process's children that were
    not there before it (orphans re-parented here), and their descendants, looked for again until none is found; then
    reap the orphans that died here. Each round stops them all before killing any (a forking one forks no more)."""
    import psutil

    me = os.getpid()
    for _ in range(rounds):
        found = {p.pid: p for p in stage_processes(cookie, None, key=ADAPTER_COOKIE_ENV)}
        for pid in _children_of(me) or []:
            if pid not in before and pid not in found and _proc_state(pid) not in ("", "Z", "X"):
                try:
                    found[pid] = psutil.Process(pid)
                except psutil.Error:
                    pass
        for p in list(found.values()):
            try:
                found.update((c.pid, c) for c in p.children(recursive=True))
            except psutil.Error:
                pass
        live = [p for p in found.values() if p.pid != me and _proc_state(p.pid) not in ("", "Z", "X")]
        if not live:
            break
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for p in live:
                try:
                    p.send_signal(sig)
                except psutil.Error:
                    pass
        time.sleep(0.01)
    _reap(before)


def _reap(before: set[int], limit_s: float = 2.0) -> None:
    """Reap this process's new children that have died (killed orphans: zombies otherwise)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        left = [pid for pid in (_children_of(os.getpid()) or []) if pid not in before]
        waiting = False
        for pid in left:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            waiting = waiting or done == 0
        if not waiting:
            return
        time.sleep(0.01)
