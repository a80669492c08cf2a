"""What every command checks before it loads a model or scores a prompt.

A run on a real model can take half an hour; what would make it fail at the end (an output
name that is a folder, a folder it cannot write, a disk without room, a working directory
that was deleted, a FIFO in a model folder that blocks the first read) is found here first,
in one line that names the place and, for room, the size needed:

- `check_working_directory`: the first thing every command does (before torch is imported:
  torch dies in a deleted working directory with "Intel oneMKL FATAL ERROR").
- `check_room`: the files a run writes (`finals`) are not folders or symbolic links, a test
  write of a staging folder beside them succeeds, and the filesystem has the run's own estimate
  free with a margin. It returns the plan line that says so.
- `check_no_special_files`: a model folder or a received folder holds no FIFO, device or socket.

Paths in its messages go through `lpes.foundation.errors.shown`, so no path can break the one line.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from lpes.foundation.devices import format_bytes
from lpes.foundation.errors import USER_OS_ERRORS, LpesError, shown

# Every estimate gets this on top: files lpes does not size exactly (plots, sidecars, a card) and the
# filesystem's own blocks. 10 % and at least 16 MiB.
MARGIN_SHARE = 0.10
MARGIN_BYTES = 16 * 2**20
PROBE_BYTES = 256 * 1024  # the test write: what a full disk or a file size limit refuses shows here
PROBE_INFIX = ".lpes-probe-"
_MAX_ENTRIES = 100_000  # a folder with more entries than this is not walked to its end


# ---- the working directory ----


def check_working_directory() -> None:
    """LpesError (one line) when the working directory was deleted or cannot be read; else nothing."""
    try:
        cwd = os.getcwd()
    except FileNotFoundError:
        raise LpesError("the working directory was deleted (or its folder moved); cd to a folder that exists "
                        "and run the command again") from None
    except OSError as err:
        raise LpesError(f"cannot read the working directory ({err.strerror or err}); cd to another folder and run "
                        "the command again") from None
    try:
        os.stat(".")
        readable = os.access(".", os.R_OK | os.X_OK)
    except OSError as err:
        raise LpesError(f"cannot read the working directory {shown(cwd)} ({err.strerror or err}); cd to another "
                        "folder and run the command again") from None
    if not readable:
        raise LpesError(f"cannot read the working directory {shown(cwd)} (permission denied); cd to another "
                        "folder and run the command again")


# ---- room for what a run writes ----


def with_margin(estimate: int) -> int:
    """What a run needs free for an estimate of `estimate` bytes: the estimate and MARGIN."""
    return int(estimate + max(estimate * MARGIN_SHARE, MARGIN_BYTES))


def check_room(finals: Sequence[Path], estimate: int, hint: str = "free some space or choose another --out") -> str:
    """Check, before any work, that a run can write the files `finals` (in one folder) and `estimate` bytes
    there: no final name is a symbolic link or a folder, a test write of a staging folder beside them
    succeeds, and the filesystem has the estimate free with a margin; else LpesError (one line) naming the
    place and the size needed. Returns the plan line: what it writes, where, and what is free."""
    for final in finals:
        _check_final_name(Path(final))
    folder = Path(finals[0]).parent
    return f"writes about {_room(folder, Path(finals[0]).name, estimate, hint)} in {shown(folder)}"


def check_folder_room(out: Path, estimate: int, hint: str = "free some space or choose another --out") -> str:
    """`check_room` for an output folder that a staging folder beside it becomes (lpes-convert's --out; its
    own name is checked by lpes.foundation.outputs.check_output_folder). Returns the plan line."""
    return f"writes about {_room(Path(out).parent, Path(out).name, estimate, hint)} into {shown(out)}"


def _room(folder: Path, name: str, estimate: int, hint: str) -> str:
    """The test write beside `name` in `folder` (or the nearest folder above it that exists) and the free
    space; the plan line's sizes."""
    existing = nearest_existing(folder)
    _probe(existing, name)
    need = with_margin(estimate)
    free = shutil.disk_usage(existing).free
    if free < need:
        raise LpesError(f"{shown(existing)} has {format_bytes(free)} free; this run writes up to "
                        f"{format_bytes(need)} there ({format_bytes(estimate)} estimated, and a margin): {hint}")
    return f"{format_bytes(estimate)} ({format_bytes(need)} with the margin; {format_bytes(free)} free)"


def nearest_existing(folder: Path) -> Path:
    """`folder`, or the nearest folder above it that exists (where the run's mkdir starts)."""
    here = Path(os.path.abspath(folder))
    while not here.exists() and here != here.parent:
        here = here.parent
    return here


def _check_final_name(final: Path) -> None:
    if final.is_symlink():
        raise LpesError(f"{shown(final)} is a symbolic link, which lpes did not make; this run writes a file "
                        "there and neither follows nor replaces a link: move it")
    if final.exists() and not final.is_file():
        kind = "folder" if final.is_dir() else "special file"
        raise LpesError(f"cannot write {shown(final)}: it is a {kind}; this run writes a file there (move it)")


def _probe(folder: Path, name: str) -> None:
    """A test write of a staging folder beside the final name: made, written PROBE_BYTES, flushed, removed."""
    if not folder.is_dir():
        raise LpesError(f"cannot write in {shown(folder)}: it is not a folder")
    probe = folder / f".{name[:64]}{PROBE_INFIX}{os.getpid()}"
    shutil.rmtree(probe, ignore_errors=True)  # one a killed run with this process id left
    try:
        probe.mkdir()
    except OSError as err:
        raise LpesError(f"cannot write in {shown(folder)}: {_why(err)} (checked before any work)") from None
    try:
        fd = os.open(probe / "probe", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            left = memoryview(b"\0" * PROBE_BYTES)
            while left:  # a file size limit cuts a write short; the write after it fails (EFBIG)
                left = left[os.write(fd, left):]
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as err:
        raise LpesError(f"cannot write in {shown(folder)}: {_why(err)} (checked before any work)") from None
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def _why(err: OSError) -> str:
    reason = err.strerror or str(err)
    return f"{reason} ({USER_OS_ERRORS[err.errno]})" if err.errno in USER_OS_ERRORS else reason


# ---- special files ----

_SPECIAL = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
            stat.S_IFSOCK: "a socket"}


def check_no_special_files(folder: Path, what: str) -> None:
    """LpesError (one line) when `folder` (symbolic links to folders not followed) holds a FIFO, a device or a
    socket: reading one blocks forever or reads what is not a file. `what` names the folder ("a model folder")."""
    for path in _entries(Path(folder)):
        try:
            mode = os.stat(path).st_mode  # a link's target: Hugging Face's cache links every file to blobs/
        except OSError:
            continue  # gone, a dangling link or unreadable: the read that needs it says so
        kind = _SPECIAL.get(stat.S_IFMT(mode))
        if kind is not None:
            raise LpesError(f"{shown(path)} is {kind}; {what} holds regular files and folders only "
                            "(lpes would block or read a device reading it): remove it")


def _entries(folder: Path) -> Iterable[Path]:
    count = 0
    for root, dirs, names in os.walk(folder):  # an unreadable subfolder is skipped: its reader says so
        for name in dirs + names:
            count += 1
            if count > _MAX_ENTRIES:
                return
            yield Path(root) / name

