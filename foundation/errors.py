"""The one exception type for errors a user can cause (how a command ends on one: foundation/commands.py)."""

from __future__ import annotations

import errno
import os


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
