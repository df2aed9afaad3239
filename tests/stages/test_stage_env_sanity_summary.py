"""The env-pairing, sanity and summary stages: a real CPU run through the CLI, plus the checks fed
with facts that must fail (a check that cannot fail is a defect)."""

from __future__ import annotations

import json
import types
import xml.etree.ElementTree as ET

import pytest

from nsa_runner.artifacts import load_manifest, write_json
from nsa_runner.context import RunContext


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """One `oneshot --only env-pairing,sanity,summary` on CPU (the three stages of this issue)."""
    from typer.testing import CliRunner

    from nsa_runner.cli import app
    from nsa_runner.commands import _common

    mp = pytest.MonkeyPatch()
    mp.setattr(_common, "current_run_id", lambda: "cpurun")
    out = tmp_path_factory.mktemp("out")
    try:
        r = CliRunner().invoke(app, ["oneshot", "--out", str(out), "--only", "env-pairing,sanity,summary",
                                     "--device", "cpu", "--json"], catch_exceptions=False)
    finally:
        mp.undo()
    return r, out / "cpurun"


def test_cpu_oneshot_passes_the_three_stages(cpu_run):
    r, run = cpu_run
    assert r.exit_code == 0, r.stdout + r.stderr
    m = load_manifest(run)
    assert [(s["name"], s["status"]) for s in m["stages"]] == [("env-pairing", "PASS"), ("sanity", "PASS"),
                                                               ("summary", "PASS")]
    for f in ("manifest.json", "env.txt", "env.json", "routing.json", "sanity.out", "sanity.json", "summary.md",
              "summary.json", "junit.xml", "logs/env-pairing.log", "logs/sanity.log", "logs/summary.log"):
        assert (run / f).is_file(), f


def test_env_pairing_records_facts(cpu_run):
    _, run = cpu_run
    env = json.loads((run / "env.json").read_text())
    assert env["schema_version"] == 1 and env["verdict"] == "PASS"
    import torch

    assert env["facts"]["torch"]["version"] == torch.__version__
    checks = {c["check"]: c for c in env["checks"]}
    if env["facts"]["triton"]["installed"]:
        assert checks["triton-launch"]["status"] == "ok" and "interpreter" in checks["triton-launch"]["detail"]
    assert {p["module"] for p in env["flash"]} == {"flash_attn", "flash_attn_interface", "flash_attn.cute"}
    assert any(p["name"] == "sanity" and p["dist"] == "nsa-run" for p in env["plugins"])
    text = (run / "env.txt").read_text()
    assert "verdict: PASS" in text and "torch" in text and "stage plugins" in text
    # where the stage's time goes (issue 13): seconds per part, none negative, within the stage's own time
    wall = env["wall_s"]
    assert {"torch", "triton", "gpu", "flash child (waited for after the facts)",
            "plugins, thresholds, checks"} <= set(wall)
    assert all(isinstance(v, float) and v >= 0 for v in wall.values())
    manifest = json.loads((run / "manifest.json").read_text())
    dur = next(s["duration_s"] for s in manifest["stages"] if s["name"] == "env-pairing")
    assert sum(wall.values()) <= dur + 0.001  # (both rounded to the millisecond)


def test_sanity_outputs(cpu_run):
    _, run = cpu_run
    routing = json.loads((run / "routing.json").read_text())
    assert set(routing["branches"]) == {"cmp", "slc", "win"}
    assert all(b["reason"] for b in routing["branches"].values())
    s = json.loads((run / "sanity.json").read_text())
    assert s["schema_version"] == 1 and s["device"] == "cpu"
    names = [c["check"] for c in s["checks"]]
    for must in ("cmp/sdpa causal", "slc/sdpa forward vs fp64 reference", "win/sdpa dq vs fp64 reference",
                 "select structure", "select GQA: groups independent", "module backward", "module causal"):
        assert must in names, must
    assert all(c["ok"] for c in s["checks"])


def test_summary_outputs(cpu_run):
    _, run = cpu_run
    root = ET.parse(run / "junit.xml").getroot()
    cases = root.findall(".//testcase")
    # the runner rewrote the reports at the end: every stage, the summary stage included
    assert [c.get("name") for c in cases] == ["env-pairing", "sanity", "summary"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["schema_version"] == 1 and summary["counts"] == {"passed": 3, "failed": 0, "skipped": 0}
    assert "**3 passed, 0 failed, 0 skipped**" in (run / "summary.md").read_text()


# ---- checks that must fail ----------------------------------------------------------------

def test_summary_maps_every_status_in_junit(tmp_path):
    from stages.summary import Summary

    def st(name, status, **kw):
        return {"name": name, "order": 1, "status": status, "duration_s": 0.5, "reason": f"{name} why",
                "files": [], "log": f"logs/{name}.log", **kw}

    write_json(tmp_path / "manifest.json", {
        "schema_version": 1, "run_id": "r", "started": "2026-11-22T00:00:00+00:00", "argv": ["nsa-run"],
        "host": {"hostname": "h"}, "stages": [
            st("p", "PASS"), st("f", "FAIL", log_tail="tail f"), st("e", "ERROR", traceback="Traceback e"),
            st("t", "TIMEOUT", log_tail="tail t"), st("s", "SKIP", hint="pip install x")]})
    res = Summary().run(RunContext(tmp_path, "cpu", "quick", {}, "r", "summary"))
    assert res.status.value == "PASS" and res.metrics == {"passed": 1, "failed": 3, "skipped": 1}
    root = ET.parse(tmp_path / "junit.xml").getroot()
    assert root.get("skipped") is None  # not in the JUnit schema for <testsuites>
    assert tuple(root.get(k) for k in ("tests", "failures", "errors")) == ("5", "1", "2")
    suites = {s.get("name"): s for s in root.findall("testsuite")}  # one suite per stage
    assert list(suites) == ["p", "f", "e", "t", "s"]
    case = {c.get("name"): c for c in root.iter("testcase")}
    assert all(case["p"].find(x) is None for x in ("failure", "error", "skipped"))
    assert case["f"].find("failure").get("message") == "f why"
    assert case["e"].find("error").text == "Traceback e"
    assert case["t"].find("error").get("type") == "TIMEOUT"
    assert case["s"].find("skipped").get("message") == "s why (fix: pip install x)"
    md = (tmp_path / "summary.md").read_text()
    assert "**1 passed, 3 failed, 1 skipped**" in md and "Traceback e" in md


def test_summary_without_earlier_stages_skips(tmp_path):
    from stages.summary import Summary

    write_json(tmp_path / "manifest.json", {"schema_version": 1, "run_id": "r", "stages": []})
    res = Summary().run(RunContext(tmp_path, "cpu", "quick", {}, "r", "summary"))
    assert res.status.value == "SKIP" and "nothing to summarise" in res.reason


def test_env_checks_fail_on_bad_pairings():
    from stages import env_pairing as ep

    base = {"torch": {"version": "2.11.0+cu130"}, "triton": {"installed": True, "version": "3.9.0",
                                                              "import_error": "skip the launch"}}
    pin = {"declared": 'triton==3.6.0; platform_system == "Linux"', "specifier": "==3.6.0"}
    rows = ep._triton_checks({**base, "torch_triton_requirement": pin}, "cuda")
    assert rows[0]["status"] == "FAIL" and "declares triton==3.6.0" in rows[0]["detail"] \
        and "triton 3.9.0 is installed" in rows[0]["detail"]
    ok = ep._triton_checks({**base, "triton": {**base["triton"], "version": "3.6.0"},
                            "torch_triton_requirement": pin}, "cuda")
    assert ok[0]["status"] == "ok"
    missing = ep._triton_checks({**base, "triton": {"installed": False, "version": None},
                                 "torch_triton_requirement": pin}, "cuda")
    assert missing[0]["status"] == "FAIL" and "not installed" in missing[0]["detail"]
    cpu = ep._triton_checks({**base, "torch_triton_requirement": {"declared": None, "note": "none (CPU build)"}},
                            "cpu")
    assert cpu[0]["status"] == "info"

    gpu = {"cuda_available": True, "driver_cuda_version": "12.2", "devices": []}
    rows = ep._cuda_checks({"torch": {"cuda_runtime": "13.0"}, "gpu": gpu, "nvidia_smi": {}})
    assert rows[0]["status"] == "FAIL" and "driver supports CUDA 12.2" in rows[0]["detail"]
    rows = ep._cuda_checks({"torch": {"cuda_runtime": "13.0"}, "nvidia_smi": {"present": True, "query_rc": 0},
                            "gpu": {"cuda_available": False, "cuda_error": "RuntimeError: driver too old"}})
    assert rows[0]["status"] == "FAIL" and "driver too old" in rows[0]["detail"]

    probes = [{"module": "flash_attn", "what": "FA-2", "hint": "h", "ok": False, "not_installed": False,
               "error": "ImportError: /x/flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi"},
              {"module": "flash_attn.cute", "what": "FA-4", "hint": "pip install flash-attn-4", "ok": False,
               "not_installed": True, "error": "No module named 'flash_attn'"}]
    rows = ep._flash_checks(probes, "2.11.0")
    assert rows[0]["status"] == "FAIL"
    assert rows[0]["detail"].startswith("flash_attn: undefined symbol — built for another torch")
    assert rows[1]["status"] == "info" and "pip install flash-attn-4" in rows[1]["detail"]


def test_env_pairing_fails_on_a_flash_attn_built_for_another_torch(plugins, cli, tmp_path, monkeypatch):
    """A real import in the probe child: a flash_attn whose extension has an undefined symbol."""
    pkg = plugins.site / "flash_attn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        'raise ImportError("/site/flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so: '
        'undefined symbol: _ZN3c104cuda9SetDeviceEi")\n')
    monkeypatch.setenv("PYTHONPATH", str(plugins.site))
    r = cli("stage", "env-pairing", "--out", tmp_path, "--device", "cpu")
    assert r.exit_code == 1
    m = load_manifest(tmp_path / "testrun")
    (e,) = m["stages"]
    assert e["status"] == "FAIL"
    assert "flash_attn: undefined symbol — built for another torch" in e["reason"]
    env = json.loads((tmp_path / "testrun" / "env.json").read_text())
    fa4 = next(p for p in env["flash"] if p["module"] == "flash_attn.cute")
    assert fa4["ok"] is False  # importing flash_attn.cute runs the broken flash_attn/__init__ too


def test_sanity_catches_a_leaky_branch():
    """A sliding branch that peeks at the future must fail the forward and causality checks."""
    import torch

    from nsa_core import NSAConfig, testing
    from nsa_core import functional as F
    from stages import sanity

    def leaky_sliding(q, k, v, cfg, backend="reference", **kw):
        o = F.sliding_attention(q, k, v, cfg, backend, **kw)
        leak = v.mean(dim=1, keepdim=True).repeat_interleave(q.shape[2] // v.shape[2], dim=2)
        return o + 0.1 * leak.to(o.dtype)

    leakyF = types.SimpleNamespace(**{n: getattr(F, n) for n in dir(F) if not n.startswith("__")})
    leakyF.sliding_attention = lambda q, k, v, cfg, backend="reference", **kw: (
        leaky_sliding(q, k, v, cfg, backend, **kw) if backend != "reference" else F.sliding_attention(
            q, k, v, cfg, backend, **kw))
    shape = sanity.SHAPES["quick"]
    cfg = NSAConfig(**shape.cfg)
    gen = torch.Generator().manual_seed(0)
    c = sanity._Checks()
    sel_q = torch.randn(shape.B, shape.T, shape.HQ, shape.dk, generator=gen)
    sel_k = torch.randn(shape.B, shape.T, shape.G, shape.dk, generator=gen)
    sanity._check_branch(c, leakyF, testing, "win", "sdpa", shape, cfg, gen, "cpu", sel_q, sel_k)
    rows = {r["check"]: r for r in c.rows}
    assert rows["win/sdpa causal"]["ok"] is False
    assert rows["win/sdpa forward vs fp64 reference"]["ok"] is False
    assert rows["win/sdpa shape"]["ok"] and rows["win/sdpa finite"]["ok"]


def test_sanity_gqa_checks_pass_and_catch_a_head_order_dependent_selection(monkeypatch):
    """The head-order check is exact (float64) on the real code and fails when the selection
    depends on which head comes first in a group (scores from head 0 instead of the Eq. 10 sum)."""
    import torch

    from nsa_core import functional as F
    from stages import sanity

    def run_checks():
        c = sanity._Checks()
        s = sanity.SHAPES["quick"]
        cfg = __import__("nsa_core").NSAConfig(**s.cfg)
        sanity._check_selection(c, F, s, cfg, torch.Generator().manual_seed(3), "cpu")
        return {r["check"]: r["ok"] for r in c.rows}

    ok = run_checks()
    assert ok["select GQA: head order within a group"] and ok["select GQA: groups independent"]

    real = F.block_scores

    def first_head_only(q, kc, S, cfg, scale=None):
        h = q.shape[2] // kc.shape[2]
        q0 = q.reshape(*q.shape[:2], kc.shape[2], h, q.shape[-1])[:, :, :, :1].expand(-1, -1, -1, h, -1)
        return real(q0.reshape(q.shape).contiguous(), kc, S, cfg, scale)

    monkeypatch.setattr(F, "block_scores", first_head_only)
    assert not run_checks()["select GQA: head order within a group"]


def _fake_flash_dist(site, version: str, init: str, so_bytes: bytes) -> None:
    """A FAKE flash_attn install as pip leaves it: the package, a compiled-extension file (not a
    real ELF: its bytes only carry the library names, read by envinfo.needed_libs' fallback when
    readelf refuses the file) and a dist-info whose RECORD lists it."""
    pkg = site / "flash_attn"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(init)
    so = "flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so"
    (site / so).write_bytes(so_bytes)
    info = site / f"flash_attn-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: flash_attn\nVersion: {version}\n")
    (info / "RECORD").write_text(f"flash_attn/__init__.py,,\n{so},,\n{info.name}/METADATA,,\n")


def test_env_pairing_reports_the_flash_build_and_fails_on_an_abi_mismatch(plugins, cli, tmp_path, monkeypatch):
    """A FAKE broken flash_attn 2.8.3 built for torch 2.7 + CUDA 12: the real child import fails
    with an undefined symbol; env-pairing names the version, what it was built for (wheel tag,
    linked libraries read from disk) and the mismatch with the installed torch."""
    _fake_flash_dist(plugins.site, "2.8.3+cu12torch2.7cxx11abiTRUE",
                     'raise ImportError("/site/flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so: '
                     'undefined symbol: _ZN3c104cuda9SetDeviceEi")\n',
                     b"not an ELF file\x00libcudart.so.12\x00libc10.so\x00libtorch_cuda.so\x00")
    monkeypatch.setenv("PYTHONPATH", str(plugins.site))
    import torch

    r = cli("stage", "env-pairing", "--out", tmp_path, "--device", "cpu")
    assert r.exit_code == 1
    (e,) = load_manifest(tmp_path / "testrun")["stages"]
    assert e["status"] == "FAIL"
    assert "flash_attn: undefined symbol — built for another torch" in e["reason"]
    assert "flash_attn 2.8.3+cu12torch2.7cxx11abiTRUE" in e["reason"]
    assert "built for: torch 2.7, CUDA 12 (wheel tag +cu12torch2.7cxx11abiTRUE)" in e["reason"]
    assert "libcudart.so.12" in e["reason"] and "libc10.so" in e["reason"]
    assert f"ABI mismatch: wheel tag +cu12torch2.7cxx11abiTRUE = built for torch 2.7, installed torch " \
           f"{torch.__version__}" in e["reason"]
    env = json.loads((tmp_path / "testrun" / "env.json").read_text())
    fa2 = next(p for p in env["flash"] if p["module"] == "flash_attn")
    assert fa2["build"]["cuda_needed"] == [12] and fa2["build"]["links_torch"] is True
    txt = (tmp_path / "testrun" / "env.txt").read_text()
    assert "BROKEN (2.8.3+cu12torch2.7cxx11abiTRUE)" in txt and "GPU-verified (2.8.3 (source build" in txt


def test_flash_checks_fail_on_a_mismatch_that_imported_and_pass_a_matching_build():
    from stages import env_pairing as ep

    def probe(build, ok=True, module="flash_attn", what="FA-2", path="fa2"):
        return {"module": module, "what": what, "hint": "pip install flash-attn", "ok": ok, "not_installed": False,
                "error": "", "version": "2.8.3", "path": path, "build": build}

    tag = {"text": "+cu12torch2.11cxx11abiTRUE", "cuda": "12", "torch": "2.11", "cxx11abi": "TRUE"}
    bad = ep._flash_checks([probe({"version": "2.8.3", "wheel_tag": tag, "cuda_needed": [12],
                                   "built_for": "torch 2.11, CUDA 12"})], "2.11.0+cu130", "13.0")
    assert bad[0]["status"] == "FAIL" and "imports but does not fit torch 2.11.0+cu130" in bad[0]["detail"]
    assert "built for CUDA 12, torch runs CUDA 13.0" in bad[0]["detail"]
    assert "links libcudart.so.12" in bad[0]["detail"]
    good = ep._flash_checks([probe({"version": "2.8.3", "wheel_tag": {**tag, "cuda": "13"}, "cuda_needed": [13],
                                    "built_for": "torch 2.11, CUDA 13"})], "2.11.0+cu130", "13.0")
    assert good[0]["status"] == "ok" and "2.8.3 imports; built for: torch 2.11, CUDA 13" in good[0]["detail"]
    assert "GPU-verified (2.8.3 (source build" in good[0]["detail"]
    # FA-4: pure Python; the CuTe DSL library flavour is advice, not a failure; the version is the
    # distribution's (flash_attn.cute.__version__ says 0.0.0)
    fa4 = {"version": "4.0.0b36", "cutlass_dsl_libs": {"cu12": "4.8.1"}, "built_for": "pure Python"}
    row = ep._flash_checks([probe(fa4, module="flash_attn.cute", what="FA-4", path="fa4") | {"version": "0.0.0"}],
                           "2.11.0+cu130", "13.0")[0]
    assert row["status"] == "info" and "4.0.0b36 imports" in row["detail"]
    assert "nvidia-cutlass-dsl[cu13]" in row["detail"]
    fa4["cutlass_dsl_libs"] = {"cu13": "4.8.1"}
    row = ep._flash_checks([probe(fa4, module="flash_attn.cute", what="FA-4", path="fa4")], "2.11.0+cu130", "13.0")[0]
    assert row["status"] == "ok"
