"""Child-process side of plugin discovery: ``python -m nsa_runner._discover RESULT`` (private).

The parent (``nsa_runner.registry.discover_group``) writes a JSON request on stdin::

    {"group": "nsa_runner.stages", "describe": "module:function", "sys_path": [...],
     "skip": [key, ...], "only": key | null, "parse": {"key": key, "args": [...]} | null,
     "keys": [key, ...] | null, "paths": [metadata folder, ...] | null}

(``keys`` / ``paths``: only those entry points of those metadata folders: nsa-run's own, described
in a child that imports no plugin.)

For every entry point of ``group`` (except the keys in ``skip``; only ``only`` when given) the
child appends ``{"loading": key}`` to RESULT, imports it, and appends ``{"entry": record}`` with
what ``describe(obj, ep)`` returned (a JSON-able dict) or the error (``"retry": true`` with it when another
plugin's import ran in this process first: the parent imports it again alone before blaming it; before it
``{"threads": {"key", "n", "python", "python_n"}}`` when the import left threads running: the parent's
evidence should the child end during a later import, ``threads_left``). ``{"done": NONCE}`` (the
request's ``nonce``) ends a complete pass; the parent checks every record again (plugin code ran
here). A plugin whose import segfaults, hangs or calls ``os._exit`` leaves a ``loading``
line without its ``entry``: the parent names that plugin as broken and starts a new child for the
rest. The imports run in a fork of this process (``_worker.keep_orphans``), which appends
``{"ended": exit status, "nonce": NONCE}`` when that child ends and keeps what it left
running. The child's stdout and stderr are not the CLI's: a plugin that prints on import changes
nothing the user sees.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import importlib.metadata as md
import json
import os
import re
import socket
import sys
import time
import traceback

# this process's exit status when it cannot write its result file (a full temp folder): the parent
# (``registry.discover_group``) then checks the folder itself, so a plugin's os._exit(228) stays its own
EXIT_TEMP_FULL = 228


@contextlib.contextmanager
def stdout_parked():
    """(The CLI, while plugin discovery runs plugin code in its children) the CLI's stdout held where no
    other process can reopen it: round 16 A9, a plugin's import opened ``/proc/<cli pid>/fd/1`` (the
    CLI's pid is in its environment; same user, so /proc lets it) and wrote into ``list --json``'s
    stdout, which was no longer JSON. While parked, the CLI's stdout descriptor is in flight in a Unix
    socket of its own (SCM_RIGHTS: no name under /proc/<cli pid>/fd opens a socket's queue) and fd 1 is
    /dev/null; it is put back when discovery ends (its children and what they started killed by then).
    Chosen over making the CLI non-dumpable (PR_SET_DUMPABLE 0): that does not stop a process with
    CAP_SYS_PTRACE (root in most containers, where nsa-run runs), and it takes away the
    ``/proc/<runner pid>/fd/<n>`` names (``artifacts.fd_path``) the runner gives its workers for their temp
    folders. Not parked in a stage's worker or a discovery child (the cookie in the environment): their
    stdout is a log. (A plugin can still reach whatever else of the user's holds that pipe or terminal,
    e.g. the reading end in the consumer: nsa-run keeps only its own descriptors out of reach.)"""
    if os.environ.get("NSA_RUN_STAGE_COOKIE"):
        yield
        return
    try:
        sys.stdout.flush()
    except (OSError, ValueError, AttributeError):
        pass
    parked = None
    try:
        os.fstat(1)
        ours, held = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            socket.send_fds(ours, [b"1"], [1])
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, 1)
            finally:
                os.close(null)
            parked = (ours, held)
        except OSError:
            ours.close()
            held.close()
    except OSError:  # no stdout (closed), no Unix sockets: nothing to park
        parked = None
    try:
        yield
    finally:
        if parked is not None:
            ours, held = parked
            try:
                _, fds, _, _ = socket.recv_fds(held, 16, 1)
                for fd in fds[:1]:
                    os.dup2(fd, 1)
                for fd in fds:
                    os.close(fd)
            except OSError:
                pass
            ours.close()
            held.close()


def entry_key(dist_name: str, ep: md.EntryPoint) -> str:
    return "\t".join((dist_name.lower().replace("_", "-").replace(".", "-"), ep.name, ep.value))


ERROR_CHARS = 4000  # a failed import's message as the child records it (the parent clips it again)
TRACEBACK_CHARS = 20_000  # its traceback (frames + the clipped message)


def _why(e: BaseException) -> str:
    """``TYPE: message`` of what a plugin's import raised, clipped (round 15 B-R6: a 20 MB message went
    whole into every record); its ``__str__`` is plugin code: never raising here."""
    try:
        text = str(e)
        text = text if type(text) is str else str.__getitem__(text, slice(0, None))
        name = type(e).__name__
        name = name if type(name) is str else "object"
    except BaseException:  # noqa: BLE001 - a hostile __str__ (even SystemExit)
        text, name = "<unprintable>", "object"
    line = " ".join(text[:2 * ERROR_CHARS].split())
    if len(line) > ERROR_CHARS or len(text) > 2 * ERROR_CHARS:
        line = f"{line[:ERROR_CHARS]}… (clipped by nsa-run, of {len(text)} characters)"
    return f"{name}: {line}" if line else name


def _traceback() -> str:
    """The traceback of the exception being handled: its frames, then ``_why`` (the type and the clipped
    message, so a 3 MB message never crowds out the type), at most TRACEBACK_CHARS: the first quarter and
    the end, with a marker saying how much was clipped in between."""
    try:
        e = sys.exc_info()[1]
        tb = "Traceback (most recent call last):\n" + "".join(traceback.format_tb(e.__traceback__)) + _why(e) + "\n"
    except BaseException:  # noqa: BLE001 - formatting runs the plugin's __str__ / __repr__
        return ""
    if len(tb) <= TRACEBACK_CHARS:
        return tb
    head = TRACEBACK_CHARS // 4
    tail = TRACEBACK_CHARS - head - 80
    return f"{tb[:head]} … [{len(tb) - head - tail} characters clipped by nsa-run] … {tb[len(tb) - tail:]}"


_NOTES: list = []  # (in the discovery child, while an entry point is described) where ``note`` writes
# (in the discovery child) the pid of the process that imports and reports: the one ``keep_orphans`` forked, or
# an isolating fork. Any other process reaching nsa-run's code here is a copy a plugin's ``os.fork()`` made
# (``forked_copy_end``)
_REPORTER: list[int] = []
# os.getpid as it was at nsa-run's import: a plugin may leave it patched (``unittest.mock.patch("os.getpid")``), and
# every process then looked like a forked copy (round 24 B24-2: a healthy plugin "ended the discovery process")
_GETPID = os.getpid


def forked_copy_end(e: BaseException | None) -> None:
    """End this process when it is not the discovery child's reporting process (``_REPORTER``) but a copy a
    plugin's import forked that came back into nsa-run's code (round 23 B23-6: a helper forked at import that ends
    with ``sys.exit(0)``, ``os._exit`` meant, unwound into this child's handlers, and the copy reported the plugin
    broken "SystemExit: 0", the real import's record coming second, at random). It ends as it would have in plain
    Python, and writes nothing to nsa-run's channels: SystemExit with its code (a non-int code printed to its
    stderr, status 1), another exception with its traceback on its stderr (status 1), a copy that returned from
    the import quietly (status 0; plain Python would run the importer's program on, here nsa-run's report)."""
    if not _REPORTER or _GETPID() == _REPORTER[0]:
        return
    code = 0
    try:
        if isinstance(e, SystemExit):
            c = e.code
            if c is None or type(c) is int:
                code = (c or 0) & 0xFF
            else:
                print(c, file=sys.stderr)
                code = 1
        elif isinstance(e, KeyboardInterrupt):
            code = 130
        elif e is not None:
            traceback.print_exception(type(e), e, e.__traceback__)
            code = 1
        sys.stderr.flush()
    except BaseException:  # noqa: BLE001 - its __str__ is plugin code
        code = code or 1
    os._exit(code)


def note(obj: dict) -> None:
    """(The ``describe`` function, in the discovery child) a line for the parent about the entry point
    being described, written before plugin code runs again: ``{"parsing": {"stage", "option"}}`` before
    an option's ``parse`` (round 17 U-7: a parse that hung or ended the process was reported as the
    plugin's import). Nothing outside a discovery child."""
    if _NOTES:
        _NOTES[0](obj)


def _resolve(spec: str):
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def _load_distfiles():
    """nsa_core/_distfiles.py, the one safe reader of installed distributions' files, loaded from its file
    beside the running nsa_runner without importing the nsa_core package (its ``__init__`` imports torch,
    whose import reads every distribution's entry_points.txt: what the reader exists to check first)."""
    import importlib.util

    name = "nsa_core._distfiles"
    mod = sys.modules.get(name)
    if mod is None:
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "nsa_core", "_distfiles.py")
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            sys.modules.pop(name, None)
            raise
    return mod


_distfiles = _load_distfiles()
MAX_DIST_FILE_BYTES = _distfiles.MAX_DIST_FILE_BYTES
UnreadableDistFile = _distfiles.UnreadableDistFile
read_dist_file = _distfiles.read_dist_file
SafeDistribution = _distfiles.SafeDistribution
# ``importlib.metadata.distributions()``, a metadata folder's each as a SafeDistribution. Read a
# distribution's ``entry_points`` first and its ``metadata`` only when it declares the group wanted:
# a package that is no plugin then never matters, whatever its other files are.
distributions = _distfiles.distributions


def _dist_stem_name(where: str) -> str:
    base = os.path.basename(where.rstrip("/"))
    for ext in (".dist-info", ".egg-info"):
        if base.endswith(ext):
            return base[:-len(ext)].partition("-")[0] or base
    return base


def _broken_distribution(dist: md.Distribution, group: str, e: Exception) -> dict | None:
    """The record naming a distribution whose metadata cannot be read as broken, when its
    ``entry_points.txt`` may declare ``group`` (its raw bytes name the group's section, or there is
    no way to tell: it cannot be read itself); None for a distribution that plainly declares other
    groups only. Read here through ``SafeDistribution`` only (``raw``: what was read already)."""
    where = str(getattr(dist, "_path", "?"))
    raw = getattr(dist, "raw", None)
    text = raw.get("entry_points.txt", False) if isinstance(raw, dict) else False
    if text is None or (isinstance(text, bytes) and f"[{group}]".encode() not in text):
        return None
    try:  # its Name, when its METADATA says one (read safely: SafeDistribution)
        name = str(dist.metadata["Name"] or "") or _dist_stem_name(where)
    except Exception:  # noqa: BLE001 - unreadable, not UTF-8, none at all: the folder's name
        name = _dist_stem_name(where)
    name = re.sub(r"[^A-Za-z0-9._-]", "_", name[:100]) or "?"
    why = str(e) if isinstance(e, UnreadableDistFile) else f"{type(e).__name__}: {str(e)}"
    key = "\t".join((name.lower(), "invalid:distribution", where))
    return {"key": key, "name": f"{name}:distribution", "value": where, "dist": name, "version": "?",
            "error": f"distribution {name} ({where}): its metadata cannot be read "
                     f"({' '.join(why.split())[:300]}); its entry points of {group} are left out, "
                     f"the other distributions' are not"}


def group_distributions(group: str, paths=None):
    """(dist, its Name, its entry points of ``group``, None) for every installed distribution declaring
    some, read safely (``distributions``: never a FIFO's wait nor an unbounded read), or (dist, name, [],
    the ``_broken_distribution`` record) for one whose metadata cannot be read; a distribution of other
    groups only is passed over, its METADATA never read. ``paths``: only those metadata folders (real
    paths). Not deduplicated (the caller's ``entry_key``s: the first on sys.path wins). Shared by
    discovery and the env-pairing stage's plugin list (round 18 B-1: it read them through
    importlib.metadata and hung on a plugin's METADATA FIFO)."""
    for dist in distributions():
        if paths is not None and os.path.realpath(str(getattr(dist, "_path", "") or "")) not in paths:
            continue
        try:  # one distribution's broken metadata (any group) never hides the others
            eps = [ep for ep in dist.entry_points if ep.group == group]
            if not eps:  # none of the group: its METADATA never read (round 17 U-6: a FIFO there stopped every
                continue  # command of nsa-run, though the package was no plugin at all)
            dist_name = dist.metadata["Name"] or "?"
        except Exception as e:  # noqa: BLE001 - malformed / binary entry_points.txt, METADATA, a FIFO, ...
            rec = _broken_distribution(dist, group, e)
            if rec is not None:
                yield dist, rec["dist"], [], rec
            continue
        yield dist, dist_name, eps, None


@contextlib.contextmanager
def plugin_import():
    """(The discovery child) around one plugin's import and description: the process's state that code may
    leave changed is put back after it, so the next plugin is imported in the child's own state (round 19
    B19-5: p-aa's import set ``warnings.simplefilter("error")`` and the next, healthy plugin, whose import
    warns, was listed broken and recorded ERROR by ``oneshot --only`` it; an alarm p-aa armed killed the
    child while it imported the next one, blamed). What ``impls.adapter_code`` puts back after an adapter
    (signal handlers and mask, armed alarms / interval timers and a faulthandler
    watchdog cancelled, the recursion limit, cwd,
    os.environ, sys.stdin / stdout / stderr and fds 0-2, resource limits, random generators, torch's modes
    and attributes, sys.path, sys.meta_path, sys.path_hooks, sys.path_importer_cache: entries taken away put back
    in front, entries added kept, ``_stdlib_put.put_back_import_state``; the umask, the trace and profile functions,
    the switch interval, socket's default timeout, the garbage collector's switch ...: ``_interpreter_settings``),
    and the warnings filters, and the builtins and the standard library's functions nsa-run's own code calls
    (``_stdlib_put``: a wrapped ``builtins.__import__``, round 22 B22-3; an orjson-style ``json.dumps`` made this
    child's own record writing fail, round 24 B24-2), once more after the filters' own put-back."""
    import warnings

    from nsa_runner import _stdlib_put
    from nsa_runner.impls import adapter_code

    saved = {"stdlib": _stdlib_put.snapshot_loaded()}
    filters = warnings.catch_warnings()
    filters.__enter__()
    try:
        with adapter_code():
            yield
    finally:
        for put in (lambda: filters.__exit__(None, None, None),
                    lambda: _stdlib_put.put_back(saved["stdlib"])):  # builtins, json.dumps, os.replace ...
            try:  # each on its own: one that cannot be put back never keeps the others
                put()
            except Exception:  # noqa: BLE001
                pass


def threads_now() -> tuple[set[str], dict[int, str]]:
    """This process's threads: the OS's (``/proc/self/task``: a thread started from C too) and Python's
    (``threading``: their names), for ``threads_left``."""
    import threading

    try:
        tids = set(os.listdir("/proc/self/task"))
    except OSError:
        tids = set()
    try:
        named = {t.ident: str(t.name)[:60] for t in list(threading._active.values())}  # (no plugin's enumerate)
    except Exception:  # noqa: BLE001
        named = {}
    return tids, named


def threads_left(before: tuple[set[str], dict[int, str]]) -> dict | None:
    """``{"n": threads started since ``before`` and still running, "python": their Python names (the first
    few)}``, or None when none is (round 21 B21-3: a watchdog thread one plugin's import left, e.g.
    ``threading.Timer(2, os._exit, [1])``, ended the child during the next plugin's import, which was
    blamed: the parent, with this evidence, imports that one again in a fresh child before blaming it)."""
    tids, named = threads_now()
    new = tids - before[0]
    if not new:
        return None
    python = [name for ident, name in named.items() if ident not in before[1]]
    return {"n": len(new), "python": python[:5], "python_n": len(python)}


def _cannot_write(e: OSError) -> None:
    """The result file cannot grow (a full temp folder: ENOSPC / EDQUOT): end with the status that
    tells the parent so (``registry.EXIT_TEMP_FULL``; it checks the folder), never the plugin's."""
    import errno

    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        os._exit(EXIT_TEMP_FULL)


def _open_result(path: str) -> int:
    """The result file the parent made, for appending: never through a symlink (O_NOFOLLOW), never a FIFO's
    wait, a regular file only. Raises OSError."""
    import stat

    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path}: not a regular file")
    os.set_blocking(fd, True)
    return fd


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def main(argv: list[str]) -> int:
    from nsa_runner._worker import _die_with_parent, _end_as, become_subreaper, keep_orphans, linger

    _die_with_parent()  # the CLI killed (kill -9, SIGHUP): this child goes with it
    become_subreaper()  # a daemon a plugin's import started stays in this tree (killed with it)
    result_path = argv[0]
    req = json.loads(sys.stdin.read())
    # the result file is opened here, once, before any plugin code runs, never through a link, and only
    # written through this descriptor (by the importing child and by this process, its keeper): round 16
    # A6, a plugin's import renamed result.jsonl, put a symlink to an outside file there and exited, and
    # the keeper, reopening the name to say how the child ended, appended its line to that file
    try:  # the parent made the file: appending needs no inode
        res_fd = _open_result(result_path)
    except OSError as e:
        _cannot_write(e)
        raise
    rc = keep_orphans()  # the imports run in a child: a daemon stays here even when an import kills it
    if rc is not None:
        try:  # how the child ended (the parent names the plugin it was importing), then keep its orphans
            # on a line of its own even after a line the dying child left half-written
            _write_all(res_fd, ("\n" + json.dumps({"ended": rc, "nonce": req.get("nonce")}) + "\n").encode())
        except OSError:  # nothing can be written (a full disk): end as the child did, its orphans killed
            _end_as(rc)
        linger()
        os._exit(0)
    _REPORTER[:] = [os.getpid()]  # the importing child: it alone reports (``forked_copy_end``)
    sys.path[:] = list(req["sys_path"]) + [p for p in sys.path if p not in req["sys_path"]]
    faulthandler.enable()
    out = open(res_fd, "a", encoding="utf-8")  # noqa: SIM115 - open for the whole pass

    def emit(obj: dict, fresh_line: bool = False) -> None:
        # fresh_line: after a line an ended import may have left half-written
        text = ("\n" if fresh_line else "") + json.dumps(obj) + "\n"  # (a TypeError / ValueError: the caller's)
        try:
            out.write(text)
            out.flush()
        except OSError as e:
            _cannot_write(e)
            raise

    import nsa_runner._discover as imported  # (this file runs as __main__: the describe function imports it anew)

    _NOTES[:] = imported._NOTES[:] = [emit]
    describe = _resolve(req["describe"])
    skip, only, parse = set(req.get("skip") or ()), req.get("only"), req.get("parse")
    # the built-in pass (round 14 R6): only these entry points of these metadata folders, in a child that
    # imports no plugin (the parent describes the plugins in another one)
    keys = set(req["keys"]) if isinstance(req.get("keys"), list) else None
    paths = set(req["paths"]) if isinstance(req.get("paths"), list) else None
    seen: set[str] = set()
    folder = req.get("folder")  # [path, st_dev, st_ino] of the parent's temp folder for this pass
    swapped = False
    # round 15 B-R5: past the parent's limit of children that plugin imports ended, the rest of the entry
    # points were never reached (a working stage: "unknown stage"). "isolate": each entry point imported in
    # a fork of its own (one that dies or hangs is named here, the pass goes on), at most ``max_hangs``
    # hangs; "list": none imported, each listed as broken with ``not_tried`` (nothing left out unsaid)
    mode = req.get("mode") if req.get("mode") in ("isolate", "list") else "normal"
    limit = float(req.get("limit") or 60.0)
    max_hangs = int(req.get("max_hangs") or 32)
    not_tried = str(req.get("not_tried") or "not imported: too many plugin imports before it failed")
    hangs = 0

    def folder_swapped() -> str | None:
        """What the parent's temp folder's name leads to now, when it is no longer that folder (a
        plugin's import renamed it and put a symlink / a file / another folder there: round 14 A BR-3d)."""
        if not (isinstance(folder, list) and len(folder) == 3 and isinstance(folder[0], str)):
            return None
        import stat

        try:
            st = os.lstat(folder[0])
        except FileNotFoundError:
            return f"removed nsa-run's plugin discovery temp folder {folder[0]}"
        except OSError:
            return None
        if (st.st_dev, st.st_ino) == (folder[1], folder[2]):
            return None
        what = ("a symlink" if stat.S_ISLNK(st.st_mode) else "another folder" if stat.S_ISDIR(st.st_mode)
                else "a file" if stat.S_ISREG(st.st_mode) else "something else")
        return f"replaced nsa-run's plugin discovery temp folder {folder[0]} by {what}"

    def base(ep: md.EntryPoint, key: str, dist: md.Distribution, dist_name: str) -> dict:
        return {"key": key, "name": ep.name, "value": ep.value, "dist": dist_name, "version": dist.version or "?",
                "dist_path": str(getattr(dist, "_path", "") or "")}  # built-in-ness: where it lives (B2)

    imports_run = [0]  # plugin imports this process ran (each ``one``; an isolating fork's are its own)

    def _load_and_describe(ep: md.EntryPoint, key: str, rec: dict) -> bool:
        """Import ``ep`` and describe it into ``rec``; False (``rec["error"]`` says why) when it did not import.
        A failure (an exception) after another plugin's import ran in this process is marked ``retry``: the parent
        imports it again in a fresh process before it is blamed (round 23 B23-1: p-aa's import set ``time.time``
        to a raising function, and the next, healthy plugin, whose import calls ``time.time()``, was listed
        broken; putting back one kind of state after another (builtins, round 22) never ends)."""
        after = imports_run[0] > 0
        imports_run[0] += 1
        try:
            obj = ep.load()
        except BaseException as e:  # noqa: BLE001 - a plugin may raise anything, even SystemExit
            forked_copy_end(e)  # (a copy the plugin forked: never reports)
            if isinstance(e, KeyboardInterrupt):
                raise
            rec["error"] = f"failed to import {ep.value}: {_why(e)}"
            rec["traceback"] = _traceback()
            if after:
                rec["retry"] = True
            return False
        forked_copy_end(None)
        try:
            rec.update(describe(obj, ep, parse["args"] if parse and parse.get("key") == key else None))
        except BaseException as e:  # noqa: BLE001
            forked_copy_end(e)
            if isinstance(e, KeyboardInterrupt):
                raise
            rec["error"] = f"{ep.value}: describing it raised {_why(e)}"
            rec["traceback"] = _traceback()
            if after:
                rec["retry"] = True
        forked_copy_end(None)
        return True

    def one(ep: md.EntryPoint, key: str, dist: md.Distribution, dist_name: str) -> None:
        """Import entry point ``ep`` and describe it: its ``loading`` line, then its ``entry`` (and before it a
        ``threads`` line when the import left threads running: ``threads_left``)."""
        nonlocal swapped
        emit({"loading": key, "dist_path": str(getattr(dist, "_path", "") or "")})
        rec = {"key": key, "name": ep.name, "value": ep.value, "dist": dist_name, "version": dist.version or "?",
               "dist_path": str(getattr(dist, "_path", "") or "")}  # built-in-ness: where it lives (B2)
        before = threads_now()
        with plugin_import():  # what its code leaves changed is put back before the next one (B19-5)
            loaded = _load_and_describe(ep, key, rec)
        left = threads_left(before)
        if left is not None:
            emit({"threads": {"key": key} | left})
        if not loaded:
            problem = None if swapped else folder_swapped()
            if problem is not None:
                swapped = True
                rec["error"] = f"{ep.value}: importing it {problem}; and it {rec['error']}"
            emit({"entry": rec})
            return
        problem = None if swapped else folder_swapped()
        if problem is not None:  # this import (or its description) did it: the entry point is broken
            swapped = True
            rec = {k: rec[k] for k in ("key", "name", "value", "dist", "version", "dist_path")}
            rec["error"] = (f"{ep.value}: importing it {problem} (nsa-run wrote nothing through it and "
                            f"went on with its own folder)")
        try:
            emit({"entry": rec})
        except (TypeError, ValueError) as e:
            emit({"entry": {k: rec[k] for k in ("key", "name", "value", "dist", "version", "dist_path")}
                  | {"error": f"{ep.value}: its description is not JSON ({e})"}})

    def isolated(ep: md.EntryPoint, key: str, dist: md.Distribution, dist_name: str) -> None:
        """``one`` in a fork of this process: one that dies or does not end within ``limit`` seconds is
        named broken here, and the pass goes on (the parent is not needed: no child of its is spent)."""
        nonlocal swapped, hangs
        told_r, told_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(told_r)
            _REPORTER[:] = [os.getpid()]  # this fork imports and reports
            try:
                os.setpgid(0, 0)  # its own group: killed with what it started when it hangs
            except OSError:
                pass
            try:
                one(ep, key, dist, dist_name)
                os.write(told_w, b"s" if swapped else b"e")
            finally:
                os._exit(0)
        os.close(told_w)
        os.set_blocking(told_r, False)  # (a daemon of the plugin's may hold the pipe's other end)
        deadline, status, timed_out = time.monotonic() + limit, 0, False
        while True:
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break
            if done:
                break
            if time.monotonic() > deadline:
                timed_out = True
                for kill in (os.killpg, os.kill):
                    try:
                        kill(pid, 9)
                    except OSError:
                        pass
                try:
                    os.waitpid(pid, 0)
                except ChildProcessError:
                    pass
                break
            time.sleep(0.02)
        try:
            told = os.read(told_r, 1)
        except OSError:
            told = b""
        os.close(told_r)
        if told == b"s":
            swapped = True
        if told and not timed_out:
            return
        rec = base(ep, key, dist, dist_name) | {"ended": True}  # (the parent: this import ended its process)
        if timed_out:
            hangs += 1
            rec["error"] = f"{ep.value}: its import did not finish within {limit:g}s (hangs?); stopped"
        else:
            rc = os.waitstatus_to_exitcode(status)
            if rc < 0:
                from nsa_runner._worker import signal_name

                rec["error"] = f"{ep.value}: importing it killed the discovery process ({signal_name(rc)})"
            else:
                rec["error"] = (f"{ep.value}: importing it ended the discovery process (exit code {rc}, e.g. "
                                "os._exit or sys.exit in C)")
        emit({"entry": rec}, fresh_line=True)

    for dist, dist_name, eps, rec in group_distributions(req["group"], paths):
        if rec is not None:
            if rec["key"] not in seen and rec["key"] not in skip:
                seen.add(rec["key"])
                emit({"entry": rec})
            continue
        for ep in eps:
            key = entry_key(dist_name, ep)
            if key in seen:  # the same distribution found twice on sys.path: the first one wins
                continue
            seen.add(key)
            if key in skip or (only is not None and key != only) or (keys is not None and key not in keys):
                continue
            if mode == "list" or (mode == "isolate" and hangs >= max_hangs):
                why = not_tried if mode == "list" else (
                    f"not imported: {hangs} plugin imports before it hung (each stopped after {limit:g}s); "
                    "nsa-run tries no more in one discovery: fix or uninstall those (listed as broken), then rerun")
                emit({"entry": base(ep, key, dist, dist_name) | {"error": f"{ep.value}: {why}"}})
            elif mode == "isolate":
                isolated(ep, key, dist, dist_name)
            else:
                one(ep, key, dist, dist_name)
    emit({"done": req.get("nonce", True)})
    try:
        out.close()
    except OSError as e:
        _cannot_write(e)
        raise
    sys.stdout.flush()
    linger()  # what a plugin's import left running stays in this tree until the parent kills it
    os._exit(0)  # a plugin's atexit handlers or threads never hold the CLI up


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
