"""``manifest.json`` of one run folder (DESIGN §6), rewritten atomically after every stage.

``{"schema_version": 1, "run_id", "started", "finished", "argv", "host", "device", "profile",
"interrupted", "stages": [{"name", "status", "duration_s", "reason", "files", ...}, ...],
"history": [...]}``. ``history`` keeps the entries replaced when ``nsa-run stage X`` reruns a
stage in an existing run folder, with where its old files were moved.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

from nsa_runner.artifacts import (
    MANIFEST_NAME,
    MANIFEST_SCHEMA_VERSION,
    load_manifest,
    now_iso,
    stage_owns,
    write_json,
)


def host_info() -> dict:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "cpu_count": os.cpu_count(),
    }


class RunManifest:
    """The manifest of one run folder; ``write()`` replaces the file atomically."""

    def __init__(self, dir: Path, data: dict):
        self.dir = Path(dir).resolve()  # absolute: stages run with it as cwd and get it as ctx.dir
        self.data = data

    @property
    def path(self) -> Path:
        return self.dir / MANIFEST_NAME

    @classmethod
    def create(cls, dir: Path, run_id: str, argv: list[str], **run_facts: Any) -> RunManifest:
        data = {
            "schema_version": MANIFEST_SCHEMA_VERSION,
            "run_id": run_id,
            "started": now_iso(),
            "finished": None,
            "argv": list(argv),
            "host": host_info(),
            **run_facts,
            "interrupted": False,
            "stages": [],
            "history": [],
        }
        m = cls(dir, data)
        m.write()
        return m

    @classmethod
    def open(cls, dir: Path, argv: list[str]) -> RunManifest:
        """An existing run folder (``nsa-run stage X`` into it). Raises ManifestError if unusable."""
        data = load_manifest(Path(dir) / MANIFEST_NAME)
        data.setdefault("history", [])
        data.setdefault("updates", []).append({"argv": list(argv), "started": now_iso()})
        return cls(dir, data)

    @property
    def stages(self) -> list[dict]:
        return self.data["stages"]

    def entry(self, name: str) -> dict | None:
        return next((s for s in self.stages if s.get("name") == name), None)

    def set_aside(self, name: str) -> Path | None:
        """Move the files and log of stage ``name``'s earlier result to ``history/<name>-<time>/``.

        The manifest entry moves to ``history`` (with ``moved_to``). Nothing is deleted.
        Returns the history folder, or None when the stage had no earlier result.
        """
        old = self.entry(name)
        if old is None:
            return None
        stamp = now_iso().replace(":", "").replace("+", "p")
        dest = self.dir / "history" / f"{name}-{stamp}"
        n = 1
        while dest.exists():
            n += 1
            dest = self.dir / "history" / f"{name}-{stamp}.{n}"
        files = old.get("files") if isinstance(old.get("files"), list) else []
        for rel, is_log in [(f, False) for f in files] + [(old.get("log") or "", True)]:
            # never anything outside the run folder, nor a shared name (logs, history, manifest)
            if not rel or not stage_owns(self.dir, name, rel, log=is_log):
                continue
            src = self.dir / rel
            if src.is_file() or src.is_dir():
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(src), str(target))
        self.data["history"].append({**old, "moved_to": str(dest.relative_to(self.dir))})
        self.write()
        return dest

    def record(self, entry: dict) -> None:
        """Add or replace (same name, same position) a stage entry, then write the manifest."""
        for i, s in enumerate(self.stages):
            if s.get("name") == entry["name"]:
                self.stages[i] = entry
                break
        else:
            self.stages.append(entry)
        self.write()

    def finish(self, interrupted: bool = False) -> None:
        if self.data.get("updates"):
            self.data["updates"][-1]["finished"] = now_iso()
        self.data["finished"] = now_iso()
        self.data["interrupted"] = bool(interrupted or self.data.get("interrupted"))
        self.write()

    def write(self) -> None:
        write_json(self.path, self.data)
