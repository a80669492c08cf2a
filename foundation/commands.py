"""How every lpes command ends: a user error (LpesError, a bad flag, a full disk) as one line and exit 2,
SIGINT and SIGTERM as exit 130 with nothing half-written."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable

from lpes.foundation.errors import USER_OS_ERRORS, LpesError, one_line, shown


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with a user error as one line (and where to read more) instead of the usage block; every
    command gets --version, and --verbose (third-party warnings, filtered otherwise: foundation/third_party.py)."""

    def __init__(self, *args, **kwargs) -> None:
        from lpes.foundation.version import __version__

        super().__init__(*args, **kwargs)
        self.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
        self.add_argument("--verbose", action="store_true",
                          help="also show the warnings of the libraries lpes calls (matplotlib, transformers) that "
                               "lpes filters as not actionable")

    def parse_known_args(self, args=None, namespace=None):
        parsed, extra = super().parse_known_args(args, namespace)
        if not parsed.verbose:  # after the flags parsed: --help and a flag error import nothing more
            from lpes.foundation.third_party import quiet_third_party

            quiet_third_party(self.prog)
        return parsed, extra

    def error(self, message: str):
        print(f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def run_command(prog: str, main: Callable[[list[str] | None], int], argv: list[str] | None) -> int:
    """Run a command's `main(argv)` the way every lpes command ends: user errors as one line and exit 2.

    SIGINT and SIGTERM end it with exit 130 and nothing written (foundation/interrupts.py). Nothing is
    said before the command's own lines: a staging folder a killed run left is mentioned only by the run
    that writes its --out, which removes it (foundation/outputs.py).
    """
    from lpes.foundation.interrupts import handling_interrupts

    with handling_interrupts():
        return _run(prog, main, argv)


def _run(prog: str, main: Callable[[list[str] | None], int], argv: list[str] | None) -> int:
    from lpes.foundation.interrupts import check_interrupted
    from lpes.foundation.preflight import check_working_directory

    try:
        check_working_directory()  # before anything imports torch, which dies in a deleted one (preflight.py)
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
