"""Reading a spec file: its bytes (a regular file of at most MAX_FILE_BYTES) decoded as strict JSON: UTF-8,
each key once, no NaN or Infinity, nested at most MAX_DEPTH levels, integers of at most MAX_INT_DIGITS
digits. Every way a file fails is one line that names it."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

from lpes.foundation.errors import LpesError, shown
from lpes.foundation.spec_fields import show

SPEC_FILE = "lpes_spec.json"  # the spec every lpes-convert output keeps beside its export
MAX_FILE_BYTES = 8 << 20
MAX_DEPTH = 64
MAX_INT_DIGITS = 40


def read_spec_file(path: Path) -> bytes:
    """The file's bytes, at most MAX_FILE_BYTES; every way it cannot be read is one line."""
    try:
        info = path.stat()
        if stat.S_ISDIR(info.st_mode):
            raise LpesError(f"spec file {shown(path)} is a directory, not a file{_spec_inside(path)}")
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block, /dev/zero never ends
            raise LpesError(f"spec file {shown(path)} is not a regular file")
        check_size(info.st_size, path)
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError):
        raise LpesError(f"spec file not found: {shown(path)}") from None
    except PermissionError:
        raise LpesError(f"cannot read spec file {shown(path)}: permission denied") from None
    except OSError as err:
        raise LpesError(f"cannot read spec file {shown(path)}: {err.strerror or err}") from None
    except ValueError as err:  # a NUL byte in the path
        raise LpesError(f"spec file path {show(str(path))} is not a valid path: {err}") from None
    check_size(len(data), path)  # again: it may have grown since the stat
    return data


def check_size(size: int, path: Path) -> None:
    if size > MAX_FILE_BYTES:
        raise LpesError(f"spec file {shown(path)} is larger than {MAX_FILE_BYTES >> 20} MiB; is it a spec?")


def _spec_inside(folder: Path) -> str:
    try:
        found = [name for name in ("best.json", SPEC_FILE) if (folder / name).is_file()]
    except OSError:  # an unreadable folder: no hint
        found = []
    return f" (did you mean {folder / found[0]}?)" if found else ""


class _LongInteger:
    """Stands in for an integer literal too long to be a real value (Python refuses > 4300 digits)."""

    def __init__(self, literal: str) -> None:
        self.digits = len(literal.lstrip("-"))

    def __repr__(self) -> str:
        return f"an integer of {self.digits} digits"


def decode_spec_json(data: bytes, path: Path) -> Any:
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark from a Windows editor is harmless
    except UnicodeDecodeError as err:
        raise LpesError(f"spec file {shown(path)} is not UTF-8 text (byte {err.start})") from None
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys, parse_int=_parse_int, parse_constant=_no_constant)
    except RecursionError:
        raise LpesError(f"spec file {shown(path)}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:
        raise LpesError(f"spec file {shown(path)} is not valid JSON: {err}") from None
    _check_structure(value)
    return value


def _no_constant(name: str) -> Any:
    """NaN, Infinity, -Infinity: Python's json reads them, but they are not JSON and other readers refuse them."""
    raise LpesError(f"spec: {name} is not a JSON value (write a number, or null for none)")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:  # json keeps the last one silently; which did the user mean?
            raise LpesError(f"spec: duplicate key {show(key)}; each key may appear once")
        out[key] = value
    return out


def _parse_int(literal: str) -> int | _LongInteger:
    return _LongInteger(literal) if len(literal.lstrip("-")) > MAX_INT_DIGITS else int(literal)


def _check_structure(value: Any) -> None:
    """No nesting deeper than MAX_DEPTH (deeper breaks json.dumps later) and no over-long integer, anywhere."""
    if not isinstance(value, (dict, list)):
        if isinstance(value, _LongInteger):
            raise LpesError(f"spec: the top level is {value!r}")
        return
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        node, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            top = where.split(".")[0].split("[")[0]
            raise LpesError(f"spec: {show(top) if top else 'the top level'} is nested deeper than {MAX_DEPTH} levels")
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            name = (f"{where}.{key}" if where else str(key)) if isinstance(node, dict) else f"{where}[{key}]"
            if isinstance(child, _LongInteger):
                raise LpesError(f"spec: {show(name)} is {child!r}")
            if isinstance(child, (dict, list)):
                stack.append((child, name, depth + 1))


# --- the fields -------------------------------------------------------------------------------------------
