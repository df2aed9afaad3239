"""Bad days, red-team round 20 (part A) A20-R1, through the CLI: a SIGTERM / Ctrl-C that landed after ``nsa-run
stage y`` had set the earlier y result aside ("earlier y result set aside in .../history/y-<time> (put back if this
run does not finish)") but before the stage started: exit 130, nothing put back (y.txt stayed in history/, the
manifest kept its ``pending`` note) and ``report`` said "runner died / unfinished" of a run that exited 130 on a
graceful signal.

Root: only an interrupt of the running stage put the earlier result back (``restore``). Between ``set_aside`` and
the run (commands/stage.py) the interrupt went to the generic handler, which did nothing; inside the run before
the stage (execute's own steps, or one landing outside execute's try) the run was finished as interrupted with the
set-aside left as it was. Now every one of these ways out puts back what this process set aside (``abandon``) and
records the interrupt as the run's own is (finished, interrupted, exit code 130).

The runner sends the signal to itself at each point (no timing): right after ``set_aside`` returns, inside
``execute`` (as it claims the stage, before the stage starts), and as ``execute`` is entered.
"""

from __future__ import annotations

import json
import subprocess
import sys

try:
    from _bad_days import MAIN, cli_cmd, env_with, make, manifest
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, cli_cmd, env_with, make, manifest

# the runner signals itself once at the point BD20H_AT names, with signal BD20H_SIG
_AT_POINT = MAIN.replace("from nsa_runner.cli import main", (
    "import os, signal\n"
    "from nsa_runner import manifest as mf\n"
    "from nsa_runner.commands import _common as cm\n"
    "AT, SIG = os.environ['BD20H_AT'], getattr(signal, os.environ['BD20H_SIG'])\n"
    "def _send():\n"
    "    os.kill(os.getpid(), SIG)\n"
    "_set_aside, _mark, _execute = mf.RunManifest.set_aside, mf.RunManifest.mark_running, cm.execute\n"
    "def set_aside(self, name):\n"
    "    r = _set_aside(self, name)\n"
    "    if AT == 'set_aside':\n"
    "        _send()\n"
    "    return r\n"
    "def mark_running(self, name):\n"
    "    if AT == 'claim':\n"
    "        _send()\n"
    "    return _mark(self, name)\n"
    "def execute(*a, **k):\n"
    "    if AT == 'execute':\n"
    "        _send()\n"
    "    return _execute(*a, **k)\n"
    "mf.RunManifest.set_aside, mf.RunManifest.mark_running, cm.execute = set_aside, mark_running, execute\n"
    "from nsa_runner.cli import main"))
assert _AT_POINT != MAIN


def _report(out, env, said):
    rep = subprocess.run(cli_cmd("report", "testrun", "--out", out), env=env, capture_output=True, text=True,
                         timeout=300)
    assert rep.returncode in (0, 130), (said, rep.stdout + rep.stderr)
    assert "runner died" not in rep.stdout + rep.stderr and "UNFINISHED" not in rep.stdout, \
        (said, rep.stdout + rep.stderr)


def test_a_signal_after_set_aside_before_the_stage_puts_the_earlier_result_back(plugins, tmp_path):
    out, env = tmp_path / "out", make(plugins)
    first = subprocess.run(cli_cmd("oneshot", "--only", "x,y", "--out", out, "--device", "cpu"),
                           env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    run = out / "testrun"
    # each point in turn into the same folder: each one leaves it as it was (y's earlier result in place)
    for sig, at in (("SIGTERM", "set_aside"), ("SIGINT", "set_aside"), ("SIGTERM", "claim"), ("SIGINT", "claim"),
                    ("SIGTERM", "execute")):
        p = subprocess.run([sys.executable, "-c", _AT_POINT, "stage", "y", "--out", str(out), "--device", "cpu"],
                           env=env_with(env, BD_TEXT="v2", BD20H_AT=at, BD20H_SIG=sig), capture_output=True,
                           text=True, timeout=300)
        said = f"{at}/{sig}: rc {p.returncode}\n{p.stdout}{p.stderr}"
        assert p.returncode == 130, said
        assert at == "set_aside" or "set aside in" in p.stderr, said  # the point is after the set-aside
        assert "y wrote" not in p.stdout + p.stderr, said  # and before the stage ran
        assert "interrupted" in p.stderr and "Traceback" not in p.stderr, said
        assert (run / "y.txt").read_text() == "v1", said  # put back
        m = manifest(out)
        assert not m.get("pending"), (said, m.get("pending"))
        assert m["finished"] and m["interrupted"] is True and m.get("exit_code") == 130, (said, m)
        assert all(u.get("finished") for u in m.get("updates", [])), (said, m.get("updates"))
        y = [s for s in m["stages"] if s["name"] == "y"]
        assert len(y) == 1 and y[0]["status"] == "PASS" and y[0]["reason"] == "y v1", (said, json.dumps(y))
        history = run / "history"
        left = [d for d in history.iterdir() if (d / "y.txt").exists()] if history.exists() else []
        assert not left, (said, left)
        if at == "set_aside" and sig == "SIGTERM":  # the generic handler's case before: "runner died"
            _report(out, env, said)
    _report(out, env, "at the end")
