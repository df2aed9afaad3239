"""Facts about this machine's software and accelerator, for env-pairing and for anything that
records "where was this measured" (benchmarks). Each probe returns plain JSON-able dicts and
never raises: a failure is recorded as text.

``collect()`` does not import flash-attn in this process (a broken build can abort the
interpreter): ``probe_flash()`` runs nsa_core.flash.detect (the shared "is it really FA-2 / FA-4"
check) in a child process.
"""

from __future__ import annotations

import ctypes
import importlib.metadata as md
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import textwrap
import time

from nsa_runner import _python
from nsa_runner._python import python_c

# (module, what it is, distribution names that provide it, install hint)
# (what is really FA-2 / FA-4 is decided by nsa_core.flash.detect, not by the module name)
FLASH_MODULES = (
    ("flash_attn", "FA-2", ("flash-attn", "flash_attn"),
     "pip install flash-attn --no-build-isolation  (pick the prebuilt wheel matching torch/CUDA)"),
    ("flash_attn_interface", "FA-3", ("flash-attn-3", "flash_attn_3", "flashattn-hopper"),
     "Hopper only: build flash-attention/hopper (cd hopper && python setup.py install)"),
    ("flash_attn.cute", "FA-4", ("flash-attn-4", "flash-attn-cute"),
     "sm_90+: pip install --pre 'flash-attn-4[cu13]' (offline: bench/prepare_fa4.sh)"),
)
# the nsa_core.flash adapter path that drives each module
FLASH_PATH = {"flash_attn": "fa2", "flash_attn_interface": "fa3", "flash_attn.cute": "fa4"}
# "+cu12torch2.7cxx11abiTRUE": the local version tag of flash-attn's prebuilt wheels
_WHEEL_TAG = re.compile(r"\+cu(?P<cuda>\d+)torch(?P<torch>\d+\.\d+)(?:cxx11abi(?P<abi>TRUE|FALSE))?", re.I)


def dist_fact(*names: str) -> tuple[str | None, str | None]:
    """(version, None) of the first installed of ``names``; (None, None) when none is; (None, a fact naming the file)
    when its metadata cannot be read safely (``detect.safe_distribution``: a FIFO as METADATA hung env-pairing, round
    18 B-1; a latin-1 one: round 20 B20-3, triton's made it "not installed"). Installed but unreadable is no absence:
    a caller decides from what it can see otherwise (the module imports)."""
    from nsa_core.flash.detect import UnreadableDistribution, safe_distribution

    for n in names:
        try:
            dist = safe_distribution(n)
        except md.PackageNotFoundError:
            continue
        except UnreadableDistribution as e:
            return None, f"{e}{_where(n)}"
        except (OSError, UnicodeError) as e:
            return None, f"{n}'s METADATA cannot be read: {type(e).__name__}: {e}{_where(n)}"
        try:
            return dist.version, None
        except UnicodeError:
            return None, f"{n}'s METADATA cannot be read: not UTF-8{_where(n)}"
        except Exception as e:  # noqa: BLE001 - a fact, never an ERROR
            return None, f"{n}'s METADATA cannot be read: {type(e).__name__}: {e}{_where(n)}"
    return None, None


def _where(name: str) -> str:
    """' (in <its dist-info folder>)', or '' (finding a distribution reads folder names only)."""
    try:
        folder = getattr(md.distribution(name), "_path", None)
    except Exception:  # noqa: BLE001
        folder = None
    return f" (in {folder})" if folder is not None else ""


def dist_version(*names: str) -> str | None:
    """The version of the first installed of ``names``; None when none is, or its metadata cannot be read safely
    (``dist_fact`` says which)."""
    return dist_fact(*names)[0]


def _dist_word(*names: str) -> str | None:
    """The version of the first installed of ``names``, 'installed, metadata unreadable: <the fact>' for one whose
    metadata cannot be read (installed all the same), None when none is."""
    version, problem = dist_fact(*names)
    return version if problem is None else f"installed, metadata unreadable: {problem}"


def python_info() -> dict:
    # where this process's bytecode goes: beside the sources, nsa-run's cache (nsa_runner._bytecode:
    # the environment set PYTHONDONTWRITEBYTECODE), or nowhere (every process compiles its imports)
    bytecode = (f"cache {sys.pycache_prefix}" if sys.pycache_prefix
                else "not written (PYTHONDONTWRITEBYTECODE)" if sys.dont_write_bytecode else "beside the sources")
    return {"version": sys.version.split()[0], "implementation": platform.python_implementation(),
            "executable": sys.executable, "platform": platform.platform(), "bytecode": bytecode}


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


def _torch_requires() -> tuple[list[str] | None, str | None]:
    """(torch's Requires-Dist lines, None), (None, a note) when torch's distribution is not found, or (None, a fact
    naming the file) when its metadata cannot be read: read through ``detect.safe_distribution`` (a torch
    dist-info first on sys.path whose METADATA was a FIFO hung env-pairing, a latin-1 one or a link loop made it
    ERROR: round 19 B19-1; importlib reads them blocking and whole)."""
    from nsa_core.flash.detect import UnreadableDistribution, safe_distribution

    try:
        dist = safe_distribution("torch")
    except md.PackageNotFoundError:
        return None, "torch distribution metadata not found"
    except UnreadableDistribution as e:
        return None, str(e)
    except (OSError, UnicodeError) as e:
        return None, f"torch's METADATA cannot be read: {type(e).__name__}: {e}"
    # (an egg-info's requires.txt, read by ``requires``, goes through the same safe reader: a special or huge one
    # raises, named, below)
    try:
        return list(dist.requires or []), None
    except UnicodeError as e:
        return None, f"torch's METADATA cannot be read: not UTF-8 ({e})"
    except Exception as e:  # noqa: BLE001 - facts are best effort: the file's fault said, never an ERROR
        return None, f"torch's METADATA cannot be read: {type(e).__name__}: {e}"


def torch_triton_requirement() -> dict:
    """The triton requirement torch itself declares in its metadata (markers evaluated here); ``note`` says why
    there is none (not declared, torch's metadata not found or not readable: a fact, never a hang or an ERROR)."""
    reqs, problem = _torch_requires()
    if reqs is None:
        return {"declared": None, "raw": [], "note": problem}
    from packaging.requirements import InvalidRequirement, Requirement

    raw = [r for r in reqs if r.split(";")[0].strip().lower().startswith(("triton", "pytorch-triton"))]
    applicable = []
    for r in raw:
        try:
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                applicable.append(req)
        except (InvalidRequirement, ValueError) as e:  # packaging's marker errors are ValueErrors too
            return {"declared": None, "raw": raw,
                    "note": f"torch's METADATA declares a triton requirement that cannot be read: {r!r} ({e})"}
    if not applicable:
        return {"declared": None, "raw": raw,
                "note": "torch declares no triton requirement for this platform"
                        + (" (CPU build)" if "+cpu" in (dist_version("torch") or "") else "")}
    req = applicable[0]
    return {"declared": str(req), "name": req.name, "specifier": str(req.specifier), "raw": raw}


def triton_info() -> dict:
    """Installed triton: its distribution's version; when its metadata cannot be read (``metadata_error``, the fact
    naming the file), whether ``import triton`` works decides, with the module's ``__version__`` (round 20 B20-3: a
    latin-1 or FIFO METADATA made an importable triton "not installed", its launch check skipped)."""
    version, problem = dist_fact("triton", "pytorch-triton", "pytorch-triton-rocm")
    info = {"installed": version is not None, "version": version, "import_error": None}
    if problem is not None:
        info["metadata_error"] = problem
    elif version is None:
        return info
    try:
        import triton

        info["module_version"] = getattr(triton, "__version__", None)
        info["path"] = getattr(triton, "__file__", None)
    except ModuleNotFoundError as e:
        if problem is not None and e.name == "triton":  # a stray dist-info, no triton module: not installed
            return info
        info["import_error"] = f"{type(e).__name__}: {e}"
    except (Exception, SystemExit) as e:  # noqa: BLE001 - a broken install (round 44 B44-2: sys.exit in it)
        info["import_error"] = f"{type(e).__name__}: {e}"
    if problem is not None:
        info["installed"] = True
        mv = info.get("module_version")
        info["version"] = str(mv) if isinstance(mv, str) and mv else None
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


# The child runs nsa_core.flash.detect (loaded from its file, so a broken nsa_core import cannot
# hide the facts): the one detection adapters / routing / fa2-probe use too. A module name is not
# enough: FA-4's wheel leaves an empty `flash_attn` namespace (no FA-2), FA-2's bundles an early
# flash_attn.cute (no FA-4).
# Its records go to a file of their own (argv[3]), never to stdout: the flash package's import writes to stdout /
# stderr, and a progress message without a newline glued onto a record made a working FA-2 "not probed" (round 19
# B19-7). What the packages printed is kept for the stage log, never parsed.
_FLASH_PROBE = textwrap.dedent("""
    import builtins, ctypes, faulthandler, importlib.util, json, os, signal, sys, threading, time, warnings
    faulthandler.enable()
    try:  # a subreaper: a helper a flash package's import starts and orphans comes back here, to be ended below
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
    except Exception:
        pass

    def children():
        out = []
        try:
            for tid in os.listdir("/proc/self/task"):
                with open(f"/proc/self/task/{tid}/children") as f:
                    out += [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            pass
        return out

    def end_helpers():
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            kids = children()
            if not kids:
                return
            for pid in kids:
                for kill in (os.killpg, os.kill):
                    try:
                        kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                pass
            time.sleep(0.01)

    # what a package's import may leave armed or changed that would kill or disturb the next path's detect: a
    # timer (signal.alarm, setitimer), a faulthandler watchdog, signal handlers, the blocked signals, warnings
    # filters, the builtins. Saved before each path, put back after it (round 20 B20-2: an alarm armed by
    # flash_attn's import killed the child during flash_attn_interface's slow import, which was blamed).
    SIGNALS = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]
    TIMERS = [signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF]

    def state():
        handlers = {}
        for s in SIGNALS:
            try:
                handlers[s] = signal.getsignal(s)
            except (OSError, ValueError):
                pass
        # the builtins whole, and the functions of the modules this script calls (an orjson-style json.dumps
        # returning bytes broke the record writing below: "crashed the interpreter", round 24 B24-2): nsa-run's one
        # mechanism for it, nsa_runner/_stdlib_put.py, loaded by its path (argv[2])
        names = stdlib.snapshot(stdlib.MODULES + (faulthandler, warnings, threading))
        limits = stdlib.limits()  # the resource limits (round 27 B27-5: a 10-byte RLIMIT_FSIZE broke the records)
        return handlers, list(warnings.filters), signal.pthread_sigmask(signal.SIG_BLOCK, []), names, limits

    def put_back(saved):
        handlers, filters, mask, names, limits = saved
        stdlib.put_back(names)  # one rebound or deleted is put back; one added is kept (a library's, used later)
        stdlib.put_back_limits(limits)
        signal.alarm(0)
        for t in TIMERS:
            signal.setitimer(t, 0)
        faulthandler.cancel_dump_traceback_later()
        for s, h in handlers.items():
            try:
                if h is not None and signal.getsignal(s) is not h:
                    signal.signal(s, h)
            except (OSError, ValueError, TypeError):
                pass
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        warnings.filters[:] = filters
        getattr(warnings, "_filters_mutated", lambda: None)()
        faulthandler.enable()

    # the threads a package's import leaves running (a watchdog thread, threading.Timer(2, os._exit, [1])) cannot be
    # put back: each path's are told to the parent, which, should the child end during a later path, probes that
    # one again first in a fresh child before blaming it (round 21 B21-3)
    def threads():
        try:
            tids = set(os.listdir("/proc/self/task"))
        except OSError:
            tids = set()
        try:
            named = {t.ident: str(t.name)[:60] for t in list(threading._active.values())}
        except Exception:
            named = {}
        return tids, named

    # a copy a package's import forked (a helper) that comes back here ends as it would in plain Python and writes no
    # record (round 23 B23-6): SystemExit with its code, an exception (detect caught it) with status 1
    GETPID = os.getpid  # (as before any package's import: one may leave it patched, round 24 B24-2)
    ME = GETPID()

    def copy_ends(e, rec):
        if GETPID() == ME:
            return
        code = 0
        try:
            if isinstance(e, SystemExit):
                code = (e.code or 0) & 0xFF if e.code is None or type(e.code) is int else 1
            elif e is not None or (rec.get("error") and not rec.get("present")):
                code = 1
                if e is not None:
                    __import__("traceback").print_exception(e)
                else:
                    print(rec.get("error"), file=sys.stderr)
            sys.stderr.flush()
        except BaseException:
            code = code or 1
        os._exit(code)

    def load(name, path):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    det = load("_nsa_flash_detect", sys.argv[1])
    stdlib = load("_nsa_stdlib_put", sys.argv[2])

    def record(obj):  # the records file opened by its name for each record: a package's import may close every
        try:  # inherited descriptor (round 24 B24-4)
            records = open(sys.argv[3], "a", encoding="utf-8")
        except FileNotFoundError:  # or remove the probe's folder (round 25 B25-2): made again, the records go on
            os.makedirs(os.path.dirname(sys.argv[3]), exist_ok=True)
            records = open(sys.argv[3], "a", encoding="utf-8")
        with records:
            records.write(json.dumps(obj) + "\\n")

    for path in sys.argv[4:]:
        record({"path": path, "start": True})
        saved, before = state(), threads()
        try:
            rec = det.detect(path)
        except BaseException as e:
            copy_ends(e, {})
            raise
        finally:
            put_back(saved)
        copy_ends(None, rec)
        tids, named = threads()
        if tids - before[0]:
            python = [n for i, n in named.items() if i not in before[1]]
            record({"path": path, "threads": {"n": len(tids - before[0]), "python": python[:5],
                                              "python_n": len(python)}})
        record(rec)
    end_helpers()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # a thread a package's import left running never holds this process up
""")


def detect_file() -> str | None:
    """nsa_core/flash/detect.py, located without importing nsa_core."""
    import importlib.util
    from pathlib import Path

    try:
        spec = importlib.util.find_spec("nsa_core")
    except (ImportError, ValueError):
        return None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        f = Path(loc) / "flash" / "detect.py"
        if f.is_file():
            return str(f)
    return None


_STDLIB_PUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_stdlib_put.py")  # the probe loads it by path
PROBE_ENV = "NSA_RUN_FLASH_PROBE"  # marks the probe child and all it starts (``_end_probe``)
PROBE_OUTPUT_MAX = 8000  # characters of what the probe child printed, kept for the stage log (its end)
# the stage's own temp folder (the worker's, removed by the runner on every way out): the probe's files go there, never
# left in TMPDIR when the stage is stopped (round 24 B24-5)
STAGE_TMP_ENV = "NSA_RUN_STAGE_TMP"


def _run_probe(cmd: list[str], output: str, timeout_s: float) -> tuple[int | None, str, str]:
    """(exit status or None, why it was stopped: "" / "timeout" / "flooded" (its output past ``_python.OUTPUT_CAP``),
    the end of what it printed) of the probe child ``cmd``.

    Its stdout / stderr go to the file ``output``, never to a pipe: a flash package whose import starts a helper
    process inheriting them kept the pipes open, and env-pairing waited for their EOF to its 300 s timeout
    (round 19 B19-6). Here the child is waited for, then its whole tree is ended (``_end_probe``), then the file
    is read."""
    import secrets

    token = secrets.token_hex(8)
    env = {**os.environ, PROBE_ENV: token}
    # the file is watched and read through this descriptor, never by its name again: a package renaming or
    # unlinking the file behind its stdout, or removing the probe's folder, went on printing past the cap (round 25
    # B25-2: 200 MiB written against 64)
    out = open(output, "w+b")  # noqa: SIM115 - closed below, after the read
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    except BaseException:
        out.close()
        raise
    try:
        return _wait_probe(proc, out, token, timeout_s)
    finally:
        out.close()


def _wait_probe(proc: subprocess.Popen, out, token: str, timeout_s: float) -> tuple[int | None, str, str]:
    """``_run_probe``'s wait, stop and read, ``out`` its output file open."""
    # waited for without being reaped (WNOWAIT): while it is a zombie its pid, which names its process group, is
    # nobody else's, so the group kill below cannot reach another process
    deadline, stopped = time.monotonic() + timeout_s, "timeout"
    try:
        while time.monotonic() < deadline:
            try:
                if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                    stopped = ""
                    break
            except ChildProcessError:
                stopped = ""
                break
            try:
                if os.fstat(out.fileno()).st_size > _python.OUTPUT_CAP:  # past it, stopped as at its timeout
                    stopped = "flooded"
                    break
            except OSError:
                pass
            time.sleep(0.02)
    finally:
        _end_probe(proc, token)
    rc = None if stopped else proc.returncode
    try:
        size = os.fstat(out.fileno()).st_size
        printed = os.pread(out.fileno(), 4 * PROBE_OUTPUT_MAX, max(0, size - 4 * PROBE_OUTPUT_MAX))
        printed = printed.decode("utf-8", "replace")[-PROBE_OUTPUT_MAX:]
    except OSError:
        printed = ""
    return rc, stopped, printed


def _end_probe(proc: subprocess.Popen, token: str) -> None:
    """Kill (SIGKILL) the probe child and everything it started: its descendants, its process group (a session
    of its own) and every process of this user carrying ``token`` in ``PROBE_ENV`` (a helper that left the
    session; the child itself, a subreaper, ends what was re-parented to it before it exits)."""
    import signal

    import psutil

    for stop in (os.killpg, os.kill):  # frozen first: the listing below takes a while, and a child printing at full
        try:  # speed went on meanwhile (round 25 U25-1: 195 MiB written against the 64 MiB cap)
            stop(proc.pid, signal.SIGSTOP)
        except OSError:
            pass
    victims: dict[int, psutil.Process] = {}
    try:  # (not reaped yet: the pid is still the child's)
        victims.update((c.pid, c) for c in psutil.Process(proc.pid).children(recursive=True))
    except psutil.Error:
        pass
    for kill in (os.kill, os.killpg):
        try:
            kill(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    me, uid = os.getpid(), os.getuid()
    for p in psutil.process_iter(["uids"]):
        try:
            if p.pid in victims or p.pid == me or p.info["uids"] is None or p.info["uids"].real != uid:
                continue
            if p.environ().get(PROBE_ENV) == token:
                victims[p.pid] = p
        except psutil.Error:
            continue
    for p in victims.values():
        try:
            p.kill()
        except psutil.Error:
            pass
    proc.wait()  # reaped only now


def _read_records(held: int, path: str) -> list[str]:
    """The probe child's record lines (a file only it writes; at most 16 MiB read): those in the file open as
    ``held``, then those of a file the child made again at ``path`` (its folder was removed)."""
    def read(fd: int) -> list[str]:
        try:
            return os.pread(fd, 16 << 20, 0).decode("utf-8", "replace").splitlines()
        except OSError:
            return []

    lines = read(held)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return lines
    try:
        again, first = os.fstat(fd), os.fstat(held)
        if (again.st_dev, again.st_ino) != (first.st_dev, first.st_ino):
            lines += read(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
    return lines


def _probe_children(det: str, paths: list[str], timeout_s: float) -> tuple[dict[str, dict], dict[str, str], str]:
    """Run the probe child on ``paths`` and, when it dies during path i (an abort, an exit, a timer a package left
    armed), blame path i and probe the paths after it again in a fresh child, until every path is probed or a child
    probes nothing new; all within ``timeout_s`` (round 20 B20-2: the paths after a crash were "not probed", and
    FA-4, not even installed, was BROKEN). Returns (records by path, why each crashed path is blamed, why the
    paths left were not probed)."""
    import tempfile

    recs: dict[str, dict] = {}
    crashed: dict[str, str] = {}
    # round 21 B21-3: a path during which the child ended while threads earlier paths' imports left were running
    # -> {"leavers": {path: their "threads" line}, "status": how it ended}: probed again first in the next child,
    # blamed only if it ends that one too, else the leavers are (``_blame_threads``)
    suspects: dict[str, dict] = {}
    # round 23 B23-1: a path that failed (a broken record) after another path was probed in the same child: probed
    # again, first, in the next child before it is blamed (flash_attn's import set time.time to a raising function
    # and flash_attn_interface, whose import calls it, was FA-3 BROKEN); its first record is kept should no child
    # probe it again. (A path during which the child ENDS is blamed, as before, unless threads earlier paths left ran)
    retried: set[str] = set()
    deferred: dict[str, dict] = {}
    left, why_left = list(paths), ""
    deadline = time.monotonic() + timeout_s
    while left:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            why_left = f"timed out after {timeout_s:g}s"
            break
        stage_tmp = os.environ.get(STAGE_TMP_ENV) or None
        if stage_tmp is not None and not os.path.isdir(stage_tmp):
            stage_tmp = None
        with tempfile.TemporaryDirectory(prefix="nsa-flash-probe-", dir=stage_tmp) as tmp:
            result = os.path.join(tmp, "records.jsonl")
            # held open from the start: a package removing the probe's folder takes the records written before with
            # it (round 25 B25-2: FA-2's "start" lost, every path "not probed"); the child makes the file again
            held = os.open(result, os.O_RDONLY | os.O_CREAT, 0o600)
            try:
                rc, stopped, printed = _run_probe(python_c(_FLASH_PROBE, det, _STDLIB_PUT, result, *left),
                                                  os.path.join(tmp, "output.txt"), remaining)
                lines = _read_records(held, result)
            finally:
                os.close(held)
        timed_out = stopped == "timeout"  # out of time; a child stopped at the output cap: the paths after go on
        if printed.strip():  # for the stage log only: what the flash packages printed is never parsed
            print(f"# the flash probe's child printed (not parsed):\n{printed}", file=sys.stderr, flush=True)
        stderr = {"timeout": f"timed out after {timeout_s:g}s", "flooded": _python.flooded("its import")}.get(stopped,
                                                                                                           printed)
        status = f"exit status {rc}" if rc is not None else stderr
        tail = "" if stopped else " | ".join(stderr.strip().splitlines()[-3:])  # (stopped: said once, in status)
        started, threaded, first = None, {}, None
        for line in lines:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict) or rec.get("path") not in left:
                continue
            if rec.get("start"):
                started = rec["path"]
                first = started if first is None else first
            elif isinstance(rec.get("threads"), dict):
                threaded[rec["path"]] = rec["threads"]
            elif rec["path"] != first and rec["path"] not in retried and not rec.get("present") \
                    and not rec.get("not_installed"):  # broken after another path's import: probed again alone
                retried.add(rec["path"])
                deferred[rec["path"]] = rec
                started = None
            else:
                recs[rec["path"]] = rec
                started = None
                held = suspects.pop(rec["path"], None)
                if held is not None:  # it imports fine in a process of its own: the leavers' threads ended it
                    _blame_threads(recs, crashed, held["leavers"], held["status"], rec["path"])
        if started is not None:
            leavers = {p: v for p, v in threaded.items() if p != started and p in recs}
            if leavers and not stopped and started not in suspects:  # probed again, first, in the next child
                suspects[started] = {"leavers": leavers, "status": status}
            else:
                crashed[started] = (status if stopped == "flooded" else
                                    f"import crashed the interpreter ({status}) {tail}".strip())
                suspects.pop(started, None)
        done = [p for p in left if p in recs or p in crashed]
        left = [p for p in left if p not in done]
        why_left = f"({status}) {tail}".strip()
        if not done or timed_out:
            break
    for path, rec in deferred.items():  # never probed again (out of time): what was seen stands
        if path not in recs and path not in crashed:
            recs[path] = rec
    return recs, crashed, why_left


def _blame_threads(recs: dict[str, dict], crashed: dict[str, str], leavers: dict[str, dict], status: str,
                   later: str) -> None:
    """The probe paths (``recs``, probed already) whose imports left threads running when the probe child ended
    (``status``) during path ``later``, which is fine in a child of its own: moved to ``crashed`` with that evidence
    (round 21 B21-3: a watchdog thread flash_attn's import left ended the child in flash_attn_interface's import,
    FA-3 was BROKEN). Those that left Python threads when any did (a thread started from C is weaker evidence)."""
    def count(info: dict, key: str) -> int:
        n = info.get(key)
        return n if type(n) is int and n > 0 else 0

    module = {v: k for k, v in FLASH_PATH.items()}
    python = {p: v for p, v in leavers.items() if count(v, "python_n")}
    blamed = python or leavers
    for path, info in blamed.items():
        names = [re.sub(r"[^ -~]", "?", str(x)[:40]) for x in info.get("python") or [] if isinstance(x, str)]
        said = (f" (Python: {', '.join(names[:5])})" if names else
                "" if count(info, "python_n") else " (started from C: no Python thread)")
        others = [module.get(o, o) for o in blamed if o != path]
        also = f"; so did {', '.join(others)}" if others else ""
        recs.pop(path, None)
        crashed[path] = (f"its import left {count(info, 'n') or 1} thread(s) running{said}; the probe process ended "
                         f"({status}) while they ran, during a later import ({module.get(later, later)}, which imports "
                         f"fine in a process of its own){also}")


def probe_flash(timeout_s: float = 300.0) -> list[dict]:
    """Detect each flash-attn package in a child process (``nsa_core.flash.detect``); one record per
    package.

    Record: ``{"module", "what", "hint", "path", "ok", "version", "not_installed", "reason",
    "error", "dist_version", "build"}``. ``ok``: the real package imports and has what nsa-run
    calls; ``not_installed``: absent, ``reason`` says what is there instead (e.g. "absent (the
    `flash_attn` package here is FA-4's namespace: flash_attn.cute only, ...)"); neither: broken
    (``error``). An import that kills the child (abort, segfault) is recorded as an error with the
    exit status; the packages after it are probed in a fresh child (``_probe_children``).
    """
    paths = [FLASH_PATH[m] for m, *_ in FLASH_MODULES]
    det = detect_file()
    if det is None:
        recs, crashed, why_left = {}, {}, "(nsa_core/flash/detect.py not found (nsa_core not installed?))"
    else:
        recs, crashed, why_left = _probe_children(det, paths, timeout_s)
    out = []
    for mod, what, dists, hint in FLASH_MODULES:
        path = FLASH_PATH[mod]
        d = recs.get(path)
        installed, unreadable = dist_fact(*dists)
        if d is None and path == "fa4" and "fa2" in crashed and path in crashed and installed is None \
                and unreadable is None:
            # locating flash_attn.cute imports its parent flash_attn, whose import kills the interpreter (FA-2's
            # crash, blamed there); with no flash-attn-4 distribution that is no broken FA-4 (detect's own rule
            # for a parent that raises)
            why = ("not installed (no flash-attn-4 distribution; locating flash_attn.cute imports flash_attn, "
                   "whose import crashed the interpreter: see FA-2)")
            rec = {"module": mod, "ok": False, "not_installed": True, "version": None, "file": None,
                   "error": "", "reason": why}
        elif d is None:
            err = crashed.get(path) or f"not probed {why_left}".strip()
            rec = {"module": mod, "ok": False, "not_installed": False, "version": None, "file": None,
                   "error": err, "reason": err}
        else:
            rec = {"module": mod, "ok": bool(d.get("present")), "not_installed": bool(d.get("not_installed")),
                   "version": d.get("version"), "file": d.get("file"), "reason": d.get("reason") or "",
                   "error": d.get("error") or ("" if d.get("present") or d.get("not_installed")
                                               else d.get("reason") or "unknown"),
                   "dist": d.get("dist")}
        rec.update({"what": what, "hint": hint, "dist_version": installed, "path": path})
        try:
            rec["build"] = flash_build(dists)
        except Exception as e:  # noqa: BLE001 - facts are best effort, never a crash
            rec["build"] = {"error": f"{type(e).__name__}: {e}"}
        out.append(rec)
    return out


def cuda_major(tag: str | None) -> int | None:
    """'12' / '124' / '12.4' / '118' -> 12 / 12 / 12 / 11 (CUDA majors are 10..13)."""
    if not tag:
        return None
    digits = tag.split(".")[0] if "." in tag else tag[:2]
    return int(digits) if digits.isdigit() else None


def needed_libs(path) -> tuple[list[str], str]:
    """The shared libraries a compiled extension asks for: (names, method). ``readelf -d`` when
    it is installed (the DT_NEEDED entries), else the ``lib*.so*`` names in the file's first
    32 MiB (the dynamic string table sits near the start of an ELF file)."""
    exe = shutil.which("readelf")
    if exe:
        try:
            r = subprocess.run([exe, "-d", str(path)], capture_output=True, text=True, timeout=60)
            if r.returncode == 0 and "Dynamic section" in r.stdout:
                return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", r.stdout), "readelf -d"
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        with open(path, "rb") as f:
            data = f.read(32 << 20)
    except OSError as e:
        return [], f"unreadable: {e}"
    names = {m.decode() for m in re.findall(rb"(lib[A-Za-z0-9_+\-]+\.so(?:\.[0-9]+)*)\x00", data)}
    return sorted(names), "strings in the file (no readelf)"


def flash_build(dists: tuple[str, ...]) -> dict:
    """What an installed flash package was built for, from facts on disk (no import):
    the distribution's version and its wheel tag (``+cu12torch2.7cxx11abiTRUE`` in the version or
    in direct_url.json), the CUDA runtime / torch libraries its compiled extensions link, and for
    FA-4 the CUDA flavour of the CuTe DSL libraries (nvidia-cutlass-dsl-libs-cu12 / -cu13)."""
    from nsa_core.flash.detect import UnreadableDistribution, safe_distribution

    dist = None
    for n in dists:
        try:
            dist = safe_distribution(n)
            break
        except md.PackageNotFoundError:
            continue
        except (UnreadableDistribution, UnicodeError) as e:
            return {"dist": n, "error": f"its metadata cannot be read: {e}"}
    if dist is None:
        return {}
    try:  # (safe_distribution checked the files are regular and bounded; an undecodable one is said, naming it)
        name, version, direct, files = (dist.metadata["Name"], dist.version, dist.read_text("direct_url.json") or "",
                                        dist.files or [])
    except UnicodeError as e:
        return {"dist": n, "error": f"{n}'s metadata cannot be read: not UTF-8 ({e})"}
    out: dict = {"dist": name or n, "version": version, "wheel_tag": None,
                 "extensions": [], "cuda_needed": [], "links_torch": False}
    m = _WHEEL_TAG.search(version or "") or _WHEEL_TAG.search(direct)
    if m:
        out["wheel_tag"] = {"text": m.group(0), "cuda": m["cuda"], "torch": m["torch"], "cxx11abi": m["abi"]}
    for f in files:
        if not (f.name.endswith(".so") or ".so." in f.name):
            continue
        p = f.locate()
        if not p.is_file():
            continue
        libs, how = needed_libs(p)
        out["extensions"].append({"file": str(f), "needed": libs, "method": how})
        for lib in libs:
            cm = re.match(r"libcudart\.so\.(\d+)", lib)
            if cm and int(cm[1]) not in out["cuda_needed"]:
                out["cuda_needed"].append(int(cm[1]))
            if re.match(r"lib(c10|torch)(_cuda|_cpu|_python)?\.so", lib):
                out["links_torch"] = True
    # (an installed one whose metadata cannot be read is installed all the same, said: ``_dist_word``)
    libs_flavour = {fl: v for fl in ("cu12", "cu13") if (v := _dist_word(f"nvidia-cutlass-dsl-libs-{fl}"))}
    if out["dist"].lower().replace("_", "-").startswith("flash-attn-4"):
        out["cutlass_dsl_libs"] = libs_flavour
        out["related"] = {n: _dist_word(n) for n in ("nvidia-cutlass-dsl", "quack-kernels", "apache-tvm-ffi",
                                                     "torch-c-dlpack-ext")}
    parts = []
    if out["wheel_tag"]:
        t = out["wheel_tag"]
        parts.append(f"torch {t['torch']}, CUDA {cuda_major(t['cuda'])} (wheel tag {t['text']})")
    if out["extensions"]:
        linked = sorted({lib for e in out["extensions"] for lib in e["needed"]
                         if lib.startswith(("libcudart", "libc10", "libtorch"))})
        parts.append("extension links " + (", ".join(linked) or "no CUDA runtime / torch library"))
    if out.get("cutlass_dsl_libs") is not None:
        fl = out["cutlass_dsl_libs"]
        parts.append("pure Python, JIT through the CuTe DSL; its libraries for "
                     + (", ".join(f"CUDA {k[2:]} ({v})" for k, v in fl.items()) or "no CUDA (libs missing)"))
    out["built_for"] = "; ".join(parts) or "no build facts found (no wheel tag, no compiled extension)"
    return out


def collect() -> dict:
    """Everything but flash (see ``probe_flash``) and the pairing verdict; ``wall_s``: seconds per
    part (where env-pairing's time goes, issue 13)."""
    out: dict = {"wall_s": {}}
    for key, fn in (("python", python_info), ("torch", torch_info),
                    ("torch_triton_requirement", torch_triton_requirement), ("triton", triton_info),
                    ("gpu", gpu_info), ("nvidia_smi", nvidia_smi)):
        t0 = time.perf_counter()
        out[key] = fn()
        out["wall_s"][key] = round(time.perf_counter() - t0, 3)
    return out
