"""The hint under a runner error says what the error was about: disk space only for a full disk
(round 11's A-R4 showed "free some space" under a "File exists" that had nothing to do with space)."""

from __future__ import annotations

import errno

from nsa_runner.commands import _common


def test_the_hint_names_space_only_for_a_full_disk():
    full = _common._disk_hint(OSError(errno.ENOSPC, "No space left on device"))
    assert "disk is full" in full and "free some space" in full
    assert "free" not in _common._disk_hint(OSError(errno.EEXIST, "File exists"))
    perm = _common._disk_hint(OSError(errno.EACCES, "Permission denied"))
    assert "not writable" in perm and "free" not in perm
    assert "not writable" in _common._disk_hint(OSError(errno.EROFS, "Read-only file system"))
