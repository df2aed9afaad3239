"""Bad days, red-team round 28, through the CLI: the note an adapter failure carries (what adapter imports changed
process-wide and nsa-run put back, round 27 B27-1 / B27-2) named the first three adapters in load order: with four
whose imports set an environment variable, the one that FAILed relying on its own had its change cut off and three
others named (B28-1). An adapter loaded through a factory had the factory's changes replace its import's: the
environment variable it relied on was not named (B28-2). An environment variable named with a newline or ESC split the
note over two lines in manifest.json and in the stage's log (U28-2). Expected: the failing adapter's own changes first,
a list cut says so; the import's and the factory's changes both named; the note one line, its characters written
out."""

from __future__ import annotations

try:
    from _bad_days import selection_map
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import selection_map

ADAPTER = """
import os

from nsa_runner.impls import Impl

os.environ[{var!r}] = "1"  # its import configures its kernels through the environment


def _select(q, k_cmp, cfg):
    from nsa_core import functional as F

    assert {relies} is None or os.environ.get({var!r}), "no kernel cache configured"
    return F.select_blocks(q, k_cmp, cfg)


IMPL = Impl({name!r}, {{"select": _select}})


def make():
    os.chdir("/")  # the factory changes something else
    return IMPL
"""


def _adapter(plugins, name: str, var: str, relies: bool, entry: str = "IMPL") -> None:
    source = ADAPTER.format(var=var, relies="1" if relies else "None", name=name)
    plugins.make(f"r28-{name}", f"r28_{name}", source, {name: f"r28_{name}:{entry}"}, version="1.0",
                 group="nsa_runner.impls")


def _selection_map(plugins, tmp_path, impls: str) -> dict:
    r, rec, _ = selection_map(plugins, tmp_path, impls)
    assert rec["status"] == "FAIL", (rec, r.stderr[-2000:])
    return rec


def test_the_failing_adapters_own_change_comes_first(plugins, tmp_path):
    for name in ("r28a", "r28b", "r28c"):
        _adapter(plugins, name, f"R28_{name}", relies=False)
    _adapter(plugins, "r28d", "R28_r28d", relies=True)
    reason = _selection_map(plugins, tmp_path, "r28a,r28b,r28c,r28d,nsa_core")["reason"]
    assert "(r28d's: os.environ (R28_r28d)" in reason, reason  # before: ra's, rb's, rc's only
    assert "and 1 more adapter(s)" in reason, reason


def test_a_factorys_changes_add_to_its_imports(plugins, tmp_path):
    _adapter(plugins, "r28f", "R28_F", relies=True, entry="make")
    reason = _selection_map(plugins, tmp_path, "r28f,nsa_core")["reason"]
    assert "r28f's: " in reason and "os.environ (R28_F)" in reason, reason  # before: the working directory only
    assert "the working directory" in reason, reason


def test_the_note_stays_one_line(plugins, tmp_path):
    _adapter(plugins, "r28n", "R28\nX\x1b[31mRED", relies=True)
    rec = _selection_map(plugins, tmp_path, "r28n,nsa_core")
    assert "r28n's: os.environ (R28\\nX\\x1b[31mRED)" in rec["reason"], rec["reason"]
    log = (tmp_path / "o" / "testrun" / "logs" / "selection-map.log").read_text()
    (line,) = [x for x in log.splitlines() if x.startswith("note: an implementation's code left")]
    assert "R28\\nX\\x1b[31mRED" in line and "put back" in line, line
