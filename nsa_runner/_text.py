"""Terminal text hygiene shared by the console, the executor, the registry and compare (imports
nothing of the runner)."""

from __future__ import annotations

import re

# the Unicode bidi controls (LRM/RLM, ALM, embeddings/overrides U+202A-E, isolates U+2066-9), which
# reorder what is shown after them: "PASS" can be made to read as something else. A character class
# body, shared by the terminal (CONTROL) and the report files (results.junit.clean: junit.xml, summary.md)
BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"

# terminal control: CSI / OSC / other ESC sequences, C0/C1 control characters but tab and newline, the line and
# paragraph separators U+2028 / U+2029 (round 26 U26-5: raw in the oneshot and compare tables), and the bidi controls
CONTROL = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])?"
                     r"|[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029" + BIDI + "]")


def visible(text: str) -> str:
    """``text`` with what CONTROL matches written visibly as its escapes (``\\x1b]0;pwn\\x07``, ``\\x9b``),
    never dropped and never sent raw: the plain-text artifacts (env.txt, a stage log's closing line) keep
    what was there, and ``cat`` of them changes no terminal (round 19 B U-1, round 20 B U-1)."""
    return CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), text)


def word_shown(text: object) -> str:
    """A path or a command-line word as every output names it: as it is when each character of it is printable
    (copy-pasteable), else its repr, each control character (newline, ESC, C1, bidi / format) written out, never
    dropped (round 19 A19-R2: ``--out $'runs\\x1b[0m'`` shown as ``runs`` named ANOTHER run's folder; round 20
    A U-2: summary.md's and report.html's "command" line did the same)."""
    text = str(text)
    return text if text.isprintable() else repr(text)


def written_out(text: object) -> str:
    """``text`` with each character that is not printable (newline, ESC, C1, U+2028, bidi / format) written out as its
    escape (``\\x1b``), the rest as it is: an error line stays one line and names what was given, never a name with a
    character dropped (round 25 B25-4: a newline split the line; round 27: ``f<ESC>x`` shown as ``fx``)."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(text))


def command_shown(argv: object) -> str:
    """A recorded command line (manifest.json's ``argv``), each word under ``word_shown``, and a printable word the
    shell would split or expand quoted as the shell reads it back (``shlex.quote``: round 21's unclear U-1,
    ``--out "my runs"`` read ``--out my runs``, two words, not copy-pasteable)."""
    import shlex

    def word(a: object) -> str:
        text = word_shown(a)
        return shlex.quote(text) if text == str(a) and text else text

    return " ".join(word(a) for a in argv) if isinstance(argv, list) else ""


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters with an explicit marker of what was left out (the
    terminal's copy only: manifest.json and the report files keep the whole text)."""
    text = str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def shown(text: object, limit: int = 60) -> str:
    """User input echoed in an error line: its repr, the first ``limit`` characters of it only, with
    its length when longer (a 100 000-character ``--only`` name made a 100 kB error line)."""
    text = str(text)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}… ({len(text)} characters)"


def env_seconds(name: str, default: float) -> float:
    """Seconds from the environment variable ``name`` (``default`` when unset or blank). Raises
    ValueError naming the variable and (the start of) its value when it is not a positive, finite
    number: the CLI refuses it in one line, exit 2 (NSA_RUN_DISCOVERY_TIMEOUT, NSA_RUN_LOCK_TIMEOUT)."""
    return env_positive(name, default, "seconds")


def env_positive(name: str, default: float, unit: str) -> float:
    """A positive, finite number of ``unit`` from the environment variable ``name`` (``default`` when
    unset or blank); anything else raises ValueError naming the variable and (the start of) its value."""
    import math

    raw, text = env_text(name)
    if raw is None:
        return default
    try:  # plain ASCII digits only: float() takes Unicode digits and "_" too (round 30 U30-2)
        value = float(text) if text.isascii() and "_" not in text else math.nan
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{env_said(name, raw)} is not a positive number of {unit}")
    return value


def env_text(name: str) -> tuple[str | None, str]:
    """(the value of ``name`` as given, or None when unset or blank: spaces and tabs only; the value stripped, to
    parse). A value of control characters only is no blank: it is refused, never taken as the default (round 29
    B29-4: ``$'\x1c'`` was)."""
    import os

    raw = os.environ.get(name, "")  # only ASCII white space is stripped (round 33 U33-5: a Unicode space was too,
    return (None, "") if not raw.strip(" \t") else (raw, raw.strip(" \t\n\r\v\f"))  # unlike the options)


def env_said(name: str, raw: str) -> str:
    """``NAME='value'`` as an error line names a variable: the value as given (never stripped: round 29 B29-4,
    ``'abc\x1c'`` was shown ``'abc'``), its start where it is long."""
    return f"{name}={raw[:40]!r}" + (f" ({len(raw)} characters)" if len(raw) > 40 else "")


_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def env_switch(name: str, default: bool) -> bool:
    """An on / off ``NSA_RUN_*`` switch: unset or blank is ``default``; 1/true/yes/on and 0/false/no/off, any case.
    Raises ValueError naming the variable and (the start of) its value for anything else: the CLI refuses it in one
    line, exit 2 (round 14 U4 for NSA_RUN_SPARE_WORKER; round 24 B24-6: NSA_RUN_PYCACHE took only ``0`` as off and
    NSA_RUN_DEBUG=off turned debug on)."""
    raw, text = env_text(name)
    if raw is None:
        return default
    if text.lower() in _ON:
        return True
    if text.lower() in _OFF:
        return False
    raise ValueError(f"{env_said(name, raw)} is not one of 1/true/yes/on, 0/false/no/off")


PARITY_JOBS_ENV, PARITY_JOBS_MAX = "NSA_RUN_PARITY_JOBS", 64


def parity_jobs() -> int | None:
    """fa2-probe's parity processes from ``NSA_RUN_PARITY_JOBS`` (None when unset or blank: the default, from
    the CPU count). Raises ValueError naming the variable and (the start of) its value when it is not a whole
    number from 1 to 64: the CLI refuses it up front in one line, exit 2, as the other NSA_RUN_* (round 17 A
    U-g: ``abc`` was fa2-probe's ValueError on a GPU, not a line of the CLI)."""
    raw, text = env_text(PARITY_JOBS_ENV)
    if raw is None:
        return None
    digits = text.lstrip("0") or "0"  # (round 33 U33-4: 5000 zeros then 1 ended in Python's digit-limit advice)
    if not (text.isascii() and text.isdigit() and len(digits) <= 3 and 1 <= int(digits) <= PARITY_JOBS_MAX):
        raise ValueError(f"{env_said(PARITY_JOBS_ENV, raw)} is not a whole number of processes from 1 to "
                         f"{PARITY_JOBS_MAX}")
    return int(digits)


# ---- a hostile object's class name and first line, never raising (one helper for the worker and the impls) ----
# A class name can be any size (a metaclass property: 30 MB, round 16 B4) or not a str; a ``__str__`` can raise or
# return a str subclass with hostile methods. The worker (a stage's exception) and ``nsa_runner.impls`` (an
# adapter's values) both word them here; each says which exceptions are not swallowed (``let_through``).
NAME_CHARS = 100  # a class name as any text of the runner gives it, at most


def _not_an_exception(e: BaseException) -> bool:
    return not isinstance(e, Exception)  # the default: SystemExit / KeyboardInterrupt / ... go on up


def type_name(value: object, let_through=_not_an_exception, fallback: str = "object") -> str:
    """The name of ``value``'s class, plain and clipped to ``NAME_CHARS``; ``fallback`` when it is not a str or
    reading it raises (an exception for which ``let_through(e)`` is true is re-raised)."""
    try:
        name = type(value).__name__
        if not issubclass(type(name), str):
            return fallback
        return clip(str.__str__(name), NAME_CHARS)
    except BaseException as e:  # noqa: BLE001 - a hostile metaclass
        if let_through(e):
            raise
        return fallback


def first_line(value: object, limit: int, *, marked: bool = False, let_through=_not_an_exception) -> str | None:
    """The first line of ``str(value)`` (stripped), cut to ``limit`` characters (``marked``: with ``clip``'s
    marker of what was left out); None when ``str()`` raised or gave no str (``let_through`` as ``type_name``)."""
    try:
        text = value if type(value) is str else str(value)
        if type(text) is not str:  # a str subclass from __str__: its own methods may be hostile
            text = str.__getitem__(text, slice(0, None))
        line = (str.splitlines(str.strip(text)) or [""])[0]
        return clip(line, limit) if marked else line[:limit]
    except BaseException as e:  # noqa: BLE001 - a hostile value
        if let_through(e):
            raise
        return None


def described(e: BaseException, limit: int, *, marked: bool = False, unreadable: str | None = None,
              let_through=_not_an_exception) -> str:
    """``TYPE: first line of its message`` (``TYPE`` alone when it has none), each part clipped, never raising;
    ``TYPE`` is "Exception" when its class name cannot be read; the message, when reading it raised, is
    ``unreadable`` (default "<unprintable TYPE>")."""
    first = first_line(e, limit, marked=marked, let_through=let_through)
    name = type_name(e, let_through, "Exception")
    if first is None:
        first = f"<unprintable {name}>" if unreadable is None else unreadable
    return f"{name}: {first}" if first else name
