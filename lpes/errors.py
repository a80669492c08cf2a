"""The one exception type for errors a user can cause, and how every lpes command ends on one."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable


class LpesError(Exception):
    """A user-caused error (bad curve, wrong layer count, missing file, no GPU...).

    The message is one line; the CLI prints it and exits with status 2.
    """


def shown(path: str | os.PathLike) -> str:
    """`path` as a message prints it: as it is when every character prints, else quoted as `repr` does
    (a newline, a tab or an escape sequence in a name then cannot break or repaint the one line)."""
    text = os.fsdecode(path) if isinstance(path, bytes) else str(os.fspath(path))
    return text if text.isprintable() else repr(text)


def one_line(text: str) -> str:
    """`text` with every character that does not print (newline, tab, escape...) written as `repr` writes it:
    the net under every message, for a path a message did not pass through `shown`."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with a user error as one line (and where to read more) instead of the usage block."""

    def error(self, message: str):
        print(f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


# OS errors the user's machine causes (full disk, file size limit, permissions, a bad path):
# one line and exit 2 like any user error, with what to look at.
USER_OS_ERRORS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "a file size limit (ulimit -f) or the filesystem's",
    errno.EACCES: "check the permissions",
    errno.EPERM: "check the permissions",
    errno.EROFS: "the filesystem is read-only",
    errno.ENAMETOOLONG: "shorten the path",
    errno.ENOTDIR: "a part of the path is a file",
    errno.EISDIR: "a folder where a file was expected",
    errno.ELOOP: "too many symbolic links",
}


def run_command(prog: str, main: Callable[[list[str] | None], int], argv: list[str] | None) -> int:
    """Run a command's `main(argv)` the way every lpes command ends: user errors as one line and exit 2.

    SIGINT and SIGTERM end it with exit 130 and nothing written (lpes/interrupts.py); staging
    folders that killed runs left anywhere are reported first (lpes/outputs.py).
    """
    from lpes.interrupts import handling_interrupts

    with handling_interrupts():
        return _run(prog, main, argv)


def _run(prog: str, main: Callable[[list[str] | None], int], argv: list[str] | None) -> int:
    from lpes.interrupts import check_interrupted
    from lpes.outputs import report_stale_staging
    from lpes.preflight import check_working_directory

    try:
        check_working_directory()  # before anything imports torch, which dies in a deleted one (lpes/preflight.py)
        report_stale_staging(prog)
        code = main(argv)
        check_interrupted()  # a signal Python dropped (in a callback) still ends the run as interrupted
        return code
    except LpesError as err:
        print(f"{prog}: error: {one_line(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; nothing was left half-written", file=sys.stderr)
        return 130
    except OSError as err:
        if err.errno not in USER_OS_ERRORS:
            raise
        # A copy that fills the disk reports its source as filename and its destination as filename2.
        full = err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
        target = err.filename2 if full and err.filename2 else err.filename
        where = f": {shown(target)}" if target else ""
        print(f"{prog}: error: {err.strerror or os.strerror(err.errno)}{where} ({USER_OS_ERRORS[err.errno]})",
              file=sys.stderr)
        return 2
