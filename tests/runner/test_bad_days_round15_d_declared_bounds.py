"""Bad days, red-team round 15 (part B), helper d, B-R2: declarations were unbounded in count / size.

A stage's ``requires`` (each entry only had to be a known word: ``("cuda",) * 3_000_000`` made ``list --json``
print 345 MB), an impl's ``differences`` keys (50 000 keys of 1 000 characters: 51 MB) and its
``Constraints`` (100 000 dtypes and a 40 MB ``check.__doc__``: 44 MB) reached ``list``, ``--json`` and the
runs whole. Discovery now bounds each where it validates it: over the bound the entry is broken, with one line
naming the attribute and its size; the check's docstring (display text) is clipped.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

try:
    from _bad_days import PINNED
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import PINNED

MAIN = PINNED.replace("from nsa_runner.cli import app; app(prog_name='nsa-run')",
                      "from nsa_runner.cli import main; sys.argv[0] = 'nsa-run'; main()")


def _main(env, *args, timeout=600):
    return subprocess.run([sys.executable, "-c", MAIN, *map(str, args)], env=env, text=True, timeout=timeout,
                          capture_output=True)


def _clean(r):
    assert "Traceback" not in r.stderr and "(unexpected" not in r.stderr, r.stderr[-3000:]


def _dist(site: Path, dirname: str, module: str, source: str, group: str, entries: str):
    (site / f"{module}.py").write_text(source)
    info = site / f"{dirname}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dirname}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n" + entries)


STAGES = """
from nsa_runner import Stage, StageResult, Status
class Many(Stage):
    name = 'd-requires'; order = 301; preload = False
    requires = ("cuda",) * 300_000
    def run(self, ctx): return StageResult(Status.PASS, 'x')
class Fine(Stage):
    name = 'd-fine'; order = 302; preload = False
    requires = ("triton", "cuda")
    def run(self, ctx): return StageResult(Status.PASS, 'fine')
"""


def test_stage_requires_is_bounded(plugins, tmp_path):
    _dist(plugins.site, "reqd", "reqmod_d", STAGES, "nsa_runner.stages",
          "d-requires = reqmod_d:Many\nd-fine = reqmod_d:Fine\n")
    env = plugins.env()
    r = _main(env, "list", "--json")
    _clean(r)
    assert r.returncode == 1  # a broken stage
    assert len(r.stdout) < 200_000, len(r.stdout)
    rows = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    why = rows["d-requires"]["why_not"]
    assert why.startswith("broken:") and "requires has 300000 entries (at most" in why, why[:500]
    assert rows["d-requires"]["requires"] == [] and len(why) < 1000
    assert rows["d-fine"]["requires"] == ["triton", "cuda"] and not rows["d-fine"]["why_not"].startswith("broken")
    # the run records it as ERROR naming the attribute and its size
    out = tmp_path / "runs"
    r = _main(env, "oneshot", "--only", "d-requires,summary", "--out", out)
    _clean(r)
    assert r.returncode == 1
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    st = next(s for s in m["stages"] if s["name"] == "d-requires")
    assert st["status"] == "ERROR" and "requires has 300000 entries" in st["reason"], st


IMPLS = """
from nsa_runner.impls import Constraints, Impl
from nsa_runner.impls.nsa_core import make
def _chk(case, part):
    return None
_chk.__doc__ = "D" * (2 << 20)
KEYS = lambda: Impl("dkeys", dict(make().parts), differences={("k" * 1000 + str(i)): "v" for i in range(5000)})
LONGKEY = lambda: Impl("dlongkey", dict(make().parts), differences={"k" * 1000: "v"})
DTYPES = lambda: Impl("ddtypes", dict(make().parts), Constraints(dtypes=("fp32",) * 100_000))
DOC = lambda: Impl("ddoc", dict(make().parts), Constraints(check=_chk))
"""


def test_impl_differences_and_constraints_are_bounded(plugins, tmp_path):
    _dist(plugins.site, "impld", "implmod_d", IMPLS, "nsa_runner.impls",
          "dkeys = implmod_d:KEYS\ndlongkey = implmod_d:LONGKEY\nddtypes = implmod_d:DTYPES\nddoc = implmod_d:DOC\n")
    env = plugins.env()
    r = _main(env, "list", "--impls", "--json", "--device", "cpu")
    _clean(r)
    assert r.returncode == 1
    assert len(r.stdout) < 100_000, len(r.stdout)
    rows = {i["name"]: i for i in json.loads(r.stdout)["impls"]}
    for name, attr, said in (("dkeys", "differences", "5000 entries"), ("dlongkey", "differences", "kkkk"),
                             ("ddtypes", "constraints.dtypes", "100000 entries")):
        why = rows[name]["why_not"]
        assert rows[name]["broken"] and attr in why and said in why and len(why) < 3000, (name, why[:500])
    assert rows["ddoc"]["runs_here"], rows["ddoc"]["why_not"][:500]
    assert len(rows["ddoc"]["constraints"]["more"]) < 3000
    # a stage's run of the broken ones says the same, one line each
    out = tmp_path / "runs"
    r = _main(env, "stage", "triton-fwd", "--impl", "dkeys,ddtypes", "--device", "cpu", "--out", out)
    _clean(r)
    for f in (out / "testrun").rglob("*"):
        if f.is_file():
            assert f.stat().st_size < 200_000, (f, f.stat().st_size)
    text = "".join(f.read_text(errors="replace") for f in (out / "testrun").rglob("*.csv"))
    assert "5000 entries" in text and "100000 entries" in text
