"""Bad days, red-team round 21 B21-1 / B21-2, through the CLI: an installed ``[torch.backends]`` entry point (torch
imports and calls it at ``import torch`` unless TORCH_DEVICE_BACKEND_AUTOLOAD is not "1") acted in nsa-run's own
process, which imported torch to see whether CUDA is there:

- B21-1: an ``init`` that exits ended ``oneshot`` / ``list`` with exit 0 having done nothing; one that changed the
  working folder put a relative ``--out`` under another folder; one that hung held off Ctrl-C;
- B21-2: one whose attribute is missing, or whose module raises ImportError, left "Only a single TORCH_LIBRARY ..."
  in every stage, naming nothing (bed651f named only a missing top-level module).

Expected: torch's import in a child process of the CLI: a failure in a backend, an exit or a hang is one line
naming torch's error (or how the import ended) and the installed backend, exit 2, no run folder, nothing left
running; a backend's change of folder or umask stays in that child; Ctrl-C stops the wait at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

try:
    from _bad_days import MAIN, env_with, wait_for
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with, wait_for

AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"


def _env(plugins, **env):
    e = env_with(plugins.env(), NSA_RUN_SPARE_WORKER="0", **env)
    e.pop(AUTOLOAD, None)  # torch's default: every backend loaded
    return e


def _run(plugins, *args, cwd=None, **env):
    return subprocess.run([sys.executable, "-c", MAIN, *map(str, args)], env=_env(plugins, **env), cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def _backend(plugins, module: str, source: str, attr: str = "init"):
    """A device backend's dist-info and module (no plugin of nsa-run): ``[torch.backends] tb = module:attr``."""
    info = plugins.site / "tb_backend-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tb-backend\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[torch.backends]\ntb = {module}:{attr}\n")
    (plugins.site / f"{module}.py").write_text(source)
    return f"tb = {module}:{attr}"


def _one_error_line(r) -> str:
    assert "Traceback" not in r.stderr and "TORCH_LIBRARY" not in r.stderr + r.stdout, r.stderr[-3000:]
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 2 and len(err) == 1 and r.stdout == "", (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    return err[0]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_b21_1_a_backend_that_exits_is_named_and_nothing_runs(plugins, tmp_path):
    said = _backend(plugins, "tb_exit", "import sys\ndef init():\n    sys.exit(0)\n")
    out = tmp_path / "o"
    line = _one_error_line(_run(plugins, "oneshot", "--only", "env-pairing", "--out", out))
    assert "import torch fails in a device backend: SystemExit" in line and said in line, line
    assert not out.exists()
    assert _one_error_line(_run(plugins, "list")) == line


def test_b21_1_a_backend_that_ends_its_process_is_named(plugins, tmp_path):
    said = _backend(plugins, "tb_osexit", "import os\ndef init():\n    os._exit(0)\n")
    out = tmp_path / "o"
    line = _one_error_line(_run(plugins, "stage", "env-pairing", "--out", out))
    assert "import torch ended its process (exit code 0) before it finished" in line and said in line, line
    assert not out.exists()


def test_b21_1_a_backend_that_changes_the_folder_or_umask_changes_nothing_of_the_cli(plugins, tmp_path):
    elsewhere, here = tmp_path / "elsewhere", tmp_path / "here"
    elsewhere.mkdir(), here.mkdir()
    _backend(plugins, "tb_cwd", f"import os\ndef init():\n    os.chdir({str(elsewhere)!r})\n    os.umask(0o277)\n")
    # the run folder is the CLI's: made under the CLI's own folder with its own umask, whatever the backend did at
    # torch's import in the CLI's check (a stage's worker imports torch too: there the backend acts, as in any
    # program importing torch; only the CLI's own files are looked at here)
    r = _run(plugins, "oneshot", "--only", "env-pairing", "--out", "runs", cwd=here)
    assert r.returncode in (0, 1), (r.returncode, r.stderr[-3000:])
    run = here / "runs" / "testrun"
    assert (run / "manifest.json").is_file(), (sorted(p.name for p in here.iterdir()), r.stderr[-3000:])
    assert not (elsewhere / "runs").exists()
    assert oct(run.stat().st_mode & 0o777) != oct(0o500), oct(run.stat().st_mode)


def test_b21_1_a_backend_that_hangs_is_stopped_and_named(plugins, tmp_path):
    pid_file = tmp_path / "backend.pid"
    said = _backend(plugins, "tb_hang", f"import os, time\ndef init():\n    open({str(pid_file)!r}, 'w').write("
                    "str(os.getpid()))\n    time.sleep(600)\n")
    line = _one_error_line(_run(plugins, "list", NSA_RUN_DISCOVERY_TIMEOUT="3"))
    assert "import torch did not finish within 3s (NSA_RUN_DISCOVERY_TIMEOUT: slow, or it hangs); stopped" in line, line
    assert said in line, line
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(pid), pid  # nothing left running


def test_a_limit_too_short_for_torchs_import_stops_it_only_when_a_backend_runs_there(plugins, tmp_path):
    """Round 22 U22-1: with no backend installed the hint said "uninstall the package that installed that backend".
    Round 23 U23-3: with none installed torch's import runs no plugin code, yet the plugin limit stopped a healthy,
    slow import (``NSA_RUN_DISCOVERY_TIMEOUT=1``, torch's 2 s). Now that limit bounds torch's import only when a
    backend runs there (and names it); without one it is at least ``TORCH_IMPORT_S``."""
    r = _run(plugins, "list", NSA_RUN_DISCOVERY_TIMEOUT="1e-9")
    assert r.returncode in (0, 1) and "import torch" not in r.stderr, r.stderr[-2000:]
    said = _backend(plugins, "tb_ok", "def init():\n    pass\n")
    r = _run(plugins, "list", NSA_RUN_DISCOVERY_TIMEOUT="1e-9")
    line = _one_error_line(r)
    assert "import torch did not finish within 1e-09s" in line and said in line, line
    assert "NSA_RUN_DISCOVERY_TIMEOUT sets the limit" in r.stderr, r.stderr


def test_b21_1_ctrl_c_stops_the_wait_for_a_hanging_backend(plugins, tmp_path):
    pid_file = tmp_path / "backend.pid"
    _backend(plugins, "tb_hang2", f"import os, time\ndef init():\n    open({str(pid_file)!r}, 'w').write("
             "str(os.getpid()))\n    time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", MAIN, "list"], env=_env(plugins), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        pid = int(wait_for(pid_file, timeout=120, proc=proc))
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)  # (the limit is 60 s: stopped by the Ctrl-C, not by the limit)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130 and "Traceback" not in err, (proc.returncode, err[-3000:])
    deadline = time.monotonic() + 10
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(pid), pid


def test_b21_2_a_missing_attribute_or_a_raising_module_is_named_with_torchs_error(plugins, tmp_path):
    said = _backend(plugins, "tb_noattr", "x = 1\n", attr="nope")
    line = _one_error_line(_run(plugins, "list"))
    assert "import torch fails in a device backend: RuntimeError: Failed to load the backend extension: tb" in line, \
        line
    assert "AttributeError" in line and said in line, line


def test_b21_2_a_module_raising_importerror_is_named(plugins, tmp_path):
    said = _backend(plugins, "tb_imperr", "raise ImportError('libfoo.so: cannot open shared object file')\n")
    line = _one_error_line(_run(plugins, "oneshot", "--only", "env-pairing", "--out", tmp_path / "o"))
    assert "Failed to load the backend extension: tb" in line and "libfoo.so" in line and said in line, line
    assert not (tmp_path / "o").exists()
