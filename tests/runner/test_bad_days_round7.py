"""Bad days, red-team round 7 (issue 16): the three weaknesses round 6 noted, each through the CLI.

Each test failed on the code before round 7's fixes (see docs/reliability.md, "Red-team round 7"):
a run folder's ``.manifest.lock`` replaced by a folder, a FIFO or a link to /dev/full was reported
as "cannot update RUN: Is a directory" without naming the lock file; INT, TERM then HUP 0.3 s apart
made the process exit 129 (the HUP's default action, once the handlers were restored) while
manifest.json recorded 130; a SIGTERM (a CI cancel) was worded "interrupted (Ctrl-C)".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

try:
    from _bad_days import MAIN, cli_cmd, env_with, gone_within, make, manifest, wait_for
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, cli_cmd, env_with, gone_within, make, manifest, wait_for

# the nsa-run script itself (cli.main: what a terminal or CI job runs), run id pinned


def main_cmd(*args) -> list[str]:
    return [sys.executable, "-c", MAIN, *map(str, args)]


@pytest.fixture
def bd(plugins):
    return make(plugins)


def _run(env, *args, timeout=90):
    return subprocess.run(cli_cmd(*args), env=env, text=True, timeout=timeout, capture_output=True)


@pytest.mark.parametrize("how", ["folder", "fifo", "devfull"])
def test_a_broken_lock_file_is_named(bd, tmp_path, how):
    out = tmp_path / "o"
    r = _run(bd, "oneshot", "--out", out, "--only", "x", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    lock = out / "testrun" / ".manifest.lock"
    lock.unlink(missing_ok=True)
    if how == "folder":
        lock.mkdir()
    elif how == "fifo":
        os.mkfifo(lock)
    else:
        lock.symlink_to("/dev/full")
    before = (out / "testrun" / "manifest.json").read_text()
    r = subprocess.run(main_cmd("stage", "x", "--out", out, "--device", "cpu"), env=bd, text=True,
                       timeout=60, capture_output=True)
    assert r.returncode == 2, r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and str(lock) in err[0], r.stderr
    assert "Traceback" not in r.stderr
    assert (out / "testrun" / "manifest.json").read_text() == before  # nothing changed


def _interrupt(bd, tmp_path, spawn, signals, gap=0.3, **env):
    mark = tmp_path / "x.started"
    pidfile = tmp_path / "daemon.pid"
    out = tmp_path / "o"
    proc = spawn(main_cmd("oneshot", "--out", out, "--only", "x", "--device", "cpu"),
                 env=env_with(bd, BD_MARK=mark, BD_SLEEP=600, BD_SETSID=pidfile, **env),
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    worker = int(wait_for(mark, proc=proc))
    daemon = int(wait_for(pidfile))
    spawn.snapshot()
    for sig in signals:
        proc.send_signal(sig)
        time.sleep(gap)
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err
    assert gone_within(worker, 5) and gone_within(daemon, 5)
    return proc.returncode, manifest(out), err


@pytest.mark.parametrize("ignore_term", [False, True])
def test_int_term_hup_exit_code_agrees_with_the_manifest(bd, tmp_path, spawn, ignore_term):
    """INT, TERM, HUP 0.3 s apart: the process exited 129 (HUP's default action after the handlers
    were restored) while manifest.json recorded 130. Both say 130 now."""
    extra = {"BD_IGNORE_TERM": 1} if ignore_term else {}
    rc, m, err = _interrupt(bd, tmp_path, spawn, [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], **extra)
    assert rc == 130, err
    assert m["exit_code"] == rc and m["interrupted"] is True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_the_stage_reason_names_the_signal(bd, tmp_path, spawn, sig):
    """A SIGTERM (a CI cancel) or SIGHUP was recorded as "interrupted (Ctrl-C)"."""
    rc, m, err = _interrupt(bd, tmp_path, spawn, [sig])
    assert rc == 130 and m["exit_code"] == 130, err
    reason = m["stages"][0]["reason"]
    assert m["stages"][0]["status"] == "ERROR" and sig.name in reason and "Ctrl-C" not in reason, reason


def test_ctrl_c_is_still_worded_ctrl_c(bd, tmp_path, spawn):
    rc, m, err = _interrupt(bd, tmp_path, spawn, [signal.SIGINT])
    assert rc == 130 and m["exit_code"] == 130, err
    assert "interrupted (Ctrl-C)" in m["stages"][0]["reason"]


def test_bidi_controls_in_a_reason_never_reach_the_terminal(bd, tmp_path):
    """Round 7's open break: a U+202E (right-to-left override) in a stage's reason reached the
    progress line and the table unchanged, so what the terminal shows could be reordered (spoofed).
    Every bidi control is stripped from shown text; the reason's visible letters stay."""
    out = tmp_path / "o"
    env = env_with(bd, BD_TEXT="ok\u202eLIAF\u2066x\u2069\u200f")
    r = _run(env, "oneshot", "--out", out, "--only", "x", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    shown = r.stdout + r.stderr
    for ch in "\u202e\u2066\u2069\u200f":
        assert ch not in shown, f"U+{ord(ch):04X} reached the terminal"
    assert "okLIAFx" in shown  # the text itself is still shown, in logical order
