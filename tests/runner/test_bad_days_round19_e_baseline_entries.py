"""Bad days, red-team round 19 part A, U-5 (/tmp/rt19a/report.md): a hand-edited baseline figure that
matches nothing in the run (metric "zz" or the typo "MS_STEP", file "Decode.csv", a key with an extra or
wrong-typed field ``{"S": true}``) was "x not comparable" and the gate passed ("no regression", exit 0): a
typo disabled the guard. Two contradictory figures for one file + key + metric were both used. The rest
of the file is checked strictly (``baseline.load``: file names, profile, numbers); now so are these: one
line naming the entry, exit 2 (the metric, the file's case and duplicates when the file is read, the key
against the table's key columns when it is checked against the run).

Through the CLI: ``compare RUN --baseline FILE`` (RUN's ms_step 3x the baseline) and ``oneshot --baseline``."""

from __future__ import annotations

import json
import subprocess

import pytest

try:
    from _bad_days import cli_cmd, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, env_with

DECODE = """
import os
from nsa_runner import Stage, StageResult, Status

class PF(Stage):
    name, order, timeout_s = "pf", 16, 120.0
    def run(self, ctx):
        (ctx.dir / "decode.csv").write_text(f"S,B,impl,ms_step\\n1024,1,nsa,{os.environ['E19_MS']}\\n")
        return StageResult(Status.PASS, "pf ok", files=["decode.csv"])
"""


@pytest.fixture
def setup(plugins, tmp_path):
    """Run b (ms_step 3.0) and a baseline saved from it with the figure set to 1.0: b is 3x slower."""
    plugins.make("e19-pf", "e19_pf", DECODE, {"pf": "e19_pf:PF"})
    env = plugins.env()
    r = subprocess.run(cli_cmd("stage", "pf", "--out", tmp_path / "b", "--device", "cpu"),
                       env=env_with(env, E19_MS="3.0"), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = {"b": tmp_path / "b" / "testrun"}
    base = tmp_path / "base.json"
    r = subprocess.run(cli_cmd("compare", runs["b"], "--save-baseline", base), env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(base.read_text())
    _figure(data)[1]["value"] = 1.0
    return env, runs, data


def _check(tmp_path, env, run, data, name):
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(data))
    return subprocess.run(cli_cmd("compare", run, "--baseline", p), env=env, capture_output=True, text=True,
                          timeout=300)


def _figure(data):
    (sec,) = data["machines"].values()
    (fig,) = sec["figures"]
    return sec, fig


def test_the_saved_baseline_still_catches_the_regression(setup, tmp_path):
    env, runs, data = setup
    r = _check(tmp_path, env, runs["b"], data, "plain")
    assert r.returncode == 1, r.stdout + r.stderr  # 3x slower
    _, fig = _figure(data)
    fig["key"] = {"B": 1.0, "impl": "nsa", "S": 1024}  # order and 1 / 1.0 are one key: still matched
    assert _check(tmp_path, env, runs["b"], data, "float").returncode == 1
    fig["value"] = 3.0
    assert _check(tmp_path, env, runs["b"], data, "same").returncode == 0


BAD = [
    ("metric", "zz", "'zz' is not a timing column"),
    ("metric", "MS_STEP", "'MS_STEP' is not a timing column"),
    ("file", "Decode.csv", "'Decode.csv' is not 'decode.csv'"),
    ("key", {"S": True, "B": 1, "impl": "nsa"}, "key S=True (bool) does not fit column S"),
    ("key", {"S": 1024, "B": 1, "impl": "nsa", "T": 5}, "key column 'T' is not a key column"),
    ("key", {"S": 1024, "B": 1, "impl": 5}, "key impl=5 (int) does not fit column impl"),
]


def test_a_figure_that_can_match_nothing_is_refused(setup, tmp_path):
    env, runs, data = setup
    for n, (field, value, says) in enumerate(BAD):
        bad = json.loads(json.dumps(data))
        _, fig = _figure(bad)
        fig[field] = value
        r = _check(tmp_path, env, runs["b"], bad, f"bad{n}")
        assert r.returncode == 2, (field, value, r.stdout + r.stderr)  # before: "no regression: 1 not comparable"
        err = r.stderr.strip().splitlines()
        assert err[0].startswith("error: ") and says in err[0] and "figures[0]" in err[0], r.stderr
        assert "Traceback" not in r.stderr and r.stdout == ""
    # two contradictory figures for one file + key + metric (the key in another order)
    sec, fig = _figure(data)
    sec["figures"] = [dict(fig, value=1.0), dict(fig, value=100.0, key=dict(reversed(list(fig["key"].items()))))]
    r = _check(tmp_path, env, runs["b"], data, "dup")
    assert r.returncode == 2, r.stdout + r.stderr  # before: "1 worse, 1 better", 1
    assert "a second figure for decode.csv" in r.stderr and "figures[1]" in r.stderr and "figures[0]" in r.stderr
    assert "Traceback" not in r.stderr


def test_oneshot_refuses_such_a_baseline_before_running(setup, tmp_path):
    env, runs, data = setup
    _, fig = _figure(data)
    fig["metric"] = "MS_STEP"
    p = tmp_path / "typo.json"
    p.write_text(json.dumps(data))
    out = tmp_path / "one"
    r = subprocess.run(cli_cmd("oneshot", "--device", "cpu", "--only", "pf", "--out", out, "--baseline", p),
                       env=env_with(env, E19_MS="3.0"), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "'MS_STEP' is not a timing column" in r.stderr, r.stdout + r.stderr
    assert not (out / "testrun").exists()
