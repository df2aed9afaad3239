"""Bad days for implementation plugins (issue 16, red-team round 3, the breaks left open there).

An entry point of ``nsa_runner.impls`` whose module segfaults, calls ``os._exit(0)`` or hangs at
import, through the CLI as a separate process (a module plus a dist-info on sys.path, what pip
leaves behind):

- ``nsa-run list --impls`` lists that one as broken with the reason and the others as usual
  (before: one child loaded every impl, so one crash marked every impl broken, nsa_core included,
  and a hang held the command for 300 s);
- a parity stage given ``--impl nsa_core,<bad>`` records the bad one's ERROR with the reason and
  still runs nsa_core's cases (before: the segfault took the whole stage down).
"""

from __future__ import annotations

import json
import subprocess

import pandas as pd
import pytest

from nsa_runner.artifacts import load_manifest

try:
    from _bad_days import cli_cmd, env_with
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import cli_cmd, env_with

try:
    from test_impls_cli import make_impl
except ImportError:  # pragma: no cover
    from tests.runner.test_impls_cli import make_impl

GOOD = """
import torch
from nsa_runner.impls import Impl

def selection_attention(q, k, v, block_idx, block_count, cfg):
    t = torch.arange(q.shape[1], device=q.device)
    live = torch.arange(block_idx.shape[-1], device=q.device) < block_count[..., None]
    blocks = torch.where(live, block_idx, -1).long()[..., None]
    mask = (blocks == t // cfg.l_sel).any(-2) & (t <= t[:, None, None])
    mask = mask.transpose(1, 2).repeat_interleave(q.shape[2] // k.shape[2], 1)
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return o.transpose(1, 2).nan_to_num()

IMPL = Impl("calm", {"selection_attention": selection_attention})
"""
# what each hostile module does at import (then it would declare a valid Impl)
HOSTILE = {
    "segv": "import ctypes\nctypes.string_at(0)\n",
    "exit0": "import os\nos._exit(0)\n",
    "hang": "import time\ntime.sleep(1000)\n",
    "noisy": "import os\nprint('GARBAGE ON STDOUT', flush=True)\nos.write(1, b'RAW FD1\\n')\n",
}
TAIL = "from nsa_runner.impls import Impl\nIMPL = Impl('{name}', {{'selection_attention': lambda *a: None}})\n"
LIMIT_S = 30  # NSA_RUN_DISCOVERY_TIMEOUT here: a hanging import is stopped after this (fla and torch
# imports take ~10 s on a loaded 2-core machine: well under it)


@pytest.fixture
def hostile(plugins):
    """hostile(*kinds) -> the CLI's environment with calm and those hostile impls installed."""
    def install(*kinds):
        make_impl(plugins, "calm-kernels", "calm_kernels", GOOD, {"calm": "calm_kernels:IMPL"})
        for name in kinds:
            make_impl(plugins, f"{name}-kernels", f"{name}_kernels", HOSTILE[name] + TAIL.format(name=name),
                      {name: f"{name}_kernels:IMPL"})
        return env_with(plugins.env(), NSA_RUN_DISCOVERY_TIMEOUT=LIMIT_S)
    return install


def _run(env, *args, timeout=240):
    return subprocess.run(cli_cmd(*args), env=env, capture_output=True, text=True, timeout=timeout)


def _list(env, fine=("calm",), timeout=150) -> dict:
    r = _run(env, "list", "--impls", "--json", "--device", "cpu", timeout=timeout)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]  # broken adapters: list says so
    assert "Traceback" not in r.stderr
    rows = {x["name"]: x for x in json.loads(r.stdout)["impls"]}  # stdout is pure JSON
    assert list(rows)[0] == "nsa_core"
    assert rows["nsa_core"]["runs_here"] and not rows["nsa_core"]["broken"]
    assert rows["nsa_core"]["source"] == "built-in" and "selection_attention" in rows["nsa_core"]["parts"]
    for name in fine:
        assert not rows[name]["broken"] and rows[name]["runs_here"], rows[name]
        assert rows[name]["parts"] == ["selection_attention"]
    assert "fla" in rows and not rows["fla"]["broken"]  # the built-in adapter: runs here or says why not
    return rows


def test_list_impls_names_an_impl_whose_import_segfaults_or_exits_and_lists_the_others(hostile):
    # before: every row (nsa_core, fla, calm, noisy too) "broken: loading the implementations in a
    # child process failed (exit status -11 ...)" (or "exit status 0": no JSON line)
    rows = _list(hostile("segv", "exit0", "noisy"), fine=("calm", "noisy"))
    for name in ("segv", "exit0"):
        assert rows[name]["broken"] and not rows[name]["runs_here"] and rows[name]["parts"] == []
        assert rows[name]["why_not"].startswith(f"broken: {name}_kernels:IMPL: "), rows[name]
    assert "killed the discovery process (SIGSEGV)" in rows["segv"]["why_not"]
    assert "ended the discovery process (exit code 0" in rows["exit0"]["why_not"]


def test_list_impls_stops_an_import_that_hangs_and_lists_the_others(hostile):
    # before: `list --impls` waited 300 s for the one child, then marked every impl broken
    # ("timed out after 300 s"): TimeoutExpired here
    rows = _list(hostile("hang"), timeout=LIMIT_S + 120)
    assert rows["hang"]["broken"] and not rows["hang"]["runs_here"]
    assert rows["hang"]["why_not"] == (f"broken: hang_kernels:IMPL: its import did not finish within {LIMIT_S}s "
                                       "(hangs?); stopped")


def _stage(out, run="testrun"):
    (rec,) = load_manifest(out / run)["stages"]
    return rec


@pytest.mark.parametrize("stage,args", [
    ("triton-fwd", ("--cases", "B2-T70")),
    ("sanity", ()),
    ("selection-map", ()),
    ("decode-bench", ("--kernel", "torch", "--S-list", "300", "--batch-list", "1", "--iters", "1", "--warmup", "0",
                      "--profile-passes", "1")),
])
def test_a_parity_stage_keeps_nsa_cores_cases_beside_an_impl_whose_import_segfaults(hostile, tmp_path, stage, args):
    # before: the stage's process died of the segfault while loading the impls (stage ERROR
    # "killed by SIGSEGV", no nsa_core result at all)
    r = _run(hostile("segv"), "stage", stage, "--impl", "nsa_core,segv", *args, "--out", tmp_path, "--device", "cpu")
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    rec = _stage(tmp_path)
    assert rec["status"] == "FAIL", rec  # the broken impl fails the stage; the stage itself ran
    if stage == "triton-fwd":
        df = pd.read_csv(tmp_path / "testrun" / "triton_fwd.csv")
        st = dict(zip(df.impl, df.status, strict=True))
        assert st == {"nsa_core": "PASS", "segv": "ERROR"}, df
        note = df.set_index("impl").loc["segv", "note"]
    elif stage == "decode-bench":
        df = pd.read_csv(tmp_path / "testrun" / "decode.csv")  # measured points only: nsa_core's
        assert list(df.impl) == ["nsa_core"] and list(df.status) == ["PASS"], df
        assert "segv S=300 B=1: segv: broken adapter" in rec["reason"]
        note = rec["reason"]
    elif stage == "selection-map":
        text = (tmp_path / "testrun" / "selection_map.txt").read_text()
        ok = [ln for ln in text.splitlines() if ln.startswith("  [ok] nsa_core: ")]
        assert len(ok) == 7 and rec["metrics"]["failed"] == 1, text  # nsa_core's checks ran and held
        note = rec["reason"]
    else:
        doc = json.loads((tmp_path / "testrun" / "sanity.json").read_text())
        core = [c for c in doc["checks"] if not c["check"].startswith("segv")]
        assert len(core) >= 5 and all(c["ok"] for c in core), core  # nsa_core's checks ran and passed
        (bad,) = [c for c in doc["checks"] if c["check"].startswith("segv")]
        assert not bad["ok"]
        note = json.dumps(bad)
    assert "segv_kernels:IMPL: importing it killed the discovery process (SIGSEGV)" in note, note


def test_a_parity_stage_names_impls_that_exit_or_hang_at_import_and_runs_the_rest(hostile, tmp_path):
    r = _run(hostile("exit0", "hang"), "stage", "triton-fwd", "--impl", "exit0,calm,hang", "--cases", "B2-T70",
             "--out", tmp_path, "--device", "cpu")
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    df = pd.read_csv(tmp_path / "testrun" / "triton_fwd.csv").set_index("impl")
    assert df.loc["calm", "status"] == "PASS"
    assert df.loc["exit0", "status"] == "ERROR" and "exit code 0" in df.loc["exit0", "note"]
    assert df.loc["hang", "status"] == "ERROR" and f"did not finish within {LIMIT_S}s" in df.loc["hang", "note"]
    assert "exit0:B2-T70" in _stage(tmp_path)["reason"] and "hang:B2-T70" in _stage(tmp_path)["reason"]
