"""Bad days, an edge named open after round 13: prefill-bench and decode-bench run an implementation's
``nsa_attention`` / ``decode_step`` (its adapter's code, issue 15) and caught only ``Exception``
around it. An adapter raising ``SystemExit`` (or ``GeneratorExit``, its own ``KeyboardInterrupt``)
ended the whole stage as an anonymous ERROR ("stage called sys.exit(7)"), its own rows, the
baselines and nsa_core's rows lost. Now it is that implementation's failure, named, as in sanity /
selection-map / the parity stages (round 13 B5); the stage's other rows are written.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

try:
    from _bad_days import MAIN
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN


SRC = '''
from nsa_runner.impls import Impl


def _raise(exc):
    def f(*a, **k):
        raise exc
    return f


def get(name, exc):
    return Impl(name, {"nsa_attention": _raise(exc), "decode_step": _raise(exc)})


PEXIT = lambda: get("pexit", SystemExit(7))
PGEN = lambda: get("pgen", GeneratorExit())
PKBI = lambda: get("pkbi", KeyboardInterrupt())
'''
NAMES = {"pexit": "SystemExit", "pgen": "GeneratorExit", "pkbi": "KeyboardInterrupt"}


@pytest.fixture
def peer_env(plugins):
    (plugins.site / "peermod.py").write_text(SRC)
    info = plugins.site / "peer_edges-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: peer-edges\nVersion: 1.0\n")
    entries = "".join(f"{n} = peermod:{n.upper()}\n" for n in NAMES)
    (info / "entry_points.txt").write_text("[nsa_runner.impls]\n" + entries)
    return plugins.env()


def _stage(env, out, *args):
    r = subprocess.run([sys.executable, "-c", MAIN, "stage", *args, "--out", str(out), "--device", "cpu"],
                       env=env, text=True, capture_output=True, timeout=900)
    assert "Traceback" not in r.stderr and "(unexpected" not in r.stderr, r.stderr[-3000:]
    st = {s["name"]: s for s in json.loads((out / "testrun" / "manifest.json").read_text())["stages"]}
    return r, st


def test_decode_bench_an_adapters_base_exception_is_its_error_row(peer_env, tmp_path):
    """Before: decode-bench ERROR "stage called sys.exit(7)" (or "process died with SIGINT"), no decode.csv."""
    out = tmp_path / "o"
    r, st = _stage(peer_env, out, "decode-bench", "--impl", "nsa_core,pexit,pgen,pkbi", "--S-list", "256",
                   "--batch-list", "1", "--iters", "2", "--warmup", "1")
    s = st["decode-bench"]
    assert s["status"] == "FAIL", s
    assert "sys.exit" not in s["reason"] and "SIGINT" not in s["reason"], s["reason"]
    assert all(name in s["reason"] or name in (out / "testrun" / "decode_bench.txt").read_text() for name in NAMES)
    text = (out / "testrun" / "decode_bench.txt").read_text()  # an unmeasured point's row is in the text only
    for name, exc in NAMES.items():
        assert f"ERROR {name} S=256 B=1" in text and f"decode_step raised {exc}" in text, (name, text[-3000:])
    rows = list(csv.DictReader((out / "testrun" / "decode.csv").open()))
    assert [x for x in rows if x["impl"] == "nsa_core"], rows[:4]  # nsa_core's point still measured


def test_prefill_bench_an_adapters_base_exception_is_named_the_others_timed(peer_env, tmp_path):
    """Before: prefill-bench ERROR "stage called sys.exit(7)", no prefill.csv: nsa_core's and SDPA's rows lost."""
    out = tmp_path / "o"
    r, st = _stage(peer_env, out, "prefill-bench", "--impl", "pexit,pgen,pkbi", "--T-list", "128")
    s = st["prefill-bench"]
    assert "sys.exit" not in s["reason"] and "SIGINT" not in s["reason"], s
    assert s["status"] == "PASS", s
    rows = list(csv.DictReader((out / "testrun" / "prefill.csv").open()))
    assert {x["path"] for x in rows} >= {"sdpa-default"}, {x["path"] for x in rows}
    text = (out / "testrun" / "prefill.txt").read_text()
    for name, exc in NAMES.items():
        assert f"{name} not timed" in text and exc in text, (name, text[-2000:])
