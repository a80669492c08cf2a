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

from lpes.converter.trust import check_hub_weights, check_lpes_fields, read_folder_json
from lpes.foundation.errors import LpesError
from lpes.foundation.files import read_json_object

GENAI_CONFIG = "genai_config.json"
ONNX_METADATA = "lpes_onnx.json"
ENGINE_SIDECAR = "model.engine.json"
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
    from lpes.converter.loading import SAFETENSORS, SAFETENSORS_INDEX, inside_folder, read_generation_config

    folder = Path(folder)
    files = _walk(folder)
    for path in files:
        if path.is_symlink() and not inside_folder(folder, path):
            raise LpesError(f"{path} is a symbolic link to {os.readlink(path)[:120]}, outside {folder}; a received "
                            "folder is read as data and may name nothing outside it")
        if _LIBRARY_VALUE.search(path.name):
            raise LpesError(f"{path} is a native library; lpes writes none and loads none from a received folder "
                            "(remove it)")
    for path in files:
        if path.name == GENAI_CONFIG:
            check_genai_config(path.parent)
        elif path.suffix == ".onnx":
            check_onnx_file(path)
        elif path.name == ENGINE_SIDECAR:
            check_engine_sidecar(path.parent)
        elif path.name == "generation_config.json":
            read_generation_config(path.parent)
        elif path.name in ("lpes_genai.json", ONNX_METADATA):
            _check_dtype_sidecar(path)
    weights = (folder / SAFETENSORS).exists() or (folder / SAFETENSORS_INDEX).exists()
    if (folder / "config.json").is_file() and weights:
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


def check_genai_config(package: Path) -> None:
    """genai_config.json: known session options only, providers lpes builds for, files inside the package,
    no library; and the fields the runner reads (model.context_length)."""
    path = Path(package) / GENAI_CONFIG
    data = read_folder_json(path)
    _check_settings(path, Path(package), data, "")
    model = data.get("model")
    context = model.get("context_length") if isinstance(model, dict) else None
    if isinstance(context, bool) or not isinstance(context, int) or not 0 < context <= 2**31:
        raise LpesError(f"{path}: 'model.context_length' must be a positive integer, got {str(context)[:40]}")


def _check_settings(path: Path, package: Path, value, where: str) -> None:
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
                _check_named_file(path, package, item, here)
            _check_settings(path, package, item, here)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_settings(path, package, item, f"{where}[{i}]")
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


def _check_named_file(path: Path, package: Path, name: str, where: str) -> None:
    """A file a runtime config names: a relative path to a regular file inside the package."""
    from lpes.converter.loading import inside_folder

    target = package / name
    if (not name or Path(name).is_absolute() or ".." in Path(name).parts or "\0" in name
            or not inside_folder(package, target)):
        raise LpesError(f"{path}: {where[:120]} names {name[:80]!r}, outside {package}; a received folder may "
                        "name only its own files")
    if target.exists() and not target.is_file():
        raise LpesError(f"{path}: {where[:120]} names {name[:80]!r}, which is not a regular file")


def check_onnx_file(onnx_file: Path) -> None:
    """Every external-data location of the graph is a regular file inside its folder (no absolute path,
    no `..`, no link out, no device); with lpes_onnx.json beside it, its layer count and dtype match the graph."""
    import onnx

    onnx_file = Path(onnx_file)
    try:
        model = onnx.load(str(onnx_file), load_external_data=False)
    except Exception as err:  # noqa: BLE001 - protobuf's DecodeError and onnx's own types
        raise LpesError(f"{onnx_file} is not an ONNX model ({type(err).__name__})") from None
    for tensor in _onnx_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = {entry.key: entry.value for entry in tensor.external_data}.get("location", "")
        where = f"external data of tensor {tensor.name[:80]!r}"
        _check_named_file(onnx_file, onnx_file.parent, location, where)
        if not (onnx_file.parent / location).is_file():
            raise LpesError(f"{onnx_file}: {where} names {location[:80]!r}, which is not a file in "
                            f"{onnx_file.parent}")
    if (onnx_file.parent / ONNX_METADATA).is_file() and onnx_file.name == "model.onnx":
        _check_onnx_metadata(onnx_file, model)


def _onnx_tensors(model):
    """Every TensorProto of an ONNX model: initializers, sparse ones, attributes, subgraphs, functions."""

    def of_nodes(nodes):
        for node in nodes:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                if attr.HasField("sparse_tensor"):
                    yield attr.sparse_tensor.values
                    yield attr.sparse_tensor.indices
                for sparse in attr.sparse_tensors:
                    yield sparse.values
                    yield sparse.indices
                if attr.HasField("g"):
                    yield from of_graph(attr.g)
                for graph in attr.graphs:
                    yield from of_graph(graph)

    def of_graph(graph):
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        yield from of_nodes(graph.node)

    yield from of_graph(model.graph)
    for function in model.functions:
        yield from of_nodes(function.node)


_ONNX_ELEMENT_DTYPES = {1: "float32", 10: "float16", 16: "bfloat16"}


def _check_onnx_metadata(onnx_file: Path, model) -> None:
    """lpes_onnx.json's layer count and dtype against the graph's past_key_values inputs (the runner trusts it)."""
    from lpes.exporters.onnx_export import read_metadata

    metadata = read_metadata(onnx_file.parent)
    past = [i for i in model.graph.input if re.fullmatch(r"past_key_values\.\d+\.key", i.name)]
    sidecar = onnx_file.parent / ONNX_METADATA
    if metadata["num_layers"] != len(past):
        raise LpesError(f"{sidecar}: 'num_layers' is {metadata['num_layers']}, but {onnx_file.name} has "
                        f"{len(past)} layers of past_key_values inputs")
    if past:
        element = past[0].type.tensor_type.elem_type
        if _ONNX_ELEMENT_DTYPES.get(element, metadata["dtype"]) != metadata["dtype"]:
            raise LpesError(f"{sidecar}: 'dtype' is {metadata['dtype']}, but {onnx_file.name}'s cache is "
                            f"{_ONNX_ELEMENT_DTYPES[element]}")


def _check_dtype_sidecar(path: Path) -> None:
    from lpes.converter.loading import DTYPES

    dtype = read_json_object(path).get("dtype", "float32")
    if dtype not in DTYPES:
        raise LpesError(f"{path}: 'dtype' must be one of {', '.join(DTYPES)}, got {str(dtype)[:40]!r}")


def check_engine_sidecar(engine_dir: Path) -> None:
    """model.engine.json names no plugin or library (the runner also deserialises with host code disallowed)."""
    path = Path(engine_dir) / ENGINE_SIDECAR
    _check_settings(path, Path(engine_dir), read_folder_json(path), "")
