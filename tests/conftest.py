"""Shared fixtures.

Runner tests build stage plugins on the fly: a module plus a ``<dist>-<version>.dist-info``
folder with ``entry_points.txt`` in a temp dir put on ``sys.path`` — exactly what pip leaves
behind for a real plugin package, so discovery goes through ``importlib.metadata`` unchanged.
"""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


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
