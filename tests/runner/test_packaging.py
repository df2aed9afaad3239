"""The installed package behaves (issue 12): the wheel holds every package folder, the built-in
stages install as ``nsa_run_stages`` (never a top-level ``stages`` that could collide with another
project's), and a wheel installed into a clean venv runs ``nsa-run oneshot`` from an unrelated
folder with the default relative ``--out``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+")
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_every_package_folder_is_in_the_wheel_and_stages_install_as_nsa_run_stages():
    st = _pyproject()["tool"]["setuptools"]
    listed = set(st["packages"])
    on_disk = {".".join(p.parent.relative_to(REPO).parts) for top in ("nsa_core", "nsa_runner")
               for p in (REPO / top).rglob("__init__.py") if "__pycache__" not in p.parts}
    assert on_disk - listed == set(), "package folders missing from [tool.setuptools] packages"
    assert st["package-dir"] == {"nsa_run_stages": "stages"} and "stages" not in listed
    eps = _pyproject()["project"]["entry-points"]["nsa_runner.stages"]
    assert all(v.startswith("nsa_run_stages.") for v in eps.values()), eps


def test_stage_modules_import_each_other_relatively():
    bad = [f"{p.name}:{i}" for p in (REPO / "stages").glob("*.py")
           for i, line in enumerate(p.read_text().splitlines(), 1)
           if re.match(r"\s*(from stages[\s.]|import stages\b)", line)]
    assert not bad, f"absolute 'stages' imports break the installed package (use 'from . import x'): {bad}"


def test_wheel_in_a_clean_venv_runs_oneshot_from_another_folder(tmp_path):
    # build from a copy: setuptools leaves build/ and *.egg-info in the source folder
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", ".venv", "artifacts", "build", "dist", "tests",
                                                             "*.egg-info", "__pycache__", ".*cache"))
    dist = tmp_path / "dist"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(dist), str(src)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = dist.glob("nsa_run-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    purelib = Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                   "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    # the dependencies (torch, typer, ...) come from this interpreter's site-packages, read as plain
    # folders: their .pth hooks (the editable install of this checkout) are not run there
    deps = [sysconfig.get_paths()["purelib"], *[p for p in sys.path if p.endswith("site-packages")]]
    (purelib / "_nsa_run_test_deps.pth").write_text("\n".join(dict.fromkeys(deps)) + "\n")
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                        "--no-deps", "--no-index", str(wheel)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (purelib / "nsa_run_stages" / "summary.py").is_file() and not (purelib / "stages").exists()

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")  # per-user thresholds file: never the user's real one
    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import nsa_runner, nsa_run_stages, importlib.util as u; "
                            "print(nsa_runner.__file__); print(nsa_run_stages.__file__); print(u.find_spec('stages'))"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    lines = where.stdout.split()
    assert where.returncode == 0 and all(str(purelib) in x for x in lines[:2]), where.stdout + where.stderr
    assert lines[2] == "None"  # nothing installs a top-level "stages"

    r = subprocess.run([str(venv / "bin" / "nsa-run"), "oneshot", "--only", "env-pairing,sanity,summary",
                        "--device", "cpu"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "3 passed, 0 failed, 0 skipped"
    (folder,) = (elsewhere / "artifacts" / "runner").iterdir()
    m = json.loads((folder / "manifest.json").read_text())
    assert [(s["name"], s["status"]) for s in m["stages"]] == [("env-pairing", "PASS"), ("sanity", "PASS"),
                                                               ("summary", "PASS")]
    assert folder.name.startswith("nogit-")  # outside git: the id hashes the installed sources
    for f in ("env.txt", "summary.md", "junit.xml", "report.html", "routing.json"):
        assert (folder / f).is_file(), f


def test_version_flag_matches_the_package_metadata(cli):
    from importlib.metadata import version

    r = cli("--version")
    assert r.exit_code == 0 and r.stdout.strip() == f"nsa-run {version('nsa-run')}"


def test_the_runner_never_imports_the_stages():
    """The runner does not depend on a plugin (issue 17): nothing under nsa_runner/ imports stages."""
    bad = [f"{p.relative_to(REPO)}:{i}" for p in (REPO / "nsa_runner").rglob("*.py")
           for i, line in enumerate(p.read_text().splitlines(), 1)
           if re.match(r"\s*(from|import)\s+(stages|nsa_run_stages)\b", line)]
    assert not bad, bad
