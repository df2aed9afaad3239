"""The run context handed to ``Stage.run(ctx)`` (see ``nsa_runner.stage.RunContextLike``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class RunContext:
    """What a stage may use: write artifacts into ``dir`` only.

    dir      the run folder (``<out>/<run-id>/``); the stage process also runs with it as cwd
    device   "cuda" or "cpu"
    profile  "quick" (tiny shapes, CPU / CI) or "full" (GPU)
    options  this stage's options by dest (``--S-list`` -> ``S_list``), defaults filled in
    run_id   the run id (git sha, ``<sha>-dirty-<hash>``, or ``nogit-<hash>``)
    stage    the name of the stage being run
    """

    dir: Path
    device: str
    profile: str
    options: dict[str, Any] = field(default_factory=dict)
    run_id: str = ""
    stage: str = ""

    def to_dict(self) -> dict:
        return {
            "dir": str(self.dir),
            "device": self.device,
            "profile": self.profile,
            "options": self.options,
            "run_id": self.run_id,
            "stage": self.stage,
        }

    @classmethod
    def from_dict(cls, d: dict) -> RunContext:
        return cls(Path(d["dir"]), d["device"], d["profile"], dict(d.get("options", {})),
                   d.get("run_id", ""), d.get("stage", ""))
