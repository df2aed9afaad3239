"""The one safe reader of installed distributions' files (private; standard library only).

``read_regular_file(path, limit)``: the bytes of a regular file, opened non-blocking, its type checked on
the open descriptor, at most ``limit`` bytes: never a FIFO's wait, a device's endless read (a link to
/dev/zero) nor a huge file's memory. ``read_dist_file(folder, name)``: one file of a distribution's
metadata folder through it (or through the folder's own path object: a folder inside a zip on sys.path).
``SafeDistribution``: an ``importlib.metadata.PathDistribution`` whose every file is read so.

Used by nsa-run's plugin discovery (``nsa_runner._discover``), its check of the installed metadata at every
command's start and of its own metadata folders (``nsa_runner.registry``) and the flash-attn facts
(``nsa_core.flash.detect.safe_distribution``): round 17 U-6, round 18 B-1, round 19 B19-2 (a blocking
``open`` of a FIFO hung every command). importlib.metadata itself reads them blocking and whole.

Never imports the ``nsa_core`` package (its ``__init__`` imports torch, whose import reads every
distribution's entry_points.txt: what this reader exists to check first): nsa-run and ``detect`` load
this file by its path (``load``'s callers), registered as ``nsa_core._distfiles``.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import stat

MAX_DIST_FILE_BYTES = 64 << 20  # one file of a distribution's metadata folder (METADATA, entry_points.txt, ...)


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in words ("a FIFO", "a character device", ...)."""
    for test, word in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return word
    return "not a regular file"


class UnreadableDistFile(Exception):
    """A file that cannot be read safely: a FIFO, a device, a socket, larger than its limit, or no permission.
    ``str()``: ``"{path} {why}"``, naming it and why; ``kind``: what it is when it is no regular file."""

    def __init__(self, path: str, why: str, kind: str | None = None):
        super().__init__(f"{path} {why}")
        self.path, self.why, self.kind = path, why, kind


def read_regular_file(path: str | os.PathLike, limit: int = MAX_DIST_FILE_BYTES) -> bytes | None:
    """The bytes of regular file ``path``: opened non-blocking (a FIFO's open never waits), its type checked
    on the descriptor (no swap between a check and the open), at most ``limit`` bytes read. None where there
    is nothing to read (missing, a dangling link, a folder); UnreadableDistFile for the rest (a FIFO, a
    device, a socket, larger than ``limit``, no permission, a link loop)."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except OSError as e:  # no permission; a socket (ENXIO); a link loop; ...
        raise UnreadableDistFile(path, f"cannot be read ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            return None
        if not stat.S_ISREG(st.st_mode):
            kind = file_kind(st.st_mode)
            raise UnreadableDistFile(path, f"is {kind}, not a regular file", kind)
        chunks, size = [], 0
        while size <= limit and (chunk := os.read(fd, min(1 << 20, limit + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise UnreadableDistFile(path, f"is larger than {_size(limit)}")
        return b"".join(chunks)
    except OSError as e:
        raise UnreadableDistFile(path, f"cannot be read ({e.strerror or e})") from None
    finally:
        os.close(fd)


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n} bytes"


def read_dist_file(folder: object, name: str) -> bytes | None:
    """The bytes of file ``name`` of a distribution's metadata folder (``""``: the folder itself, an old
    egg-info file), as ``importlib.metadata`` reads it but through ``read_regular_file`` (round 17 U-6: a
    METADATA FIFO of a package that is no plugin at all stopped every command). None where
    importlib.metadata finds nothing (missing, a dangling link, a folder); UnreadableDistFile for the rest."""
    if not isinstance(folder, (str, os.PathLike)):  # a folder inside a zip on sys.path (zipfile.Path)
        return _read_member(folder, name)
    return read_regular_file(os.path.join(os.fspath(folder), name) if name else os.fspath(folder))


def _read_member(folder, name: str) -> bytes | None:
    """``read_dist_file`` for a distribution whose metadata folder is no folder of the file system but a
    path object of its own, e.g. ``zipfile.Path`` inside a zip on sys.path (round 18 B-2: os.open of
    ``<zip>/<folder>/METADATA`` failed, NotADirectoryError, and the plugin was neither listed nor named
    broken). Read through that object (a zip member is no FIFO nor device), at most MAX_DIST_FILE_BYTES;
    None where importlib.metadata finds nothing, UnreadableDistFile naming it and why for the rest."""
    where = f"{folder}{name}" if str(folder).endswith("/") else f"{folder}/{name}" if name else str(folder)
    try:
        path = folder.joinpath(name) if name else folder
        if path.is_dir():
            return None
        with path.open("rb") as f:
            data = f.read(MAX_DIST_FILE_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, KeyError):
        return None
    except Exception as e:  # noqa: BLE001 - a bad zip (BadZipFile, zlib.error), no permission, ...
        raise UnreadableDistFile(where, f"cannot be read ({type(e).__name__}: {e})") from None
    if len(data) > MAX_DIST_FILE_BYTES:
        raise UnreadableDistFile(where, f"is larger than {_size(MAX_DIST_FILE_BYTES)}")
    return data


class SafeDistribution(md.PathDistribution):
    """An installed distribution whose files are read by ``read_dist_file`` (each once: ``raw``). Its
    ``entry_points``, ``metadata``, ``version``, ``files`` raise UnreadableDistFile naming a file that cannot
    be read safely, UnicodeDecodeError for one that is not UTF-8 (as importlib.metadata does)."""

    def __init__(self, path):
        super().__init__(path)
        self.raw: dict[str, bytes | None] = {}

    def read_text(self, filename):
        filename = str(filename)
        if filename not in self.raw:
            self.raw[filename] = read_dist_file(self._path, filename)
        data = self.raw[filename]
        if data is None:
            return None
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")  # (text mode's newlines)


def safe(dist: md.Distribution) -> md.Distribution:
    """``dist`` as a SafeDistribution when it is a metadata folder (of the file system or inside a zip);
    another finder's distribution as it is."""
    path = getattr(dist, "_path", None)
    return SafeDistribution(path) if type(dist) is md.PathDistribution and path is not None else dist


def distributions():
    """``importlib.metadata.distributions()``, a metadata folder's each as a SafeDistribution (finding them
    reads folder names only)."""
    for dist in md.distributions():
        yield safe(dist)
