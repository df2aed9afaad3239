"""docs stand alone (issue 17): docs/architecture.md names every module of the three packages.

A module added without a line in the map fails here, naming it. The check is by module name
(``fast`` / ``fast.py``) as a word, inside the tree of its package (the text between the package's
heading line, e.g. ``nsa_core/``, and the next package), so a same-named module of another
package does not count.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("nsa_core", "nsa_runner", "stages")


def _package_text(doc: str, pkg: str) -> str:
    starts = {p: m.start() for p in PACKAGES if (m := re.search(rf"^{p}/", doc, re.M))}
    assert pkg in starts, f"docs/architecture.md has no tree for {pkg}/"
    after = sorted(v for v in starts.values() if v > starts[pkg])
    return doc[starts[pkg]: after[0] if after else len(doc)]


def test_architecture_names_every_module():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    missing = []
    for pkg in PACKAGES:
        text = _package_text(doc, pkg)
        for f in sorted((ROOT / pkg).rglob("*.py")):
            if f.name == "__init__.py" or "__pycache__" in f.parts:
                continue
            if not re.search(rf"(?<![\w.]){re.escape(f.stem)}\b", text):
                missing.append(str(f.relative_to(ROOT)))
    assert not missing, f"docs/architecture.md does not name: {', '.join(missing)}"
