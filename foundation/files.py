"""Atomic writes: the one place lpes puts a file where a user will look for it.

Each file is written under a temporary name in its destination folder, flushed to disk,
then renamed into place, so a reader (or a run killed halfway) never sees a partial file.
`tempfile.mkstemp` creates its file with mode 0600; a published file must follow the
user's umask like any other file they create (0644 under the usual 022), so the mode is
set to 0666 & ~umask before the rename. Failures to write (a full disk, a read-only
folder, a path that is a directory) are the user's to fix: LpesError, one line.

`read_json_object` is the reading side for the JSON files lpes and users write (configs,
sidecars): a file that is missing, unreadable, not JSON or not an object is LpesError, one line.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from lpes.foundation.errors import LpesError, shown
from lpes.foundation.interrupts import check_interrupted


def write_bytes_atomic(path: str | os.PathLike, data: bytes | bytearray | memoryview) -> None:
    """Write `data` (bytes, or any buffer such as TensorRT's IHostMemory) to `path` through a temporary
    file renamed into place; the mode follows the umask."""
    save_atomic(path, lambda tmp: tmp.write_bytes(data))


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically; mode follows the umask."""
    write_bytes_atomic(path, text.encode("utf-8"))


def save_atomic(path: str | os.PathLike, save: Callable[[Path], object]) -> Path:
    """Let `save(tmp)` write the file (savefig, onnx.save, an engine's bytes), then rename it to `path`.

    The temporary name keeps `path`'s suffix, for writers that choose the format by extension.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp{path.suffix}")
    except OSError as err:
        raise LpesError(f"cannot write {shown(path)}: {_reason(err)}") from None
    os.close(fd)
    tmp = Path(name)
    try:
        save(tmp)
        fsync_path(tmp)  # without it a crash soon after the rename can leave an empty file under the final name
        os.chmod(tmp, 0o666 & ~current_umask())
        check_interrupted()  # a SIGINT/SIGTERM Python dropped: nothing is renamed into place (foundation/interrupts.py)
        os.replace(tmp, path)
    except OSError as err:
        raise LpesError(f"cannot write {shown(path)}: {_reason(err)}") from None
    finally:
        tmp.unlink(missing_ok=True)  # gone already after a successful rename
    return path


def current_umask() -> int:
    """The process's umask, read without changing it where the kernel reports it.

    os.umask can only read the mask by setting it; between the set and the restore another
    thread's new files would get the wrong mode, so Linux's /proc/self/status comes first.
    """
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def read_json_object(path: str | os.PathLike) -> dict:
    """The JSON object in `path`; LpesError (one line) when it cannot be read or is not an object."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:  # ValueError: also integers of over 4300 digits
        why = str(err).splitlines()[0][:120] if str(err) else type(err).__name__
        raise LpesError(f"cannot read {shown(path)}: {why}") from None
    except RecursionError:
        raise LpesError(f"cannot read {shown(path)}: JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise LpesError(f"{shown(path)} is not a JSON object")
    return data


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a file's data, or a folder's entries (its renames), to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _reason(err: OSError) -> str:
    return err.strerror or str(err)
