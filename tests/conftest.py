"""Shared fixtures.

Runner tests build stage plugins on the fly: a module plus a ``<dist>-<version>.dist-info``
folder with ``entry_points.txt`` in a temp dir put on ``sys.path`` — exactly what pip leaves
behind for a real plugin package, so discovery goes through ``importlib.metadata`` unchanged.
"""

from __future__ import annotations

import fcntl
import importlib
import os
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# pytest-xdist's workers run with COLUMNS=80 / LINES=24 set, which every nsa-run a test starts inherits: its tables then
# fold at 80 and a test looking for a name in them fails in parallel only. The suite's processes see no terminal
# width; a test that needs one sets it.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


@pytest.fixture(autouse=True)
def _serial_alone(request, tmp_path_factory):
    """A test marked ``serial`` (a fork storm: round 15's comet forks thousands of processes a second) runs while no
    other test of the session runs; the others run side by side (pytest-xdist). In parallel, a fork beside the comet
    failed with EAGAIN. Two flocks in the session's temp folder (shared by the workers): a serial test takes the gate,
    which stops new tests from starting, then the room alone; every other test passes the gate, then shares the
    room."""
    base = tmp_path_factory.getbasetemp()
    folder = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    serial = request.node.get_closest_marker("serial") is not None
    gate = os.open(folder / "serial-gate.lock", os.O_RDWR | os.O_CREAT, 0o600)
    room = os.open(folder / "serial-room.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)
        if serial:
            fcntl.flock(room, fcntl.LOCK_EX)
        else:
            fcntl.flock(gate, fcntl.LOCK_UN)
            fcntl.flock(room, fcntl.LOCK_SH)
        yield
    finally:
        os.close(room)  # closing releases its flock
        os.close(gate)


class PluginFactory:
    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch):
        self.root = root
        self.site = root / "site"
        self.site.mkdir()
        monkeypatch.syspath_prepend(str(self.site))
        self._mp = monkeypatch

    def make(self, dist: str, module: str, source: str, stages: dict[str, str], version: str = "1.2.3",
             group: str = "nsa_runner.stages") -> Path:
        """Write ``module.py`` (``source``) and a dist-info declaring ``stages`` {entry name: "module:Attr"} in
        entry-point ``group`` (``nsa_runner.impls`` for implementation adapters)."""
        (self.site / f"{module}.py").write_text(textwrap.dedent(source))
        info = self.site / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        lines = [f"[{group}]"] + [f"{k} = {v}" for k, v in stages.items()]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        importlib.invalidate_caches()
        sys.modules.pop(module, None)
        return info

    def env(self) -> dict[str, str]:
        """Environment for a subprocess that must see the plugins and this checkout."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(self.site), str(REPO), env.get("PYTHONPATH", "")])
        return env


@pytest.fixture
def plugins(tmp_path, monkeypatch) -> PluginFactory:
    return PluginFactory(tmp_path, monkeypatch)


@pytest.fixture
def fixed_run_id(monkeypatch):
    """Pin the run id: the checkout is edited while tests run, which would change it between calls."""
    from nsa_runner.commands import _common

    monkeypatch.setattr(_common, "current_run_id", lambda: "testrun")
    return "testrun"


@pytest.fixture
def cli(fixed_run_id):
    """Invoke the typer app in-process: cli("oneshot", "--out", ...) -> click Result (stdout/stderr apart)."""
    from typer.testing import CliRunner

    from nsa_runner.cli import app

    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)

    return invoke
