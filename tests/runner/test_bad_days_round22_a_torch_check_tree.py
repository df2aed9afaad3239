"""Bad days, red-team round 22 B22-1, through the CLI: a helper process a ``[torch.backends]`` init starts in a new
session with a cleared environment (no cookie to find it by) outlived ``nsa-run list``: the CLI's torch-import child
(round 21, ``nsa_runner/_torch_check.py``) ended, and the helper went to init. Expected: as for a stage or a plugin's
import, the import runs under a keeper that is a child subreaper: the helper is re-parented to it and killed with the
tree once the CLI has its answer; nothing is left running."""

from __future__ import annotations

import os
import subprocess
import sys
import time

try:
    from _bad_days import MAIN, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_a_backends_cleared_env_new_session_helper_does_not_outlive_the_cli(plugins, tmp_path):
    pid_file = tmp_path / "helper.pid"
    info = plugins.site / "tb_helper-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tb-helper\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntb = tb_helper:init\n")
    (plugins.site / "tb_helper.py").write_text(
        "import subprocess\n"
        "def init():\n"
        f"    p = subprocess.Popen([{sys.executable!r}, '-c', 'import time; time.sleep(300)'], env={{}},\n"
        "                         start_new_session=True)\n"
        f"    open({str(pid_file)!r}, 'a').write(str(p.pid) + '\\n')\n")
    env = env_with(plugins.env(), NSA_RUN_SPARE_WORKER="0")
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    r = subprocess.run([sys.executable, "-c", MAIN, "list", "--json"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.lstrip().startswith("{"), (r.returncode, r.stderr[-3000:])
    # every process that imported torch started one (the CLI's torch child first; discovery's children too)
    pids = [int(x) for x in pid_file.read_text().split()]
    assert pids, "the backend's init never ran"
    deadline = time.monotonic() + 10
    while not all(map(_gone, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if not _gone(p)]
    for p in left:
        os.kill(p, 9)
    assert not left, f"helpers {left} of {pids} still running after nsa-run list exited"
