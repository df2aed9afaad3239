"""``nsa-run stage NAME --help`` lists the stage's own options; ``nsa-run stage`` alone is a usage error."""

from __future__ import annotations

STAGES = """
from nsa_runner import Option, Stage, StageResult, Status, int_list

class Knobs(Stage):
    name, order = "knobs", 1
    description = "a stage with its own options"
    options = (Option("--S-list", int_list, default=[8], help="lengths to try"),
               Option("--mode", str, default="a", choices=("a", "b"), help="which mode"))
    def run(self, ctx):
        raise AssertionError("--help must not run the stage")
"""


def test_stage_name_help_lists_its_own_options(plugins, cli, tmp_path):
    plugins.make("knob-stages", "knob_stages_mod", STAGES, {"knobs": "knob_stages_mod:Knobs"})
    r = cli("stage", "knobs", "--help", "--out", tmp_path / "out")
    assert r.exit_code == 0, r.stdout + r.stderr
    assert "--S-list" in r.stdout and "lengths to try" in r.stdout and "which mode" in r.stdout
    assert "--out" in r.stdout and "a stage with its own options" in r.stdout  # the command's help too
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written


def test_stage_help_without_name_and_errors(plugins, cli):
    plugins.make("knob-stages", "knob_stages_mod", STAGES, {"knobs": "knob_stages_mod:Knobs"})
    r = cli("stage", "--help")
    assert r.exit_code == 0 and "Run one stage" in r.stdout
    r = cli("stage")
    assert r.exit_code == 2 and "needs a stage NAME" in r.stderr
    r = cli("stage", "nope", "--help")
    assert r.exit_code == 2 and "unknown stage 'nope'" in r.stderr
