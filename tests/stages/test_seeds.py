"""Reproducible randomness: every stage that draws random inputs takes ``--seed``, records the
seed it used in its artifacts, prints the command that replays it, and that command reproduces
the same inputs (a red check can be replayed).

Stages: sanity (fresh seed per run unless --seed), selection-map, triton-fwd / triton-bwd
(``stages._parity``), fa2-probe (its parity part), decode-bench.
"""

from __future__ import annotations

import json
import os
import re
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from nsa_runner.stage import Status  # noqa: E402
from stages import _parity, _seed, sanity  # noqa: E402

REPLAY = re.compile(r"nsa-run stage ([\w-]+) --seed (\d+) --device (\w+) --profile (\w+)")


def _ctx(tmp_path, stage, **options):
    return SimpleNamespace(dir=tmp_path, device="cpu", profile="quick", options=options, run_id="t", stage=stage)


def _replayed(text: str, stage: str) -> int:
    """The seed of the replay command for ``stage`` printed in ``text`` (asserts there is one)."""
    hits = [m for m in REPLAY.finditer(text) if m.group(1) == stage]
    assert hits, f"no replay command for {stage} in: {text[-2000:]}"
    assert (hits[0].group(3), hits[0].group(4)) == ("cpu", "quick")
    return int(hits[0].group(2))


# ---- the option ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["-1", "abc", "1.5", str(2**63)])
def test_bad_seed_is_a_clear_value_error(text):
    with pytest.raises(ValueError, match="--seed"):
        _seed.parse(text)


def test_seed_option_parses_and_bad_seed_exits_2_before_running(cli, tmp_path):
    assert _seed.parse("1234") == 1234 and _seed.parse(" 16 ") == 16
    for odd in ("0x10", "1_2", "\u0661\u0662", "9" * 5000):  # round 31 U31-2: decimal ASCII digits only, as every int
        with pytest.raises(ValueError, match="--seed"):
            _seed.parse(odd)
    r = cli("stage", "sanity", "--seed", "abc", "--out", tmp_path / "o", "--device", "cpu")
    assert r.exit_code == 2 and "--seed" in r.stderr
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


@pytest.mark.parametrize("name", ["sanity", "selection-map", "triton-fwd", "triton-bwd", "fa2-probe", "decode-bench"])
def test_every_random_stage_declares_seed(name):
    from nsa_runner.registry import discover

    entry = {e.name: e for e in discover()}[name]
    assert "--seed" in [o.flag for o in entry.stage.options]


# ---- sanity: fresh by default, recorded, replayable ----------------------------------------------

@pytest.fixture
def sanity_draws(monkeypatch):
    """Replace sanity's (slow) checks by a recorder of what its generator draws."""
    draws: list[list[float]] = []

    def record(c, *args, **kw):
        gen = next(a for a in args if isinstance(a, torch.Generator))
        draws.append(torch.randn(8, generator=gen).tolist())
        c.add("recorded", True, "draws recorded")

    for fn in ("_check_branch", "_check_selection", "_check_module"):
        monkeypatch.setattr(sanity, fn, record)
    return draws


def _sanity(tmp_path, capsys, draws, **options):
    d = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    d.mkdir()
    res = sanity.Sanity().run(_ctx(d, "sanity", **options))
    assert res.status == Status.PASS, res.reason
    doc = json.loads((d / "sanity.json").read_text())
    out = capsys.readouterr().out
    seed = _replayed(out, "sanity")
    assert doc["seed"] == seed == res.metrics["seed"]  # recorded = printed
    assert _replayed(doc["replay"], "sanity") == seed
    assert _replayed((d / "sanity.out").read_text(), "sanity") == seed
    got = [list(x) for x in draws]
    draws.clear()
    return seed, got


def test_sanity_draws_a_fresh_seed_records_it_and_its_replay_reproduces_the_inputs(tmp_path, capsys, sanity_draws):
    seed1, inputs1 = _sanity(tmp_path, capsys, sanity_draws)
    seed2, inputs2 = _sanity(tmp_path, capsys, sanity_draws)
    assert seed1 != seed2 and inputs1 != inputs2  # fresh inputs every run by default
    replay, inputs_r = _sanity(tmp_path, capsys, sanity_draws, seed=seed1)
    assert replay == seed1 and inputs_r == inputs1  # the printed command replays run 1 exactly


def test_sanity_failure_names_the_replay_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sanity, "_check_branch", lambda c, *a, **k: c.add("planted", False, "red on purpose"))
    monkeypatch.setattr(sanity, "_check_selection", lambda c, *a, **k: None)
    monkeypatch.setattr(sanity, "_check_module", lambda c, *a, **k: None)
    res = sanity.Sanity().run(_ctx(tmp_path, "sanity", seed=77))
    assert res.status == Status.FAIL
    assert "nsa-run stage sanity --seed 77 --device cpu --profile quick" in res.hint
    assert capsys.readouterr().out.count("--seed 77") >= 2  # at the start and with the failure


# ---- triton-fwd / triton-bwd ----------------------------------------------------------------------

def _drops_last_block(q, k, v, idx, cnt, bs, scale=None, deterministic=False, **kw):
    """Wrong on purpose, by an amount that depends on the inputs (so seeds are visible in rel_err)."""
    cnt = (cnt - 1).clamp(min=0).to(torch.int32)
    idx = torch.where(torch.arange(idx.shape[-1], device=idx.device) < cnt[..., None], idx, -1).to(torch.int32)
    return _parity.reference(q, k, v, idx, cnt, bs).to(q.dtype)


def test_parity_stage_records_the_seed_and_one_case_replays_exactly(tmp_path, monkeypatch, capsys):
    pytest.importorskip("triton", reason="needs triton: pip install triton")
    from stages.triton_fwd import TritonFwd

    monkeypatch.setattr(_parity, "KERNEL", _drops_last_block)
    full = tmp_path / "full"
    full.mkdir()
    res = TritonFwd().run(_ctx(full, "triton-fwd", seed=5))
    assert res.status == Status.FAIL
    assert _replayed(capsys.readouterr().out, "triton-fwd") == 5
    df = pd.read_csv(full / "triton_fwd.csv")
    assert (df.seed == 5).all()
    assert _replayed((full / "triton_fwd.txt").read_text(), "triton-fwd") == 5
    # the hint replays the first failing case alone: same inputs, same error, whatever --cases selects
    last = df.case.iloc[-1]
    m = re.search(r"--cases (\S+)", res.hint)
    assert m and m.group(1) == df.case.iloc[0] and "--seed 5" in res.hint
    one = tmp_path / "one"
    one.mkdir()
    TritonFwd().run(_ctx(one, "triton-fwd", seed=5, cases=last))
    alone = pd.read_csv(one / "triton_fwd.csv")
    assert alone.case.tolist() == [last]
    assert alone.rel_err.iloc[0] == df.set_index("case").rel_err[last]
    # another seed: other inputs
    other = tmp_path / "other"
    other.mkdir()
    TritonFwd().run(_ctx(other, "triton-fwd", seed=6, cases=last))
    assert pd.read_csv(other / "triton_fwd.csv").rel_err.iloc[0] != alone.rel_err.iloc[0]


# ---- selection-map ---------------------------------------------------------------------------------

def test_selection_map_prints_and_records_its_replay(tmp_path, capsys):
    from stages.selection_map import SelectionMap

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    assert SelectionMap().run(_ctx(a, "selection-map", seed=11, T=256)).status == Status.PASS
    assert _replayed(capsys.readouterr().out, "selection-map") == 11
    assert _replayed((a / "selection_map.txt").read_text(), "selection-map") == 11
    assert "--T 256" in (a / "selection_map.txt").read_text()
    SelectionMap().run(_ctx(b, "selection-map", seed=12, T=256))
    assert (a / "sel_ranges.jsonl").read_text() != (b / "sel_ranges.jsonl").read_text()


# ---- fa2-probe (parity part) and decode-bench -----------------------------------------------------

def test_fa2_probe_parity_records_the_seed(tmp_path, monkeypatch, capsys):
    from nsa_runner.measure import flash_bench as _flash_bench
    from stages.fa2_probe import Fa2Probe

    monkeypatch.setattr(_flash_bench, "parity_cases", lambda profile: [_flash_bench.Case(1, 70, 4, 2, 16)])
    ctx = _ctx(tmp_path, "fa2-probe", S_list=None, thresholds="none", bench="no", seed=21)
    doc, txt, files = {"probe": []}, [], []
    Fa2Probe()._measure(ctx, tmp_path, ctx.options, "cpu", {"cmp": ["sdpa-math"], "win": []}, doc, txt, files)
    assert _replayed(capsys.readouterr().out, "fa2-probe") == 21
    assert doc["seed"] == 21 and _replayed(doc["replay"], "fa2-probe") == 21
    assert (pd.read_csv(tmp_path / "fa2_varlen.csv").seed == 21).all()


def test_decode_bench_records_the_seed_and_replay(tmp_path, capsys):
    from stages.decode_bench import DecodeBench

    options = {o.dest: o.default for o in DecodeBench.options}
    options.update(S_list=[300], batch_list=[1], iters=1, warmup=0, seed=9)
    res = DecodeBench().run(_ctx(tmp_path, "decode-bench", **options))
    assert res.status == Status.PASS, res.reason
    assert _replayed(capsys.readouterr().out, "decode-bench") == 9
    text = (tmp_path / "decode_bench.txt").read_text()
    assert "seed=9" in text and _replayed(text, "decode-bench") == 9
