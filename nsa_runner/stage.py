"""The public plugin API (DESIGN §5): ``Stage``, ``StageResult``, ``Status``, ``Option``.

A stage is a small object with ``name``, ``order``, ``requires``, ``options`` and
``run(ctx) -> StageResult``. Built-in stages and third-party plugins are both found through
the entry-point group ``nsa_runner.stages``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class Status(str, enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"  # ran; a check did not hold
    SKIP = "SKIP"  # could not run here (always with the reason, and the fix when there is one)
    ERROR = "ERROR"  # the stage itself broke: exception, crash, CUDA fault
    TIMEOUT = "TIMEOUT"

    @property
    def failed(self) -> bool:
        return self in (Status.FAIL, Status.ERROR, Status.TIMEOUT)


@dataclass
class StageResult:
    status: Status
    reason: str = ""
    files: list[str] = field(default_factory=list)  # paths relative to ctx.dir
    metrics: dict[str, Any] = field(default_factory=dict)  # small JSON-able facts for summary
    hint: str = ""  # the fix, for SKIP (e.g. an install command)

    def to_dict(self) -> dict:
        return {
            "status": self.status.value,
            "reason": self.reason,
            # a list as given; anything else (e.g. one string) is passed on as is, so the runner
            # names the wrong type instead of splitting "a.txt" into letters
            "files": list(self.files) if isinstance(self.files, (list, tuple)) else self.files,
            "metrics": self.metrics,
            "hint": self.hint,
        }

    @classmethod
    def from_dict(cls, d: dict) -> StageResult:
        return cls(
            Status(d["status"]),
            d.get("reason", ""),
            list(d.get("files", [])),
            dict(d.get("metrics", {})),
            d.get("hint", ""),
        )


def int_list(text: str) -> list[int]:
    """Parse '512,1024,2k,64K' -> [512, 1024, 2048, 65536]."""
    out = []
    for part in text.split(","):
        p = part.strip().lower()
        if not p:
            continue
        mult = 1
        if p.endswith("k"):
            mult, p = 1024, p[:-1]
        v = int(p) * mult
        if v <= 0:
            raise ValueError(f"expected positive integers, got {part.strip()!r}")
        out.append(v)
    if not out:
        raise ValueError("expected a comma-separated list of integers")
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
