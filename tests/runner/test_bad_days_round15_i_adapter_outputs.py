"""Bad days, red-team round 15 (part B) B-R3: what an adapter's part returned was used outside the adapter
guard. selection-map guarded the ``select`` call, then used the tensors (``idx.shape``, the structure
checks, the comparison with the reference) unguarded: a ``torch.Tensor`` subclass passes ``isinstance``
and its ``__torch_function__`` runs on every later op; one raising SystemExit once returned ended the
stage "stage called sys.exit(9)": no selection_map.txt, nsa_core's checks lost, the adapter not named.

Expected: every stage that calls an adapter's part converts what it returned into a plain torch.Tensor
inside its guard (``impls.plain_tensor``): the hostile tensor is that implementation's failure at most,
the other implementations' results are kept.
"""

from __future__ import annotations

import json
import subprocess
import sys

try:
    from _bad_days import MAIN
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN

EVIL = '''
import torch
from nsa_runner.impls import Impl
from nsa_runner.impls.nsa_core import make

ARMED = []


class Evil(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if ARMED:  # once returned to the stage: any use of it ends the process
            raise SystemExit(9)
        return super().__torch_function__(func, types, args, kwargs or {})


_core = make().parts


def select(q, k_cmp, cfg):
    idx, cnt = _core["select"](q, k_cmp, cfg)
    idx, cnt = idx.as_subclass(Evil), cnt.as_subclass(Evil)
    ARMED.append(1)
    return idx, cnt


def selection_attention(q, k, v, block_idx, block_count, cfg):
    ARMED.clear()
    o = _core["selection_attention"](q, k, v, block_idx, block_count, cfg).as_subclass(Evil)
    ARMED.append(1)
    return o


def evilsel():
    return Impl("evilsel", {"select": select, "selection_attention": selection_attention})
'''


def _site(plugins) -> None:
    (plugins.site / "r15i_evil.py").write_text(EVIL)
    info = plugins.site / "r15i_evil-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: r15i-evil\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[nsa_runner.impls]\nevilsel = r15i_evil:evilsel\n")


def _oneshot(plugins, out, only: str):
    r = subprocess.run([sys.executable, "-c", MAIN, "oneshot", "--only", only, "--device", "cpu",
                        "--impl", "nsa_core,evilsel", "--out", str(out)],
                       env=plugins.env(), text=True, capture_output=True, timeout=600)
    assert "Traceback" not in r.stderr and "(unexpected" not in r.stderr, r.stderr[-3000:]
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    assert m["finished"], m
    return next(s for s in m["stages"] if s["name"] == only)


def test_a_select_returning_a_hostile_tensor_subclass_is_that_impls_failure(plugins, tmp_path):
    _site(plugins)
    out = tmp_path / "runs"
    rec = _oneshot(plugins, out, "selection-map")
    # before: ERROR "stage called sys.exit(9)", no selection_map.txt, nsa_core's checks lost
    assert rec["status"] in ("PASS", "FAIL"), rec
    assert "sys.exit" not in rec["reason"], rec["reason"]
    text = (out / "testrun" / "selection_map.txt").read_text()
    assert "evilsel" in text, text[-2000:]
    core = [line for line in text.splitlines() if line.strip().startswith("[")
            and "evilsel" not in line and "SKIP" not in line]
    assert len(core) >= 7 and all(line.strip().startswith("[ok]") for line in core), core
    assert (out / "testrun" / "sel_ranges.jsonl").stat().st_size > 0


def test_parity_and_sanity_take_plain_tensors_of_an_adapter(plugins, tmp_path):
    """triton-fwd (selection_attention's output) and sanity (select, selection_attention): the subclass's
    code never runs after the part returned; the adapter's results are compared like any other."""
    _site(plugins)
    rec = _oneshot(plugins, tmp_path / "fwd", "triton-fwd")
    assert rec["status"] == "PASS", rec  # both implementations within tolerance: nothing of Evil ran
    import pandas as pd

    df = pd.read_csv(tmp_path / "fwd" / "testrun" / "triton_fwd.csv")
    assert set(df.impl) == {"nsa_core", "evilsel"} and (df.status == "PASS").all(), df[["impl", "status", "note"]]
    rec = _oneshot(plugins, tmp_path / "san", "sanity")
    checks = json.loads((tmp_path / "san" / "testrun" / "sanity.json").read_text())["checks"]
    mine = [c for c in checks if c["check"].startswith("evilsel")]
    assert mine and all(c["ok"] for c in mine), [c for c in mine if not c["ok"]][:3]
    assert rec["status"] == "PASS", rec
