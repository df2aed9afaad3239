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
backends (a broken CUDA library): no CUDA, as before; env-pairing records why in the run."""

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


def torch_facts() -> TorchFacts:
    """Whether torch sees a CUDA device, asked of a child process (see the module's docstring)."""
    from nsa_runner._python import python_m
    from nsa_runner._worker import COOKIE_ENV, PARENT_ENV, Watchdog, kill_processes
    from nsa_runner.registry import DISCOVERY_TIMEOUT_ENV, STARTUP_S, _pkg_parent, discovery_timeout

    limit = discovery_timeout()  # (the CLI refused a bad value before)
    r, w = os.pipe()
    cookie = uuid.uuid4().hex  # every process the import starts carries it: killed with the child
    env = dict(os.environ)
    env[COOKIE_ENV], env[PARENT_ENV] = cookie, str(os.getpid())
    # the running nsa_runner first on the child's path (``python -P``: not the working folder; as discovery's child)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_pkg_parent(), env.get("PYTHONPATH", "")]))
    try:
        # the child's output goes to stderr: never into stdout (``--json``), as a backend's print at load did
        proc = subprocess.Popen(python_m("nsa_runner._torch_check", str(w)), pass_fds=(w,),
                                stdin=subprocess.DEVNULL, stdout=sys.__stderr__ or subprocess.DEVNULL,
                                stderr=sys.__stderr__ or subprocess.DEVNULL, env=env, start_new_session=True)
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
                if data.endswith(b"}\n"):
                    break
            elif chunk == b"" and proc.poll() is not None:  # ended, the pipe closed: nothing more comes
                break
            now = time.monotonic()
            waited, allowed = (now - t0, max(limit, STARTUP_S)) if started is None else (now - started, limit)
            if waited > allowed:  # (the hint names a backend only when one is installed: round 22 U22-1)
                backends = _backends_said()
                limit_hint = f"{DISCOVERY_TIMEOUT_ENV} sets the limit (now {limit:g}s)"
                return TorchFacts(False, f"import torch did not finish within {limit:g}s (hangs?); stopped" + backends,
                                  f"{HINT}; {limit_hint}" if backends else limit_hint)
            if len(data) > 1 << 20:  # (its one line is short: more is not the child's)
                break
            time.sleep(POLL_S)
    finally:
        os.close(r)
        kill_processes(cookie, proc.pid, grace_s=0.0)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if guard is not None:
            guard.done()
    said, ended = None, None  # the import's line; its keeper's "ended" one (the import's process ended first)
    for line in data.splitlines():
        try:
            obj = json.loads(line.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(obj, dict) and "ended" in obj:
            ended = obj["ended"] if ended is None else ended
        elif isinstance(obj, dict) and said is None:
            said = obj
    if said is None:
        rc = ended if type(ended) is int else proc.returncode
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


def main(argv: list[str]) -> int:
    from nsa_runner._text import described
    from nsa_runner._worker import _die_with_parent, become_subreaper, keep_orphans, linger

    if argv[:1] == ["--say"]:  # a stage's worker asking after an ERROR out of torch's import (``_worker._torch_named``)
        import dataclasses

        print(json.dumps(dataclasses.asdict(torch_facts())), flush=True)
        return 0
    _die_with_parent()  # the CLI killed: this child goes with it
    fd = int(argv[0])
    # the import runs in a fork of this process, which keeps what it leaves running (a helper a backend's init
    # starts in a new session with a cleared environment went to init and outlived nsa-run: round 22 B22-1):
    # this process says how the import's process ended, then stays until the CLI kills the tree
    become_subreaper()
    rc = keep_orphans()
    if rc is not None:
        try:
            os.write(fd, (json.dumps({"ended": rc}) + "\n").encode())
        except OSError:
            pass
        linger()
        os._exit(0)
    os.write(fd, _STARTING)
    out: dict = {"cuda": False}
    try:
        import torch
    except BaseException as e:  # noqa: BLE001 - a backend's init may raise anything, SystemExit too
        missing = isinstance(e, ModuleNotFoundError) and e.name == "torch"
        out["kind"] = "missing" if missing else "backend" if _through_backends(e) else "import"
        cause = e.__cause__ or e.__context__
        out["error"] = (described(e, 500, let_through=_none)
                        + (f" (from {described(cause, 300, let_through=_none)})" if cause is not None else ""))
    else:
        try:
            out["cuda"] = bool(torch.cuda.is_available())
        except BaseException as e:  # noqa: BLE001
            out["cuda_error"] = described(e, 300, let_through=_none)
    os.write(fd, (json.dumps(out) + "\n").encode())
    os._exit(0)  # (nothing of torch's or a backend's exit handlers runs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
