"""Plugins: a distribution created on the fly (dist-info + entry_points.txt on sys.path) shows up in
`list` and runs in `oneshot` at its order; a broken plugin is listed with its error and fails the
run without crashing the CLI."""

from __future__ import annotations

import json
from pathlib import Path

from nsa_runner.artifacts import load_manifest
from nsa_runner.registry import discover

HELLO = """
from nsa_runner import Stage, StageResult, Status

class Hello(Stage):
    name = "hello"
    order = 65            # between the built-ins sanity (20) and summary (70)
    requires = ()
    def run(self, ctx):
        (ctx.dir / "hello.txt").write_text("hi")
        return StageResult(Status.PASS, "said hi", files=["hello.txt"])

class Early(Stage):
    name = "early"
    order = 5
    def run(self, ctx):
        return StageResult(Status.PASS, "first")
"""


def test_plugin_is_listed_and_runs_at_its_order(plugins, cli, tmp_path):
    plugins.make("hello-plugin", "hello_plugin_mod", HELLO,
                 {"hello": "hello_plugin_mod:Hello", "early": "hello_plugin_mod:Early"}, version="0.4.1")
    r = cli("list", "--device", "cpu", "--json")
    assert r.exit_code == 0
    rows = json.loads(r.stdout)["stages"]
    names = [s["name"] for s in rows]
    assert names.index("early") < names.index("env-pairing") < names.index("hello") < names.index("summary")
    hello = next(s for s in rows if s["name"] == "hello")
    assert hello["source"] == "plugin hello-plugin 0.4.1" and hello["order"] == 65 and hello["runs_here"]

    r = cli("oneshot", "--out", tmp_path, "--only", "summary,hello,early", "--device", "cpu")
    assert r.exit_code == 0, r.stdout + r.stderr
    m = load_manifest(tmp_path / "testrun")
    assert [(s["name"], s["status"]) for s in m["stages"]] == [("early", "PASS"), ("hello", "PASS"),
                                                               ("summary", "PASS")]
    assert (tmp_path / "testrun" / "hello.txt").read_text() == "hi"
    assert m["stages"][1]["source"] == "plugin hello-plugin 0.4.1"
    # the summary stage saw the plugin's result
    summary = json.loads((tmp_path / "testrun" / "summary.json").read_text())
    assert [s["name"] for s in summary["stages"]] == ["early", "hello", "summary"]  # the whole run


def test_broken_plugin_is_listed_and_fails_the_run_without_crashing(plugins, cli, tmp_path):
    plugins.make("broken-plugin", "broken_plugin_mod", "import no_such_module_xyz\n",
                 {"broken": "broken_plugin_mod:Whatever"})
    plugins.make("hello-plugin", "hello_plugin_mod", HELLO, {"hello": "hello_plugin_mod:Hello"})
    r = cli("list", "--device", "cpu", "--json")
    assert r.exit_code == 1  # a broken plugin would fail oneshot: list says so too
    rows = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    assert rows["broken"]["runs_here"] is False
    assert "No module named 'no_such_module_xyz'" in rows["broken"]["why_not"]
    assert rows["hello"]["runs_here"] is True

    r = cli("oneshot", "--out", tmp_path, "--only", "broken,hello", "--device", "cpu", "--json")
    assert r.exit_code == 1
    st = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    assert st["broken"]["status"] == "ERROR" and "failed to import broken_plugin_mod:Whatever" in st["broken"]["reason"]
    assert "Traceback" in st["broken"]["traceback"]
    assert st["hello"]["status"] == "PASS"  # the rest still runs


def test_malformed_plugins_fail_loudly_at_load_time(plugins):
    plugins.make("odd-plugin", "odd_plugin_mod", """
        from nsa_runner import Stage, StageResult, Status
        class Misnamed(Stage):
            name, order = "other-name", 1
        class NotAStage:
            pass
        class BadReq(Stage):
            name, order, requires = "badreq", 1, ("tpu",)
        class Dup(Stage):
            name, order = "sanity", 1
        class Reserved(Stage):
            from nsa_runner import Option
            name, order, options = "reserved", 1, (Option("--out"),)
    """, {"misnamed": "odd_plugin_mod:Misnamed", "notastage": "odd_plugin_mod:NotAStage",
          "badreq": "odd_plugin_mod:BadReq", "sanity": "odd_plugin_mod:Dup", "reserved": "odd_plugin_mod:Reserved"})
    by = {(e.name, e.dist): e for e in discover()}
    assert "registered as 'misnamed'" in by["misnamed", "odd-plugin"].error
    assert "not an nsa_runner.Stage" in by["notastage", "odd-plugin"].error
    assert "unknown requirement(s) ['tpu']" in by["badreq", "odd-plugin"].error
    assert "reserved by nsa-run" in by["reserved", "odd-plugin"].error
    # a plugin taking a built-in's name is broken and the built-in stays (issue 16, red-team round 3):
    # which one runs never depends on install order, and a plugin never switches a built-in off
    entries = discover()
    (builtin,) = [e for e in entries if e.name == "sanity"]
    assert builtin.builtin and builtin.stage is not None and not builtin.error
    (plugin,) = [e for e in entries if e.dist == "odd-plugin" and e.value == "odd_plugin_mod:Dup"]
    assert plugin.stage is None and "'sanity' is taken by the built-in stage" in plugin.error


def test_readme_plugin_example_works_as_written(plugins, cli, tmp_path):
    """The plugin example in README.md, verbatim, registered as its comment says."""
    import re

    REPO = Path(__file__).resolve().parents[2]  # the checkout (tests/runner/ -> repo root)

    readme = (REPO / "README.md").read_text()
    block = re.search(r"## Writing a plugin stage.*?```python\n(.*?)```", readme, re.S).group(1)
    assert len(block.strip().splitlines()) <= 15
    entry = re.search(r'^# (hello = "my_stages:Hello")$', block, re.M).group(1)
    name, value = (x.strip().strip('"') for x in entry.split("="))
    plugins.make("my-stages", "my_stages", block, {name: value})
    r = cli("oneshot", "--out", tmp_path, "--only", "hello", "--device", "cpu")
    assert r.exit_code == 0, r.stdout + r.stderr
    assert (tmp_path / "testrun" / "hello.txt").read_text() == "hi from cpu: [512]"
