"""Bad days, found in CI (stop 35): a stage's fork storm (round 15's comet test) cycled the system's pids within a
second, and the runner, freezing and killing a stage whose worker had already exited and been reaped, acted on the
worker's pid: another nsa-run, started meanwhile, had that pid and was stopped (SIGSTOP) with its spare worker, its
test timed out. Here the reuse is made certain: the reaped worker's Popen is given the pid of an unrelated live
process, as the kernel would. Expected: the tree kill acts on the worker only while it is still the runner's
unreaped child (``_worker.hold_pid``: a pidfd, the returncode); the unrelated process is never signalled."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

from nsa_runner import _worker, executor
from nsa_runner._worker import _proc_state


def test_a_reaped_workers_pid_taken_by_another_process_is_never_signalled():
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        worker = _worker.hold_pid(subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True))
        worker.wait(timeout=60)  # reaped: its pid is free for any process
        worker.pid = victim.pid  # ... and the kernel gave it to the victim
        reaper = executor._Reaper(worker, uuid.uuid4().hex, guard=None)
        reaper.release()
        reaper.join()
        time.sleep(0.2)
        assert victim.poll() is None, victim.returncode  # before: SIGKILLed (frozen, then killed as the root)
        assert _proc_state(victim.pid) not in ("T", "t"), _proc_state(victim.pid)
    finally:
        victim.kill()
        victim.wait(timeout=30)
