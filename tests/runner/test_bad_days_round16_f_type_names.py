"""Bad days, red-team round 16 (part B) B4: ``impls.type_name`` returned ``type(value).__name__`` whole when it
was a plain ``str``; a metaclass property makes it any size. Every "raised TYPE: message" text
(``describe_failure``: the message clipped, the name not) and every "returned a TYPE" text carried it:
sanity's check details (a 30 MB name: the stage's result too large for manifest.json, every other check
lost), selection_map.txt one 20 MB line, and the traceback in the stage's log as large.

Expected: the class name clipped like every other adapter text: the adapter's FAIL names it in a short
line, the files stay small.
"""

from __future__ import annotations

import json
import subprocess
import sys

try:
    from _bad_days import MAIN
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN

BIG = 2_000_000  # characters of the class name (30 MB in the report; the clipping does not depend on it)

ADAPTERS = f'''
from nsa_runner.impls import Impl

BIG = "Y" * {BIG}


class M(type):
    @property
    def __name__(cls):
        return BIG  # a plain str


class E(Exception, metaclass=M):
    pass


def _raises(q, k_cmp, cfg):
    raise E("boom")


def _returns(q, k_cmp, cfg):
    return E("x")  # neither a tuple nor tensors: "select returned TYPE, want ..."


def meta():
    return Impl("meta", {{"select": _raises}})


def metaret():
    return Impl("metaret", {{"select": _returns}})
'''


def test_a_huge_exception_class_name_is_clipped_in_every_text(plugins, tmp_path):
    (plugins.site / "r16f_meta.py").write_text(ADAPTERS)
    info = plugins.site / "r16f_meta-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: r16f-meta\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[nsa_runner.impls]\nmeta = r16f_meta:meta\n"
                                           "metaret = r16f_meta:metaret\n")
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-c", MAIN, "oneshot", "--only", "selection-map,sanity", "--device", "cpu",
                        "--impl", "nsa_core,meta,metaret", "--out", str(out)],
                       env=plugins.env(), text=True, capture_output=True, timeout=600)
    assert len(r.stdout) + len(r.stderr) < 100_000, (len(r.stdout), len(r.stderr))
    run = out / "testrun"
    m = json.loads((run / "manifest.json").read_text())
    stages = {s["name"]: s for s in m["stages"]}
    assert stages["sanity"]["status"] == "FAIL", stages["sanity"]
    assert stages["selection-map"]["status"] == "FAIL", stages["selection-map"]
    # the adapter's failures are named, with the clipped class name and the message
    checks = json.loads((run / "sanity.json").read_text())["checks"]
    mine = [c for c in checks if c["check"].startswith("meta ") and not c["ok"]]
    assert mine and "boom" in mine[0]["detail"] and "more characters" in mine[0]["detail"], mine[:1]
    core = [c for c in checks if c["check"].startswith("nsa_core")]
    assert core and all(c["ok"] for c in core)
    text = (run / "selection_map.txt").read_text()
    assert [line for line in text.splitlines() if "meta:" in line and "boom" in line], text[-2000:]
    assert [line for line in text.splitlines() if "metaret:" in line and "select returned" in line], text[-2000:]
    # before: sanity.json, selection_map.txt and the logs each held the 2 MB name (several times)
    for f in [run / "sanity.json", run / "selection_map.txt", run / "manifest.json", *run.rglob("*.log")]:
        assert f.stat().st_size < 200_000, (f, f.stat().st_size)
