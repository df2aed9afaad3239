""""Is it really FA-2 / FA-4?" (nsa_core.flash.detect) through adapters.status, available_paths
(what fa2-probe tests and routing reads) and pick, on FAKE installs laid out as the real wheels
leave them (tests/_fake_flash.install_dists):

1. flash-attn-4 4.0.0b36 only: its wheel has flash_attn/cute and no flash_attn/__init__.py, so
   ``import flash_attn`` works (a namespace package) although FA-2 is absent. Seen on the H100:
   env-pairing said "FA-2 ok".
2. flash-attn 2.8.3 only: its wheel bundles an early flash_attn/cute 0.1.0 that is not FA-4.
3. both (FA-4 installed last) -> both; and FA-2 installed after FA-4, whose bundled cute files
   overwrote FA-4's -> FA-4 broken, never called.

The fakes prove nothing about the real kernels (fa2-probe on a GPU does); they reproduce the
package layouts the detection reads.
"""

from __future__ import annotations

import pytest
import torch

from nsa_core import routing
from nsa_core.flash import adapters as K
from nsa_core.flash import pick as P
from tests import _fake_flash as fake

F16 = torch.float16
NAMESPACE = ("absent (the `flash_attn` package here is FA-4's namespace: flash_attn.cute only, "
             "from flash-attn-4 4.0.0b36")
BUNDLED = "absent (the flash_attn.cute here is flash_attn 2.8.3's bundled early CuTe port, not FA-4"


@pytest.fixture
def on_h100(monkeypatch):
    """status(path, "cuda") on this CPU machine: an sm_90 capability, and CPU tensors checked as
    if they were on the GPU (the FAKE kernels compute on CPU)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0))
    real = K.status
    monkeypatch.setattr(K, "status", lambda path, device_type: real(path, "cuda" if device_type == "cpu" else
                                                                        device_type))
    return real


def _qkv():
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 40, 4, 16, generator=g).to(F16)
    k = torch.randn(1, 40, 2, 16, generator=g).to(F16)
    return q, k, k.clone()


def test_fa4_only_is_no_fa2(monkeypatch, tmp_path, on_h100):
    fake.install_dists(monkeypatch, tmp_path / "site", which=("fa4",))
    import flash_attn  # the trap: the namespace package imports

    assert not hasattr(flash_attn, "flash_attn_func")
    st = K.available_paths("cuda")  # what fa2-probe tests and routing's facts hold
    assert not st["fa2"]["present"] and st["fa2"]["reason"].startswith("flash_attn " + NAMESPACE)
    assert st["fa4"]["present"]
    assert [p for p, s in st.items() if s["present"] and p.startswith("fa")] == ["fa4"]
    assert not routing._flash_paths("cuda")["fa2"]["present"]
    q, k, v = _qkv()
    for branch in ("cmp", "win"):
        assert P.pick(None, branch, q, k, v) == "fa4"
    with pytest.raises(K.PathUnavailable, match="FA-4's namespace"):
        P.pick("fa2", "win", q, k, v)
    # the path picked runs: the FAKE FA-4 through the adapter matches float64 attention
    out = K.window(q, k, v, 8, 0.25, "fa4")
    ref = fake.attend(q.double(), k.double(), v.double(), 0.25, 7, 0)[0]
    torch.testing.assert_close(out.double(), ref.double(), atol=2e-3, rtol=2e-3)
    from nsa_core.flash import detect as D

    fa2, fa4 = D.detect("fa2"), D.detect("fa4")
    assert not fa2["present"] and fa2["not_installed"] and fa2["reason"].startswith(NAMESPACE)
    assert D.summary(fa2).startswith("FA-2 absent (the `flash_attn` package here is FA-4's namespace")
    assert fa4["present"] and fa4["version"] == "4.0.0b36" and fa4["dist"] == "flash-attn-4"


def test_fa2_with_its_bundled_cute_is_no_fa4(monkeypatch, tmp_path, on_h100):
    fake.install_dists(monkeypatch, tmp_path / "site", which=("fa2",))
    import flash_attn.cute  # the trap: FA-2's bundled early port imports and has a flash_attn_func

    assert flash_attn.cute.__version__ == "0.1.0" and callable(flash_attn.cute.flash_attn_func)
    st = K.available_paths("cuda")
    assert st["fa2"]["present"] and not st["fa4"]["present"]
    assert st["fa4"]["reason"].startswith("flash_attn.cute " + BUNDLED) and "flash-attn-4" in st["fa4"]["reason"]
    assert not routing._flash_paths("cuda")["fa4"]["present"]
    q, k, v = _qkv()
    assert P.pick(None, "win", q, k, v) == "fa2"
    with pytest.raises(K.PathUnavailable, match="bundled early CuTe port"):
        P.pick("fa4", "cmp", q, k, v)
    from nsa_core.flash import detect as D

    fa2, fa4 = D.detect("fa2"), D.detect("fa4")
    assert fa2["present"] and fa2["version"] == "2.8.3"
    assert not fa4["present"] and fa4["not_installed"] and fa4["reason"].startswith(BUNDLED)


def test_both_installed_are_both_present(monkeypatch, tmp_path, on_h100):
    fake.install_dists(monkeypatch, tmp_path / "site", which=("fa2", "fa4"))
    st = K.available_paths("cuda")
    assert st["fa2"]["present"] and st["fa4"]["present"]
    q, k, v = _qkv()
    assert P.pick(None, "win", q, k, v) == "fa2"  # preference order fa3, fa2, fa4
    assert P.pick("fa4", "cmp", q, k, v) == "fa4"
    from nsa_core.flash import detect as D

    fa2, fa4 = D.detect("fa2"), D.detect("fa4")
    assert fa2["present"] and fa2["version"] == "2.8.3"
    assert fa4["present"] and fa4["version"] == "4.0.0b36"


def test_fa2_installed_after_fa4_overwrote_its_cute_files(monkeypatch, tmp_path, on_h100):
    """Both distributions, but flash_attn/cute on disk is FA-2's bundled 0.1.0 (pip installed
    flash-attn last): FA-4 is broken, said so with the fix, and never called (the adapter would
    pass return_lse to a function without it)."""
    fake.install_dists(monkeypatch, tmp_path / "site", which=("fa2", "fa4"), last="fa2")
    st = K.available_paths("cuda")
    assert st["fa2"]["present"] and not st["fa4"]["present"]
    q, k, v = _qkv()
    with pytest.raises(K.PathUnavailable, match="reinstall flash-attn-4"):
        P.pick("fa4", "cmp", q, k, v)
    from nsa_core.flash import detect as D

    fa2, fa4 = D.detect("fa2"), D.detect("fa4")
    assert fa2["present"]
    assert not fa4["present"] and not fa4["not_installed"]
    assert "does not match the installed flash-attn-4 4.0.0b36" in fa4["reason"]
    assert "no return_lse" in fa4["reason"] and "reinstall flash-attn-4" in fa4["reason"]
    assert D.summary(fa4).startswith("FA-4 BROKEN: ")


def test_detection_without_import_and_of_nothing(monkeypatch, tmp_path):
    """do_import=False reads metadata and locates modules only (no flash module imported); with
    nothing installed every path is plainly not installed."""
    import sys

    from nsa_core.flash import detect as D

    fake.install_dists(monkeypatch, tmp_path / "site", which=("fa4",))
    assert not D.detect("fa2", do_import=False)["present"]
    assert D.detect("fa4", do_import=False)["present"]
    assert "flash_attn.cute" not in sys.modules
    empty = tmp_path / "empty"
    fake.install_dists(monkeypatch, empty, which=())
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path / "site")])
    for path in ("fa2", "fa3", "fa4"):
        r = D.detect(path)
        assert r["not_installed"] and r["reason"].startswith("not installed"), r
    with pytest.raises(ValueError, match="unknown flash-attn path"):
        D.detect("fa5")


def test_the_probe_table_prefill_baselines_and_fla_window_use_the_same_detection(monkeypatch, tmp_path):
    """fa2-probe's package table (flash_probe.probe), prefill-bench's full-attention paths and fla's
    window constraint decided "installed" by the module name: FA-4's namespace counted as FA-2, and
    FA-2's bundled cute 0.1.0 as FA-4."""
    from nsa_core import NSAConfig
    from nsa_runner.impls import Case
    from nsa_runner.impls import fla as fla_impl
    from nsa_runner.measure import flash_probe
    from stages import prefill_bench

    fake.install_dists(monkeypatch, tmp_path / "a", which=("fa4",))
    rows = {r["name"]: r for r in flash_probe.probe("cpu") if r["kind"] == "package"}
    assert not rows["flash_attn (FA-2)"]["present"] and "FA-4's namespace" in rows["flash_attn (FA-2)"]["reason"]
    assert rows["flash_attn.cute (FA-4)"]["present"]
    why = dict(prefill_bench.full_paths("cuda", ["fa2"]))["fa2"]
    assert why.startswith("flash_attn absent (the `flash_attn` package here is FA-4's namespace"), why
    case = Case(B=1, T=256, HQ=16, G=1, dk=64, dv=64, dtype="bf16", device="cuda",
                cfg=NSAConfig(l=64, d=64, l_sel=64, n_sel=4, w=64), shared_kv=True, window=True)
    assert "window branch calls flash-attn" in fla_impl._check(case, "nsa_attention")

    fake.install_dists(monkeypatch, tmp_path / "b", which=("fa2",))  # FA-2 now, above the FA-4 one
    rows = {r["name"]: r for r in flash_probe.probe("cpu") if r["kind"] == "package"}
    assert rows["flash_attn (FA-2)"]["present"]
    assert not rows["flash_attn.cute (FA-4)"]["present"]
    assert "bundle" in rows["flash_attn.cute (FA-4)"]["reason"]
    assert dict(prefill_bench.full_paths("cuda", ["fa2"]))["fa2"] == ""
