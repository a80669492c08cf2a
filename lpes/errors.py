"""The one exception type for errors a user can cause."""


import argparse
import sys


class LpesError(Exception):
    """A user-caused error (bad curve, wrong layer count, missing file, no GPU...).

    The message is one line; the CLI prints it and exits with status 2.
    """


class ArgumentParser(argparse.ArgumentParser):
    """argparse, with a user error as one line (and where to read more) instead of the usage block."""

    def error(self, message: str):
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)
