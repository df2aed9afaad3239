"""Reproducible randomness for the stages that draw random inputs (private).

Every such stage takes ``--seed`` (:func:`option`), seeds its ``torch.Generator`` from it,
records the seed it used in its artifacts and prints the command that replays the run
(:func:`announce`), e.g. ``nsa-run stage sanity --seed 1234 --device cuda --profile full``.
A stage whose default is ``None`` draws a fresh seed per run (fresh inputs every time, still
replayable: the drawn seed is what is recorded and printed).
"""

from __future__ import annotations

import os
import shlex

from nsa_runner._text import shown
from nsa_runner.stage import ASCII_SPACE, NotAnInteger, Option, whole_number

MAX_SEED = 2**63 - 1


def parse(text: str) -> int:
    """A seed: ASCII decimal digits, 0 .. 2**63-1, read as every integer option is (``stage.whole_number``; round 31
    U31-2: ``int(text, 0)`` took Unicode digits, ``_`` and ``0x`` / ``0b``)."""
    t = str(text).strip(ASCII_SPACE)
    try:
        return whole_number(t, 0, MAX_SEED)
    except NotAnInteger:
        raise ValueError(f"--seed must be an integer in 0..2**63-1 (decimal digits), got {shown(t, 40)}") from None
    except ValueError:
        raise ValueError(f"--seed must be in 0..2**63-1, got {shown(t, 40)}") from None


def option(default: int | None, what: str = "the random inputs") -> Option:
    fresh = "default: a fresh seed each run, recorded" if default is None else f"default {default}"
    return Option("--seed", parse, default, f"seed of {what} ({fresh}); the stage prints the command that replays it")


def resolve(ctx) -> int:
    """The ``--seed`` given, else a fresh one (os.urandom) for a stage whose default is None."""
    value = (getattr(ctx, "options", None) or {}).get("seed")
    if value is None:
        return int.from_bytes(os.urandom(4), "little")
    return parse(value) if isinstance(value, str) else int(value)


def replay_command(ctx, stage: str, seed: int, **options) -> str:
    """``nsa-run stage NAME --seed N --device D --profile P [--opt value ...]`` for this run."""
    parts = ["nsa-run", "stage", stage, "--seed", str(seed), "--device", str(ctx.device), "--profile", str(ctx.profile)]
    for key, value in options.items():
        if value is not None:
            parts += [f"--{key.replace('_', '-')}", str(value)]
    return shlex.join(parts)


def announce(ctx, stage: str, seed: int, **options) -> str:
    """Print the seed and the replay command (it lands in the stage log); returns the command."""
    cmd = replay_command(ctx, stage, seed, **options)
    print(f"seed {seed}; replay with: {cmd}", flush=True)
    return cmd
