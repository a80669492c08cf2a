"""Before lpes loads a Hub folder with trust_remote_code=True: is its code exactly lpes's own?

A Hub folder runs `modeling_lpes.py` (which imports `lpes_rope.py`) when loaded. A folder
someone published may hold anything there, and validating such a folder is what a careful
user does before trusting it. So lpes renders the `modeling_lpes.py` this version writes for
the folder's config, compares bytes, compares `lpes_rope.py` with lpes's own, and refuses
any other Python file or any auto_map entry that would reach one, before transformers
imports a line of it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from lpes.errors import LpesError
from lpes.files import read_json_object

MODELING = "modeling_lpes.py"
ROPE = "lpes_rope.py"
AUTO_MAP_FILES = ("config.json", "tokenizer_config.json")  # what from_pretrained reads auto_map from
_AUTO_MAP_ENTRY = re.compile(r"modeling_lpes\.[A-Za-z_][A-Za-z0-9_]*")  # a class of the folder's modeling_lpes.py
# A template value read from a folder's file: a class or model-type name, nothing that could be code.
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")


def check_hub_code(folder: Path) -> None:
    """Return if loading `folder` runs no code or only lpes's own; else LpesError naming the file that differs.

    Call it before any `from_pretrained(folder, trust_remote_code=True)`. A folder with
    neither modeling_lpes.py nor auto_map loads without custom code and passes.
    """
    from lpes.converter import lpes_rope
    from lpes.converter.loading import check_weights
    from lpes.version import __version__

    folder = Path(folder)
    entries = _auto_map_entries(folder)
    if not (folder / MODELING).exists() and not entries:
        return
    for file_name, entry in entries:
        if not _AUTO_MAP_ENTRY.fullmatch(entry):
            raise LpesError(f"{folder / file_name}: auto_map entry {entry[:80]!r} points at code lpes did not write; "
                            "refusing to load the folder")
    config = _read_json(folder / "config.json")
    expected = {
        MODELING: _expected_modeling(folder, config, __version__),
        ROPE: Path(lpes_rope.__file__).read_bytes(),
    }
    for name, data in expected.items():
        path = folder / name
        if not path.is_file():
            raise LpesError(f"{folder} has no {name}; it is not a folder lpes-convert wrote")
        if data is None or path.read_bytes() != data:
            raise LpesError(f"{path} differs from the {name} that lpes {__version__} writes for this config"
                            f"{_written_by(path, __version__)}; refusing to run it (convert the model again)")
    for path in sorted(folder.rglob("*.py")):
        if path.parent != folder or path.name not in expected:
            raise LpesError(f"{path} is Python code that lpes did not write; refusing to load {folder} "
                            "with trust_remote_code (remove it if it is yours)")
    check_weights(folder)


def _auto_map_entries(folder: Path) -> list[tuple[str, str]]:
    """(file name, "module.Class") for every auto_map entry transformers could follow."""
    entries = []
    for name in AUTO_MAP_FILES:
        path = folder / name
        if not path.is_file():
            continue
        auto_map = _read_json(path).get("auto_map")
        if not auto_map:
            continue
        values = auto_map.values() if isinstance(auto_map, dict) else auto_map
        if not isinstance(values, (list, tuple, type({}.values()))):
            raise LpesError(f"{path}: auto_map must be an object")
        for value in values:
            for item in value if isinstance(value, (list, tuple)) else [value]:
                if item is None:  # a tokenizer pair without its slow or fast class
                    continue
                if not isinstance(item, str):
                    raise LpesError(f"{path}: auto_map holds {item!r}; expected \"module.Class\" names")
                entries.append((name, item))
    return entries


def _read_json(path: Path) -> dict:
    if not path.exists():
        raise LpesError(f"{path} not found; is {path.parent} a Hub folder lpes-convert wrote?")
    return read_json_object(path)


def _expected_modeling(folder: Path, config: dict, version: str) -> bytes | None:
    """The modeling_lpes.py this lpes writes for the folder's config.json (hf_folder.render_modeling).

    The config comes from the folder too, so a rendering from it alone could carry code an
    attacker put in its values. The file must therefore also be the template itself with
    plain names for every value and this lpes's version: only then is the rendering expected.
    """
    from lpes.converter.hf_folder import render_modeling
    from lpes.converter.modeling_template import MODELING_LPES

    path = folder / MODELING
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
    if _template_values(MODELING_LPES, text, {"lpes_version": version}) is None:
        return None  # not the template with plain names (or written by another lpes version)
    try:
        return render_modeling(config).encode()
    except (KeyError, TypeError, ValueError, AttributeError, IndexError):
        return None  # config.json lacks what lpes records when it writes the file


def _template_values(template: str, text: str, known: dict[str, str]) -> dict[str, str] | None:
    """The field values that make `template` render to `text` (None when no plain-name values do)."""
    import string

    values, at = dict(known), 0
    for literal, field, _, _ in string.Formatter().parse(template):
        if not text.startswith(literal, at):
            return None
        at += len(literal)
        if field is None:
            continue
        if field in values:
            if not text.startswith(values[field], at):
                return None
            at += len(values[field])
            continue
        match = _PLAIN_NAME.match(text, at)
        if not match:
            return None
        values[field] = match.group(0)
        at = match.end()
    return values if at == len(text) else None


def _written_by(path: Path, version: str) -> str:
    """Which lpes wrote the file, when it says another version (a plain version string only)."""
    try:
        match = re.search(r"Written by lpes-convert ([0-9A-Za-z.+-]{1,32})\b", path.read_text())
    except (OSError, UnicodeDecodeError):
        return ""
    return f" (it says lpes-convert {match.group(1)} wrote it)" if match and match.group(1) != version else ""


# ---- received folders are data: what a runtime config may name ----
#
# lpes-validate and lpes-generate run folders someone else may have written. Besides Python
# (above), a runtime can be told by its files to load a native library or to read a file
# elsewhere: onnxruntime-genai's `session_options.custom_ops_library`, an execution provider's
# `backend_path`, ONNX external data at `/dev/zero` or `../../home/...`, TensorRT plugins. So
# every such file is checked before any runtime opens it, against what lpes itself writes:
# an allow-list of settings per runtime, file names that stay inside the folder, no library.

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


def check_lpes_fields(folder: Path) -> None:
    """A per-layer Hub folder's config.json `lpes` fields are exactly those lpes writes for its lpes_spec.json
    and base config: modeling_lpes.py runs on them (scales, module paths), so other values would run another model
    than the one validated, or fail inside it."""
    from transformers import AutoConfig

    from lpes.converter.architectures import architecture_for
    from lpes.converter.hf_folder import _lpes_config
    from lpes.spec import load_spec

    path = folder / "config.json"
    data = _read_json(path)
    fields = data.get("lpes")
    if not isinstance(fields, dict) or "base_model_type" not in fields:
        return  # a stock-RoPE folder: plain transformers reads it
    if not (folder / "lpes_spec.json").is_file():
        raise LpesError(f"{folder} has per-layer scales in config.json but no lpes_spec.json; it is not a folder "
                        "lpes-convert wrote")
    base = {k: v for k, v in data.items() if k not in ("auto_map", "lpes", "architectures", "model_type")}
    try:
        config = AutoConfig.for_model(str(fields["base_model_type"]), **base)
        config.architectures = [str(fields.get("base_architecture"))]
        spec = load_spec(folder / "lpes_spec.json").for_layers(config.num_hidden_layers)
        layout = architecture_for(config).patch_kwargs(config)
        expected = _lpes_config(data, spec, config, str(fields["base_architecture"]), layout,
                                str(fields.get("lpes_version")))["lpes"]
    except LpesError as err:
        raise LpesError(f"{path}: {err}") from None
    except Exception as err:  # noqa: BLE001 - transformers' and the layout's own errors on a doctored config
        raise LpesError(f"{path}: its 'lpes' fields are not what lpes-convert writes ({type(err).__name__}: "
                        f"{str(err).splitlines()[0][:80] if str(err) else ''})") from None
    for key in sorted(set(expected) | set(fields)):
        if expected.get(key) != fields.get(key):
            raise LpesError(f"{path}: 'lpes.{key}' is {str(fields.get(key))[:60]}, but lpes writes "
                            f"{str(expected.get(key))[:60]} for this folder's lpes_spec.json and base config; "
                            "refusing to run it (convert the model again)")


def _walk(folder: Path) -> list[Path]:
    """Every path under `folder`, symbolic links to folders not followed; a bounded number."""
    found = []
    for root, dirs, names in os.walk(folder):
        for name in dirs + names:
            found.append(Path(root) / name)
        if len(found) > _MAX_FILES:
            raise LpesError(f"{folder} holds over {_MAX_FILES} files; it is not an lpes-convert output folder")
    return sorted(found)


def check_hub_weights(folder: Path) -> None:
    """The Hub folder's safetensors against the model its config.json describes (per-layer folders: the base)."""
    from transformers import AutoConfig

    from lpes.converter.loading import check_weights, check_weights_match

    check_weights(folder)
    data = _read_json(folder / "config.json")
    if data.get("quantization_config"):
        raise LpesError(f"{folder / 'config.json'} holds a quantization_config; lpes writes unquantized folders only")
    lpes_fields = data.get("lpes")
    if isinstance(lpes_fields, dict) and "base_model_type" in lpes_fields:  # a per-layer folder: LpesForCausalLM
        data = {k: v for k, v in data.items() if k not in ("auto_map", "lpes", "architectures")}
        data["model_type"] = lpes_fields["base_model_type"]
    if not isinstance(data.get("model_type"), str) or data.get("auto_map"):
        return  # check_hub_code has refused other code; a config transformers cannot read fails where it is loaded
    try:
        config = AutoConfig.for_model(data.pop("model_type"), **data)
    except Exception:  # noqa: BLE001 - reported with the transformers message where the folder is loaded
        return
    check_weights_match(folder, config)


def check_genai_config(package: Path) -> None:
    """genai_config.json: known session options only, providers lpes builds for, files inside the package,
    no library; and the fields the runner reads (model.context_length)."""
    path = Path(package) / GENAI_CONFIG
    data = _read_json(path)
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
    _check_settings(path, Path(engine_dir), _read_json(path), "")
