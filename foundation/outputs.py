"""Output paths that never destroy anything: checks at plan time, then a lock, a staging folder and a swap.

Next to an output folder OUT, in its parent:

    OUT/                      the output; holds MARKER, which is what --force looks for
    .OUT.lpes-lock            flock'ed by the one run writing OUT; removed when it is done
    .OUT.lpes-partial-PID     the staging folder that run writes into
    .OUT.lpes-old             the previous OUT for a moment, where the swap takes two renames

`check_output_folder` (plan time) refuses an --out whose replacement could lose the user's
files: empty, the working directory or a folder holding it, the model folder, inside it or
holding it, a file, or a folder lpes did not write. `staged_output` (execute time) takes
the lock, repairs what a killed run left, yields the staging folder and, when the body
finishes, swaps it in atomically. `check_output_file` is the same idea for a single file
(lpes-search's spec), whose write is atomic by itself (lpes.foundation.files.write_text_atomic);
`locked_output` gives such a file its lock. A name beside OUT that holds something lpes did
not make (a planted symbolic link) is refused, never followed. A staging folder a killed run
left is removed by the next run that writes the same OUT, which says so (with its size) once
every check has passed; no other command mentions it (its one stderr line stays its own), and
lpes keeps no record of it anywhere else.

--force replaces only what lpes wrote. MARKER is an inventory: just before the swap it lists
every file in the staging folder with its size (and, up to HASHED_BYTES, its sha256), and
`record_written` adds what a later lpes command writes into the folder (lpes-validate's report
and card). A file in OUT that the inventory does not list, or that differs from it (a notes
file, an edited card), an empty folder of the user's, or a marker with no inventory (an older
lpes) makes the run refuse in one line naming it, at plan time and again under the lock; it is
never deleted. A temporary file of an interrupted atomic write (`files.save_atomic`) is lpes's.
`check_not_in_output` refuses an input (--curve, a --data file) inside the OUT a run would replace.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lpes.foundation.devices import format_bytes
from lpes.foundation.errors import LpesError, shown
from lpes.foundation.files import fsync_path, write_text_atomic
from lpes.foundation.interrupts import check_interrupted, shielded
from lpes.foundation.preflight import check_room, nearest_existing

MARKER = ".lpes-output"
MARKER_FORMAT = "lpes-output"
STAGING_INFIX = ".lpes-partial-"
# The longest sibling name lpes makes from OUT's name: "." + name + ".lpes-partial-" + a 7-digit pid.
SIBLING_EXTRA = 1 + len(STAGING_INFIX) + 7
HASHED_BYTES = 2**20  # files up to this size are inventoried with their sha256 (cards, configs, code); larger by size
# files.save_atomic's temporary name (tempfile.mkstemp: 8 of [a-z0-9_]), left where a write was killed
_ATOMIC_TEMP = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp(\.[^/]*)?")


# ---- plan time ----


def check_output_folder(out: str | os.PathLike, model_path: Path, force: bool,
                        inputs: list[tuple[str, str | os.PathLike]] = ()) -> Path:
    """The --out folder as a Path, or LpesError (one line) when writing it could destroy anything (`inputs`:
    (flag, path) of the files the run reads, which must not be in it)."""
    path = _non_empty(out)
    _check_not_around_cwd(path)
    _check_apart_from_model(path, model_path)
    if path.is_symlink():
        raise LpesError(f"--out {shown(path)} is a symbolic link; name the folder itself")
    if path.exists() and not path.is_dir():
        raise LpesError(f"--out {shown(path)} is a file; lpes-convert writes a folder there (choose a new name)")
    for flag, read in inputs if force else ():  # without --force an existing --out is refused below
        check_not_in_output(read, path, flag)
    _check_replaceable(path, force)
    _check_creatable(path)
    check_siblings(path)
    return path


def check_output_file(out: str | os.PathLike, force: bool) -> Path:
    """A file --out (lpes-search's spec) as a Path, or LpesError: not a folder, not there without --force."""
    path = _non_empty(out)
    if path.is_dir():
        raise LpesError(f"--out {shown(path)} is a folder; name the spec file to write (e.g. {path / 'best.json'})")
    if path.exists() and not force:
        raise LpesError(f"{shown(path)} exists; pass --force to overwrite it")
    _check_creatable(path)
    check_siblings(path)
    return path


_TEMP_EXTRA = len("..") + 8 + len(".tmp")  # files.save_atomic's temporary name: .NAME.XXXXXXXX.tmpSUFFIX


def check_files_beside(out: Path, names: list[str], need_bytes: int) -> str:
    """The files a run will write in `out`'s folder (`names`) fit the filesystem's name limit with their
    temporary names, the folder takes a test write, and it has `need_bytes` free with a margin; else
    LpesError. Returns the plan line (preflight.check_room)."""
    name_max = os.pathconf(nearest_existing(_real(out).parent), "PC_NAME_MAX")
    for name in names:
        there = Path(out).parent / name
        if there.is_symlink() or (there.exists() and not there.is_file()):
            raise LpesError(f"{shown(there)} is in the way: this run writes a file there, and it is a "
                            f"{'symbolic link' if there.is_symlink() else 'folder'}; move it")
        if len(name.encode()) + _TEMP_EXTRA + len(Path(name).suffix) > name_max:
            raise LpesError(f"--out {out.name[:40]!r}...: the file {name[:60]!r}... it writes beside it makes a name "
                            f"longer than this filesystem allows ({name_max} bytes); shorten the name")
    return check_room([Path(out).parent / name for name in names], need_bytes)


def check_siblings(out: Path) -> None:
    """The names lpes uses beside `out` (lock, aside, staging) hold nothing lpes did not make: a planted
    symbolic link there would make lpes create, rename or remove files elsewhere."""
    lock, aside = _sibling(out, ".lpes-lock"), _sibling(out, ".lpes-old")
    if lock.is_symlink() or (lock.exists() and not lock.is_file()):
        raise LpesError(f"{shown(lock)} is not lpes's lock file (a "
                        f"{'symbolic link' if lock.is_symlink() else 'folder'}); lpes does not follow or remove it: "
                        "remove it yourself")
    if aside.is_symlink() or (aside.exists() and not aside.is_dir()):
        raise LpesError(f"{shown(aside)} is not a folder lpes set aside (a "
                        f"{'symbolic link' if aside.is_symlink() else 'file'}); lpes does not follow or remove it: "
                        "remove it yourself")
    for stale in _staging_folders(out):
        if stale.is_symlink() or not stale.is_dir():
            raise LpesError(f"{shown(stale)} is not a staging folder lpes made (a "
                            f"{'symbolic link' if stale.is_symlink() else 'file'}); remove it yourself")


def check_not_in_output(path: str | os.PathLike | None, out: str | os.PathLike, flag: str) -> None:
    """Refuse an input file (`flag`: --curve, --data) that is the existing --out a run would replace, or inside
    it: --force would delete it."""
    if path is None or not str(out).strip():
        return
    here, there = _real(Path(path)), _real(Path(out))
    if here == there or (there.is_dir() and there in here.parents):
        link = f" (a link to {shown(here)})" if Path(os.path.abspath(path)) != here else ""
        raise LpesError(f"{flag} {shown(path)}{link} is {'inside --out' if here != there else '--out'} "
                        f"{shown(out)}, which --force would replace; copy it out first or choose another --out")


def check_outside_model(path: Path, model_path: Path) -> None:
    """Refuse an output file written into the model folder (or a subfolder of it)."""
    here, model = _real(path), _real(model_path)
    if here == model or model in here.parents:
        raise LpesError(f"--out {shown(path)} is inside the model folder {shown(model_path)}; write it elsewhere")


def is_lpes_output(path: Path) -> bool:
    """Whether `path` is a folder an lpes run wrote (it holds the marker)."""
    marker = path / MARKER
    if marker.is_symlink() or not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("format") == MARKER_FORMAT
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return False


def _non_empty(out: str | os.PathLike) -> Path:
    if not str(out).strip():  # Path("") is ".": an unset shell variable would name the working directory
        raise LpesError("--out is empty (an unset shell variable?); name a new folder")
    return Path(out)


def _real(path: Path) -> Path:
    return Path(os.path.realpath(os.path.abspath(path)))


def _check_not_around_cwd(path: Path) -> None:
    here, cwd = _real(path), _real(Path.cwd())
    if here == cwd:
        raise LpesError(f"--out {shown(path)} is the current directory; name a new folder")
    if here in cwd.parents:
        raise LpesError(f"--out {shown(path)} holds the current directory; name a new folder")


def _check_apart_from_model(path: Path, model_path: Path) -> None:
    here, model = _real(path), _real(model_path)
    if here == model:
        raise LpesError(f"--out {shown(path)} is the model folder; name a new folder")
    if model in here.parents:
        raise LpesError(f"--out {shown(path)} is inside the model folder {shown(model_path)}; name a folder elsewhere")
    if here in model.parents:
        raise LpesError(f"--out {shown(path)} holds the model folder {shown(model_path)}; name a new folder")


def _check_replaceable(path: Path, force: bool) -> None:
    if not path.exists():
        return
    if not force:
        raise LpesError(f"output folder {shown(path)} exists; pass --force to replace it")
    if not is_lpes_output(path):
        if any(path.iterdir()):
            raise LpesError(f"{shown(path)} was not written by lpes-convert (no {MARKER} in it); --force replaces "
                            "only lpes output folders, delete it yourself if it is yours")
        return
    _check_only_lpes_files(path)


def _check_only_lpes_files(path: Path) -> None:
    """Every entry of the lpes output `path` is one its marker's inventory lists, as lpes wrote it; else
    LpesError naming the first that is not (it is the user's: --force must not delete it)."""
    files = _inventory_of(path)
    if files is None:
        raise LpesError(f"{shown(path)} was written by an older lpes (its {MARKER} lists no files), so lpes cannot "
                        "tell its files from yours; delete it yourself or choose another --out")
    folders = {parent.as_posix() for name in files for parent in Path(name).parents if parent != Path(".")}
    for root, dirs, names in os.walk(path):
        dirs.sort()
        for name in sorted(dirs) + sorted(names):
            full = os.path.join(root, name)
            rel = Path(os.path.relpath(full, path)).as_posix()
            if rel == MARKER or (name in names and _ATOMIC_TEMP.fullmatch(name)):
                continue
            try:
                info = os.lstat(full)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(info.st_mode):
                if rel not in folders:
                    _refuse_foreign(path, f"{rel}/", "which lpes did not write")
                continue
            if rel not in files:
                _refuse_foreign(path, rel, "which lpes did not write")
            if _entry(full, info) != files[rel]:
                _refuse_foreign(path, rel, "which was changed since lpes wrote it")


def _refuse_foreign(out: Path, rel: str, why: str) -> None:
    raise LpesError(f"{shown(out)} holds {shown(rel)}, {why}; --force replaces only what lpes wrote: move it out "
                    "or delete it, then rerun")


def _inventory_of(folder: Path) -> dict | None:
    """The files the marker of `folder` lists (relative path -> `_entry`), None where it lists none."""
    try:
        files = json.loads((folder / MARKER).read_text()).get("files")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return None
    return files if isinstance(files, dict) else None


def _entry(path: str | os.PathLike, info: os.stat_result | None = None) -> dict:
    """What the inventory records of a file: its size, its kind where it is not a regular file, and its
    sha256 up to HASHED_BYTES (a file that cannot be read gets none, so it never matches one with a hash)."""
    info = info or os.lstat(path)
    if not stat.S_ISREG(info.st_mode):
        return {"bytes": info.st_size, "kind": "link" if stat.S_ISLNK(info.st_mode) else "other"}
    entry = {"bytes": info.st_size}
    if info.st_size <= HASHED_BYTES:
        try:
            with open(path, "rb") as file:
                entry["sha256"] = hashlib.sha256(file.read()).hexdigest()
        except OSError:
            entry["sha256"] = None
    return entry


def _inventory(folder: Path) -> dict:
    """Every file under `folder` but the marker: relative path (POSIX) -> `_entry`."""
    files = {}
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(root, name)
            rel = Path(os.path.relpath(full, folder)).as_posix()
            if rel != MARKER:
                files[rel] = _entry(full)
    return files


def record_written(folder: str | os.PathLike, paths: list) -> None:
    """Add `paths`, just written by lpes into `folder`, to the inventory of the lpes output holding `folder`
    (its marker, in `folder` or above): --force may replace them. Nothing where no output holds it."""
    root = _real(Path(folder))
    while not (root / MARKER).is_file():
        if root == root.parent:
            return
        root = root.parent
    files = _inventory_of(root) if is_lpes_output(root) else None
    if files is None:  # an older lpes's output: it is refused as a whole
        return
    for path in paths:
        full = _real(Path(path))
        if root in full.parents and full.exists():
            files[full.relative_to(root).as_posix()] = _entry(full)
    data = json.loads((root / MARKER).read_text())
    write_text_atomic(root / MARKER, json.dumps({**data, "files": files}) + "\n")


def _check_creatable(path: Path) -> None:
    """The nearest existing ancestor must be a writable folder; OUT's and its siblings' names must fit."""
    ancestor = _real(path).parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise LpesError(f"cannot create --out {shown(path)}: {shown(ancestor)} is not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise LpesError(f"cannot create --out {shown(path)}: no permission to write in {shown(ancestor)}")
    name_max = os.pathconf(ancestor, "PC_NAME_MAX")
    to_make = _real(path).parts[len(ancestor.parts):]  # the folders lpes will create, OUT last
    if len(path.name.encode()) + SIBLING_EXTRA > name_max or any(len(p.encode()) > name_max for p in to_make):
        raise LpesError(f"--out name {path.name[:40]!r}... is too long: this filesystem allows "
                        f"{name_max - SIBLING_EXTRA} bytes (lpes adds {SIBLING_EXTRA} for its staging folder)")
    if len(os.fsencode(_real(path))) + SIBLING_EXTRA >= os.pathconf(ancestor, "PC_PATH_MAX"):
        raise LpesError(f"--out {path.name[:40]!r}... makes a path longer than this filesystem allows")


# ---- execute time ----


@contextmanager
def staged_output(out: Path, force: bool) -> Iterator[Path]:
    """Yield an empty staging folder for `out`; when the body returns, make it `out` in one step.

    If the body raises (or the run is killed), `out` is as it was: the next run on `out`
    removes the staging folder this one left.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _locked(out):
        check_siblings(out)  # again, under the lock
        _recover(out)
        _remove_stale_staging(out)
        _check_replaceable(out, force)  # again, under the lock: another run may have written `out` since plan
        staging = _sibling(out, f"{STAGING_INFIX}{os.getpid()}")
        staging.mkdir()
        try:
            _write_marker(staging)
            yield staging
            _write_marker(staging, _inventory(staging))  # what --force may replace next time
            check_interrupted()  # a SIGINT/SIGTERM Python dropped: the output is not swapped in
            _swap_in(staging, out)
        except BaseException:
            with shielded():  # a second Ctrl-C must not leave half a staging folder behind
                shutil.rmtree(staging, ignore_errors=True)
            raise


@contextmanager
def locked_output(out: Path) -> Iterator[None]:
    """The lock of `out` (a file output: lpes-search's spec), held while the body runs; a second run on
    `out` is turned away at once (LpesError). The folders it makes for `out` are removed again where the body
    raises and leaves them empty (a run refused at plan time leaves nothing behind)."""
    out = Path(out)
    made = _missing_folders(out.parent)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with _locked(out):
            check_siblings(out)
            yield
    except BaseException:
        for folder in made:  # deepest first; one that holds anything (a checkpoint to resume) stays
            try:
                folder.rmdir()
            except OSError:
                break
        raise


def _missing_folders(folder: Path) -> list[Path]:
    """`folder` and the folders above it that do not exist yet, deepest first."""
    missing, here = [], Path(os.path.abspath(folder))
    while not here.exists() and here != here.parent:
        missing.append(here)
        here = here.parent
    return missing


def _sibling(out: Path, suffix: str) -> Path:
    return out.parent / f".{out.name}{suffix}"


@contextmanager
def _locked(out: Path) -> Iterator[None]:
    """flock on `.OUT.lpes-lock`; a second run on the same `out` fails at once instead of waiting."""
    path = _sibling(out, ".lpes-lock")
    while True:
        try:  # O_NOFOLLOW: a planted symbolic link must not make lpes create a file at its target
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666)
        except OSError as err:
            if err.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise
            raise LpesError(f"{shown(path)} is not lpes's lock file ({os.strerror(err.errno).lower()}); lpes does "
                            "not follow or remove it: remove it yourself") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise LpesError(f"{shown(path)} is not lpes's lock file (not a regular file); remove it yourself")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LpesError(f"another lpes run is writing {shown(out)} (it holds {path.name}); "
                            "wait for it to finish or choose another --out") from None
        # The holder before us unlinks the file while it still holds it; if we locked that
        # unlinked file, a third run could lock a new one beside us. Lock the file at `path`.
        if _same_file(fd, path):
            break
        os.close(fd)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        held, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)


def _recover(out: Path) -> None:
    """Finish or undo a two-rename swap that a killed run left half done."""
    aside = _sibling(out, ".lpes-old")
    if not aside.exists() and not aside.is_symlink():
        return
    if aside.is_symlink() or not aside.is_dir():
        raise LpesError(f"{shown(aside)} is not a folder lpes set aside; lpes does not follow or remove it: "
                        "remove it yourself")
    if out.exists():  # the new output was renamed in; only the removal of the old one was cut short
        shutil.rmtree(aside)
    else:  # killed between the two renames: the old output goes back
        os.rename(aside, out)
        _say(f"restored {out} (a replace of it was interrupted)")


def _remove_stale_staging(out: Path) -> None:
    """Staging folders of `out` left by killed runs. Every writer holds the lock while its staging
    folder exists (a killed one loses the lock with its life), so under the lock all are stale."""
    for stale in _staging_folders(out):
        if stale.is_symlink() or not stale.is_dir():
            raise LpesError(f"{shown(stale)} is not a staging folder lpes made; remove it yourself")
        size = _disk_bytes(stale)
        shutil.rmtree(stale, ignore_errors=True)
        _say(f"removed {stale.name} ({format_bytes(size)}), left by an interrupted run")


def _disk_bytes(folder: Path) -> int:
    """What `folder` takes on disk (blocks, so a sparse or half-written file counts as it is)."""
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


def _staging_folders(out: Path) -> list[Path]:
    pattern = glob.escape(str(_sibling(out, STAGING_INFIX))) + "*"
    return [Path(p) for p in sorted(glob.glob(pattern)) if Path(p).name.rsplit("-", 1)[-1].isdigit()]


def _write_marker(staging: Path, files: dict | None = None) -> None:
    from lpes.foundation.version import __version__

    # No paths of this machine (the inventory's are relative to the folder): it may be published as it is.
    marker = {"format": MARKER_FORMAT, "written_by": f"lpes {__version__}"}
    if files is not None:
        marker["files"] = files
    (staging / MARKER).write_text(json.dumps(marker) + "\n")


def _swap_in(staging: Path, out: Path) -> None:
    """Make `staging` the folder at `out`; an old `out` is removed only once the new one is in place."""
    if not out.exists():
        os.rename(staging, out)
        _fsync_dir(out.parent)
    elif _exchange(staging, out):  # one atomic step: `out` is the new folder, the old one is at `staging`
        _fsync_dir(out.parent)
        shutil.rmtree(staging)  # killed here: the next run removes it as stale staging
    else:  # no atomic exchange here: two renames; killed between them, the next run's _recover undoes the first
        aside = _sibling(out, ".lpes-old")
        os.rename(out, aside)
        try:
            os.rename(staging, out)
        except BaseException:
            os.rename(aside, out)
            raise
        _fsync_dir(out.parent)
        shutil.rmtree(aside)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:  # glibc < 2.28, musl
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # the filesystem cannot exchange
        return False
    raise OSError(code, os.strerror(code), str(b))


def _fsync_dir(folder: Path) -> None:
    """Make the renames durable, so a power cut does not undo them."""
    try:
        fsync_path(folder)
    except OSError:  # some filesystems cannot fsync a directory; the rename is still atomic
        pass


def _say(message: str) -> None:
    print(f"lpes: {message}", file=sys.stderr, flush=True)
