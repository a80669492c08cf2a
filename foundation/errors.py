"""The one exception type for errors a user can cause (how a command ends on one: foundation/commands.py)."""

from __future__ import annotations


class LpesError(Exception):
    """A user-caused error (bad curve, wrong layer count, missing file, no GPU...).

    The message is one line; the CLI prints it and exits with status 2.
    """
