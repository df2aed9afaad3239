"""Bad days, red-team round 2 (issue 16): one installed distribution with a malformed
``entry_points.txt`` (in any group) must not hide every other stage. Discovery reads entry points per
distribution: the broken one that may declare stages is listed as broken, naming it; one that
declares only other groups is passed over; the built-ins and the other plugins stay. (Round 19 B19-3:
``import torch`` parses every distribution's entry points and fails on such a file, so the CLI now refuses
it up front, exit 2 naming it: test_bad_days_round19_a_entry_points. Discovery itself, checked here, still
keeps it to its own distribution.)"""

from __future__ import annotations

import json

from _bad_days import make


def _broken_dist(site, dist: str, text: bytes) -> None:
    info = site / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_bytes(text)


def test_a_malformed_entry_points_file_breaks_only_its_own_distribution(plugins, cli):
    from nsa_runner.registry import discover

    make(plugins)
    _broken_dist(plugins.site, "junk_pkg", b"[nsa_runner.stages]\nthis line has no equals sign\n")
    _broken_dist(plugins.site, "other_pkg", b"[console_scripts]\nbroken line\n")
    r = cli("list", "--device", "cpu", "--json")
    assert r.exit_code == 2 and "entry_points.txt cannot be parsed" in r.output, r.output  # round 19 B19-3
    stages = {e.name: {"error": e.error, "dist": e.dist} for e in discover()}  # discovery on its own
    assert {"sanity", "env-pairing", "x", "y", "z"} <= set(stages), sorted(stages)  # built-ins and plugins kept
    broken = [s for s in stages.values() if "junk-pkg" in json.dumps(s)]
    assert len(broken) == 1 and "cannot be read" in json.dumps(broken[0]), broken
    assert not [s for s in stages.values() if "other-pkg" in json.dumps(s)]
