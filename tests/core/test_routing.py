"""nsa_core.routing: the decision per branch, overrides, and the thresholds file (good and bad)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from nsa_core import routing

GPU = "NVIDIA H100 80GB HBM3"


def _entry(**over):
    e = {"gpu": GPU, "capability": "9.0", "torch": "2.11.0+cu130", "measured": "2026-11-22",
         "source_run": "abc1234", "branches": {"cmp": {"varlen": {"min_len": 16384, "max_measured": 65536,
                                                                  "speedup_at_max": 7.3},
                                                       "sdpa-cudnn": {"min_len": 16384, "max_measured": 65536,
                                                                      "speedup_at_max": 10.6}},
                                               "win": {"varlen": {"min_len": 4096, "max_measured": 65536,
                                                                  "speedup_at_max": 298.0},
                                                       "sdpa-efficient": {"min_len": None, "max_measured": 65536,
                                                                          "speedup_at_max": 0.9}}}}
    e.update(over)
    return e


def _doc(*entries):
    return {"schema_version": 1, "entries": list(entries) or [_entry()]}


def _write(tmp_path, obj, name="thresholds.json"):
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def _cuda_facts(paths=("varlen", "sdpa-cudnn", "sdpa-efficient"), torch_version="2.11.0+cu130"):
    fp = {p: {"present": True, "reason": "available", "branches": ("cmp", "win")} for p in paths}
    fp["fa2"] = {"present": False, "reason": "flash_attn not installed", "branches": ("cmp", "win")}
    return {"device": "cuda", "torch": torch_version, "gpu": GPU, "capability": "9.0",
            "triton": {"present": True, "reason": "triton imports", "version": "3.6.0"},
            "triton_sel": {"present": True, "reason": "nsa_core.selection.attention imports"}, "flash_paths": fp}


# ---- the CPU decision -----------------------------------------------------------------------

def test_cpu_routes_everything_to_sdpa_with_reasons():
    r = routing.decide("cpu")
    for b in routing.BRANCHES:
        assert r.backend(b) == "sdpa"
        assert "cpu" in r.reason(b)
    j = r.to_json()
    json.dumps(j)  # JSON-able as written to routing.json
    assert j["schema_version"] == routing.SCHEMA_VERSION
    assert set(j["branches"]) == set(routing.BRANCHES)
    assert {"backend", "reason"} <= set(j["branches"]["win"])
    assert j["facts"]["device"] == "cpu" and "triton" in j["facts"] and "flash_paths" in j["facts"]
    assert "source" in j["thresholds"]


def test_cpu_decision_does_not_import_triton():
    code = "import sys; from nsa_core import routing; routing.decide('cpu'); print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_unknown_branch_is_a_value_error():
    with pytest.raises(ValueError, match="unknown branch"):
        routing.decide("cpu").backend("nope")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_requested_without_cuda_is_a_value_error():
    with pytest.raises(ValueError, match="cuda"):
        routing.decide("cuda")


# ---- overrides ------------------------------------------------------------------------------

def test_override_argument_is_applied_and_recorded():
    r = routing.decide("cpu", overrides={"win": "reference"})
    assert r.backend("win") == "reference" and r.backend("cmp") == "sdpa"
    assert "override" in r.reason("win") and "automatic choice was sdpa" in r.reason("win")
    assert r.to_json()["overrides"] == {"source": "argument", "backends": {"win": "reference"}, "thresholds": None}


def test_override_file_is_applied_and_recorded(tmp_path):
    p = _write(tmp_path, {"schema_version": 1, "backends": {"cmp": "reference"}}, "routing.json")
    r = routing.decide("cpu", overrides=p)
    assert r.backend("cmp") == "reference"
    assert r.to_json()["overrides"]["source"] == str(p)


@pytest.mark.parametrize("ov, msg", [
    ({"win": "triton"}, "not valid for branch 'win'"),
    ({"xyz": "sdpa"}, "unknown branch"),
    ({"backends": {"slc": "flash"}}, "not valid for branch 'slc'"),
    ({"backends": {}, "colour": 1}, "unknown keys"),
    (42, "must be a dict or a path"),
])
def test_bad_override_argument(ov, msg):
    with pytest.raises(ValueError, match=msg):
        routing.decide("cpu", overrides=ov)


@pytest.mark.parametrize("text, msg", [
    ("{not json", "not valid JSON"),
    (json.dumps({"backends": {"win": "sdpa"}}), "schema_version"),
    (json.dumps({"schema_version": 1, "backends": {"win": "sdpa"}, "extra": 1}), "unknown keys"),
    (json.dumps({"schema_version": 1, "thresholds": 5}), "'thresholds' must be a path"),
])
def test_bad_override_file_names_the_file(tmp_path, text, msg):
    p = _write(tmp_path, text, "ov.json")
    with pytest.raises(ValueError, match=msg) as ei:
        routing.decide("cpu", overrides=p)
    assert str(p) in str(ei.value)


def test_missing_override_file(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        routing.decide("cpu", overrides=tmp_path / "absent.json")


# ---- the thresholds file --------------------------------------------------------------------

def test_good_thresholds_file_loads(tmp_path):
    p = _write(tmp_path, _doc())
    doc = routing.load_thresholds(p)
    assert doc["entries"][0]["branches"]["win"]["varlen"]["min_len"] == 4096
    r = routing.decide("cpu", thresholds=p)  # on CPU the file is read (and validated) but does not apply
    assert r.to_json()["thresholds"]["source"] == str(p)
    assert r.backend("win") == "sdpa"


def _bad(**over):
    return _doc(_entry(**over))


@pytest.mark.parametrize("obj, msg", [
    ("[1, 2", "not valid JSON"),
    ([], "expected a JSON object"),
    ({"entries": []}, "schema_version None is not supported"),
    ({"schema_version": 2, "entries": []}, "schema_version 2 is not supported"),
    ({"schema_version": 1, "entries": {}}, "'entries' must be a list"),
    ({"schema_version": 1, "entries": [3]}, r"entries\[0\] must be an object"),
    (_bad(gpu=""), r"entries\[0\].gpu must be a non-empty string"),
    (_bad(torch=None), r"entries\[0\].torch must be a non-empty string"),
    (_bad(measured="yesterday"), "not an ISO date"),
    (_bad(branches={}), "branches must be a non-empty object"),
    (_bad(branches={"slc": {"triton": {"min_len": 5}}}), "unknown branch 'slc'"),
    (_bad(branches={"win": {"varlen": {}}}), "must be an object with 'min_len'"),
    (_bad(branches={"win": {"varlen": {"min_len": -4}}}), "positive int or null"),
    (_bad(branches={"win": {"varlen": {"min_len": "4k"}}}), "positive int or null"),
    (_bad(branches={"win": {"varlen": {"min_len": True}}}), "positive int or null"),
])
def test_bad_thresholds_file_is_a_clear_value_error(tmp_path, obj, msg):
    p = _write(tmp_path, obj)
    with pytest.raises(ValueError, match=msg) as ei:
        routing.load_thresholds(p)
    assert str(p) in str(ei.value)
    with pytest.raises(ValueError, match=msg):  # decide never silently ignores a bad file
        routing.decide("cpu", thresholds=p)


def test_missing_explicit_thresholds_file(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        routing.decide("cpu", thresholds=tmp_path / "nope.json")


def test_overrides_file_can_name_the_thresholds_file(tmp_path):
    _write(tmp_path, "{", "thr.json")  # malformed, named by the overrides file
    ov = _write(tmp_path, {"schema_version": 1, "thresholds": "thr.json"}, "ov.json")
    with pytest.raises(ValueError, match="thr.json"):
        routing.decide("cpu", overrides=ov)


def test_merge_replaces_the_same_machine_and_keeps_others():
    a = _entry()
    b = _entry(gpu="NVIDIA A100-SXM4-80GB", capability="8.0")
    doc = routing.merge_thresholds(routing.merge_thresholds(None, a), b)
    a2 = _entry(source_run="newrun")
    doc = routing.merge_thresholds(doc, a2)
    assert len(doc["entries"]) == 2
    assert [e["source_run"] for e in doc["entries"] if e["gpu"] == GPU] == ["newrun"]
    with pytest.raises(ValueError):
        routing.merge_thresholds(doc, _entry(measured="not a date"))


# ---- the CUDA decision, from facts ----------------------------------------------------------

def _decide_from(facts, doc, tmp_path):
    p = _write(tmp_path, doc)
    thr = routing._thresholds_for(facts, p, explicit=True)
    return {b: routing._decide_flash(b, facts, thr) for b in ("cmp", "win")}, thr


def test_measured_flash_path_is_chosen_from_its_threshold(tmp_path):
    ch, thr = _decide_from(_cuda_facts(), _doc(), tmp_path)
    assert thr["entry"]["source_run"] == "abc1234"
    win = ch["win"]
    assert (win.backend, win.path, win.min_len) == ("flash", "varlen", 4096)
    assert "S=4096" in win.reason and "abc1234" in win.reason
    # tie on min_len -> the larger speedup at the longest S
    assert (ch["cmp"].backend, ch["cmp"].path) == ("flash", "sdpa-cudnn")
    r = routing.Routing(ch | {"slc": routing._decide_slc(_cuda_facts())}, _cuda_facts(), thr)
    assert r.backend("win", S=1024) == "sdpa"  # below the measured threshold
    assert r.backend("win", S=4096) == "flash"
    assert r.backend("win") == "flash"
    assert r.backend("slc") == "triton"
    assert r.to_json()["branches"]["win"]["flash_min_len"] == 4096


def test_never_faster_stays_on_sdpa(tmp_path):
    e = _entry(branches={"win": {"varlen": {"min_len": None, "max_measured": 65536}}})
    ch, _ = _decide_from(_cuda_facts(), _doc(e), tmp_path)
    assert ch["win"].backend == "sdpa" and "never" in ch["win"].reason and "65536" in ch["win"].reason
    assert ch["cmp"].backend == "sdpa" and "no cmp measurement" in ch["cmp"].reason


def test_unmeasured_gpu_or_torch_stays_on_sdpa(tmp_path):
    ch, thr = _decide_from(_cuda_facts(torch_version="2.12.0+cu130"), _doc(), tmp_path)
    assert ch["win"].backend == "sdpa" and "not measured" in ch["win"].reason
    assert "2.11.0+cu130" in thr["note"] and "re-run fa2-probe" in thr["note"]
    e = _entry(gpu="Some Other GPU")
    ch, thr = _decide_from(_cuda_facts(), _doc(e), tmp_path)
    assert ch["cmp"].backend == "sdpa" and "no entry" in thr["note"]


def test_measured_path_that_is_not_installed_here_is_not_used(tmp_path):
    ch, _ = _decide_from(_cuda_facts(paths=("sdpa-efficient",)), _doc(), tmp_path)
    assert ch["win"].backend == "sdpa" and "never" in ch["win"].reason  # only sdpa-efficient is usable
    ch, _ = _decide_from(_cuda_facts(paths=()), _doc(), tmp_path)
    assert ch["win"].backend == "sdpa" and "no flash path" in ch["win"].reason
    assert "flash_attn not installed" in ch["win"].reason


def test_selection_branch_needs_triton_and_the_kernel():
    f = _cuda_facts()
    f["triton"] = {"present": False, "reason": "triton is not installed"}
    c = routing._decide_slc(f)
    assert c.backend == "sdpa" and "pip install triton" in c.reason
    f = _cuda_facts()
    f["triton_sel"] = {"present": False, "reason": "nsa_core.selection.attention is not installed"}
    c = routing._decide_slc(f)
    assert c.backend == "sdpa" and "selection.attention" in c.reason


def _h100_cmp(speedups=True):
    """cmp as fa2-probe measured it on the H100 (2026-11-25, min of fwd / fwd+bwd speedup over
    sdpa): sdpa-flash pays off first (8K) but FA-4 is far faster at long S; FA-2 never leads."""
    per = {"sdpa-flash": (8192, {"8192": 1.3, "16384": 1.9, "32768": 3.1, "65536": 5.2}),
           "fa4": (16384, {"8192": 1.1, "16384": 1.6, "32768": 5.0, "65536": 8.3}),
           "fa2": (16384, {"8192": 1.0, "16384": 2.0, "32768": 3.4, "65536": 6.4})}
    out = {}
    for p, (m, sp) in per.items():
        out[p] = {"min_len": m, "max_measured": 65536, "speedup_at_max": sp["65536"]}
        if speedups:
            out[p]["speedups"] = sp
    return out


def test_the_path_measured_fastest_at_each_length_is_routed(tmp_path):
    """Issue 13: routing picks the flash path measured fastest where it is fastest. On the H100
    the old rule (the path that pays off earliest) kept cmp on sdpa-flash at 64K, 1.6x slower
    than FA-4 there."""
    e = _entry(branches={"cmp": _h100_cmp()})
    facts = _cuda_facts(paths=("fa4", "fa2", "sdpa-flash"))
    facts["flash_paths"]["fa2"] = {"present": True, "reason": "available", "branches": ("cmp", "win")}
    ch, thr = _decide_from(facts, _doc(e), tmp_path)
    c = ch["cmp"]
    # from the top: FA-4 is fastest at 64K and pays off down to 16K; below, only sdpa-flash (8K)
    assert c.ladder == ((8192, "sdpa-flash"), (16384, "fa4"))
    assert (c.backend, c.path, c.min_len) == ("flash", "sdpa-flash", 8192)
    assert "sdpa-flash >= 1.2x faster than sdpa from S=8192, fa4 from S=16384" in c.reason
    r = routing.Routing(ch | {"slc": routing._decide_slc(facts)}, facts, thr)
    assert r.backend("cmp", S=4096) == "sdpa"
    assert [r.path("cmp", S) for S in (8192, 16383, 16384, 65536, 131072)] == \
        ["sdpa-flash", "sdpa-flash", "fa4", "fa4", "fa4"]
    assert r.path("cmp") == "sdpa-flash"  # no length: the first step, as before
    assert r.to_json()["branches"]["cmp"]["flash_ladder"] == [[8192, "sdpa-flash"], [16384, "fa4"]]
    # only installed paths take part: without FA-4, FA-2 (faster than sdpa-flash at 64K) takes 16K on
    facts["flash_paths"]["fa4"]["present"] = False
    ch, _ = _decide_from(facts, _doc(e), tmp_path)
    assert ch["cmp"].ladder == ((8192, "sdpa-flash"), (16384, "fa2"))


def test_noisy_short_lengths_do_not_make_the_ladder_flip_flop(tmp_path):
    """win as measured on the H100: FA-2 and FA-4 trade places at short S (sub-ms timings); FA-4
    is fastest at 64K and pays off from 1K: one step, FA-4 everywhere."""
    sp4 = {"1024": 3.2, "2048": 8.7, "4096": 9.7, "8192": 18.0, "16384": 16.2, "32768": 17.2, "65536": 19.8}
    sp2 = {"1024": 3.9, "2048": 2.9, "4096": 14.9, "8192": 6.7, "16384": 11.1, "32768": 10.6, "65536": 13.4}
    e = _entry(branches={"win": {"fa2": {"min_len": 1024, "max_measured": 65536, "speedups": sp2},
                                 "fa4": {"min_len": 1024, "max_measured": 65536, "speedups": sp4}}})
    facts = _cuda_facts(paths=("fa4", "fa2"))
    facts["flash_paths"]["fa2"] = {"present": True, "reason": "available", "branches": ("cmp", "win")}
    ch, _ = _decide_from(facts, _doc(e), tmp_path)
    assert ch["win"].ladder == ((1024, "fa4"),)


def test_without_per_length_speedups_the_ladder_uses_the_speedup_at_the_longest_length(tmp_path):
    e = _entry(branches={"cmp": _h100_cmp(speedups=False)})
    facts = _cuda_facts(paths=("fa4", "sdpa-flash"))
    ch, _ = _decide_from(facts, _doc(e), tmp_path)
    assert ch["cmp"].ladder == ((8192, "sdpa-flash"), (16384, "fa4"))
    # one path, or the earliest also the fastest: one step (the old behaviour)
    ch, _ = _decide_from(_cuda_facts(), _doc(), tmp_path)
    assert ch["win"].ladder == ((4096, "varlen"),) and ch["cmp"].ladder == ((16384, "sdpa-cudnn"),)


@pytest.mark.parametrize("sp", [{"abc": 1.0}, {"0": 1.0}, {"1024": "fast"}, {"1024": True}, [1.0],
                                {"1024": float("nan")}])
def test_bad_per_length_speedups_are_a_clear_error(tmp_path, sp):
    e = _entry()
    e["branches"]["cmp"]["varlen"]["speedups"] = sp
    p = _write(tmp_path, json.dumps(_doc(e)).replace("NaN", '"nan"') if sp == {"1024": float("nan")}
               else _doc(e))
    with pytest.raises(ValueError, match="speedups must be an object"):
        routing.load_thresholds(p)


def test_fa2_probe_thresholds_carry_per_length_speedups():
    from nsa_runner.measure.flash_bench import thresholds

    rows = [{"kind": "flash", "branch": "cmp", "path": "fa4", "S": S, "speedup_fwd": f, "speedup_fwdbwd": b}
            for S, f, b in ((1024, 0.5, 0.9), (8192, 1.5, 1.3), (65536, 9.0, 8.3))]
    t = thresholds(rows)["cmp"]["fa4"]
    assert t["min_len"] == 8192 and t["speedups"] == {"1024": 0.5, "8192": 1.3, "65536": 8.3}


def test_flash_branches_ask_routing_for_the_path_at_their_sequence_length(monkeypatch):
    """The compressed branch asks with the RAW key length S (the thresholds' S, not the
    compressed length), the window branch with its key length; pick() hands it to the ladder."""
    import torch

    from nsa_core.compression import fast as cmp_fast
    from nsa_core.config import NSAConfig
    from nsa_core.flash import pick as pick_mod
    from nsa_core.window import fast as win_fast

    real_routed = pick_mod._routed
    seen = []
    monkeypatch.setattr(pick_mod, "_routed", lambda branch, device, S=None: seen.append((branch, S)))
    cfg = NSAConfig(l=16, d=8, l_sel=16, n_sel=4, w=32)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 100, 2, 16, generator=g, dtype=torch.float16)
    kc = torch.randn(1, cfg.num_cmp(100), 1, 16, generator=g, dtype=torch.float16)
    k = torch.randn(1, 100, 1, 16, generator=g, dtype=torch.float16)
    for call in (lambda: cmp_fast.compressed_attention(q, kc, kc, 100, cfg),
                 lambda: win_fast.sliding_attention(q, k, k, 32)):
        try:
            call()
        except pick_mod.FlashUnavailable:  # no flash path on CPU: what was asked is the point
            pass
    assert seen == [("cmp", 100), ("win", 100)]
    # and the ladder answers by length
    facts = _cuda_facts(paths=("fa4", "sdpa-flash"))
    ch = {"cmp": routing.Choice("flash", "x", path="sdpa-flash", min_len=8192,
                                ladder=((8192, "sdpa-flash"), (32768, "fa4"))),
          "win": routing.Choice("sdpa", "x"), "slc": routing.Choice("sdpa", "x")}
    monkeypatch.setattr(routing, "cached_decide", lambda device: routing.Routing(ch, facts))
    cuda = torch.device("cuda")
    assert [real_routed("cmp", cuda, S) for S in (8192, 65536, None)] == ["sdpa-flash", "fa4", "sdpa-flash"]
    assert real_routed("cmp", torch.device("cpu"), 65536) is None
