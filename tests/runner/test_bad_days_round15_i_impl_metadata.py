"""Bad days, red-team round 15 (part B) B-R1: an implementation's ``note`` / ``name`` / ``differences`` were
kept as the plugin's own objects (only an exact ``str`` was clipped, their types never checked) and the
stages used them outside the adapter guard:

- a 1 MB ``str``-subclass note was written whole into every triton-fwd row (the red team's 30 MB one made
  a 126 MB CSV that ``report`` / ``compare`` refuse for good);
- a list note ended triton-fwd in "TypeError: sequence item 0 ..." naming no adapter, every row lost;
- a ``str``-subclass name whose ``__add__`` / ``__format__`` return megabytes made MB-long SKIP reasons;
- a note whose ``__bool__`` raises SystemExit (in the stage's process only) ended sanity "stage called
  sys.exit(7)": nsa_core's checks lost, the adapter not named.

Expected: discovery keeps a plain copy of the Impl, made inside the adapter guard (texts plain ``str``,
clipped; a value of the wrong type makes that adapter broken, the attribute named); the other
implementations' results are kept and the run folder can be reported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

try:
    from _bad_days import MAIN
except ImportError:  # pragma: no cover - run from the repository root
    from tests.runner._bad_days import MAIN

IMPLS = '''
import sys
import torch
from nsa_runner.impls import Constraints, Impl


def _in_stage():
    return any(m.startswith("nsa_run_stages") or m.startswith("stages.") for m in sys.modules)


def selection_attention(q, k, v, block_idx, block_count, cfg):
    t = torch.arange(q.shape[1], device=q.device)
    live = torch.arange(block_idx.shape[-1], device=q.device) < block_count[..., None]
    blocks = torch.where(live, block_idx, -1).long()[..., None]
    mask = (blocks == t // cfg.l_sel).any(-2) & (t <= t[:, None, None])
    mask = mask.transpose(1, 2).repeat_interleave(q.shape[2] // k.shape[2], 1)
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    return o.transpose(1, 2).nan_to_num()


PARTS = {"selection_attention": selection_attention}


class S(str):
    pass


class Huge(str):
    def __format__(self, spec):
        return "subname" + "N" * (1 << 20)

    def __add__(self, other):
        return "subname" + "N" * (1 << 20) + str.__str__(other)


class Exits:
    def __bool__(self):
        raise SystemExit(7)

    def __str__(self):
        return "fine"


def bign():
    return Impl("bign", dict(PARTS), note=S("N" * (1 << 20)), differences={"selection_attention": S("D" * (1 << 20))})


def listn():
    return Impl("listn", dict(PARTS), note=["a list note"])


def subname():
    return Impl(Huge("subname"), dict(PARTS), Constraints(dtypes=("bf16",)))


def booln():
    return Impl("booln", dict(PARTS), note=Exits() if _in_stage() else "")
'''

ENTRIES = "".join(f"{n} = r15i_meta:{n}\n" for n in ("bign", "listn", "subname", "booln"))


def _site(plugins) -> None:
    (plugins.site / "r15i_meta.py").write_text(IMPLS)
    info = plugins.site / "r15i_meta-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: r15i-meta\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[nsa_runner.impls]\n" + ENTRIES)


def _main(env, *args, timeout=600):
    r = subprocess.run([sys.executable, "-c", MAIN, *map(str, args)], env=env, text=True, capture_output=True,
                       timeout=timeout)
    assert "Traceback" not in r.stderr and "(unexpected" not in r.stderr, r.stderr[-3000:]
    return r


def _stage(out: Path, name: str) -> dict:
    m = json.loads((out / "testrun" / "manifest.json").read_text())
    assert m["finished"], m
    return next(s for s in m["stages"] if s["name"] == name)


def test_impl_texts_of_any_class_are_plain_and_clipped_in_triton_fwd_and_list(plugins, tmp_path):
    _site(plugins)
    env = plugins.env()
    r = _main(env, "list", "--impls", "--json", "--device", "cpu")
    assert r.returncode in (0, 1), r.stderr[-2000:]  # 1: an implementation is broken
    assert len(r.stdout) < 200_000, len(r.stdout)  # before: the 1 MB note and difference whole
    rows = {x["name"]: x for x in json.loads(r.stdout)["impls"]}
    assert rows["listn"]["broken"] and "note must be text" in rows["listn"]["why_not"], rows["listn"]
    assert not rows["bign"]["broken"] and len(rows["bign"]["note"]) < 5000, len(rows["bign"]["note"])

    out = tmp_path / "runs"
    r = _main(env, "oneshot", "--only", "triton-fwd", "--device", "cpu", "--impl", "bign,listn,subname",
              "--out", out)
    rec = _stage(out, "triton-fwd")
    # before: ERROR "TypeError: sequence item 0: expected str instance, list found", every row lost
    assert rec["status"] == "FAIL", rec
    assert "listn" in rec["reason"] and "note must be text" in rec["reason"], rec["reason"]
    csv = out / "testrun" / "triton_fwd.csv"
    assert csv.stat().st_size < 200_000, csv.stat().st_size  # before: MBs (the note and the SKIP reasons)
    import pandas as pd

    df = pd.read_csv(csv)
    by = {n: df[df.impl == n] for n in ("bign", "listn", "subname")}
    assert (by["bign"].status == "PASS").all() and len(by["bign"]), by["bign"]
    assert (by["listn"].status == "ERROR").all() and len(by["listn"]), by["listn"]
    assert (by["subname"].status == "SKIP").all() and len(by["subname"]), by["subname"]
    assert all(str(n).startswith("subname: dtype") for n in by["subname"].note), by["subname"].note.tolist()
    # the run folder can be reported (before: "field larger than field limit", exit 2 for good)
    r = _main(env, "report", out / "testrun")
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])


def test_a_note_whose_bool_exits_breaks_its_adapter_not_the_sanity_stage(plugins, tmp_path):
    _site(plugins)
    out = tmp_path / "runs"
    _main(plugins.env(), "oneshot", "--only", "sanity", "--device", "cpu", "--impl", "nsa_core,booln",
          "--out", out)
    rec = _stage(out, "sanity")
    # before: ERROR "stage called sys.exit(7)", no sanity.json, the adapter not named
    assert rec["status"] == "FAIL", rec
    assert "booln" in rec["reason"] and "note must be text" in rec["reason"], rec["reason"]
    checks = json.loads((out / "testrun" / "sanity.json").read_text())["checks"]
    core = [c for c in checks if not c["check"].startswith("booln")]
    assert len(core) >= 10 and all(c["ok"] for c in core), [c for c in core if not c["ok"]][:3]
