"""Stage ``env-pairing``: do torch / triton / CUDA / driver / flash-attn fit together here?

The verdict comes from facts, never from a hand-written version table:
- the triton requirement torch itself declares in its metadata vs the installed triton;
- a real tiny Triton launch (the interpreter on CPU, compiled on GPU);
- a real tiny CUDA op, and the driver's CUDA version vs torch's CUDA runtime;
- real imports of flash_attn (FA-2), flash_attn_interface (FA-3), flash_attn.cute (FA-4), in a
  child process, through nsa_core.flash.detect: the real package, not the module name (FA-4's
  wheel leaves an empty ``flash_attn`` namespace, which is no FA-2: "FA-2 absent (the `flash_attn`
  package here is FA-4's namespace: flash_attn.cute only, ...)"; FA-2's wheel bundles an early
  flash_attn.cute 0.1.0, which is no FA-4), and each package's build facts read from disk (envinfo.flash_build: version,
  wheel tag ``+cu12torch2.7``, the libcudart / libc10 its extension links, FA-4's CuTe DSL
  library flavour). "Not installed" is reported with an install hint and is not a failure; an
  import that fails (e.g. an undefined symbol: built for another torch) is a FAIL, and so is a
  package that imports but whose build facts name another torch major.minor or CUDA major
  (an ABI mismatch that imported by luck). Each line says whether nsa-run's adapter for the
  package ran on a GPU (``adapters.GPU_VERIFIED``).
Writes env.txt (for people) and env.json (schema_version 1).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

from nsa_runner.artifacts import now_iso, write_bytes, write_json, write_text
from nsa_runner.envinfo import collect, probe_flash
from nsa_runner.registry import GROUP
from nsa_runner.stage import Stage, StageResult, Status

OK, FAIL, INFO = "ok", "FAIL", "info"


def _check(name: str, status: str, detail: str) -> dict:
    return {"check": name, "status": status, "detail": detail}


def _triton_checks(facts: dict, device: str) -> list[dict]:
    checks = []
    pin, tri, torch_v = facts["torch_triton_requirement"], facts["triton"], facts["torch"].get("version")
    if tri.get("metadata_error"):  # a fact naming the file; whether triton imports decided the rest (B20-3)
        checks.append(_check("triton-metadata", INFO, tri["metadata_error"] + (
            f"; import triton works: version {tri['version'] or 'unknown'} from the module" if tri["installed"]
            and not tri.get("import_error") else "; import triton failed" if tri["installed"]
            else "; no triton module: not installed")))
    if pin.get("declared") is None:
        checks.append(_check("triton-pin", INFO, f"torch {torch_v}: {pin.get('note', 'no triton pin')}"))
    else:
        from packaging.specifiers import SpecifierSet

        if not tri["installed"]:
            checks.append(_check("triton-pin", FAIL, f"torch {torch_v} declares {pin['declared']} but triton "
                                 f"is not installed (fix: pip install '{pin['declared'].split(';')[0]}')"))
        elif not tri["version"]:
            checks.append(_check("triton-pin", INFO, f"torch {torch_v} declares {pin['declared']}; the installed "
                                 "triton's version is unknown (see triton-metadata)"))
        elif SpecifierSet(pin["specifier"]).contains(tri["version"], prereleases=True):
            checks.append(_check("triton-pin", OK, f"torch {torch_v} declares {pin['declared']}; "
                                 f"installed triton {tri['version']}"))
        else:
            checks.append(_check("triton-pin", FAIL, f"torch {torch_v} declares {pin['declared']} but triton "
                                 f"{tri['version']} is installed (fix: pip install '{pin['declared']}')"))
    if not tri["installed"]:
        checks.append(_check("triton-launch", INFO, "triton not installed: the Triton selection kernel "
                             "cannot run here (fix: pip install triton)"))
        return checks
    if tri.get("import_error"):
        checks.append(_check("triton-launch", FAIL, f"import triton failed: {tri['import_error']}"))
        return checks
    try:
        from nsa_runner import _triton_probe

        r = _triton_probe.launch(device)
    except Exception as e:  # noqa: BLE001 - the failure is the finding
        traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0][:300]
        checks.append(_check("triton-launch", FAIL, f"tiny Triton kernel on {device} raised "
                             f"{type(e).__name__}: {first}"))
        return checks
    if r["ok"]:
        checks.append(_check("triton-launch", OK, f"tiny Triton kernel ran on {device} ({r['mode']}), "
                             f"{r['n']} elements exact (max_abs {r['max_abs']:.1e})"))
    else:
        checks.append(_check("triton-launch", FAIL, f"tiny Triton kernel on {device} ({r['mode']}) gave wrong "
                             f"results: max_abs {r['max_abs']}"))
    return checks


def _triton_word(tri: dict, short: bool = False) -> str:
    """'3.9.0', 'not installed' / 'absent', or with its unreadable metadata said: '3.9.0 (from the module; triton's
    METADATA cannot be read: ...)'."""
    if not tri.get("installed"):
        word = "absent" if short else "not installed"
    else:
        word = tri.get("version") or "installed (version unknown)"
    if tri.get("metadata_error") and short:
        word += " (metadata unreadable)"
    elif tri.get("metadata_error"):
        word += f" ({'from the module; ' if tri.get('installed') else ''}{tri['metadata_error']})"
    return word


def _cuda_checks(facts: dict) -> list[dict]:
    t, gpu, smi = facts["torch"], facts["gpu"], facts["nvidia_smi"]
    if t.get("hip"):
        return [_check("cuda", INFO, f"ROCm/HIP build (HIP {t['hip']}); CUDA checks do not apply")]
    if not t.get("cuda_runtime"):
        return [_check("cuda", INFO, "CPU build of torch: no CUDA path on this machine")]
    if not gpu["cuda_available"]:
        if smi.get("present") and smi.get("query_rc") == 0:
            return [_check("cuda", FAIL, f"nvidia-smi sees a GPU but torch (CUDA {t['cuda_runtime']}) cannot use "
                           f"it: {gpu.get('cuda_error', 'torch.cuda.is_available() is False')}")]
        return [_check("cuda", INFO, f"CUDA {t['cuda_runtime']} build of torch, no GPU visible")]
    checks = []
    drv, rt = gpu.get("driver_cuda_version"), t["cuda_runtime"]
    if drv is None:
        checks.append(_check("cuda-driver", INFO, "driver CUDA version unknown (libcuda not found by ctypes)"))
    else:
        dmaj, dmin = (int(x) for x in drv.split(".")[:2])
        rmaj, rmin = (int(x) for x in rt.split(".")[:2])
        if dmaj < rmaj:
            checks.append(_check("cuda-driver", FAIL, f"driver supports CUDA {drv} but torch is built for CUDA "
                                 f"{rt}: update the driver or install a torch built for CUDA {dmaj}.x"))
        elif (dmaj, dmin) < (rmaj, rmin):
            checks.append(_check("cuda-driver", INFO, f"driver CUDA {drv} < runtime {rt}: runs through minor-"
                                 "version compatibility (PTX JIT of newer code may fail)"))
        else:
            checks.append(_check("cuda-driver", OK, f"driver supports CUDA {drv} >= torch runtime {rt}"))
    try:
        import torch

        g = torch.Generator(device="cpu").manual_seed(0)
        a, b = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
        got = (a.cuda() @ b.cuda()).double().cpu()
        torch.cuda.synchronize()
        rel = float((got - a.double() @ b.double()).norm() / (a.double() @ b.double()).norm())
        # fp32 matmul may run in TF32 on the GPU: 1e-2 is generous for that and catches garbage
        status = OK if rel < 1e-2 else FAIL
        checks.append(_check("cuda-op", status, f"64x64 fp32 matmul on {torch.cuda.get_device_name(0)}: "
                             f"rel err {rel:.1e}"))
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        checks.append(_check("cuda-op", FAIL, f"tiny CUDA matmul raised {type(e).__name__}: {e}"))
    return checks


def _mm(version: str | None) -> tuple[int, int] | None:
    try:
        a, b = (version or "").split("+")[0].split(".")[:2]
        return int(a), int(b)
    except ValueError:
        return None


def _abi_mismatch(build: dict, torch_version: str | None, torch_cuda: str | None) -> tuple[list[str], list[str]]:
    """(hard, soft): reasons a flash package does not fit this torch / CUDA, from its build facts.
    hard (FAIL): a compiled extension made for another torch major.minor (wheel tag) or another
    CUDA major (wheel tag, or the libcudart it links). soft (info): FA-4's CuTe DSL libraries are
    not the CUDA flavour of torch (it compiles its kernels itself; the matching flavour is the
    one its [cu13] extra installs)."""
    hard, soft = [], []
    from nsa_runner.envinfo import cuda_major

    tmaj = cuda_major(torch_cuda)
    tag = build.get("wheel_tag")
    if tag:
        if _mm(tag["torch"]) and _mm(torch_version) and _mm(tag["torch"]) != _mm(torch_version):
            hard.append(f"wheel tag {tag['text']} = built for torch {tag['torch']}, installed torch {torch_version}")
        if tmaj and cuda_major(tag["cuda"]) != tmaj:
            hard.append(f"wheel tag {tag['text']} = built for CUDA {cuda_major(tag['cuda'])}, "
                        f"torch runs CUDA {torch_cuda}")
    other = [c for c in build.get("cuda_needed") or [] if tmaj and c != tmaj]
    if other:
        hard.append(f"its extension links libcudart.so.{other[0]} (CUDA {other[0]}), torch runs CUDA {torch_cuda}")
    libs = build.get("cutlass_dsl_libs")
    if libs is not None and tmaj and f"cu{tmaj}" not in libs:
        soft.append(f"CuTe DSL libraries for {', '.join(libs) or 'no CUDA'} while torch runs CUDA {torch_cuda} "
                    f"(pip install 'nvidia-cutlass-dsl[cu{tmaj}]')")
    return hard, soft


def _verified(p: dict) -> str:
    try:
        from nsa_core.flash.adapters import verified_label

        return "nsa-run adapter " + verified_label(p.get("path", ""))
    except Exception as e:  # noqa: BLE001 - nsa_core broken: the other stages say why
        return f"nsa-run adapter: unknown ({type(e).__name__})"


def _flash_checks(probes: list[dict], torch_version: str | None, torch_cuda: str | None = None) -> list[dict]:
    checks = []
    for p in probes:
        label = f"{p['module']} ({p['what']})"
        b = p.get("build") or {}
        # the distribution's version: FA-4's own __version__ reads a distribution "fa4" and says 0.0.0
        v = b.get("version") or p.get("dist_version") or p.get("version") or "unknown version"
        built = f"built for: {b['built_for']}" if b.get("built_for") else ""
        hard, soft = _abi_mismatch(b, torch_version, torch_cuda)
        if p["ok"]:
            if hard:
                checks.append(_check(p["module"], FAIL, f"{p['module']} {v} imports but does not fit torch "
                                     f"{torch_version}: ABI mismatch ({'; '.join(hard)}); a call can crash — "
                                     f"install a build for this torch + CUDA ({p.get('hint', '')})"))
            else:
                note = f"; note: {'; '.join(soft)}" if soft else ""
                checks.append(_check(p["module"], INFO if soft else OK,
                                     f"{label} {v} imports; {built or 'no build facts'}; {_verified(p)}{note}"))
        elif p.get("not_installed"):
            checks.append(_check(p["module"], INFO, f"{label} {_absent(p)} (fix: {p['hint']}); {_verified(p)}"))
        elif "undefined symbol" in p["error"]:
            sym = p["error"].split("undefined symbol:")[-1].strip()[:120]
            checks.append(_check(p["module"], FAIL, f"{p['module']}: undefined symbol — built for another torch "
                                 f"(installed torch {torch_version}, CUDA {torch_cuda or '-'}; symbol {sym}); "
                                 f"{p['module']} {v}" + (f", {built}" if built else "")
                                 + (f"; ABI mismatch: {'; '.join(hard)}" if hard else "")))
        else:
            why = p.get("reason") or ""
            what = why if why and not why.startswith("fails to import") else f"import failed: {p['error'][:400]}"
            checks.append(_check(p["module"], FAIL, f"{p['module']} {v}: {what}" + (f" ({built})" if built else "")))
    return checks


def _absent(p: dict) -> str:
    """'not installed' or what is there instead, from nsa_core.flash.detect: 'absent (the
    `flash_attn` package here is FA-4's namespace: flash_attn.cute only, ...)'."""
    why = p.get("reason") or ""
    return why if why.startswith("absent") else "not installed"


def _flash_word(p: dict) -> str:
    """The verdict's word for one package: 'FA-2 ok', 'FA-3 absent', 'FA-2 absent (the ...)'."""
    return f"{p['what']} " + ("ok" if p["ok"] else _absent(p).replace("not installed", "absent"))


def _flash_can_run(flash: list[dict], module: str, checks: dict[str, dict], cuda: bool, ok_status) -> str:
    """'yes' only when the real package was detected (nsa_core.flash.detect), its check passed
    and a GPU is visible; else 'no: <why>'."""
    p = next((r for r in flash if r.get("module") == module), None)
    if p is None:
        return "no: not probed"
    if not p["ok"]:
        return f"no: {p['what']} " + (_absent(p) if p.get("not_installed") else "BROKEN (see checks)")
    if checks.get(module, {}).get("status") not in ok_status:
        return f"no: {checks.get(module, {}).get('detail', 'check failed')[:200]}"
    return "yes" if cuda else "no: no CUDA GPU here"


def _paths(facts: dict, checks: dict[str, dict], device: str, flash: list[dict] | None = None) -> dict[str, str]:
    tri = checks.get("triton-launch", {})
    cuda = bool(facts["gpu"]["cuda_available"])
    flash = flash or []
    paths = {
        "triton selection kernel": (f"yes ({'interpreter' if device == 'cpu' else 'compiled'})"
                                    if tri.get("status") == OK else f"no: {tri.get('detail', '')}"),
        "flash-attn (FA-2) varlen": _flash_can_run(flash, "flash_attn", checks, cuda, (OK,)),
        "flash-attn-4 (FA-4)": _flash_can_run(flash, "flash_attn.cute", checks, cuda, (OK, INFO)),
        "torch SDPA": "yes",
    }
    try:
        import torch

        if facts["gpu"]["cuda_available"]:
            fa = getattr(torch.backends.cuda, "is_flash_attention_available", lambda: None)()
            paths["torch SDPA flash kernel"] = {True: "yes", False: "no", None: "unknown"}[fa]
    except Exception:  # noqa: BLE001
        pass
    return paths


def _plugins() -> list[dict]:
    """Entry points of the stage group with their distributions (not imported here), read as discovery
    reads them (``_discover.group_distributions``: non-blocking, bounded; round 18 B-1, a plugin whose
    METADATA was a FIFO hung this stage, a symlink loop made it ERROR): a distribution whose metadata
    cannot be read is listed with ``error`` naming the file and why, the others as usual."""
    from nsa_runner._discover import entry_key, group_distributions

    out, seen = [], set()
    for dist, dist_name, eps, broken in group_distributions(GROUP):
        if broken is not None:
            if broken["key"] not in seen:
                seen.add(broken["key"])
                out.append({"name": broken["name"], "value": broken["value"], "dist": broken["dist"],
                            "version": "?", "error": broken["error"]})
            continue
        try:
            version = dist.version or "?"
        except Exception:  # noqa: BLE001 - its METADATA was read already (the Name); never raising here
            version = "?"
        for ep in eps:
            key = entry_key(dist_name, ep)
            if key not in seen:  # the same distribution found twice on sys.path: the first one wins
                seen.add(key)
                out.append({"name": ep.name, "value": ep.value, "dist": dist_name, "version": version})
    return sorted(out, key=lambda p: p["name"])


THRESHOLDS_COPY = "routing_thresholds.json"


def _thresholds_copy(run_dir) -> tuple[dict, list[str]]:
    """Which routing thresholds file this run reads (the per-user default, DESIGN §7), and a copy
    of it in the run folder as it was when the run started (the run stays self-contained even
    after a later fa2-probe merges new figures into the per-user file)."""
    try:
        from nsa_core import routing

        path = routing.DEFAULT_THRESHOLDS
    except Exception as e:  # noqa: BLE001 - nsa_core broken: the other stages will say why
        return {"file": None, "exists": False, "note": f"nsa_core.routing not importable: {e}"}, []
    rec = {"file": str(path), "exists": path.is_file(), "copy": None, "note": ""}
    if not rec["exists"]:
        rec["note"] = "absent: shipped defaults (CUDA) or SDPA apply until fa2-probe measures this machine"
        return rec, []
    try:
        write_bytes(run_dir / THRESHOLDS_COPY, path.read_bytes())
    except OSError as e:
        rec["note"] = f"could not copy it: {e}"
        return rec, []
    rec["copy"] = THRESHOLDS_COPY
    return rec, [THRESHOLDS_COPY]


def _render(env: dict) -> str:
    f = env["facts"]
    t, tri, gpu = f["torch"], f["triton"], f["gpu"]
    lines = [f"nsa-run env-pairing  run {env['run_id']}  {env['time']}",
             f"verdict: {env['verdict']}  {env['reason']}", "",
             f"python        {f['python']['version']} ({f['python']['implementation']}) {f['python']['executable']}",
             f"platform      {f['python']['platform']}",
             f"torch         {t.get('version', 'not importable: ' + t.get('error', ''))}  build={t.get('build')}",
             f"torch pins    {f['torch_triton_requirement'].get('declared') or 'no triton requirement'}",
             f"triton        {_triton_word(tri)}",
             f"CUDA runtime  {t.get('cuda_runtime') or '-'}   driver supports CUDA "
             f"{gpu.get('driver_cuda_version') or '-'}   cuda available: {gpu['cuda_available']}"]
    for d in gpu["devices"]:
        lines.append(f"GPU {d['index']}         {d['name']}  capability {d['capability']}  {d['memory_gib']} GiB")
    for p in env["flash"]:
        b = p.get("build") or {}
        v = b.get("version") or p.get("dist_version") or p.get("version")
        state = (v or "ok") if p["ok"] else (_absent(p) if p.get("not_installed")
                                             else f"BROKEN ({v or 'unknown version'}): " + p["error"][:200])
        lines.append(f"{p['what']:<13} {p['module']}: {state}  [{_verified(p)}]")
        if b.get("built_for"):
            lines.append(f"{'':<13}   built for: {b['built_for']}")
    lines += ["", "checks:"]
    lines += [f"  [{c['status']:<4}] {c['check']:<22} {c['detail']}" for c in env["checks"]]
    lines += ["", "what can run here:"]
    lines += [f"  {k:<28} {v}" for k, v in env["paths"].items()]
    thr = env.get("routing_thresholds") or {}
    lines += ["", f"routing thresholds file  {thr.get('file')}  "
              + (f"(copied into this run as {thr['copy']})" if thr.get("copy") else f"({thr.get('note', '')})")]
    lines += ["", f"stage plugins (entry-point group {GROUP}):"]
    for p in env["plugins"]:
        lines.append(f"  {p['name']:<16} {p['value']:<36} {p['dist']} {p['version']}")
        if p.get("error"):
            lines.append(f"  {'':<16} unreadable: {p['error']}")
    smi = f["nvidia_smi"]
    lines += ["", "nvidia-smi:", *(("  " + x) for x in (smi.get("summary") or "").splitlines())] \
        if smi.get("present") else ["", "nvidia-smi: not present"]
    return "\n".join(lines) + "\n"


def _shown(text: str) -> str:
    """``text`` as env.txt and the stage log show it: what the project's one rule for the terminal and the files
    takes out (``_text.CONTROL``: escape sequences with their bodies, C0 / C1 controls, DEL, bidi controls) is
    written visibly as its escapes (``\\x1b]0;pwn\\x07``), line by line, never sent raw: a plugin's METADATA Name
    or a flash import error holding ESC / OSC / BEL / U+009B reached env.txt as is (``cat env.txt`` retitled
    the terminal; round 19 B U-1). env.json keeps the text as it was (JSON escapes it)."""
    from nsa_runner._text import visible

    return "\n".join(visible(line) for line in text.split("\n"))


class _Background:
    """``fn()`` in a thread from now; ``result()`` waits for it and returns its value, or raises
    what it raised (as if it had been called where ``result()`` is)."""

    def __init__(self, fn):
        self._out: dict = {}

        def target():
            try:
                self._out["value"] = fn()
            except BaseException as e:  # noqa: BLE001 - handed to result()
                self._out["error"] = e

        self._thread = threading.Thread(target=target, name=getattr(fn, "__name__", "background"), daemon=True)
        self._thread.start()

    def result(self):
        self._thread.join()
        if "error" in self._out:
            raise self._out["error"]
        return self._out["value"]


class EnvPairing(Stage):
    name = "env-pairing"
    order = 10
    requires = ()
    description = "torch / triton / CUDA / driver / flash-attn versions fit together (from facts)"
    timeout_s = 600.0

    def run(self, ctx) -> StageResult:
        if ctx.device == "cpu" and "triton" not in sys.modules:
            os.environ.setdefault("TRITON_INTERPRET", "1")  # the interpreter is Triton's CPU path
        # the flash-attn child (import torch + each flash package: ~10 s with FA-4 on an H100) runs
        # while this process collects its own facts (import torch, a Triton launch, a CUDA op):
        # this side only waits for the child (envinfo._run_probe), so the two overlap (issue 13: the oneshot's wall)
        t0 = time.perf_counter()
        flash_probe = _Background(probe_flash)
        facts = collect()
        wall = facts.pop("wall_s", {})  # seconds per part: where this stage's time goes (issue 13)
        t1 = time.perf_counter()
        flash = flash_probe.result()
        wall["flash child (waited for after the facts)"] = round(time.perf_counter() - t1, 3)
        if not facts["torch"].get("installed"):
            checks = [_check("torch", FAIL, f"import torch failed: {facts['torch']['error']}")]
        else:
            checks = [_check("torch", INFO, f"torch {facts['torch']['version']} ({facts['torch']['build']} build)")]
            checks += _triton_checks(facts, ctx.device)
            checks += _cuda_checks(facts)
        checks += _flash_checks(flash, facts["torch"].get("version"), facts["torch"].get("cuda_runtime"))
        fails = [c["detail"] for c in checks if c["status"] == FAIL]
        status = Status.FAIL if fails else Status.PASS
        if fails:
            reason = "; ".join(fails)
        else:
            by = {c["check"]: c for c in checks}
            tri = by.get("triton-launch", {})
            reason = (f"torch {facts['torch']['version']} ({facts['torch']['build']}), triton "
                      f"{_triton_word(facts['triton'], short=True)}"
                      + (" launch ok" if tri.get("status") == OK else "")
                      + ", flash: " + ", ".join(_flash_word(p) for p in flash))
        env = {"schema_version": 1, "run_id": ctx.run_id, "time": now_iso(), "device": ctx.device,
               "verdict": status.value, "reason": reason, "checks": checks,
               "paths": _paths(facts, {c["check"]: c for c in checks}, ctx.device, flash),
               "flash": flash, "plugins": _plugins(), "facts": facts}
        env["routing_thresholds"], extra = _thresholds_copy(ctx.dir)
        wall["plugins, thresholds, checks"] = round(time.perf_counter() - t0 - sum(wall.values()), 3)
        env["wall_s"] = wall
        write_json(ctx.dir / "env.json", env)
        text = _shown(_render(env))
        write_text(ctx.dir / "env.txt", text)
        print(text)
        return StageResult(status, reason, files=["env.txt", "env.json", *extra],
                           metrics={"checks_failed": len(fails), "torch": facts["torch"].get("version"),
                                    "triton": facts["triton"].get("version")})
