"""Before a runtime opens a received export folder: what its files may name (no code, nothing outside it).

lpes-validate and lpes-generate run folders someone else may have written. Besides Python
(`converter/trust.py` checks the Hub folder's code), a runtime can be told by its files to load a
native library or to read a file elsewhere: onnxruntime-genai's `session_options.custom_ops_library`,
an execution provider's `backend_path`, ONNX external data at `/dev/zero` or `../../home/...`,
TensorRT plugins. So every such file is checked before any runtime opens it, against what lpes itself
writes: an allow-list of settings per runtime, file names that stay inside the folder, no library.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from lpes.converter.trust import check_hub_weights, check_lpes_fields
from lpes.exporters.targets import registry
from lpes.foundation.errors import LpesError
from lpes.foundation.files import read_json_object
from lpes.foundation.preflight import check_no_special_files

# onnxruntime-genai session options that load nothing and write nothing (no profiling, no EP context
# files, no custom ops, no raw session config entries).
GENAI_SESSION_OPTIONS = frozenset({
    "log_id", "log_severity_level", "intra_op_num_threads", "inter_op_num_threads", "enable_cpu_mem_arena",
    "enable_mem_pattern", "graph_optimization_level", "disable_cpu_ep_fallback", "disable_quant_qdq",
    "enable_quant_qdq_cleanup", "use_env_allocators", "provider_options",
})
GENAI_PROVIDERS = frozenset({"cpu", "cuda", "dml", "webgpu"})  # what --genai-provider builds for
# A key that names code to load, or a string that is a native library.
_CODE_KEY = re.compile(r"librar|plugin|custom_?op|(^|_)(lib|libs|so|dll|backend_path)$", re.IGNORECASE)
_LIBRARY_VALUE = re.compile(r"\.(so(\.[0-9]+)*|dll|dylib)$", re.IGNORECASE)
# A key whose string value names a file the runtime opens.
_FILE_KEY = re.compile(r"(file(name)?|path|dir(ectory)?|folder|location)s?$", re.IGNORECASE)
_MAX_FILES = 10_000  # a received folder with more entries than this is not an lpes output


def check_received_folder(folder: Path) -> None:
    """Return if every runtime file in `folder` (an lpes-convert output, or its onnx/ or genai/ alone) names
    only files inside it and no code; else LpesError (one line) naming the file and the setting.

    Call it before any runtime opens the folder (lpes-validate, lpes-generate). It also checks the
    Hub folder's weights against its config (headers only) and the JSON sidecars the runners read.
    """
    from lpes.converter.loading import (
        PICKLE_SUFFIXES,
        SAFETENSORS,
        SAFETENSORS_INDEX,
        inside_folder,
        read_generation_config,
    )

    folder = Path(folder)
    check_no_special_files(folder, "a received folder")  # a FIFO would block the first read (foundation/preflight.py)
    files = _walk(folder)
    for path in files:
        if path.is_symlink() and not inside_folder(folder, path):
            raise LpesError(f"{path} is a symbolic link to {os.readlink(path)[:120]}, outside {folder}; a received "
                            "folder is read as data and may name nothing outside it")
        if _LIBRARY_VALUE.search(path.name):
            raise LpesError(f"{path} is a native library; lpes writes none and loads none from a received folder "
                            "(remove it)")
    runtimes = registry().values()
    for path in files:
        if path.name == "generation_config.json":
            read_generation_config(path.parent)
        for target in runtimes:
            target.check_received_file(path)
    weights = (folder / SAFETENSORS).exists() or (folder / SAFETENSORS_INDEX).exists()
    # A stock Hub folder (no lpes code) whose weights are pickles only: check_hub_weights refuses it now, in one
    # line, rather than from_pretrained after the reference has been scored.
    pickles = any(path.parent == folder and path.name.endswith(PICKLE_SUFFIXES) for path in files)
    if (folder / "config.json").is_file() and (weights or pickles):
        check_lpes_fields(folder)
        check_hub_weights(folder)


def _walk(folder: Path) -> list[Path]:
    """Every path under `folder`, symbolic links to folders not followed; a bounded number."""
    found = []
    for root, dirs, names in os.walk(folder):
        for name in dirs + names:
            found.append(Path(root) / name)
        if len(found) > _MAX_FILES:
            raise LpesError(f"{folder} holds over {_MAX_FILES} files; it is not an lpes-convert output folder")
    return sorted(found)


def check_settings(path: Path, package: Path, value, where: str) -> None:
    """A runtime config's settings, recursively: no key or value that names native code, known onnxruntime
    session and provider options only, every file it names inside `package`."""
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{where}.{key}" if where else str(key)
            if _CODE_KEY.search(str(key)):
                raise LpesError(f"{path}: {here[:120]} names native code to load; lpes runs no code from a "
                                "received folder (remove the setting)")
            if key == "session_options" and isinstance(item, dict):
                unknown = sorted(set(item) - GENAI_SESSION_OPTIONS, key=lambda k: (not _CODE_KEY.search(k), k))
                if unknown and _CODE_KEY.search(unknown[0]):
                    raise LpesError(f"{path}: {here}.{unknown[0][:80]} names native code to load; lpes runs no "
                                    "code from a received folder (remove the setting)")
                if unknown:
                    raise LpesError(f"{path}: {here}.{unknown[0][:80]} is not a session option lpes allows (it "
                                    "could load code or write files); remove it")
            if key == "provider_options":
                _check_provider_options(path, item, here)
            if _FILE_KEY.search(str(key)) and isinstance(item, str):
                check_named_file(path, package, item, here)
            check_settings(path, package, item, here)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_settings(path, package, item, f"{where}[{i}]")
    elif isinstance(value, str) and _LIBRARY_VALUE.search(value.strip()):
        raise LpesError(f"{path}: {where[:120]} names a native library ({value[:80]!r}); lpes loads none from a "
                        "received folder")


def _check_provider_options(path: Path, options, where: str) -> None:
    entries = options if isinstance(options, list) else [options]
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise LpesError(f"{path}: {where}[{i}] must be an object {{provider: {{option: value}}}}")
        for provider, settings in entry.items():
            if provider not in GENAI_PROVIDERS:
                raise LpesError(f"{path}: {where}[{i}] names execution provider {str(provider)[:40]!r}; lpes runs "
                                f"{', '.join(sorted(GENAI_PROVIDERS))} only")
            for option in settings if isinstance(settings, dict) else []:
                if _FILE_KEY.search(str(option)) or _CODE_KEY.search(str(option)) or "cache" in str(option).lower():
                    raise LpesError(f"{path}: {where}[{i}].{provider}.{str(option)[:60]} names a file or library; "
                                    "lpes allows no provider option that reads or writes files")


def check_named_file(path: Path, package: Path, name: str, where: str) -> None:
    """A file a runtime config names: a relative path to a regular file inside the package."""
    from lpes.converter.loading import inside_folder

    target = package / name
    if (not name or Path(name).is_absolute() or ".." in Path(name).parts or "\0" in name
            or not inside_folder(package, target)):
        raise LpesError(f"{path}: {where[:120]} names {name[:80]!r}, outside {package}; a received folder may "
                        "name only its own files")
    if target.exists() and not target.is_file():
        raise LpesError(f"{path}: {where[:120]} names {name[:80]!r}, which is not a regular file")


def check_dtype_sidecar(path: Path) -> None:
    """A sidecar's `dtype` (lpes_onnx.json, lpes_genai.json): one lpes writes."""
    from lpes.converter.loading import DTYPES

    dtype = read_json_object(path).get("dtype", "float32")
    if dtype not in DTYPES:
        raise LpesError(f"{path}: 'dtype' must be one of {', '.join(DTYPES)}, got {str(dtype)[:40]!r}")
