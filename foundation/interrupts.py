"""SIGINT and SIGTERM always end an lpes run, with exit 130 and nothing written.

Python runs a signal handler between two bytecodes of whatever the main thread executes.
An exception raised there inside a weakref callback, a `__del__` or a finalizer is dropped
("Exception ignored in ... KeyboardInterrupt") and the run went on to write its output. So:

- the handler records the signal first, and raises KeyboardInterrupt only where Python
  would not drop it (not inside such a callback);
- `check_interrupted()` raises it at every step boundary: before any file is renamed into
  place (lpes.foundation.files.save_atomic), before an output folder is swapped in (lpes.foundation.outputs), and
  when a command returns. A signal that arrived anywhere is therefore never lost;
- a KeyboardInterrupt that Python reports as unraisable is not printed (it is recorded).

`handling_interrupts()` installs this for the duration of a command (lpes.foundation.commands.run_command);
`shielded()` holds both signals back while a cleanup runs (they are delivered after it).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_received: int | None = None  # the first signal of this run, None before any
# Frames in which an exception raised by the handler is dropped by Python.
_CALLBACK_FILES = ("weakref.py", "_weakrefset.py")
_CALLBACK_NAMES = frozenset({"__del__", "_remove_dead_weakref"})


def received() -> int | None:
    """The signal number recorded in this run, or None."""
    return _received


def check_interrupted() -> None:
    """Raise KeyboardInterrupt when a signal was recorded (a step boundary: nothing more is written)."""
    if _received is not None:
        raise KeyboardInterrupt(f"signal {_received}")


def _handler(signum: int, frame) -> None:
    global _received
    if _received is None:
        _received = signum
    if _in_callback(frame):
        return  # Python would drop the exception here: the next step boundary raises it
    raise KeyboardInterrupt(f"signal {signum}")


def _in_callback(frame) -> bool:
    while frame is not None:
        code = frame.f_code
        if code.co_name in _CALLBACK_NAMES or code.co_filename.endswith(_CALLBACK_FILES):
            return True
        frame = frame.f_back
    return False


def _unraisable(previous):
    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and _received is not None:
            return  # dropped by Python, but recorded: check_interrupted ends the run at the next step boundary
        previous(unraisable)
    return hook


@contextmanager
def handling_interrupts() -> Iterator[None]:
    """SIGINT and SIGTERM recorded and raised as above while the body runs (main thread only)."""
    global _received
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received = None
    previous = {sig: signal.signal(sig, _handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    previous_hook = sys.unraisablehook
    sys.unraisablehook = _unraisable(previous_hook)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sys.unraisablehook = previous_hook


@contextmanager
def shielded() -> Iterator[None]:
    """SIGINT and SIGTERM held back while the body runs (a cleanup that must finish), delivered after it."""
    on_main = threading.current_thread() is threading.main_thread() and hasattr(signal, "pthread_sigmask")
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM}) if on_main else None
    try:
        yield
    finally:
        if blocked is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
