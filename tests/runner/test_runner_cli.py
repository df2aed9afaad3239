"""CLI behaviour: exit codes, --json, the counts line, rerun policy, stage options, bad input."""

from __future__ import annotations

import json
import os

import pytest

from nsa_runner.artifacts import load_manifest

STAGES = """
from nsa_runner import Option, Stage, StageResult, Status, int_list

class Echo(Stage):
    name, order = "echo", 1
    options = (Option("--S-list", int_list, default=[8], help="lengths"),
               Option("--mode", str, default="a", choices=("a", "b")))
    def run(self, ctx):
        (ctx.dir / "echo.json").write_text(__import__("json").dumps(
            {"options": ctx.options, "device": ctx.device, "profile": ctx.profile, "run_id": ctx.run_id}))
        return StageResult(Status.PASS, "echoed", files=["echo.json"])

class NeedsCuda(Stage):
    name, order, requires = "needs-cuda", 2, ("cuda",)
    def run(self, ctx):
        raise AssertionError("must not be spawned without CUDA")

class NeedsTriton(Stage):
    name, order, requires = "needs-triton", 3, ("triton",)
    def run(self, ctx):
        return StageResult(Status.PASS, "triton here")

class SelfSkip(Stage):
    name, order = "self-skip", 4
    def run(self, ctx):
        return StageResult(Status.SKIP, "no flash backend here", hint="pip install flash-attn")

class Failing(Stage):
    name, order = "failing", 5
    def run(self, ctx):
        return StageResult(Status.FAIL, "a check did not hold")
"""

ALL = {"echo": "Echo", "needs-cuda": "NeedsCuda", "needs-triton": "NeedsTriton", "self-skip": "SelfSkip",
       "failing": "Failing"}


@pytest.fixture
def fake(plugins):
    plugins.make("fake-stages", "fake_stages_mod", STAGES, {k: f"fake_stages_mod:{v}" for k, v in ALL.items()})
    return plugins


def _last(text: str) -> str:
    return text.strip().splitlines()[-1]


def test_pass_exit_0_table_and_counts_line(fake, cli, tmp_path):
    r = cli("oneshot", "--out", tmp_path, "--only", "echo", "--device", "cpu")
    assert r.exit_code == 0, r.stderr
    assert "echo" in r.stdout and "PASS" in r.stdout
    assert _last(r.stdout) == "1 passed, 0 failed, 0 skipped"
    echo = json.loads((tmp_path / "testrun" / "echo.json").read_text())
    assert echo == {"options": {"S_list": [8], "mode": "a"}, "device": "cpu", "profile": "quick",
                    "run_id": "testrun"}


def test_fail_exit_1_and_skips_are_not_passes(fake, cli, tmp_path):
    r = cli("oneshot", "--out", tmp_path, "--only", "echo,needs-cuda,self-skip,failing", "--device", "cpu",
            "--json")
    assert r.exit_code == 1
    p = json.loads(r.stdout)
    assert p["counts"] == {"passed": 1, "failed": 1, "skipped": 2}
    st = {s["name"]: s for s in p["stages"]}
    assert st["needs-cuda"]["status"] == "SKIP" and "requires cuda" in st["needs-cuda"]["reason"]
    assert st["needs-cuda"]["log"] == ""  # never spawned
    assert st["self-skip"]["hint"] == "pip install flash-attn"
    assert _last(r.stderr) == "1 passed, 1 failed, 2 skipped"


def test_strict_fails_on_fixable_skips_only(fake, cli, tmp_path, monkeypatch):
    from nsa_runner import registry
    from nsa_runner.commands import _common

    # no CUDA here: a CUDA-only stage and a stage's own skip are excused under --strict
    r = cli("oneshot", "--out", tmp_path / "a", "--only", "echo,needs-cuda,self-skip", "--device", "cpu",
            "--strict")
    assert r.exit_code == 0, r.stdout
    assert _last(r.stdout) == "1 passed, 0 failed, 2 skipped"
    # triton missing is fixable on this machine: --strict fails, plain run does not
    monkeypatch.setattr(_common, "triton_installed", lambda: False)
    monkeypatch.setattr(registry, "triton_installed", lambda: False)
    r = cli("oneshot", "--out", tmp_path / "b", "--only", "echo,needs-triton", "--device", "cpu")
    assert r.exit_code == 0
    r = cli("oneshot", "--out", tmp_path / "c", "--only", "echo,needs-triton", "--device", "cpu", "--strict")
    assert r.exit_code == 1
    assert "--strict" in r.stdout and "needs-triton" in r.stdout
    assert _last(r.stdout) == "1 passed, 0 failed, 1 skipped"
    m = load_manifest(tmp_path / "c" / "testrun")
    assert m["stages"][1]["strict_fail"] is True and "pip install triton" in m["stages"][1]["hint"]


def test_stage_command_parses_stage_options(fake, cli, tmp_path):
    r = cli("stage", "echo", "--S-list", "1k,64", "--mode=b", "--out", tmp_path, "--device", "cpu",
            "--profile", "full")
    assert r.exit_code == 0, r.stderr
    echo = json.loads((tmp_path / "testrun" / "echo.json").read_text())
    assert echo["options"] == {"S_list": [1024, 64], "mode": "b"} and echo["profile"] == "full"


@pytest.mark.parametrize("args, needle", [
    (["stage", "nosuch"], "unknown stage 'nosuch'"),
    (["oneshot", "--only", "echo,nosuch"], "unknown stage 'nosuch'"),
    (["oneshot", "--skip", "nosuch"], "unknown stage 'nosuch'"),
    (["oneshot", "--only", ","], "needs a comma-separated list"),
    (["oneshot", "--profile", "fast"], "--profile 'fast' is not one of quick, full"),
    (["oneshot", "--device", "tpu"], "--device 'tpu' is not one of cuda, cpu"),
    (["oneshot", "--timeout", "-3"], "--timeout must be a positive number"),
    (["oneshot", "--timeout", "soon"], "Invalid value for '--timeout'"),
    (["stage", "echo", "--S-list", "abc"], "invalid value 'abc' for --S-list"),
    (["stage", "echo", "--S-list", "0"], "invalid value '0' for --S-list"),
    (["stage", "echo", "--mode", "c"], "'c' is not one of a, b"),
    (["stage", "echo", "--bogus", "1"], "unknown option --bogus for stage echo"),
    (["stage", "echo", "--S-list"], "needs a value"),
    (["stage", "echo", "stray"], "unexpected argument 'stray'"),
])
def test_bad_input_exits_2_with_a_message_and_writes_nothing(fake, cli, tmp_path, args, needle):
    out = tmp_path / "out"
    r = cli(*args, "--out", out)
    assert r.exit_code == 2
    assert needle in " ".join(r.stderr.split()), r.stderr
    assert not (out / "testrun").exists()


def test_cuda_requested_without_cuda_exits_2(fake, cli, tmp_path):
    from nsa_runner._torch_check import torch_facts

    if torch_facts().cuda:
        pytest.skip("this machine has CUDA")
    r = cli("oneshot", "--out", tmp_path, "--device", "cuda", "--only", "echo")
    assert r.exit_code == 2 and "no CUDA device" in r.stderr


def test_unwritable_out_exits_2(fake, cli, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("keep me")
    r = cli("oneshot", "--out", blocker / "sub", "--only", "echo")
    assert r.exit_code == 2 and "cannot write there" in r.stderr
    assert blocker.read_text() == "keep me"


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write into a read-only folder")
def test_read_only_out_exits_2(fake, cli, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        r = cli("oneshot", "--out", ro, "--only", "echo")
        assert r.exit_code == 2 and "cannot write there" in r.stderr
    finally:
        ro.chmod(0o700)


def test_oneshot_rerun_never_touches_the_earlier_run(fake, cli, tmp_path):
    assert cli("oneshot", "--out", tmp_path, "--only", "echo", "--device", "cpu").exit_code == 0
    first = tmp_path / "testrun"
    before = {p: p.read_bytes() for p in first.rglob("*") if p.is_file()}
    r = cli("oneshot", "--out", tmp_path, "--only", "echo,failing", "--device", "cpu")
    assert r.exit_code == 1
    assert {p: p.read_bytes() for p in first.rglob("*") if p.is_file()} == before
    second = load_manifest(tmp_path / "testrun.2")
    assert [s["name"] for s in second["stages"]] == ["echo", "failing"]


def test_stage_rerun_sets_the_old_result_aside(fake, cli, tmp_path):
    assert cli("oneshot", "--out", tmp_path, "--only", "echo,failing", "--device", "cpu").exit_code == 1
    run = tmp_path / "testrun"
    old = (run / "echo.json").read_text()
    r = cli("stage", "echo", "--mode", "b", "--out", tmp_path, "--device", "cpu")
    assert r.exit_code == 0, r.stderr
    m = load_manifest(run)
    assert [s["name"] for s in m["stages"]] == ["echo", "failing"]  # replaced in place, failing kept
    assert m["stages"][0]["options"]["mode"] == "b"
    (hist,) = m["history"]
    assert hist["name"] == "echo" and hist["options"]["mode"] == "a"
    assert (run / hist["moved_to"] / "echo.json").read_text() == old
    assert (run / hist["moved_to"] / "logs" / "echo.log").exists()
    assert json.loads((run / "echo.json").read_text())["options"]["mode"] == "b"
    assert len(m["updates"]) == 1
    # round 39 U39-1: summary.md and report.html named only the first command into the folder
    # (in-process, each command's argv is pytest's own: the later one is told by its line)
    summary, report = (run / "summary.md").read_text(), (run / "report.html").read_text()
    assert summary.count("\n  - then: ") == 1 and "started" in summary.split("  - then: ")[1].splitlines()[0], summary
    assert report.count("<th>then</th>") == 1, report[:3000]


def test_corrupted_earlier_manifest_exits_2_and_deletes_nothing(fake, cli, tmp_path):
    assert cli("oneshot", "--out", tmp_path, "--only", "echo", "--device", "cpu").exit_code == 0
    run = tmp_path / "testrun"
    (run / "manifest.json").write_text('{"schema_version": 1, "run_id": "testrun", "stages": [')
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for args in (["stage", "echo"], ["oneshot", "--only", "echo"]):
        r = cli(*args, "--out", tmp_path, "--device", "cpu")
        assert r.exit_code == 2
        assert "not valid JSON" in r.stderr and "manifest.json" in r.stderr
        assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    (run / "manifest.json").write_text('{"schema_version": 99, "run_id": "x", "stages": []}')
    r = cli("stage", "echo", "--out", tmp_path, "--device", "cpu")
    assert r.exit_code == 2 and "schema_version 99" in r.stderr


def test_list_shows_plugins_requirements_and_why_not(fake, cli):
    r = cli("list", "--device", "cpu", "--json")
    assert r.exit_code == 0, r.stdout
    rows = {s["name"]: s for s in json.loads(r.stdout)["stages"]}
    assert rows["echo"]["source"] == "plugin fake-stages 1.2.3"
    assert rows["echo"]["order"] == 1 and [o["flag"] for o in rows["echo"]["options"]] == ["--S-list", "--mode"]
    assert rows["needs-cuda"]["runs_here"] is False and "requires cuda" in rows["needs-cuda"]["why_not"]
    assert rows["echo"]["runs_here"] is True
    for builtin in ("env-pairing", "sanity", "summary"):
        assert rows[builtin]["source"] == "built-in"
    r = cli("list", "--device", "cpu")
    assert r.exit_code == 0 and "needs-cuda" in r.stdout and "plugin fake-stages" in r.stdout


def test_no_args_shows_help(cli):
    r = cli()
    assert "oneshot" in r.stdout and "stage" in r.stdout and "list" in r.stdout


def test_list_name_shows_one_stage_and_its_options(fake, cli):
    r = cli("list", "echo", "--device", "cpu", "--json")
    assert r.exit_code == 0
    st = json.loads(r.stdout)["stage"]
    assert st["name"] == "echo" and st["options"][1] == {"flag": "--mode", "default": "a", "help": "",
                                                         "choices": ["a", "b"]}
    r = cli("list", "echo", "--device", "cpu")
    assert r.exit_code == 0 and "--S-list" in r.stdout and "a, b" in r.stdout
    r = cli("list", "nosuch")
    assert r.exit_code == 2 and "unknown stage 'nosuch'" in r.stderr
