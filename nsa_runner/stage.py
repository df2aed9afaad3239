"""The public plugin API (DESIGN §5): ``Stage``, ``StageResult``, ``Status``, ``Option``.

A stage is a small object with ``name``, ``order``, ``requires``, ``options`` and
``run(ctx) -> StageResult``. Built-in stages and third-party plugins are both found through
the entry-point group ``nsa_runner.stages``.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsa_runner._text import shown


class Status(str, enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"  # ran; a check did not hold
    SKIP = "SKIP"  # could not run here (always with the reason, and the fix when there is one)
    ERROR = "ERROR"  # the stage itself broke: exception, crash, CUDA fault
    TIMEOUT = "TIMEOUT"

    @property
    def failed(self) -> bool:
        return self in (Status.FAIL, Status.ERROR, Status.TIMEOUT)


# metrics nested deeper than this are passed on as they are (JSON decides: a cycle or 100 000 levels
# is the worker's ERROR "not JSON-serialisable")
METRICS_DEPTH = 200
NOTED_METRICS, NOTED_NAME_CHARS = 5, 60  # in the note: this many metric names, each clipped


class MalformedResult(ValueError):
    """A field of a stage's StageResult that cannot be read (a property or a container that raises).
    ``problems``: (field, exception) pairs; ``partial``: what ``to_dict`` could read (its ``files``
    are the stage's declared files when they could be read)."""

    def __init__(self, problems: list[tuple[str, BaseException]], partial: dict):
        super().__init__("; ".join(field for field, _ in problems))
        self.problems = problems
        self.partial = partial


def _plain_text(value: Any) -> Any:
    """A str (or a str subclass) as the plain str it holds, read with str's own method (a subclass's
    ``__str__`` / ``__format__`` / ``__len__`` ... are never called: round 17 U-3, one that raised
    killed the worker); any other value as it is (the runner names a wrong type)."""
    return str.__str__(value) if issubclass(type(value), str) else value


def _nonfinite_text(f: float) -> str:
    """NaN / inf / -inf (a metric JSON has no number for) as the text it is recorded as."""
    return "nan" if f != f else ("inf" if f > 0 else "-inf")


def _path_text(path: tuple | None) -> str:
    """``stats.max`` / ``rows[1]`` from the linked (parent, segment) pairs ``_plain_metrics`` keeps."""
    segs = []
    while path is not None:
        path, seg = path
        segs.append(seg)
    text = "".join(reversed(segs)).lstrip(".")
    return text if len(text) <= NOTED_NAME_CHARS else text[:NOTED_NAME_CHARS] + "…"


def _key_segment(key: Any) -> str:
    """A metric key as a segment of a metric's name (clipped; a key of another type: ``?``)."""
    if type(key) is str:
        return "." + key[:NOTED_NAME_CHARS]
    if key is None or type(key) in (bool, int):
        return "." + repr(key)[:NOTED_NAME_CHARS]
    return ".?"


def _plain_metrics(value: Any, default: Callable[[Any], Any] | None, changed: list[str],
                   path: tuple | None = None, depth: int = 0, seen: frozenset[int] = frozenset()) -> Any:
    """``value`` (a stage's metrics, or a part of them) as plain JSON data: str / int / float / dict /
    list / tuple subclasses as their plain type (read with the base type's own methods), NaN / inf / -inf
    as the text ``"nan"`` / ``"inf"`` / ``"-inf"`` (their names appended to ``changed``), other objects
    through ``default`` (``artifacts._json_default``: numpy / torch scalars, enums, sets, ...). What
    cannot be converted (an object ``default`` refuses, a cycle, nesting deeper than ``METRICS_DEPTH``)
    is passed on as it is: JSON refuses it where the result is written."""
    t = type(value)
    if value is None or t is bool:
        return value
    if issubclass(t, str):
        return str.__str__(value)
    if issubclass(t, int):
        return int.__index__(value)
    if issubclass(t, float):
        f = float.__float__(value)
        if math.isfinite(f):
            return f
        changed.append(_path_text(path) or "metrics")
        return _nonfinite_text(f)
    if depth >= METRICS_DEPTH or id(value) in seen:
        return value
    inner = seen | {id(value)}
    if issubclass(t, dict):
        out = {}
        for k, v in dict.items(value):
            kt = type(k)
            if issubclass(kt, str):
                key = str.__str__(k)
            elif issubclass(kt, float) and not math.isfinite(float.__float__(k)):
                key = _nonfinite_text(float.__float__(k))
                changed.append(_path_text((path, "." + key)))
            else:
                key = k
            out[key] = _plain_metrics(v, default, changed, (path, _key_segment(key)), depth + 1, inner)
        return out
    if issubclass(t, (list, tuple)):
        items = list.__iter__(value) if issubclass(t, list) else tuple.__iter__(value)
        return [_plain_metrics(v, default, changed, (path, f"[{i}]"), depth + 1, inner) for i, v in enumerate(items)]
    if default is None:
        return value
    try:
        converted = default(value)
    except Exception:  # noqa: BLE001 - not JSON: refused (and named) where the result is written
        return value
    if converted is value:
        return value
    return _plain_metrics(converted, default, changed, path, depth + 1, inner)


def _says_something(text: str) -> bool:
    """Whether ``text`` holds a character a reader sees (what ``executor.visible`` keeps), looking at
    its start only (a reason of 60 MB)."""
    import unicodedata

    from nsa_runner._text import CONTROL

    return any(unicodedata.category(ch)[0] not in "CZ" for ch in CONTROL.sub("", text[:4096]))


def _metrics_note(changed: list[str]) -> str:
    """One clause naming the metrics recorded as text (the first ``NOTED_METRICS``, each clipped)."""
    names = changed[:NOTED_METRICS]
    more = f" and {len(changed) - NOTED_METRICS} more" if len(changed) > NOTED_METRICS else ""
    return f"metric(s) not a JSON number, recorded as the text \"nan\" / \"inf\" / \"-inf\": {', '.join(names)}{more}"


@dataclass
class StageResult:
    status: Status
    reason: str = ""
    files: list[str] = field(default_factory=list)  # paths relative to ctx.dir
    metrics: dict[str, Any] = field(default_factory=dict)  # small JSON-able facts for summary
    hint: str = ""  # the fix, for SKIP (e.g. an install command)

    def to_dict(self, default: Callable[[Any], Any] | None = None) -> dict:
        """The result as plain data, what the stage's worker writes (round 17 U-2, U-3):

        - text (the status, reason, hint, each declared file name, each metric key and text value) is
          read as the plain str it holds, with str's own method: a str subclass's own methods (a
          ``__str__`` that raises) are never called;
        - a metric that is NaN, inf or -inf (a float, or what ``default`` makes of an object: a numpy or
          torch scalar) is recorded as the text ``"nan"``, ``"inf"`` or ``"-inf"`` (JSON has no number
          for them; readers of the record take metric values as they are), and one clause naming those
          metrics is appended to the reason (to the hint when the stage gave no reason: a SKIP without
          a reason stays the runner's ERROR);
        - a value of another type is passed on as it is: the runner names a reason, hint or file name
          that is not text, and the worker a metric with no JSON form.

        Raises ``MalformedResult`` naming each field that cannot be read at all (a property that raises).
        """
        problems: list[tuple[str, BaseException]] = []
        out: dict[str, Any] = {}

        def read(name: str, convert: Callable[[Any], Any]) -> None:
            try:
                out[name] = convert(getattr(self, name))
            except Exception as e:  # noqa: BLE001 - the stage's field: named, never the worker's end
                problems.append((name, e))

        def status(s: Any) -> str:
            if type(s) is Status:
                return s.value
            return Status(_plain_text(s)).value

        def files(f: Any) -> Any:
            # a list as given; anything else (e.g. one string) is passed on as is, so the runner
            # names the wrong type instead of splitting "a.txt" into letters
            t = type(f)
            if issubclass(t, list):
                return [_plain_text(x) for x in list.__iter__(f)]
            if issubclass(t, tuple):
                return [_plain_text(x) for x in tuple.__iter__(f)]
            return _plain_text(f)

        changed: list[str] = []

        def metrics(m: Any) -> Any:
            return _plain_metrics(m, default, changed)

        read("status", status)
        read("reason", _plain_text)
        read("files", files)
        read("metrics", metrics)
        read("hint", _plain_text)
        if changed:
            note = _metrics_note(changed)
            reason, hint = out.get("reason"), out.get("hint")
            if type(reason) is str and _says_something(reason):
                out["reason"] = f"{reason}; {note}"
            elif type(hint) is str:
                out["hint"] = f"{hint}; {note}" if _says_something(hint) else note
        if problems:
            raise MalformedResult(problems, out)
        return out

    @classmethod
    def from_dict(cls, d: dict) -> StageResult:
        return cls(
            Status(d["status"]),
            d.get("reason", ""),
            list(d.get("files", [])),
            dict(d.get("metrics", {})),
            d.get("hint", ""),
        )


# the largest integer a size option takes (``int_list``, ``whole_number``): past it no kernel indexes (int32), and a
# point was ERROR at run time, "Overflow when unpacking long long" (round 28 U28-7: --S-list 99999999999999999999k was
# accepted; round 30 B30-3: the single-integer options --dk, --heads, --T, --iters had no bound at all)
INT_LIST_MAX = 2**31 - 1


def _quoted(text: str, bad: int | None = None) -> str:
    """``text`` quoted for an error line (``_text.shown``: its first 40 characters), and, where it is longer, the
    first character that is not a digit named with its place (round 30 U30-3: the offending character was cut off)."""
    q = shown(text, 40)
    if bad is not None and len(text) > 40:
        q += f" ({text[bad]!r} at character {bad + 1})"
    return q


ASCII_SPACE = " \t\n\r\v\f"


class NotAnInteger(ValueError):
    """Command-line text that is no integer at all (``whole_number``), as against one out of range."""


def whole_number(text: str, least: int = 1, most: int = INT_LIST_MAX) -> int:
    """Parse one integer of the command line: ASCII digits only (``int`` would take Unicode digits and ``_``,
    round 30 U30-2), in ``least`` .. ``most``; ``NotAnInteger`` or a ValueError that quotes the text otherwise. Only
    ASCII white space around it is dropped (round 32 U32-2: a Unicode space was stripped as well, and the refusal
    quoted the text stripped)."""
    t = text.strip(ASCII_SPACE)
    if not re.fullmatch(r"[+-]?[0-9]+", t, flags=re.ASCII):
        bad = next((i for i, c in enumerate(t) if not ("0" <= c <= "9" or (i == 0 and c in "+-"))), None)
        raise NotAnInteger(f"expected an integer, got {_quoted(t, bad)}")
    if len(t.lstrip("+-").lstrip("0")) > len(str(most)):  # before int(): 4300+ digits raise Python's advice
        raise ValueError(f"expected an integer up to {most}, got {_quoted(t)}")  # (round 31 U31-4)
    sign, digits = (t[0], t[1:]) if t[0] in "+-" else ("", t)
    v = int(sign + (digits.lstrip("0") or "0"))  # leading zeros dropped first (round 32 U32-1: 5000 of them
    if v < least:  # ended in Python's int-digit-limit advice)
        raise ValueError(f"expected {'a positive integer' if least == 1 else f'an integer >= {least}'}, "
                         f"got {_quoted(t)}")
    if v > most:
        raise ValueError(f"expected an integer up to {most}, got {_quoted(t)}")
    return v


def positive_int(text: str) -> int:
    """An option's positive integer: 1 .. ``INT_LIST_MAX`` (``whole_number``)."""
    return whole_number(text, 1)


def nonneg_int(text: str) -> int:
    """An option's non-negative integer: 0 .. ``INT_LIST_MAX`` (``whole_number``)."""
    return whole_number(text, 0)


def int_list(text: str) -> list[int]:
    """Parse '512,1024,2k,64K' -> [512, 1024, 2048, 65536]; each in 1 .. ``INT_LIST_MAX``; an empty element
    (``1k,,2k``) is an error, not dropped (round 30 U30-6)."""
    parts = text.split(",")
    if not text.strip():
        raise ValueError("expected a comma-separated list of integers")
    out = []
    for i, part in enumerate(parts):
        p = part.strip()
        if not p:
            raise ValueError(f"expected a comma-separated list of integers, element {i + 1} of {len(parts)} is empty")
        mult = 1
        if p[-1] in "kK":
            mult, p = 1024, p[:-1]
        try:
            v = whole_number(p, 1) * mult
        except ValueError as e:  # the element as typed, not its number part (round 31 U31-3: "2kk" said '2k')
            raise ValueError(str(e).replace(_quoted(p), _quoted(part.strip()), 1)) from None
        if v > INT_LIST_MAX:
            raise ValueError(f"expected integers up to {INT_LIST_MAX}, got {_quoted(part.strip())}")
        out.append(v)
    return out


@dataclass(frozen=True)
class Option:
    """A stage option: ``nsa-run stage NAME --S-list 512,1024``.

    ``parse`` turns the command-line text into a value (raise ValueError for bad input);
    ``default`` is used when the option is not given (None = the stage picks by device/profile).
    """

    flag: str  # "--S-list"
    parse: Callable[[str], Any] = str
    default: Any = None
    help: str = ""
    choices: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def convert(self, text: str) -> Any:
        if self.choices and text not in self.choices:
            raise ValueError(f"{self.flag}: {text!r} is not one of {', '.join(self.choices)}")
        return self.parse(text)


class Stage:
    """Base class for a check stage. Subclasses set the class attributes and implement run."""

    name: str = ""
    order: int = 100
    requires: tuple[str, ...] = ()  # any of "cuda", "triton"
    description: str = ""
    options: tuple[Option, ...] = ()
    timeout_s: float = 900.0  # default per-stage timeout; --timeout overrides
    # the spare worker (executor._Spare, issue 13): this stage's process may be started ahead, while
    # the stage before runs, with torch already imported; False for a stage that imports no torch
    # (summary), whose spare would still be importing it when its turn came
    preload: bool = True
    # and, with it, the CUDA-free part of FA-4's import (torch._dynamo, the CuTe DSL: ~5 s on the H100
    # host) when FA-4 is installed: for a stage that calls the flash paths (sanity, fa2-probe, benches)
    preload_flash: bool = False
    # and the torch parts fla's import pulls in (torch._inductor's compile_fx, functorch.compile: 2-5 s)
    # when fla is installed: for a stage that times fla (prefill-bench). fla itself is not imported
    # ahead (its import may touch the GPU, and a spare must not start CUDA)
    preload_fla: bool = False

    def run(self, ctx: RunContextLike) -> StageResult:  # pragma: no cover - interface
        raise NotImplementedError


class RunContextLike:  # documentation only: what a stage may use from ctx
    dir: Path  # the run folder; write artifacts here
    device: str  # "cuda" or "cpu" (torch device string)
    profile: str  # "quick" or "full"
    options: dict[str, Any]  # this stage's options by dest, defaults filled in
    run_id: str
