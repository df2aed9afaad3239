"""Bad days, red-team round 23 B23-2 / B23-3 / B23-6 (torch part), through the CLI: the CLI's torch-import child
(``nsa_runner/_torch_check.py``) took as its answer the first JSON line ANY process wrote into a pipe every fork of
the import inherited, and wrote it unguarded:

- B23-2: a ``[torch.backends]`` init that forks and lets the importing process exit (a "daemonize yourself" backend):
  rc 0 or rc 2 "ended its process (exit code 0)" at random (the forked copy's answer raced the keeper's "ended" line),
  with a ``BrokenPipeError`` traceback of nsa-run's child on the user's terminal;
- B23-3: an init that closes inherited descriptors (``os.closerange(3, 1024)``) or rebinds ``json.dumps``: nsa-run's
  own traceback and "ended its process (exit code 1)" although torch imported fine;
- B23-6: an init forking a helper that ends with ``sys.exit(0)``: the helper unwound into nsa-run's handlers and
  answered "import torch fails in a device backend: SystemExit: 0" for a backend that works in plain Python.

Expected: only the child nsa-run started answers (a forked copy ends as it would in plain Python); the answer
channel survives closed descriptors and a rebound ``json``; one outcome for one input; one line, exit 2, no
traceback when nsa-run refuses."""

from __future__ import annotations

import subprocess
import sys

try:
    from _bad_days import MAIN, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with


def _run(plugins, *args, **env):
    e = env_with(plugins.env(), NSA_RUN_SPARE_WORKER="0", **env)
    e.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)  # torch's default: every backend loaded
    return subprocess.run([sys.executable, "-c", MAIN, *map(str, args)], env=e, capture_output=True, text=True,
                          timeout=300)


def _backend(plugins, source: str) -> str:
    """A device backend (no plugin of nsa-run): ``[torch.backends] tb = tb23a:init``; written anew on each call."""
    info = plugins.site / "tb23a-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tb23a\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntb = tb23a:init\n")
    (plugins.site / "tb23a.py").write_text(source)
    for cached in (plugins.site / "__pycache__").glob("tb23a.*"):
        cached.unlink()
    return "tb = tb23a:init"


def _listed(r, *, quiet: bool = True) -> None:
    """``list --json`` worked: rc 0, the JSON whole, no traceback of nsa-run's (``quiet``: none at all)."""
    assert r.returncode == 0 and r.stdout.lstrip().startswith("{") and r.stdout.rstrip().endswith("}"), \
        (r.returncode, r.stdout[-1000:], r.stderr[-3000:])
    assert not quiet or "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "BrokenPipeError" not in r.stderr and "Bad file descriptor" not in r.stderr, r.stderr[-3000:]


def _one_error_line(r) -> str:
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 2 and len(err) == 1 and r.stdout == "", (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    return err[0]


def test_b23_2_a_daemonizing_backend_gets_one_answer_whichever_process_finishes_first(plugins):
    # the forked copy finishes torch's import (and, in the old code, wrote its answer) before the importing process
    # exits: the old CLI took the copy's answer (rc 0); with the opposite order, the keeper's "ended" line won
    said = _backend(plugins, "import os\ndef init():\n    pid = os.fork()\n    if pid:\n"
                             "        os.waitpid(pid, 0)\n        os._exit(0)\n")
    copy_first = _one_error_line(_run(plugins, "list", "--json"))
    assert "import torch ended its process (exit code 0) before it finished" in copy_first and said in copy_first, \
        copy_first
    # the report's form: the importing process exits at once, the forked copy goes on
    _backend(plugins, "import os\ndef init():\n    if os.fork():\n        os._exit(0)\n")
    assert _one_error_line(_run(plugins, "list", "--json")) == copy_first
    # B23-3's form of it: descriptors closed, then daemonized
    _backend(plugins, "import os\ndef init():\n    os.closerange(3, 1024)\n    pid = os.fork()\n    if pid:\n"
                      "        os.waitpid(pid, 0)\n        os._exit(0)\n")
    assert _one_error_line(_run(plugins, "list", "--json")) == copy_first


def test_b23_3_a_backend_closing_descriptors_or_rebinding_json_leaves_the_answer_whole(plugins):
    _backend(plugins, "import os\ndef init():\n    os.closerange(3, 1024)\n")
    _listed(_run(plugins, "list", "--json"))
    # the answer's descriptor number reused for a file of the backend's: nothing of nsa-run's is written into it
    _backend(plugins, "import os\ndef init():\n    os.closerange(3, 1024)\n"
                      "    global KEEP\n    KEEP = [open(os.devnull, 'w') for _ in range(16)]\n")
    _listed(_run(plugins, "list", "--json"))
    _backend(plugins, "import json\ndef init():\n    json.dumps = lambda o, *a, **k: b'{}'\n")
    _listed(_run(plugins, "list", "--json"))


def test_b23_3_an_answer_that_cannot_be_delivered_is_said_truthfully(plugins):
    # descriptors closed and no new one can be opened: torch imported, nsa-run's child could not tell
    said = _backend(plugins, "import os, resource\ndef init():\n    os.closerange(3, 1024)\n"
                             "    resource.setrlimit(resource.RLIMIT_NOFILE, (3, 3))\n")
    line = _one_error_line(_run(plugins, "list", "--json"))
    assert "import torch finished, but nsa-run's torch child could not deliver what it found" in line, line
    assert "ended its process" not in line and said in line, line


def test_b23_6_a_helper_forked_by_a_backend_ending_with_sys_exit_is_not_nsa_runs_answer(plugins):
    _backend(plugins, "import os, sys\ndef init():\n    if os.fork() == 0:\n        sys.exit(0)\n")
    _listed(_run(plugins, "list", "--json"))
    # a helper whose work raises: as in plain Python, it prints its traceback and ends; torch's import goes on
    _backend(plugins, "import os, time\ndef init():\n    if os.fork() == 0:\n"
                      "        raise RuntimeError('helper: upload failed')\n    os.wait()\n")
    r = _run(plugins, "list", "--json")
    _listed(r, quiet=False)
    assert "RuntimeError: helper: upload failed" in r.stderr, r.stderr[-3000:]  # (torch chains its own to it)
