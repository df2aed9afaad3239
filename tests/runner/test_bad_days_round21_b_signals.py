"""Bad days, red-team round 21 B21-4 / B21-5, through the CLI: several signals at once (a CI cancel, a user's
Ctrl-C and a closed terminal together).

- B21-4: sent the moment ``nsa-run stage y`` had set y's earlier result aside, before its run began: the first
  signal's interrupt went to the put-back (d99fc27), the next one's handler raised again inside it: y's earlier
  files stayed in history/, the manifest's ``pending`` note stayed, ``report`` said "runner died".
- B21-5: one arriving while ``cli.main`` ended the process (its ``_quiet_signals``, setting SIG_IGN signal by
  signal) raised inside it: a traceback, exit 1.

Expected: the first signal is the command's interrupt; the others while it is being handled are noted, never
raised: the earlier result put back, the run recorded interrupted, exit 130; and a signal while the process ends
changes neither its exit code nor its output (no traceback).

The runner sends the signals to itself at the point (no timing): each handler runs at Python's next check, one
after the other, as they do when they arrive together.
"""

from __future__ import annotations

import subprocess
import sys

try:
    from _bad_days import MAIN, cli_cmd, env_with, make, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, cli_cmd, env_with, make, manifest

# the runner signals itself with TERM right after set_aside returned, then with INT and HUP as the put-back of that
# first interrupt begins (``run_and_report(stopped=True)``): the others of the three, arriving a moment later
_AFTER_SET_ASIDE = MAIN.replace("from nsa_runner.cli import main", (
    "import os, signal\n"
    "from nsa_runner import manifest as mf\n"
    "from nsa_runner.commands import _common as cm\n"
    "_set_aside, _run_and_report = mf.RunManifest.set_aside, cm.run_and_report\n"
    "def set_aside(self, name):\n"
    "    r = _set_aside(self, name)\n"
    "    os.kill(os.getpid(), signal.SIGTERM)\n"
    "    return r\n"
    "def run_and_report(*a, **k):\n"
    "    if k.get('stopped'):\n"
    "        os.kill(os.getpid(), signal.SIGINT)\n"
    "        os.kill(os.getpid(), signal.SIGHUP)\n"
    "    return _run_and_report(*a, **k)\n"
    "mf.RunManifest.set_aside, cm.run_and_report = set_aside, run_and_report\n"
    "from nsa_runner.cli import main"))
assert _AFTER_SET_ASIDE != MAIN

# the runner signals itself with TERM and HUP the moment the process's end ignores SIGINT (``_quiet_signals``)
_WHILE_ENDING = MAIN.replace("from nsa_runner.cli import main", (
    "import os, signal\n"
    "_signal = signal.signal\n"
    "_sent = []\n"
    "def _patched(sig, handler):\n"
    "    if sig == signal.SIGINT and handler == signal.SIG_IGN and not _sent:\n"
    "        _sent.append(1)\n"
    "        os.kill(os.getpid(), signal.SIGTERM)\n"
    "        os.kill(os.getpid(), signal.SIGHUP)\n"
    "    return _signal(sig, handler)\n"
    "signal.signal = _patched\n"
    "from nsa_runner.cli import main"))
assert _WHILE_ENDING != MAIN


def test_b21_4_three_signals_after_set_aside_put_the_earlier_result_back(plugins, tmp_path):
    out, env = tmp_path / "out", make(plugins)
    first = subprocess.run(cli_cmd("oneshot", "--only", "x,y", "--out", out, "--device", "cpu"),
                           env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    run = out / "testrun"
    p = subprocess.run([sys.executable, "-c", _AFTER_SET_ASIDE, "stage", "y", "--out", str(out), "--device", "cpu"],
                       env=env_with(env, BD_TEXT="v2"), capture_output=True, text=True, timeout=300)
    said = f"rc {p.returncode}\n{p.stdout}{p.stderr}"
    assert p.returncode == 130 and "Traceback" not in p.stderr, said
    assert "y wrote" not in p.stdout + p.stderr, said  # (signalled right after the set-aside: no stage ran)
    assert "interrupted: no stage was running" in p.stderr and "stage was stopped" not in p.stderr, said
    assert (run / "y.txt").read_text() == "v1", said  # put back
    m = manifest(out)
    assert not m.get("pending"), (said, m.get("pending"))
    assert m["finished"] and m["interrupted"] is True and m.get("exit_code") == 130, (said, m)
    history = run / "history"
    left = [d for d in history.iterdir() if (d / "y.txt").exists()] if history.exists() else []
    assert not left, (said, left)
    rep = subprocess.run(cli_cmd("report", "testrun", "--out", out), env=env, capture_output=True, text=True,
                         timeout=300)
    assert "runner died" not in rep.stdout + rep.stderr and "UNFINISHED" not in rep.stdout, rep.stdout + rep.stderr


def test_b21_5_signals_while_the_process_ends_change_nothing(plugins, tmp_path):
    env = make(plugins)
    p = subprocess.run([sys.executable, "-c", _WHILE_ENDING, "list", "--json"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0 and "Traceback" not in p.stderr, (p.returncode, p.stderr[-3000:])
    assert '"stages"' in p.stdout, p.stdout[-2000:]
