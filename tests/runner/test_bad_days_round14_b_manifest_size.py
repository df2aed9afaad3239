"""Bad days, red-team round 14 (part B) R8, through the CLI: the manifest writer never checked that what
it wrote stays under its own reader's limit (``artifacts.MAX_READ_BYTES``, 256 MiB). A stage declaring
70 000 long file names (+ 3 000 more in another) made manifest.json 263 MiB: the run was "incomplete"
(exit 2) and every later ``stage`` / ``report`` refused the run folder as unusable.

Expected: a stage's record is bounded (``manifest.RECORD_MAX_BYTES``), and a record that would bring
the manifest near what its readers accept is refused: the stage is an ERROR naming why, the run goes
on, exit 1, and the run folder stays usable. The second test lowers the readers' limit (the typer app
in this process) so that a few stages reach it without writing hundreds of MiB (there the record is
cut by the manifest's writer, and the executor's record object made to say the same).
"""

from __future__ import annotations

import json
import subprocess
import sys

try:
    from _bad_days import MAIN, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN, env_with


# every stage declares R14BM_<NAME> long file names (each ~3.3 KB: a chain of 12 folders of 250
# characters, then a name of 246), all of them real files of the run folder
STAGES = """
import os
from nsa_runner import Stage, StageResult, Status

def _act(ctx, name):
    n = int(os.environ.get("R14BM_" + name.upper(), "0"))
    (ctx.dir / f"{name}.txt").write_text(name)
    files = [f"{name}.txt"]
    if n:
        chain = "/".join([name.upper() * 250] * 12)
        leaf = ctx.dir / chain
        leaf.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            f = f"{i:06d}" + "F" * 240
            (leaf / f).touch()
            files.append(chain + "/" + f)
    return StageResult(Status.PASS, f"{name} declared {len(files)}", files=files)

class X(Stage):
    name, order, timeout_s = "x", 10, 300.0
    def run(self, ctx):
        return _act(ctx, "x")

class Y(Stage):
    name, order, timeout_s = "y", 11, 300.0
    def run(self, ctx):
        return _act(ctx, "y")

class Z(Stage):
    name, order, timeout_s = "z", 12, 300.0
    def run(self, ctx):
        return _act(ctx, "z")

class W(Stage):
    name, order, timeout_s = "w", 13, 300.0
    def run(self, ctx):
        return _act(ctx, "w")
"""
ENTRIES = {n: f"r14bm_mod:{n.upper()}" for n in "xyzw"}


def _cmd(*args) -> list[str]:
    return [sys.executable, "-c", MAIN, *map(str, args)]


def _stages(run) -> dict:
    m = json.loads((run / "manifest.json").read_text())
    return {s["name"]: s for s in m["stages"]}


def test_a_record_past_the_bound_is_the_stages_error_and_the_folder_stays_usable(plugins, tmp_path):
    from nsa_runner import manifest

    plugins.make("r14bm-plugin", "r14bm_mod", STAGES, ENTRIES)
    out = tmp_path / "out"
    run = out / "testrun"
    # ~17.7 MB of declared names: more than one stage's record may take (16 MiB)
    env = env_with(plugins.env(), R14BM_X=5400, NSA_RUN_SPARE_WORKER=0)
    r = subprocess.run(_cmd("oneshot", "--only", "x,y", "--out", out, "--device", "cpu", "--json"),
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stderr[-3000:]
    shown = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    assert shown["x"]["status"] == "ERROR", shown["x"]["reason"][:300]
    assert "too large for manifest.json" in shown["x"]["reason"]
    assert "5401 declared file name(s)" in shown["x"]["reason"]
    assert shown["y"]["status"] == "PASS"
    size = (run / "manifest.json").stat().st_size
    assert size < manifest.RECORD_MAX_BYTES, size
    got = _stages(run)
    assert got["x"]["status"] == "ERROR" and got["x"]["files"] == [] and "too large" in got["x"]["reason"]
    assert got["y"]["status"] == "PASS"
    # the run folder is still usable: another stage into it, and its report
    r = subprocess.run(_cmd("stage", "w", "--out", out, "--device", "cpu"), env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run(_cmd("report", run), env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode != 2, r.stderr[-3000:]
    assert _stages(run)["w"]["status"] == "PASS"


def test_a_record_that_would_fill_the_manifest_is_refused(plugins, tmp_path, cli, monkeypatch):
    from nsa_runner import artifacts, manifest

    plugins.make("r14bm-plugin", "r14bm_mod", STAGES, ENTRIES)
    # the readers accept 3 MiB here; x, y, z declare ~1.15 MB of names each: x and y fit, z would
    # bring the manifest to ~3.5 MB
    monkeypatch.setattr(artifacts, "MAX_READ_BYTES", 3 << 20)
    monkeypatch.setattr(manifest, "ROOM_BYTES", 256 << 10, raising=False)
    for name in "xyz":
        monkeypatch.setenv(f"R14BM_{name.upper()}", "350")
    monkeypatch.setenv("NSA_RUN_SPARE_WORKER", "0")
    out = tmp_path / "out"
    run = out / "testrun"
    r = cli("oneshot", "--only", "x,y,z", "--out", out, "--device", "cpu", "--json")
    assert r.exit_code == 1, r.stderr[-3000:]  # the run is recorded whole (it was "incomplete": exit 2)
    shown = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    assert [shown[n]["status"] for n in "xyz"] == ["PASS", "PASS", "ERROR"], r.stdout[-3000:]
    assert "manifest.json would be" in shown["z"]["reason"]
    assert (run / "manifest.json").stat().st_size <= artifacts.MAX_READ_BYTES
    got = _stages(run)
    assert [got[n]["status"] for n in "xyz"] == ["PASS", "PASS", "ERROR"]
    assert "too large for manifest.json" in got["z"]["reason"]
    assert "manifest.json would be" in got["z"]["reason"] and got["z"]["files"] == []
    # usable: a later stage into the run folder and its report
    monkeypatch.delenv("R14BM_W", raising=False)
    r = cli("stage", "w", "--out", out, "--device", "cpu")
    assert r.exit_code == 0, r.stderr[-3000:]
    assert _stages(run)["w"]["status"] == "PASS"
    r = cli("report", run)
    assert r.exit_code != 2, r.stderr[-3000:]
