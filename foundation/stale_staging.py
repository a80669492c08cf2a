"""Staging folders of killed runs, reported by every later command.

A SIGKILL (or a power cut) leaves `.OUT.lpes-partial-PID`, gigabytes for a 7B export, hidden
beside OUT until a later run writes the same OUT. Each staging folder is therefore recorded in
the user's state folder while it exists; every lpes command starts by reporting the recorded
ones whose process is gone, with their size and the command that removes them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
from pathlib import Path

from lpes.foundation.devices import format_bytes
from lpes.foundation.errors import shown


def state_dir() -> Path:
    """Where lpes records its staging folders: $LPES_STATE_DIR, else $XDG_STATE_HOME/lpes, else ~/.local/state/lpes."""
    if os.environ.get("LPES_STATE_DIR"):
        return Path(os.environ["LPES_STATE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "lpes"


def _record(staging: Path) -> Path:
    key = hashlib.sha256(os.fsencode(os.path.abspath(staging))).hexdigest()[:24]
    return state_dir() / "staging" / f"{key}.json"


def register_staging(staging: Path) -> None:
    try:
        record = _record(staging)
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"path": os.path.abspath(staging), "pid": os.getpid()}))
    except OSError:  # no writable home: the staging folder is still removed by the next run on OUT
        pass


def unregister_staging(staging: Path) -> None:
    try:
        _record(staging).unlink(missing_ok=True)
    except OSError:
        pass


def report_stale_staging(prog: str) -> list[Path]:
    """Say, one line each, which recorded staging folders a killed run left (its process gone); forget the
    records of folders that no longer exist. Returns the stale folders."""
    try:
        records = sorted((state_dir() / "staging").glob("*.json"))
    except OSError:
        return []
    stale = []
    for record in records[:100]:
        try:
            data = json.loads(record.read_text())
            path, pid = Path(data["path"]), int(data["pid"])
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            continue
        if _alive(pid):
            continue
        if not path.is_dir() or path.is_symlink():
            unregister_staging(path)
            continue
        stale.append(path)
        print(f"{prog}: note: {shown(path)} ({format_bytes(_size(path))}) was left by an interrupted lpes run "
              f"(pid {pid}); remove it with: rm -rf {_shell_quoted(str(path))} (a run writing the same --out also "
              "removes it)",
              file=sys.stderr, flush=True)
    return stale


def _shell_quoted(text: str) -> str:
    """`text` as bash reads it back, on one line: shlex's quoting, or $'...' where a character does not print."""
    if text.isprintable():
        return shlex.quote(text)
    return "$'" + "".join(f"\\x{ord(c):02x}" if ord(c) < 256 and (not c.isprintable() or c in "'\\")
                          else c if c.isprintable() else repr(c)[1:-1] for c in text) + "'"


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except (OverflowError, ValueError):
        return False
    return True


def _size(folder: Path) -> int:
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total
