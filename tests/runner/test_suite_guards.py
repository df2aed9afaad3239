"""The suite cannot hang: pytest-timeout is configured for every test, and a hang becomes a
failure with a stack while the finalisers still run (timeout_method = "signal").

Checked on the real configuration (pyproject.toml) and by running a small inner pytest session
in a subprocess with a test that hangs on purpose.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

INNER = '''
import subprocess, sys, time
import pytest

@pytest.fixture
def child(tmp_path_factory):
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield p
    p.kill()          # the finaliser must run even though the test timed out
    p.wait()
    open({done!r}, "w").write(str(p.pid))

def test_hangs(child):
    time.sleep(600)  # a broken timeout in the code under test

def test_after_the_hang_still_runs():
    assert True
'''


def test_every_test_has_a_time_limit(request):
    assert request.config.pluginmanager.hasplugin("timeout"), "pytest-timeout is not installed (dev extra)"
    assert float(request.config.getini("timeout")) == 300
    assert request.config.getini("timeout_method") == "signal"


def test_a_hang_fails_with_a_stack_and_the_session_goes_on(tmp_path):
    pytest.importorskip("pytest_timeout")
    done = tmp_path / "finaliser_ran"
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER.format(done=str(done))))
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=3",
                        "-o", "timeout_method=signal", "test_inner.py"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=240)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "1 failed, 1 passed" in out, out
    assert "Timeout" in out and "time.sleep(600)" in out, out  # the stack of the hung test
    assert done.exists(), "the timed-out test's fixture finaliser did not run"
    pid = int(done.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the child the hung test started is gone
    assert time.monotonic() - t0 < 200
