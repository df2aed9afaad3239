"""Bad days, red-team round 28 U28-4, through the CLI: a stage's own thread armed an interval timer after the stage
had returned (``threading.Timer(0.05, lambda: signal.setitimer(ITIMER_REAL, 0.001))``): the worker, writing the
stage's PASS, died of SIGALRM, recorded ERROR "process died with SIGALRM" (round 27 B27-3 cancelled only the timers
armed when the stage returned). The same for a CPU-time limit a stage set just above what it used (U27-2: SIGXCPU).
Expected: once the stage has ended, the timer and CPU-limit signals cannot end the worker; the PASS stands."""

from __future__ import annotations

import subprocess

try:
    from _bad_days import cli_cmd, manifest, running_first
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, manifest, running_first

# the thread arms the timers the moment the stage's run() has left the main thread's stack (the worker's own steps)
LATE_TIMER = ("import signal, sys, threading, time\n"
              "def _in_run():\n"
              "    f = sys._current_frames().get(threading.main_thread().ident)\n"
              "    while f is not None:\n"
              "        if f.f_code.co_name == 'run' and 'ctx' in f.f_locals:\n"
              "            return True\n"
              "        f = f.f_back\n"
              "    return False\n"
              "def _arm():\n"
              "    while _in_run():\n"
              "        time.sleep(0.0005)\n"
              "    signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)\n"
              "    signal.setitimer(signal.ITIMER_PROF, 0.001, 0.001)\n"
              "    signal.setitimer(signal.ITIMER_VIRTUAL, 0.001, 0.001)\n"
              "threading.Thread(target=_arm, daemon=True).start()\n"
              "time.sleep(0.05)\n")
STAGES = running_first(("A", "r28t", 11, LATE_TIMER))


def test_a_timer_armed_by_the_stages_thread_after_it_returned_never_ends_the_worker(plugins, tmp_path):
    plugins.make("r28-timer", "r28_timer", STAGES, {"r28t": "r28_timer:A"})
    out = tmp_path / "o"
    for _ in range(2):  # a rerun too
        r = subprocess.run(cli_cmd("stage", "r28t", "--out", out, "--device", "cpu"), env=plugins.env(),
                           capture_output=True, text=True, timeout=300)
        (rec,) = manifest(out)["stages"]
        # before: ERROR "process died with SIGALRM"
        assert (rec["status"], rec["reason"]) == ("PASS", "r28t ok"), (rec, r.stderr[-2000:])
