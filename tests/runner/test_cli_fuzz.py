"""Fuzz the CLI (hypothesis): generated argv over the real commands never produces a traceback,
only exit codes 0 / 1 / 2, a message with every 2, and never changes a run's evidence.

Cheap by construction: ``oneshot`` always gets ``--only`` with at least one name that is not a
stage (it must stop at validation), ``stage`` only gets names that are not stages, and
``compare`` / ``report`` work on run folders fabricated in a temp folder.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from nsa_runner import baseline as bl
from nsa_runner._readers import Run
from nsa_runner.cli import app

try:  # tests/ is on sys.path under pytest's default (prepend) import mode
    from _runfolders import make_run, snapshot
except ImportError:  # pragma: no cover - run as a package
    from tests._runfolders import make_run, snapshot

WEIRD = ["", " ", "..", "../..", "/", "a/b", "-", "--", "-x", "aaaaaaa/..", "./aaaaaaa", "x" * 300, "é", "nan",
         "inf", "-inf", "-1", "0", "1e309", "10%", "abc%", "%", "2,3", "\t", "\x7f", "~", "$HOME", "--json"]
TEXT = st.one_of(st.sampled_from(WEIRD), st.text(alphabet=st.characters(blacklist_categories=("Cs",),
                                                                        blacklist_characters="\x00"), max_size=12))
BOGUS_STAGE = st.text(alphabet="zqxj-_.,", min_size=1, max_size=8).map(lambda s: "zz" + s)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    out = root / "runs"
    make_run(out, "aaaaaaa")
    make_run(out, "bbbbbbb", time_scale=1.4, statuses={"triton-fwd": "FAIL"})
    broken = make_run(out, "ccccccc")
    data = (broken / "decode.csv").read_bytes()
    (broken / "decode.csv").write_bytes(data[: len(data) // 2])
    make_run(out, "ddddddd", device="cpu")
    bl.save_new(root / "base.json", bl.from_run(Run.open(out / "aaaaaaa")))
    (root / "broken_base.json").write_text('{"schema_version": 1, "kind": "nsa-run-baseline", "mach')
    (root / "precious.json").write_text("do not overwrite")
    return root


def _evidence(root) -> dict:
    """Everything the CLI must never change: the runs (report.html / summary.md excepted) and the files."""
    snap = snapshot(root)
    return {k: v for k, v in snap.items() if not k.endswith("report.html") and not k.startswith("new-")}


@st.composite
def argv(draw, root):
    out = str(root / "runs")
    valid = st.sampled_from(["aaaaaaa", "bbbbbbb", "ddddddd", str(root / "runs" / "aaaaaaa")])
    runs = st.one_of(valid, valid, valid, st.sampled_from(["ccccccc", "zzzzzzz", str(root)]), TEXT)
    cmd = draw(st.sampled_from(["compare", "compare", "compare", "report", "report", "oneshot", "stage", "list",
                                "bogus", "--help"]))
    args: list[str] = [cmd]
    if cmd == "compare":
        if draw(st.integers(0, 9)):  # mostly the fabricated runs; sometimes the default --out (empty)
            args += ["--out", out]
        args.append(draw(runs))
        if draw(st.integers(0, 4)):
            args.append(draw(runs))
        for opt in draw(st.lists(st.sampled_from(["--threshold", "--parity-factor", "--baseline", "--save-baseline",
                                                  "--only-changed", "--markdown", "--json", "--out"]), max_size=4)):
            args.append(opt)
            if opt == "--threshold":
                args.append(draw(st.one_of(st.sampled_from(["10%", "0.05", "5", "0"]), TEXT)))
            elif opt == "--parity-factor":
                args.append(draw(st.one_of(st.sampled_from(["2", "1", "1.5", "1e9"]), TEXT)))
            elif opt == "--baseline":
                args.append(draw(st.sampled_from([str(root / "base.json"), str(root / "broken_base.json"),
                                                  str(root / "nope.json"), str(root), "", "-"])))
            elif opt == "--save-baseline":
                n = draw(st.integers(0, 10**9))
                args.append(draw(st.sampled_from([str(root / f"new-{n}.json"), str(root / "precious.json"),
                                                  str(root / "no" / "dir.json"), str(root)])))
            elif opt == "--out":
                args.append(draw(st.sampled_from([out, str(root / "elsewhere"), str(root / "precious.json")])))
    elif cmd == "report":
        args.append(draw(runs))
        if draw(st.booleans()):
            args.append("--json")
        args += ["--out", draw(st.sampled_from([out, str(root / "precious.json")]))]
    elif cmd == "oneshot":
        only = draw(st.lists(st.one_of(BOGUS_STAGE, st.sampled_from(["sanity", "summary", ""])), min_size=1,
                             max_size=3).filter(lambda xs: any(x.startswith("zz") for x in xs)))
        args += ["--only", ",".join(only), "--out", str(root / "oneshot-out")]
        args += _common_opts(draw)
    elif cmd == "stage":
        args += [draw(BOGUS_STAGE), "--out", str(root / "stage-out")] + _common_opts(draw)
        if draw(st.booleans()):
            args += [draw(st.sampled_from(["--T", "--S-list", "--x"])), draw(TEXT)]
    elif cmd == "list":
        args += _common_opts(draw, allowed=("--device", "--json"))
    return args


def _common_opts(draw, allowed=("--device", "--profile", "--timeout", "--strict", "--json")) -> list[str]:
    args: list[str] = []
    for opt in draw(st.lists(st.sampled_from(allowed), max_size=3)):
        args.append(opt)
        if opt == "--device":
            args.append(draw(st.one_of(st.sampled_from(["cpu", "cuda"]), TEXT)))
        elif opt == "--profile":
            args.append(draw(st.one_of(st.sampled_from(["quick", "full"]), TEXT)))
        elif opt == "--timeout":
            args.append(draw(st.one_of(st.sampled_from(["1", "0", "-5", "nan", "inf"]), TEXT)))
    return args


def test_cli_fuzz_never_tracebacks(world, monkeypatch):
    monkeypatch.chdir(world)  # a default --out (artifacts/runner) lands in the temp folder
    before = _evidence(world)
    runner = CliRunner()

    @settings(max_examples=50, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(args=argv(world))
    def check(args):
        r = runner.invoke(app, args)
        where = f"argv={args!r}\n{r.output[-2000:]}"
        assert r.exception is None or isinstance(r.exception, SystemExit), f"{where}\n{r.exc_info}"
        assert r.exit_code in (0, 1, 2), where
        assert "Traceback" not in r.output, where
        if r.exit_code == 2:
            assert r.output.strip(), f"exit 2 without a message: {where}"
        assert _evidence(world) == before, f"evidence changed by {args!r}"
        assert (world / "precious.json").read_text() == "do not overwrite"

    check()
    # oneshot/stage never got as far as running anything
    for sub in ("oneshot-out", "stage-out"):
        p = world / sub
        assert not p.exists() or not any(p.rglob("manifest.json")), os.listdir(p)
