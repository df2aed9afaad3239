"""Facts about this machine's software and accelerator, for env-pairing and for anything that
records "where was this measured" (benchmarks). Each probe returns plain JSON-able dicts and
never raises: a failure is recorded as text.

``collect()`` does not import flash-attn in this process (a broken build can abort the
interpreter): ``probe_flash()`` imports the flash modules in a child process.
"""

from __future__ import annotations

import ctypes
import importlib.metadata as md
import json
import platform
import shutil
import subprocess
import sys
import textwrap

# (module, what it is, distribution names that provide it, install hint)
FLASH_MODULES = (
    ("flash_attn", "FA-2", ("flash-attn", "flash_attn"),
     "pip install flash-attn --no-build-isolation  (pick the prebuilt wheel matching torch/CUDA)"),
    ("flash_attn_interface", "FA-3", ("flash-attn-3", "flash_attn_3", "flashattn-hopper"),
     "Hopper only: build flash-attention/hopper (cd hopper && python setup.py install)"),
    ("flash_attn.cute", "FA-4", ("flash-attn-4", "flash-attn-cute"),
     "Hopper/Blackwell: pip install flash-attn-4"),
)


def dist_version(*names: str) -> str | None:
    for n in names:
        try:
            return md.version(n)
        except md.PackageNotFoundError:
            continue
    return None


def python_info() -> dict:
    return {"version": sys.version.split()[0], "implementation": platform.python_implementation(),
            "executable": sys.executable, "platform": platform.platform()}


def torch_info() -> dict:
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return {"installed": False, "error": f"{type(e).__name__}: {e}"}
    cuda, hip = torch.version.cuda, getattr(torch.version, "hip", None)
    build = f"CUDA {cuda}" if cuda else (f"HIP {hip}" if hip else "CPU")
    info = {"installed": True, "version": torch.__version__, "build": build, "cuda_runtime": cuda,
            "hip": hip, "git_version": getattr(torch.version, "git_version", None)}
    try:
        info["cudnn"] = torch.backends.cudnn.version() if cuda else None
    except Exception:  # noqa: BLE001
        info["cudnn"] = None
    return info


def torch_triton_requirement() -> dict:
    """The triton requirement torch itself declares in its metadata (markers evaluated here)."""
    try:
        reqs = md.requires("torch") or []
    except md.PackageNotFoundError:
        return {"declared": None, "raw": [], "note": "torch distribution metadata not found"}
    from packaging.requirements import Requirement

    raw = [r for r in reqs if r.split(";")[0].strip().lower().startswith(("triton", "pytorch-triton"))]
    applicable = []
    for r in raw:
        req = Requirement(r)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            applicable.append(req)
    if not applicable:
        return {"declared": None, "raw": raw,
                "note": "torch declares no triton requirement for this platform"
                        + (" (CPU build)" if "+cpu" in (dist_version("torch") or "") else "")}
    req = applicable[0]
    return {"declared": str(req), "name": req.name, "specifier": str(req.specifier), "raw": raw}


def triton_info() -> dict:
    version = dist_version("triton", "pytorch-triton", "pytorch-triton-rocm")
    info = {"installed": version is not None, "version": version, "import_error": None}
    if version is None:
        return info
    try:
        import triton

        info["module_version"] = getattr(triton, "__version__", None)
        info["path"] = getattr(triton, "__file__", None)
    except Exception as e:  # noqa: BLE001
        info["import_error"] = f"{type(e).__name__}: {e}"
    return info


def cuda_driver_version() -> str | None:
    """The CUDA version the installed driver supports (cuDriverGetVersion), e.g. '13.0'."""
    for lib in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            cuda = ctypes.CDLL(lib)
        except OSError:
            continue
        v = ctypes.c_int(0)
        if cuda.cuDriverGetVersion(ctypes.byref(v)) == 0 and v.value:
            return f"{v.value // 1000}.{(v.value % 1000) // 10}"
    return None


def gpu_info() -> dict:
    info: dict = {"cuda_available": False, "devices": [], "driver_cuda_version": cuda_driver_version()}
    try:
        import torch

        info["cuda_available"] = bool(torch.cuda.is_available())
        if info["cuda_available"]:
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                info["devices"].append({
                    "index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                    "memory_gib": round(p.total_memory / 2**30, 1),
                    "multiprocessors": p.multi_processor_count,
                })
        elif torch.version.cuda:
            try:
                torch.cuda.init()
            except Exception as e:  # noqa: BLE001 - the reason CUDA is unusable
                info["cuda_error"] = f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001
        info["error"] = f"{type(e).__name__}: {e}"
    return info


def nvidia_smi() -> dict:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"present": False}
    out: dict = {"present": True, "path": exe}
    for key, args in (("summary", []),
                      ("query", ["--query-gpu=name,driver_version,memory.total,compute_cap",
                                 "--format=csv,noheader"])):
        try:
            r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=30)
            out[key] = (r.stdout + r.stderr).strip()
            out[f"{key}_rc"] = r.returncode
        except (OSError, subprocess.SubprocessError) as e:
            out[key] = f"{type(e).__name__}: {e}"
    return out


_FLASH_PROBE = textwrap.dedent("""
    import faulthandler, importlib, json, sys
    faulthandler.enable()
    for mod in sys.argv[1:]:
        print(json.dumps({"module": mod, "start": True}), flush=True)
        try:
            m = importlib.import_module(mod)
            rec = {"module": mod, "ok": True, "version": getattr(m, "__version__", None),
                   "file": getattr(m, "__file__", None)}
        except ModuleNotFoundError as e:
            missing = e.name or ""
            rec = {"module": mod, "ok": False, "missing": missing,
                   "not_installed": mod == missing or mod.startswith(missing + ".") if missing else False,
                   "error": f"{type(e).__name__}: {e}"}
        except BaseException as e:
            rec = {"module": mod, "ok": False, "not_installed": False, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(rec), flush=True)
""")


def probe_flash(timeout_s: float = 300.0) -> list[dict]:
    """Import each flash module in a child process; one record per module.

    Record: ``{"module", "what", "hint", "ok", "version", "not_installed", "error"}``. An import
    that kills the child (abort, segfault) is recorded as an error with the exit status.
    """
    mods = [m for m, *_ in FLASH_MODULES]
    recs: dict[str, dict] = {}
    crashed: str | None = None
    try:
        r = subprocess.run([sys.executable, "-c", _FLASH_PROBE, *mods], capture_output=True, text=True,
                           timeout=timeout_s)
        lines, rc, stderr = r.stdout.splitlines(), r.returncode, r.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        lines, rc, stderr = out.splitlines(), None, f"timed out after {timeout_s:g}s"
    started = None
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("start"):
            started = rec["module"]
        else:
            recs[rec["module"]] = rec
            started = None
    if started is not None:
        crashed = started
    out = []
    for mod, what, dists, hint in FLASH_MODULES:
        rec = recs.get(mod)
        if rec is None:
            why = ("import crashed the interpreter" if mod == crashed else "not probed")
            status = f"exit status {rc}" if rc is not None else stderr
            tail = " | ".join(stderr.strip().splitlines()[-3:])
            rec = {"module": mod, "ok": False, "not_installed": False,
                   "error": f"{why} ({status}) {tail}".strip()}
        rec.update({"what": what, "hint": hint, "dist_version": dist_version(*dists)})
        out.append(rec)
    return out


def collect() -> dict:
    """Everything but flash (see ``probe_flash``) and the pairing verdict."""
    return {
        "python": python_info(),
        "torch": torch_info(),
        "torch_triton_requirement": torch_triton_requirement(),
        "triton": triton_info(),
        "gpu": gpu_info(),
        "nvidia_smi": nvidia_smi(),
    }
