"""Shipped routing thresholds (nsa_core/data/shipped_thresholds.json): a GPU with no local
measurement already takes the measured fast paths for cmp / win; a local entry wins; CPU never
uses them. Decided from faked facts (no GPU needed)."""

from __future__ import annotations

import json

import pytest

from nsa_core import routing

H100 = "NVIDIA H100 80GB HBM3"


def _facts(gpu=H100, cap="9.0", torch_version="2.11.0+cu130",
           paths=("varlen", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient")):
    branches = {"sdpa-flash": ("cmp",)}
    fp = {p: {"present": True, "reason": "available", "branches": branches.get(p, ("cmp", "win"))} for p in paths}
    return {"device": "cuda", "torch": torch_version, "cuda_runtime": "13.0", "gpu": gpu, "capability": cap,
            "triton": {"present": True, "reason": "triton imports", "version": "3.6.0"},
            "triton_sel": {"present": True, "reason": "imports"}, "flash_paths": fp}


@pytest.fixture
def fake_cuda(monkeypatch, tmp_path):
    """decide('cuda') from faked facts, with the default local thresholds file absent."""
    state = {"facts": _facts()}
    monkeypatch.setattr(routing, "machine_facts", lambda device="cpu": json.loads(json.dumps(state["facts"])))
    monkeypatch.setattr(routing, "DEFAULT_THRESHOLDS", tmp_path / "no-such-dir" / "thresholds.json")
    return state


def test_shipped_file_is_valid_and_in_the_package():
    doc = routing.load_shipped()
    assert routing.SHIPPED_THRESHOLDS.is_file()
    (e,) = doc["entries"]
    assert e["gpu"] == H100 and e["shipped"] is True
    # the figures of docs/benchmarks.md "GPU session of 2026-11-25, afternoon" (fa2-probe with FA-2 and
    # FA-4 installed): cmp from 8192 (sdpa-flash) / 16384 (the others), win from 1024 (flash kernels)
    assert e["branches"]["cmp"]["sdpa-flash"]["min_len"] == 8192
    assert e["branches"]["cmp"]["sdpa-cudnn"]["min_len"] == e["branches"]["cmp"]["fa4"]["min_len"] == 16384
    assert e["branches"]["win"]["varlen"]["min_len"] == e["branches"]["win"]["fa4"]["min_len"] == 1024
    assert e["branches"]["cmp"]["fa4"]["speedups"]["65536"] == 8.326


def test_fresh_h100_takes_the_measured_fast_paths(fake_cuda):
    r = routing.decide("cuda")
    cmp, win = r.choices["cmp"], r.choices["win"]
    # torch-bundled paths only (no flash-attn package): cmp sdpa-flash from 8K, cuDNN (faster at
    # 64K) from 16K; win varlen from 1K
    assert cmp.ladder == ((8192, "sdpa-flash"), (16384, "sdpa-cudnn"))
    assert (win.backend, win.path, win.min_len) == ("flash", "varlen", 1024)
    assert r.backend("cmp", S=4096) == "sdpa" and r.backend("cmp", S=65536) == "flash"
    assert r.path("cmp", S=8192) == "sdpa-flash" and r.path("cmp", S=65536) == "sdpa-cudnn"
    assert r.backend("win", S=512) == "sdpa" and r.backend("win", S=1024) == "flash"
    assert r.backend("slc") == "triton"
    for b in ("cmp", "win"):
        assert "shipped defaults (measured on NVIDIA H100" in r.reason(b)
        assert "this GPU and torch" in r.reason(b) and "fa2-probe" in r.reason(b)
    j = r.to_json()
    assert j["thresholds"]["source"] == str(routing.SHIPPED_THRESHOLDS)
    assert j["thresholds"]["entry"]["shipped"] is True and "no thresholds file" in j["thresholds"]["note"]
    json.dumps(j)


def test_fresh_h100_with_fa4_takes_it_where_it_is_fastest(fake_cuda):
    fake_cuda["facts"] = _facts(paths=("fa4", "varlen", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient"))
    r = routing.decide("cuda")
    assert r.choices["cmp"].ladder == ((8192, "sdpa-flash"), (16384, "fa4"))
    assert r.choices["win"].ladder == ((1024, "fa4"),)


def test_other_torch_and_other_gpu_get_the_defaults_with_an_honest_reason(fake_cuda):
    fake_cuda["facts"] = _facts(torch_version="2.12.0+cu130")
    r = routing.decide("cuda")
    assert r.backend("cmp", S=65536) == "flash" and "applied to torch 2.12.0+cu130" in r.reason("cmp")
    fake_cuda["facts"] = _facts(gpu="NVIDIA H200", cap="9.0")
    r = routing.decide("cuda")
    assert r.backend("win", S=65536) == "flash" and "applied to NVIDIA H200" in r.reason("win")
    fake_cuda["facts"] = _facts(gpu="Tesla V100", cap="7.0")  # below the entry's applies_from_capability
    r = routing.decide("cuda")
    assert r.backend("cmp", S=65536) == "sdpa" and r.backend("win", S=65536) == "sdpa"
    assert "no shipped thresholds apply" in r.to_json()["thresholds"]["note"]


def test_only_installed_paths_are_used(fake_cuda):
    fake_cuda["facts"] = _facts(paths=("sdpa-efficient",))
    r = routing.decide("cuda")
    assert (r.choices["cmp"].path, r.choices["win"].path) == ("sdpa-efficient", "sdpa-efficient")
    fake_cuda["facts"] = _facts(paths=())
    assert routing.decide("cuda").backend("cmp", S=65536) == "sdpa"


def test_a_local_entry_replaces_the_shipped_one(fake_cuda, tmp_path):
    local = {"schema_version": 1, "entries": [{
        "gpu": H100, "capability": "9.0", "torch": "2.11.0+cu130", "measured": "2026-11-23", "source_run": "local1",
        "branches": {"cmp": {"varlen": {"min_len": 4096, "max_measured": 65536, "speedup_at_max": 9.0}},
                     "win": {"varlen": {"min_len": None, "max_measured": 65536}}}}]}
    p = tmp_path / "thr.json"
    p.write_text(json.dumps(local))
    r = routing.decide("cuda", thresholds=p)
    assert (r.choices["cmp"].path, r.choices["cmp"].min_len) == ("varlen", 4096)
    assert r.backend("win", S=65536) == "sdpa" and "never" in r.reason("win")
    assert "shipped" not in r.reason("cmp") and "local1" in r.reason("cmp")
    # a local file without an entry for this machine: the shipped defaults still apply
    local["entries"][0]["gpu"] = "Another GPU"
    p.write_text(json.dumps(local))
    r = routing.decide("cuda", thresholds=p)
    assert r.choices["cmp"].min_len == 8192 and "shipped defaults" in r.reason("cmp")  # sdpa-flash


def test_overrides_still_win(fake_cuda):
    r = routing.decide("cuda", overrides={"cmp": "sdpa"})
    assert r.backend("cmp", S=65536) == "sdpa" and "override" in r.reason("cmp")
    assert "shipped defaults" in r.reason("cmp")  # the automatic choice it replaced is recorded


def test_cpu_never_uses_shipped_thresholds():
    r = routing.decide("cpu")
    assert all(r.backend(b) == "sdpa" for b in ("cmp", "slc", "win"))
    assert "shipped" not in json.dumps(r.to_json()["thresholds"])
    entry, why = routing.shipped_entry({"device": "cpu", "gpu": None})
    assert entry is None and "no GPU" in why
