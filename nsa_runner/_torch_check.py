"""``import torch`` for the CLI, in a child process (``python -m nsa_runner._torch_check FD``).

The CLI needs one fact from torch: whether a CUDA device is there. ``import torch`` runs installed code
(each ``[torch.backends]`` entry point's ``init``, unless ``TORCH_DEVICE_BACKEND_AUTOLOAD`` is not "1"):
red-team round 21 B21-1, imported in the CLI's own process, a backend whose init exits ended ``nsa-run
oneshot`` with exit 0 having done nothing; one that changed the working folder moved a relative ``--out``;
one that hung held off Ctrl-C. B21-2: one whose import raised left "Only a single TORCH_LIBRARY ..." in every
stage, naming nothing. Here the import runs in a child of its own session (killed as a tree, the watchdog
after a ``kill -9`` of the CLI, as plugin discovery's child): what it does stays there, a hang is stopped
after the discovery limit, and an import that fails in a backend, ends its process or hangs is one line
naming torch's own error (and the installed backends), exit 2. torch missing, or failing outside the
backends (a broken CUDA library): no CUDA, as before; env-pairing records why in the run.

Round 23 (B23-2, B23-3, B23-6): only the process that began the import answers (its pid, taken at its start); a
process a backend's init forked that comes back into this module's handlers ends as it would in plain Python
(quietly, with SystemExit's code, or with its traceback and exit code 1), and the CLI takes the answer, which comes
before the keeper's "ended" line in the pipe, or that line: one outcome for one input. The answer is encoded and
written by means taken before the import, to the pipe as it was or, when the import closed or reused its descriptor,
to a fresh end opened through the keeper's; never a traceback of nsa-run's own on the user's terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

# the child says it is about to import torch (its own start-up before that may be slow on a loaded machine),
# then its one JSON line
_STARTING = b"starting\n"
POLL_S = 0.02

# the import's process (the one that began it) ended after torch's import finished, unable to deliver its answer
# (its channel closed or replaced under it, and no fresh one could be opened): the keeper's "ended" line says so
UNTOLD_EXIT = 227


@dataclass
class TorchFacts:
    cuda: bool
    problem: str = ""  # "" or the line the CLI exits 2 with: no stage can run here
    hint: str = ""


def _backends_said() -> str:
    """The installed ``[torch.backends]`` entry points, named (``folder/entry_points.txt: [torch.backends]
    name = value``), for a message; "" when none or when torch does not load them. Read through the safe
    reader (``registry.distributions``); ``entry_points_problem`` has refused unreadable files already."""
    from nsa_runner.registry import (
        TORCH_AUTOLOAD_ENV,
        TORCH_BACKENDS_GROUP,
        distributions,
        torch_backend_autoload,
        torch_backend_said,
    )

    if not torch_backend_autoload():
        return ""
    said: list[str] = []
    try:
        for dist in distributions():
            for ep in dist.entry_points:
                if ep.group == TORCH_BACKENDS_GROUP:
                    said.append(torch_backend_said(dist, ep))
    except Exception:  # noqa: BLE001 - only a message's detail
        pass
    if not said:
        return ""
    more = f" (and {len(said) - 3} more)" if len(said) > 3 else ""
    return (f"; torch runs the installed device backends at its import ({TORCH_AUTOLOAD_ENV}): "
            + "; ".join(said[:3]) + more)


HINT = ("uninstall the package that installed that backend, or set TORCH_DEVICE_BACKEND_AUTOLOAD=0 "
        "(torch then loads no device backend)")


def _read_lines(data: bytes) -> tuple[dict | None, int | None]:
    """(The CLI) the import's answer and its keeper's "ended" status among the complete lines of ``data``."""
    said, ended = None, None
    for line in data.split(b"\n")[:-1]:
        try:
            obj = json.loads(line.decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError):
            continue
        if not isinstance(obj, dict):
            continue
        if "ended" in obj:
            ended = obj["ended"] if ended is None else ended
        elif said is None:
            said = obj
    return said, ended


TORCH_IMPORT_S = 300.0  # torch's own import with no device backend to run: bounded all the same


def torch_facts() -> TorchFacts:
    """Whether torch sees a CUDA device, asked of a child process (see the module's docstring)."""
    from nsa_runner._python import python_m
    from nsa_runner._worker import COOKIE_ENV, PARENT_ENV, Watchdog, hold_pid, kill_processes
    from nsa_runner.registry import DISCOVERY_TIMEOUT_ENV, STARTUP_S, _pkg_parent, discovery_timeout

    # (the CLI refused a bad value before). The limit is there for a [torch.backends] init that hangs (round 21
    # B21-1); with none installed (or not loaded) torch's import runs no plugin code, and a small plugin limit
    # stopped a healthy, slow import (round 23 U23-3: NSA_RUN_DISCOVERY_TIMEOUT=1, torch's 2 s): then at least
    # TORCH_IMPORT_S (a cold pod's first import can take a minute)
    limit = discovery_timeout() if _backends_said() else max(discovery_timeout(), TORCH_IMPORT_S)
    r, w = os.pipe()
    cookie = uuid.uuid4().hex  # every process the import starts carries it: killed with the child
    env = dict(os.environ)
    env[COOKIE_ENV], env[PARENT_ENV] = cookie, str(os.getpid())
    # the running nsa_runner first on the child's path (``python -P``: not the working folder; as discovery's child)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_pkg_parent(), env.get("PYTHONPATH", "")]))
    try:
        # the child's output goes to stderr: never into stdout (``--json``), as a backend's print at load did
        proc = hold_pid(subprocess.Popen(python_m("nsa_runner._torch_check", str(w)), pass_fds=(w,),
                                         stdin=subprocess.DEVNULL, stdout=sys.__stderr__ or subprocess.DEVNULL,
                                         stderr=sys.__stderr__ or subprocess.DEVNULL, env=env,
                                         start_new_session=True))
    except BaseException:
        os.close(r)
        os.close(w)
        raise
    os.close(w)
    guard = None
    try:
        guard = Watchdog(cookie, proc.pid, "", env)
        os.set_blocking(r, False)
        data, started, t0 = b"", None, time.monotonic()
        while True:
            try:
                chunk = os.read(r, 65536)
            except BlockingIOError:
                chunk = None
            if chunk:
                data += chunk
                if started is None and data.startswith(_STARTING):
                    started = time.monotonic()
                # the import's answer, or its keeper's "ended" line: only the import's own process answers, and
                # before it ends, so its answer comes first in the pipe whenever there is one (round 23 B23-2)
                if b"\n" in chunk and _read_lines(data) != (None, None):
                    break
            elif chunk == b"" and proc.poll() is not None:  # ended, the pipe closed: nothing more comes
                break
            now = time.monotonic()
            waited, allowed = (now - t0, max(limit, STARTUP_S)) if started is None else (now - started, limit)
            if waited > allowed:  # (the hint names a backend only when one is installed: round 22 U22-1)
                backends = _backends_said()
                # (the limit also bounds torch's own import: a small one stops a healthy, slow import too, U23-3)
                limit_hint = (f"{DISCOVERY_TIMEOUT_ENV} sets the limit (now {limit:g}s; torch's own import takes a few "
                              "seconds on a cold machine: give it more there)")
                return TorchFacts(False, f"import torch did not finish within {limit:g}s ({DISCOVERY_TIMEOUT_ENV}: "
                                  "slow, or it hangs); stopped" + backends,
                                  f"{HINT}; {limit_hint}" if backends else limit_hint)
            if len(data) > 1 << 20:  # (its one line is short: more is not the child's)
                break
            time.sleep(POLL_S)
    finally:
        os.close(r)
        kill_processes(cookie, proc, grace_s=0.0)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if guard is not None:
            guard.done()
    said, ended = _read_lines(data)  # the import's line (preferred); its keeper's "ended" one
    if said is None:
        rc = ended if type(ended) is int else proc.returncode
        if rc == UNTOLD_EXIT and type(ended) is int:
            return TorchFacts(False, "import torch finished, but nsa-run's torch child could not deliver what it "
                              "found: its answer channel was closed or replaced during the import (a device backend "
                              "closing inherited file descriptors?)" + _backends_said(), HINT)
        if rc is not None and rc < 0:
            from nsa_runner._worker import signal_name

            how = f"was killed ({signal_name(rc)})"
        else:
            how = f"ended its process (exit code {rc})"
        return TorchFacts(False, f"import torch {how} before it finished" + _backends_said(), HINT)
    if said.get("kind") == "backend":
        return TorchFacts(False, f"import torch fails in a device backend: {said.get('error')}" + _backends_said(),
                          HINT)
    return TorchFacts(said.get("cuda") is True)


def _through_backends(e: BaseException) -> bool:
    """``e`` (or what it was raised from) came out of torch's device-backend loading."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        tb = e.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_name == "_import_device_backends":
                return True
            tb = tb.tb_next
        e = e.__cause__ or e.__context__
    return False


def _none(e: BaseException) -> bool:
    return False


# The child's own means, taken before torch's import runs installed code (round 23 B23-3: a backend's init that
# rebinds ``json.dumps`` or ``os.write`` changes what a later lookup finds, never these references)
_getpid, _getppid, _write, _open, _close, _fstat, _exit = os.getpid, os.getppid, os.write, os.open, os.close, \
    os.fstat, os._exit
_set_blocking = os.set_blocking


def _q(text: str) -> str:
    """``text`` as a JSON string, ASCII only (what ``json.dumps`` writes), by nothing a backend can rebind."""
    out = ['"']
    for c in text:
        o = ord(c)
        if 0x20 <= o < 0x7F and c != '"' and c != "\\":
            out.append(c)
        elif o > 0xFFFF:
            o -= 0x10000
            out.append(f"\\u{0xD800 + (o >> 10):04x}\\u{0xDC00 + (o & 0x3FF):04x}")
        else:
            out.append(f"\\u{o:04x}")
    out.append('"')
    return "".join(out)


def _encode(obj: dict) -> bytes:
    """One JSON line of the child's answer (str keys; bool, int, None or str values)."""
    parts = []
    for k, v in obj.items():
        if v is True or v is False or v is None:
            val = "true" if v is True else "false" if v is False else "null"
        elif type(v) is int:
            val = int.__repr__(v)
        else:
            val = _q(v if type(v) is str else "<not text>")
        parts.append(f"{_q(k)}: {val}")
    return ("{" + ", ".join(parts) + "}\n").encode("ascii")


class _Channel:
    """The answer pipe, as the child got it: its descriptor, the pipe's identity (st_dev, st_ino) and the keeper's
    pid (which holds the same descriptor number: the import's code runs in the other process). A write goes to the
    descriptor while it is still that pipe; when the import closed it (``os.closerange(3, 1024)``: round 23 B23-3)
    or put something else at that number, to a fresh write end opened through ``/proc/<keeper>/fd/<fd>``."""

    def __init__(self, fd: int) -> None:
        st = _fstat(fd)
        self.fd, self.ident, self.keeper = fd, (st.st_dev, st.st_ino), None

    def _ours(self, fd: int) -> bool:
        try:
            st = _fstat(fd)
        except BaseException:  # noqa: BLE001
            return False
        return (st.st_dev, st.st_ino) == self.ident

    def _all(self, fd: int, data: bytes) -> None:
        _set_blocking(fd, True)
        view = memoryview(data)
        while view:
            view = view[_write(fd, view):]

    def say(self, data: bytes) -> bool:
        """``data`` written whole into the pipe; False when it could not be (never raising)."""
        try:
            if self._ours(self.fd):
                self._all(self.fd, data)
                return True
        except BaseException:  # noqa: BLE001 - the reader gone (BrokenPipeError), anything else: try a fresh end
            pass
        if self.keeper is None:
            return False
        fd = -1
        try:
            # non-blocking open: a pipe with no reader left (the CLI gave up) is ENXIO, not a wait
            fd = _open(f"/proc/{self.keeper}/fd/{self.fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            if not self._ours(fd):
                return False
            self._all(fd, data)
            return True
        except BaseException:  # noqa: BLE001
            return False
        finally:
            if fd >= 0:
                try:
                    _close(fd)
                except BaseException:  # noqa: BLE001
                    pass


def _flush_stdio() -> None:
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except BaseException:  # noqa: BLE001
            pass


def _as_plain_python(e: BaseException | None) -> None:
    """(A process forked during torch's import by a backend's code, back in this module's handlers: round 23 B23-2,
    B23-6.) It is not nsa-run's child, which alone answers: it ends as it would have in plain Python, quietly for
    an import that finished, with SystemExit's code, or with the traceback and exit code 1 for an exception."""
    code = 0
    try:
        if isinstance(e, SystemExit):
            c = e.code
            if c is None:
                code = 0
            elif type(c) is int or isinstance(c, int):
                code = int(c) & 0xFF
            else:
                code = 1
                try:
                    print(c, file=sys.stderr)
                except BaseException:  # noqa: BLE001
                    pass
        elif e is not None:
            code = 1
            try:
                import traceback

                traceback.print_exception(type(e), e, e.__traceback__)
            except BaseException:  # noqa: BLE001
                pass
            if isinstance(e, KeyboardInterrupt):
                code = 130
    except BaseException:  # noqa: BLE001
        code = 1
    _flush_stdio()
    _exit(code)


def main(argv: list[str]) -> int:
    from nsa_runner._text import described
    from nsa_runner._worker import _die_with_parent, become_subreaper, keep_orphans, linger

    if argv[:1] == ["--say"]:  # a stage's worker asking after an ERROR out of torch's import (``_worker._torch_named``)
        import dataclasses

        print(json.dumps(dataclasses.asdict(torch_facts())), flush=True)
        return 0
    _die_with_parent()  # the CLI killed: this child goes with it
    channel = _Channel(int(argv[0]))
    # the import runs in a fork of this process, which keeps what it leaves running (a helper a backend's init
    # starts in a new session with a cleared environment went to init and outlived nsa-run: round 22 B22-1):
    # this process says how the import's process ended, then stays until the CLI kills the tree
    become_subreaper()
    rc = keep_orphans()
    if rc is not None:
        channel.say(_encode({"ended": rc}))
        linger()
        _exit(0)
    # the import's process, the one nsa-run started: it alone answers (round 23 B23-2, B23-6: a process a backend's
    # init forked came back here too, finished torch's import or carried a SystemExit, and its answer raced this one)
    me, channel.keeper = _getpid(), _getppid()
    channel.say(_STARTING)
    out: dict = {"cuda": False}
    try:
        import torch
    except BaseException as e:  # noqa: BLE001 - a backend's init may raise anything, SystemExit too
        if _getpid() != me:
            _as_plain_python(e)
        try:
            missing = isinstance(e, ModuleNotFoundError) and e.name == "torch"
            out["kind"] = "missing" if missing else "backend" if _through_backends(e) else "import"
            cause = e.__cause__ or e.__context__
            out["error"] = (described(e, 500, let_through=_none)
                            + (f" (from {described(cause, 300, let_through=_none)})" if cause is not None else ""))
        except BaseException:  # noqa: BLE001 - describing it ran a backend's code
            out.setdefault("kind", "import")
            out["error"] = out.get("error") or "<an exception nsa-run could not describe>"
    else:
        if _getpid() != me:
            _as_plain_python(None)
        try:
            out["cuda"] = bool(torch.cuda.is_available())
        except BaseException as e:  # noqa: BLE001
            if _getpid() != me:
                _as_plain_python(e)
            try:
                out["cuda_error"] = described(e, 300, let_through=_none)
            except BaseException:  # noqa: BLE001
                out["cuda_error"] = "<an exception nsa-run could not describe>"
    if _getpid() != me:
        _as_plain_python(None)
    try:
        told = channel.say(_encode(out))
    except BaseException:  # noqa: BLE001
        told = False
    _exit(0 if told else UNTOLD_EXIT)  # (nothing of torch's or a backend's exit handlers runs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
