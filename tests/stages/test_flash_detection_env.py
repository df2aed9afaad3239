"""env-pairing on FAKE flash-attn installs laid out as the real wheels leave them
(tests/_fake_flash.install_dists; the probe child imports them for real): the verdict, env.txt's
rows and its "what can run here" list say FA-2 / FA-4 present only for the real package.

Seen on the H100: with only flash-attn-4 installed, env-pairing said "flash: FA-2 ok" and
"flash-attn (FA-2) varlen  yes" (FA-4's wheel leaves an empty `flash_attn` namespace package).
"""

from __future__ import annotations

import json

import pytest

from nsa_runner.artifacts import load_manifest
from stages import env_pairing as ep
from tests import _fake_flash as fake

NAMESPACE = ("absent (the `flash_attn` package here is FA-4's namespace: flash_attn.cute only, "
             "from flash-attn-4 4.0.0b36; no flash-attn 2.x distribution, no flash_attn_2_cuda)")
BUNDLED = "absent (the flash_attn.cute here is flash_attn 2.8.3's bundled early CuTe port, not FA-4"


def _env_pairing(cli, tmp_path, monkeypatch, which, last="fa4"):
    fake.install_dists(monkeypatch, tmp_path / "site", which=which, last=last)
    r = cli("stage", "env-pairing", "--out", tmp_path / "runs", "--device", "cpu")
    run = tmp_path / "runs" / "testrun"
    (e,) = load_manifest(run)["stages"]
    env = json.loads((run / "env.json").read_text())
    flash = {p["module"]: p for p in env["flash"]}
    checks = {c["check"]: c for c in env["checks"]}
    # "what can run here" as on a GPU machine: the same records with a visible GPU
    facts = {**env["facts"], "gpu": {**env["facts"]["gpu"], "cuda_available": True}}
    return r, e, flash, checks, (run / "env.txt").read_text(), lambda: ep._paths(facts, checks, "cuda", env["flash"])


def test_fa4_only_env_pairing_says_fa2_absent(cli, tmp_path, monkeypatch):
    r, e, flash, checks, txt, paths = _env_pairing(cli, tmp_path, monkeypatch, ("fa4",))
    assert e["status"] == "PASS", e["reason"]
    assert "flash: FA-2 " + NAMESPACE + ", FA-3 absent, FA-4 ok" in e["reason"]
    assert flash["flash_attn"]["ok"] is False and flash["flash_attn"]["not_installed"] is True
    assert flash["flash_attn.cute"]["ok"] is True
    assert checks["flash_attn"]["status"] == "info"
    assert checks["flash_attn"]["detail"].startswith("flash_attn (FA-2) " + NAMESPACE)
    assert checks["flash_attn.cute"]["detail"].startswith("flash_attn.cute (FA-4) 4.0.0b36 imports")
    assert "FA-2          flash_attn: " + NAMESPACE in txt
    assert "FA-4          flash_attn.cute: 4.0.0b36" in txt
    assert "flash_attn: ok" not in txt and "FA-2 ok" not in txt
    assert "flash-attn (FA-2) varlen     no: FA-2 absent (the `flash_attn` package here is FA-4's namespace" in txt
    assert paths()["flash-attn (FA-2) varlen"] == "no: FA-2 " + NAMESPACE
    assert paths()["flash-attn-4 (FA-4)"] == "yes"


def test_fa2_with_bundled_cute_env_pairing_says_fa4_absent(cli, tmp_path, monkeypatch):
    r, e, flash, checks, txt, paths = _env_pairing(cli, tmp_path, monkeypatch, ("fa2",))
    assert e["status"] == "PASS", e["reason"]
    assert "flash: FA-2 ok, FA-3 absent, FA-4 " + BUNDLED in e["reason"]
    assert flash["flash_attn"]["ok"] is True and flash["flash_attn"]["version"] == "2.8.3"
    assert flash["flash_attn.cute"]["ok"] is False and flash["flash_attn.cute"]["not_installed"] is True
    assert checks["flash_attn"]["status"] == "ok"
    assert checks["flash_attn.cute"]["status"] == "info"
    assert checks["flash_attn.cute"]["detail"].startswith("flash_attn.cute (FA-4) " + BUNDLED)
    assert "pip install --pre 'flash-attn-4[cu13]'" in checks["flash_attn.cute"]["detail"]
    assert "FA-2          flash_attn: 2.8.3" in txt
    assert "FA-4          flash_attn.cute: " + BUNDLED in txt
    assert paths()["flash-attn (FA-2) varlen"] == "yes"
    assert paths()["flash-attn-4 (FA-4)"].startswith("no: FA-4 " + BUNDLED)


@pytest.mark.parametrize("last", ["fa4", "fa2"])
def test_both_env_pairing(cli, tmp_path, monkeypatch, last):
    """Both installed -> both present. If flash-attn was installed after flash-attn-4, its
    bundled cute 0.1.0 overwrote FA-4's files: FA-4 is broken (FAIL, with the fix), not "ok"."""
    r, e, flash, checks, txt, paths = _env_pairing(cli, tmp_path, monkeypatch, ("fa2", "fa4"), last)
    assert flash["flash_attn"]["ok"] is True and checks["flash_attn"]["status"] == "ok"
    assert "FA-2          flash_attn: 2.8.3" in txt
    if last == "fa4":
        assert e["status"] == "PASS", e["reason"]
        assert "flash: FA-2 ok, FA-3 absent, FA-4 ok" in e["reason"]
        assert flash["flash_attn.cute"]["ok"] is True
        assert "FA-4          flash_attn.cute: 4.0.0b36" in txt
        assert paths()["flash-attn-4 (FA-4)"] == "yes"
    else:
        assert e["status"] == "FAIL" and r.exit_code == 1
        assert "does not match the installed flash-attn-4 4.0.0b36" in e["reason"]
        assert "reinstall flash-attn-4" in e["reason"]
        assert flash["flash_attn.cute"]["ok"] is False and flash["flash_attn.cute"]["not_installed"] is False
        assert checks["flash_attn.cute"]["status"] == "FAIL"
        assert "FA-4          flash_attn.cute: BROKEN (4.0.0b36)" in txt
        assert paths()["flash-attn-4 (FA-4)"] == "no: FA-4 BROKEN (see checks)"
    assert paths()["flash-attn (FA-2) varlen"] == "yes"
