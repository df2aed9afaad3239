"""FAKE flash-attn modules for CPU tests. They are NOT the real packages and prove nothing about
the real kernels (numerics, JIT, architecture limits): only the fa2-probe stage on a GPU does.

What they are for: the adapters in nsa_core.flash.adapters call flash-attn 2 (``flash_attn``)
and flash-attn 4 (``flash_attn.cute``) through their public functions. These fakes have the
same signatures as the real ones (parameter names, order, defaults; no ``**kwargs``, so a
keyword the real function lacks is a TypeError here too), the same return values (FA-2: ``out``;
FA-4: ``(out, lse)``, lse ``[B, H, Sq]`` float32 natural log or None) and the same dtype rule
(fp16 / bf16 only), and they compute attention with plain float64 torch ops written from the
flash-attn conventions, independent of nsa_core: bottom-right causal / window
(``key j visible to query i iff i + Sk - Sq - left <= j <= i + Sk - Sq + right``), GQA
(query head h uses KV head ``h // (H // Hk)``), an empty row gives 0 and lse -inf.

``install`` puts module objects into sys.modules (the kernels' tests); ``install_dists`` writes
installs laid out as the real wheels leave them (dist-info, FA-4's namespace-only ``flash_attn``,
FA-2's compiled extension and bundled early cute) for the "is it really FA-2 / FA-4" detection.

Signatures copied from: flash-attn 2.8 ``flash_attn/flash_attn_interface.py`` and flash-attn-4
4.0.0b36 ``flash_attn/cute/interface.py`` (the wheel bench/prepare_fa4.sh downloads;
tests/core/test_flash.py compares the FA-4 one with that file when the wheel is present).
"""

from __future__ import annotations

import importlib.machinery
import types
from collections.abc import Callable

import torch

FLASH_DTYPES = (torch.float16, torch.bfloat16)


def attend(q, k, v, scale, left, right):
    """float64 attention, flash layout. left/right: window bounds, None or < 0 = unbounded.
    q [B, Sq, H, D], k [B, Sk, Hk, D], v [B, Sk, Hk, Dv] -> (out [B, Sq, H, Dv] in q.dtype,
    lse [B, H, Sq] float32)."""
    B, Sq, H, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    if H % Hk:
        raise RuntimeError("Number of heads in key/value must divide number of heads in query")
    rep = H // Hk
    qd = q.double().permute(0, 2, 1, 3)  # [B, H, Sq, D]
    kd = k.double().permute(0, 2, 1, 3).repeat_interleave(rep, dim=1)
    vd = v.double().permute(0, 2, 1, 3).repeat_interleave(rep, dim=1)
    s = (qd @ kd.transpose(-1, -2)) * scale  # [B, H, Sq, Sk]
    i = torch.arange(Sq, device=q.device)[:, None] + (Sk - Sq)
    j = torch.arange(Sk, device=q.device)[None, :]
    mask = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device)
    if right is not None and right >= 0:
        mask &= j <= i + right
    if left is not None and left >= 0:
        mask &= j >= i - left
    mask = mask.expand_as(s)
    any_ = mask.any(-1)
    m = torch.where(any_, s.masked_fill(~mask, float("-inf")).amax(-1), torch.zeros_like(s[..., 0])).detach()
    e = torch.exp(torch.where(mask, s, m[..., None]) - m[..., None]) * mask
    tot = e.sum(-1)
    p = e / torch.where(any_, tot, torch.ones_like(tot))[..., None]
    out = (p @ vd).permute(0, 2, 1, 3).to(q.dtype)
    lse = (torch.log(tot) + m).float()  # log(0) = -inf for an empty row
    return out, lse


def _check_dtype(*ts):
    if any(t.dtype not in FLASH_DTYPES for t in ts):
        raise RuntimeError("FlashAttention only support fp16 and bf16 data type")


# ---- flash-attn 2.8 (module ``flash_attn``) ---------------------------------------------------

def fa2_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                        softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    _check_dtype(q, k, v)
    if dropout_p or softcap or alibi_slopes is not None or return_attn_probs:
        raise NotImplementedError("FAKE flash_attn: only dropout_p=0, softcap=0, no alibi, no probs")
    if q.shape[-1] != v.shape[-1] or q.shape[-1] != k.shape[-1]:
        raise RuntimeError("FAKE flash_attn: FA-2 needs the same head dim for q, k, v")
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    left, right = window_size
    if causal:
        right = 0
    return attend(q, k, v, scale, left, right)[0]


def fa2_flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                               alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None):
    outs = []
    for b in range(cu_seqlens_q.numel() - 1):
        qs = q[int(cu_seqlens_q[b]):int(cu_seqlens_q[b + 1])][None]
        ks = k[int(cu_seqlens_k[b]):int(cu_seqlens_k[b + 1])][None]
        vs = v[int(cu_seqlens_k[b]):int(cu_seqlens_k[b + 1])][None]
        outs.append(fa2_flash_attn_func(qs, ks, vs, dropout_p, softmax_scale, causal, window_size, softcap,
                                        alibi_slopes, deterministic, return_attn_probs)[0])
    return torch.cat(outs)


# ---- flash-attn-4 4.0.0b36 (module ``flash_attn.cute``) ---------------------------------------

def fa4_flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    qv: torch.Tensor | None = None,
    gather_kv_indices: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int | None, int | None] = (None, None),
    learnable_sink: torch.Tensor | None = None,
    softcap: float = 0.0,
    num_splits: int = 1,
    pack_gqa: bool | None = None,
    deterministic: bool = False,
    score_mod: Callable | None = None,
    score_mod_bwd: Callable | None = None,
    mask_mod: Callable | None = None,
    aux_tensors: list | None = None,
    aux_scalars: tuple | None = None,
    block_sparse_tensors=None,
    block_sparse_tensors_bwd=None,
    return_lse: bool = False,
    gather_bwd_recompute_p: bool = False,
    gather_bwd_token_chunk: int | None = None,
):
    if any(x is not None for x in (qv, gather_kv_indices, learnable_sink, score_mod, score_mod_bwd, mask_mod,
                                   aux_tensors, aux_scalars, block_sparse_tensors, block_sparse_tensors_bwd)) \
            or softcap or gather_bwd_recompute_p or gather_bwd_token_chunk is not None:
        raise NotImplementedError("FAKE flash_attn.cute: only plain / causal / window attention")
    if v.dtype not in (*FLASH_DTYPES, torch.float8_e4m3fn, torch.float8_e5m2):
        raise AssertionError("inputs must be float16, bfloat16, fp8 e4m3fn, or fp8 e5m2")
    assert q.dtype == k.dtype == v.dtype, "q, k, v, and qv must have the same dtype"
    assert q.shape[-2] % v.shape[-2] == 0, "num_head must be divisible by num_head_kv"
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    left, right = window_size
    if left is not None and right is not None and left < 0 and right < 0:
        left = right = None
    if causal:
        right = 0
    out, lse = attend(q, k, v, scale, left, right)
    need_lse = return_lse or any(t.requires_grad for t in (q, k, v))
    return out, (lse if need_lse else None)


def fa4_flash_attn_varlen_func(*args, **kwargs):
    raise NotImplementedError("FAKE flash_attn.cute: varlen is not used by nsa_core")


def _module(name: str, **attrs) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None)
    m.__doc__ = f"FAKE {name} for CPU tests (tests/_fake_flash.py): not the real package"
    for k, val in attrs.items():
        setattr(m, k, val)
    return m


def install(monkeypatch, which=("fa2", "fa4")) -> dict:
    """Put the fakes into sys.modules (``flash_attn``, ``flash_attn.cute``) for one test and
    forget the adapters' cached imports. Returns {path: module}."""
    import sys

    from nsa_core.flash import adapters

    mods = {}
    parent = _module("flash_attn")
    parent.__path__ = []  # a package, so flash_attn.cute resolves under it
    if "fa2" in which:
        parent.__version__ = "2.8.3"
        parent.flash_attn_func = fa2_flash_attn_func
        parent.flash_attn_varlen_func = fa2_flash_attn_varlen_func
        mods["fa2"] = parent
    monkeypatch.setitem(sys.modules, "flash_attn", parent)
    if "fa4" in which:
        cute = _module("flash_attn.cute", __version__="0.0.0", flash_attn_func=fa4_flash_attn_func,
                       flash_attn_varlen_func=fa4_flash_attn_varlen_func)
        parent.cute = cute
        monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
        mods["fa4"] = cute
    else:
        monkeypatch.delitem(sys.modules, "flash_attn.cute", raising=False)
    monkeypatch.setattr(adapters, "_imported", {})
    for var in ("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)  # adapters._import("fa4") sets them; undone after the test
    return mods


def present_on_cpu(monkeypatch, paths=("fa2", "fa4")) -> None:
    """Let adapters.status() report the FAKE paths as present on CPU (the real status refuses any
    device but CUDA), so pick()/check() and the branch fast paths can be driven end to end."""
    from nsa_core.flash import adapters

    real = adapters.status

    def status(path, device_type):
        if path in paths and device_type == "cpu":
            return {"present": True, "reason": "FAKE module on CPU (tests)", "branches": adapters.PATHS[path]}
        return real(path, device_type)

    monkeypatch.setattr(adapters, "status", status)


# ---- FAKE installs on disk, laid out as the real wheels leave them --------------------------
# For the "is it really FA-2 / FA-4" detection (nsa_core.flash.detect), which reads distribution
# metadata and imports through the real import system (also in env-pairing's child process):
#   flash-attn 2.8.3:        flash_attn/__init__.py (imports flash_attn_interface, which imports the
#                            compiled flash_attn_2_cuda), flash_attn_2_cuda (top level), and its
#                            bundled early flash_attn/cute (__version__ "0.1.0", no return_lse);
#                            dist-info flash_attn-2.8.3 whose RECORD lists all of them.
#   flash-attn-4 4.0.0b36:   flash_attn/cute/ ONLY (no flash_attn/__init__.py: `flash_attn` is an
#                            empty namespace package); dist-info flash_attn_4-4.0.0b36.
# Both: FA-4 installed after FA-2, so flash_attn/cute holds FA-4's files (both RECORDs list them).
# The functions are the fakes above (same signatures as the real ones); flash_attn_2_cuda is a .py
# module standing in for the compiled extension.

_FA2_INIT = '''"""FAKE flash-attn 2.8.3 (tests/_fake_flash.py)."""
__version__ = "2.8.3"
from flash_attn.flash_attn_interface import flash_attn_func, flash_attn_varlen_func
'''
_FA2_INTERFACE = '''import flash_attn_2_cuda as flash_attn_gpu  # the compiled extension in the real package
from tests._fake_flash import fa2_flash_attn_func as flash_attn_func
from tests._fake_flash import fa2_flash_attn_varlen_func as flash_attn_varlen_func
'''
_FA2_EXT = '"""FAKE stand-in for flash-attn 2\'s compiled extension flash_attn_2_cuda."""\n'
# flash-attn 2.8's bundled early CuTe port: another flash_attn_func (no return_lse, returns (out, lse))
_CUTE_010_INIT = '''"""FAKE flash-attn 2.8.3 bundled flash_attn/cute (Flash Attention CUTE, early port)."""
__version__ = "0.1.0"
from .interface import flash_attn_func, flash_attn_varlen_func
'''
_CUTE_010_INTERFACE = '''def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(None, None),
                    learnable_sink=None, softcap=0.0, pack_gqa=None):
    raise NotImplementedError("FAKE flash-attn 2.8.3 bundled cute 0.1.0: not FA-4")


def flash_attn_varlen_func(*args, **kwargs):
    raise NotImplementedError("FAKE flash-attn 2.8.3 bundled cute 0.1.0: not FA-4")
'''
# flash-attn-4 4.0.0b36's flash_attn/cute/__init__.py (its __version__ reads a distribution "fa4")
_CUTE_4_INIT = '''"""FAKE flash-attn-4 4.0.0b36 flash_attn/cute (tests/_fake_flash.py)."""
from importlib.metadata import PackageNotFoundError, version
try:
    __version__ = version("fa4")
except PackageNotFoundError:
    __version__ = "0.0.0"
from .interface import flash_attn_func, flash_attn_varlen_func
# the real package reads its JIT-cache settings once, at import (flash_attn/cute/cache_utils.py)
import os as _os
CACHE_SETTINGS_AT_IMPORT = {v: _os.environ.get(v) for v in (
    "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR")}
'''
_CUTE_4_INTERFACE = '''from tests._fake_flash import fa4_flash_attn_func as flash_attn_func
from tests._fake_flash import fa4_flash_attn_varlen_func as flash_attn_varlen_func
'''
FLASH_MODULE_NAMES = ("flash_attn", "flash_attn.flash_attn_interface", "flash_attn.cute",
                      "flash_attn.cute.interface", "flash_attn_2_cuda")


def _write_dist(site, dist: str, version: str, files: dict[str, str]) -> None:
    for rel, text in files.items():
        f = site / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "top_level.txt").write_text("flash_attn\n")
    record = [*files, f"{info.name}/METADATA", f"{info.name}/top_level.txt", f"{info.name}/RECORD"]
    (info / "RECORD").write_text("".join(f"{r},,\n" for r in record))


def install_dists(monkeypatch, site, which=("fa2", "fa4"), last="fa4"):
    """Write FAKE flash-attn 2.8.3 and/or flash-attn-4 4.0.0b36 installs into ``site`` (a folder),
    put it first on sys.path and on PYTHONPATH (with this checkout, for env-pairing's child
    process), and forget every imported flash module and the adapters' cached detection. All of
    it is undone after the test. ``last``: with both, the one pip installed last, whose
    flash_attn/cute files are on disk ("fa2": FA-2's bundled 0.1.0 overwrote FA-4's)."""
    import importlib
    import os
    import sys
    from pathlib import Path

    from nsa_core.flash import adapters

    site = Path(site)
    site.mkdir(parents=True, exist_ok=True)
    order = [p for p in ("fa4", "fa2") if p != last] + [last]
    for path in order:
        if path not in which:
            continue
        if path == "fa2":
            _write_dist(site, "flash_attn", "2.8.3", {
                "flash_attn/__init__.py": _FA2_INIT, "flash_attn/flash_attn_interface.py": _FA2_INTERFACE,
                "flash_attn_2_cuda.py": _FA2_EXT,
                "flash_attn/cute/__init__.py": _CUTE_010_INIT, "flash_attn/cute/interface.py": _CUTE_010_INTERFACE})
        else:
            _write_dist(site, "flash-attn-4", "4.0.0b36", {
                "flash_attn/cute/__init__.py": _CUTE_4_INIT, "flash_attn/cute/interface.py": _CUTE_4_INTERFACE})
    repo = Path(__file__).resolve().parent.parent
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(repo), os.environ.get("PYTHONPATH", "")]))
    for name in FLASH_MODULE_NAMES:
        # set then delete: the test starts without the module, and whatever the test imports
        # under that name is removed again at teardown (monkeypatch undoes in reverse order)
        monkeypatch.setitem(sys.modules, name, None)
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(adapters, "_imported", {})
    for var in ("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    importlib.invalidate_caches()
    return site
