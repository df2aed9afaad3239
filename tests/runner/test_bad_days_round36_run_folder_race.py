"""Bad days, red-team round 36 B36-4: six ``nsa-run stage`` commands started at once into an empty ``--out`` split
across two run folders (``<id>`` and ``<id>.2``) in 2 of 8 trials, a stage run in each. The root, reproduced without
timing luck: ``create_run_folder(only_first=True)`` chose the folder number after writing the manifest, so a first
folder another command made meanwhile moved this one to ``<id>.2``. Expected (its docstring): the only name tried is
the next after the folders that existed at the call; None when another run took it (the caller joins that run)."""

from __future__ import annotations

from nsa_runner.artifacts import create_run_folder


def test_a_first_folder_made_meanwhile_is_joined_never_split(tmp_path):
    out = tmp_path / "out"

    def fill(tmp):  # another ``stage`` command makes the first folder while this one writes its manifest
        (tmp / "manifest.json").write_text("{}")
        other = out / "rid"
        other.mkdir()
        (other / "manifest.json").write_text("{}")

    assert create_run_folder(out, "rid", fill, only_first=True) is None  # before: out/rid.2, a second run
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["rid"]


def test_without_only_first_the_next_free_name_is_taken(tmp_path):
    out = tmp_path / "out"

    def fill(tmp):
        (tmp / "manifest.json").write_text("{}")
        (out / "rid").mkdir()
        (out / "rid" / "manifest.json").write_text("{}")

    assert create_run_folder(out, "rid", fill).name == "rid.2"  # a oneshot: a run of its own, never another's folder
