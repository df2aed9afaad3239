"""Bad days, red-team round 15 (part B), helper d, B-R5: past the limit of crashing plugin imports, the rest
of the entry points silently vanished.

Discovery starts a new child per plugin whose import kills the child, ``MAX_CHILDREN`` (32) times; then the
loop just ended: the entry points not reached yet were neither described nor listed as broken (a working
stage ``zz``: "unknown stage"; a working impl missing from ``list --impls`` while ``--impl`` ran it). Now,
past that limit, each remaining entry point is imported in a fork of its own (one that dies is named, the
working ones are found), and what even that cannot reach is listed as broken, saying why. The limit is made
small here (it is the count, not the time, that matters).
"""

from __future__ import annotations

import json
import textwrap

import pytest

import nsa_runner.registry as registry

SEGV = "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"
KILL_PARENT = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(os.getpid(), signal.SIGKILL)\n"
GOOD_STAGE = textwrap.dedent("""
    from nsa_runner import Stage, StageResult, Status
    class Z(Stage):
        name, order, preload = "zz", 99, False
        def run(self, ctx): return StageResult(Status.PASS, "zz ok")
""")
GOOD_IMPL = textwrap.dedent("""
    from nsa_runner.impls import Impl
    from nsa_runner.impls.nsa_core import make
    def IMPL():
        return Impl("zgood", dict(make().parts))
""")


def _dist(site, name: str, group: str, modules: dict[str, str], entries: list[tuple[str, str]]) -> None:
    for mod, src in modules.items():
        (site / f"{mod}.py").write_text(src)
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries))


@pytest.fixture
def few_children(monkeypatch):
    monkeypatch.setattr(registry, "MAX_CHILDREN", 2)


def test_working_stage_after_many_crashing_imports_is_found(plugins, cli, few_children, tmp_path):
    mods = {f"segd{i}": SEGV for i in range(5)} | {"zzgood_d": GOOD_STAGE}
    _dist(plugins.site, "segd", "nsa_runner.stages", mods,
          [(f"s{i}", f"segd{i}:X") for i in range(5)] + [("zz", "zzgood_d:Z")])
    r = cli("list", "--json")
    assert r.exit_code == 1, r.output[-2000:]
    rows = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    for i in range(5):  # every crashing import named, none left out
        why = rows[f"s{i}"]["why_not"]
        assert why.startswith("broken:") and "SIGSEGV" in why, why
    assert rows["zz"]["runs_here"], rows.get("zz")
    assert rows["sanity"]["runs_here"]  # the built-ins as ever
    out = tmp_path / "runs"
    r = cli("oneshot", "--only", "zz,summary", "--out", out)
    assert r.exit_code == 0, r.output[-3000:]
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    assert {s["name"]: s["status"] for s in m["stages"]}["zz"] == "PASS"


def test_what_even_the_forks_cannot_reach_is_listed_broken(plugins, cli, monkeypatch):
    monkeypatch.setattr(registry, "MAX_CHILDREN", 1)
    mods = {"kd0": SEGV, "kd1": KILL_PARENT, "kd2": SEGV, "zzgood_d2": GOOD_STAGE}
    _dist(plugins.site, "killd", "nsa_runner.stages", mods,
          [("k0", "kd0:X"), ("k1", "kd1:X"), ("k2", "kd2:X"), ("zz", "zzgood_d2:Z")])
    r = cli("list", "--json")
    assert r.exit_code == 1, r.output[-2000:]
    rows = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    assert "SIGSEGV" in rows["k0"]["why_not"] and "killed the discovery process" in rows["k1"]["why_not"], rows
    for name in ("k2", "zz"):  # never imported, but never dropped: listed broken, saying why
        why = rows[name]["why_not"]
        assert why.startswith("broken:") and "not imported: 2 plugin imports" in why, why
    r = cli("oneshot", "--only", "zz,summary", "--out", plugins.root / "runs")
    assert r.exit_code == 1 and "unknown stage" not in r.output, r.output[-2000:]


def test_working_impl_after_many_crashing_imports_is_listed(plugins, cli, few_children):
    mods = {f"segid{i}": SEGV for i in range(5)} | {"zgood_d": GOOD_IMPL}
    _dist(plugins.site, "segid", "nsa_runner.impls", mods,
          [(f"i{i}", f"segid{i}:X") for i in range(5)] + [("zgood", "zgood_d:IMPL")])
    r = cli("list", "--impls", "--json", "--device", "cpu")
    assert r.exit_code == 1, r.output[-2000:]
    rows = {i["name"]: i for i in json.loads(r.stdout)["impls"]}
    for i in range(5):
        assert rows[f"i{i}"]["broken"] and "SIGSEGV" in rows[f"i{i}"]["why_not"], rows.get(f"i{i}")
    assert rows["zgood"]["runs_here"] and not rows["zgood"]["broken"], rows.get("zgood")
    assert rows["nsa_core"]["runs_here"]


HANG = "import time\ntime.sleep(1000)\n"


def test_hanging_imports_past_the_limit_are_stopped_and_the_rest_listed(plugins, cli, monkeypatch):
    monkeypatch.setattr(registry, "MAX_CHILDREN", 1)
    monkeypatch.setenv("NSA_RUN_DISCOVERY_TIMEOUT", "2")
    mods = {"hd0": HANG, "hd1": HANG, "zzgood_d3": GOOD_STAGE}
    _dist(plugins.site, "hangd", "nsa_runner.stages", mods, [("h0", "hd0:X"), ("h1", "hd1:X"), ("zz", "zzgood_d3:Z")])
    r = cli("list", "--json")
    assert r.exit_code == 1, r.output[-2000:]
    rows = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    for name in ("h0", "h1"):  # the first in a child, the second in a fork of the isolating child: both stopped
        assert "did not finish within 2s" in rows[name]["why_not"], rows.get(name)
    # past the hangs the isolating child may spend (MAX_CHILDREN): listed, saying why, never dropped
    assert "not imported: 1 plugin imports before it hung" in rows["zz"]["why_not"], rows.get("zz")
