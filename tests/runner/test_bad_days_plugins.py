"""Bad days, hostile plugin attributes (issue 16): a non-string reason in a StageResult, a stage
timeout of None / 'abc' / NaN, a stage name with '/' or rich markup never crash nsa-run with a
traceback: the plugin is listed as broken with the reason (registry validation) or the stage is
ERROR, and the other stages run."""

from __future__ import annotations

import json
import re

import pytest

SRC = """
from nsa_runner import Stage, StageResult, Status

class Good(Stage):
    name, order = "good", 30
    def run(self, ctx):
        (ctx.dir / "good.txt").write_text("ok")
        return StageResult(Status.PASS, "fine", files=["good.txt"])

class Odd(Stage):
    name, order = {name!r}, 31
    timeout_s = {timeout}
    requires = {requires}
    options = {options}
    def run(self, ctx):
        return StageResult(Status.PASS, {reason}, files={files}, metrics={metrics}, hint={hint})
"""


def _make(plugins, name="odd", timeout="60.0", requires="()", options="()", reason="'ok'", files="[]",
          metrics="{}", hint="''", entry=None):
    plugins.make("odd-plugin", "odd_attr_mod",
                 SRC.format(name=name, timeout=timeout, requires=requires, options=options, reason=reason,
                            files=files, metrics=metrics, hint=hint),
                 {"good": "odd_attr_mod:Good", entry or name: "odd_attr_mod:Odd"})


def _oneshot(cli, tmp_path, only):
    r = cli("oneshot", "--out", tmp_path / "out", "--only", only, "--device", "cpu", "--json")
    assert "Traceback" not in r.stdout + r.stderr
    return r, {s["name"]: s for s in json.loads(r.stdout)["stages"]}


@pytest.mark.parametrize("reason, shown", [
    ("123", "reason must be a string, got int"),
    ("['a', 'b']", "reason must be a string, got list"),
    ("None", "reason must be a string, got NoneType"),
    ("b'bytes'", "not JSON-serialisable"),  # refused by the worker before it is written
])
def test_a_non_string_reason_is_an_error_and_the_others_run(plugins, cli, tmp_path, reason, shown):
    _make(plugins, reason=reason)
    r, st = _oneshot(cli, tmp_path, "good,odd")
    assert r.exit_code == 1, r.stdout + r.stderr
    assert st["good"]["status"] == "PASS"
    assert st["odd"]["status"] == "ERROR" and shown in st["odd"]["reason"], st["odd"]
    assert isinstance(st["odd"]["reason"], str)
    assert "1 passed, 1 failed, 0 skipped" in r.stderr


@pytest.mark.parametrize("field, value, shown", [
    ("hint", "7", "hint must be a string, got int"),
    ("files", "[1]", "files must be a list of strings"),
    ("metrics", "[1, 2]", "metrics must be an object, got list"),
])
def test_other_result_fields_of_the_wrong_type_are_an_error(plugins, cli, tmp_path, field, value, shown):
    _make(plugins, **{field: value})
    r, st = _oneshot(cli, tmp_path, "good,odd")
    assert r.exit_code == 1, r.stdout + r.stderr
    assert st["good"]["status"] == "PASS"
    assert st["odd"]["status"] == "ERROR" and shown in st["odd"]["reason"], st["odd"]


@pytest.mark.parametrize("timeout", ["None", "'abc'", "float('nan')", "float('inf')", "-1", "0", "True"])
def test_a_bad_timeout_lists_the_plugin_as_broken_and_the_others_run(plugins, cli, tmp_path, timeout):
    _make(plugins, timeout=timeout)
    r = cli("list", "--device", "cpu", "--json")
    assert r.exit_code == 1 and "Traceback" not in r.stdout + r.stderr
    rows = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    assert rows["odd"]["runs_here"] is False
    assert "timeout_s must be a positive number of seconds" in rows["odd"]["why_not"]
    assert rows["good"]["runs_here"] is True
    r, st = _oneshot(cli, tmp_path, "good,odd")
    assert r.exit_code == 1
    assert st["good"]["status"] == "PASS"
    assert st["odd"]["status"] == "ERROR" and "timeout_s must be a positive number" in st["odd"]["reason"]


@pytest.mark.parametrize("attr, value, shown", [
    ("requires", "None", "requires must be a tuple of strings"),
    ("requires", "'cuda'", "requires must be a tuple of strings"),
    ("options", "None", "options must be a tuple of nsa_runner.Option"),
])
def test_other_bad_attributes_list_the_plugin_as_broken(plugins, cli, tmp_path, attr, value, shown):
    _make(plugins, **{attr: value})
    r = cli("list", "--device", "cpu", "--json")
    assert r.exit_code == 1 and "Traceback" not in r.stdout + r.stderr
    rows = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    assert rows["odd"]["runs_here"] is False and shown in rows["odd"]["why_not"], rows["odd"]
    r, st = _oneshot(cli, tmp_path, "good,odd")
    assert st["good"]["status"] == "PASS" and st["odd"]["status"] == "ERROR"


@pytest.mark.parametrize("name", ["a/b", "[red]x", "[/x]", "..", "x y", "-x", ""])
def test_a_name_that_is_not_a_plain_word_lists_the_plugin_as_broken(plugins, cli, tmp_path, name):
    _make(plugins, name=name, entry=name or "empty")
    r = cli("list", "--device", "cpu")  # the rich table: markup in the name must not be interpreted
    assert r.exit_code == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    r = cli("list", "--device", "cpu", "--json")
    rows = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    shown = name or "empty"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", shown):  # shown by a stand-in, never as markup
        shown = "invalid:" + re.sub(r"[^A-Za-z0-9._-]", "_", shown)
    odd = rows[shown]
    assert odd["runs_here"] is False
    assert "name must" in odd["why_not"] or "has no name" in odd["why_not"], odd
    r = cli("oneshot", "--out", tmp_path / "out", "--device", "cpu", "--only", "good")
    assert r.exit_code == 0, r.stdout + r.stderr
    r = cli("oneshot", "--out", tmp_path / "out2", "--device", "cpu", "--json", "--only", f"good,{odd['name']}")
    assert "Traceback" not in r.stdout + r.stderr
    st = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    assert st["good"]["status"] == "PASS" and st[odd["name"]]["status"] == "ERROR"
    assert not any(p.is_symlink() or not p.resolve().is_relative_to(tmp_path) for p in (tmp_path / "out2").rglob("*"))
