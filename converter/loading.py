"""Finding and loading the base model: a bundled short name, a local folder, or a hub id.

Nothing in a model folder runs: every transformers call passes trust_remote_code=False (so
transformers never prompts), a config with auto_map (custom code) is refused before
transformers reads it, and only safetensors weights are read (a pickle can run code when
unpickled). `check_model_folder` says so in one line at plan time, before any weight is read.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lpes.converter.architectures import architecture_for
from lpes.converter.real_models import is_real_model, licence_line, real_model_folder, real_model_path
from lpes.foundation.errors import LpesError, shown
from lpes.foundation.files import read_json_object
from lpes.foundation.preflight import check_no_special_files

if TYPE_CHECKING:
    from lpes.foundation.spec import Spec

BUNDLED_MODELS_DIR = Path(str(files("lpes") / "models"))  # package data of lpes, editable or wheel
DEFAULT_MODEL = "lpes-tiny-kv"

# torch is imported where a dtype is needed, not here: lpes-convert refuses a mistyped --out before torch loads (3 s).
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}  # a weight's bytes, for the plans' memory and disk checks
DTYPES = tuple(DTYPE_BYTES)
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
# Weights stored as Python pickles: unpickling can run arbitrary code, so lpes neither reads nor copies them.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def check_dtype(dtype: str) -> str:
    """`dtype` if it names one of DTYPES, else LpesError listing them."""
    if dtype not in DTYPES:
        raise LpesError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return dtype


def dtype_bytes(name: str) -> int:
    """The bytes of one weight in the dtype `name` (one of DTYPES)."""
    return DTYPE_BYTES[check_dtype(name)]


def torch_dtype(name: str):
    """The torch dtype that `name` (one of DTYPES) names."""
    import torch

    return getattr(torch, check_dtype(name))


def bundled_models() -> dict[str, Path]:
    """Short name -> folder of the models that ship inside lpes."""
    if not BUNDLED_MODELS_DIR.is_dir():
        return {}
    return {p.name: p for p in sorted(BUNDLED_MODELS_DIR.iterdir()) if (p / "config.json").is_file()}


def model_label(name: str) -> str:
    """How published files name the model: a Hub id or bundled name as given, a local folder by its name only."""
    path = Path(name).expanduser()
    known = name in bundled_models() or is_real_model(name)
    return name if known or not path.exists() else path.resolve().name


def model_location(name: str | os.PathLike) -> Path | None:
    """Where the folder of `name` is, known without fetching, converting or checking it: a bundled short name, a
    real model's cache folder, an existing path; None for a hub id (known once downloaded)."""
    name = str(name)
    if name in bundled_models():
        return bundled_models()[name]
    if _registry_name(name):
        return real_model_path(name)
    path = Path(name).expanduser()
    return path if path.exists() else None


def _registry_name(name: str) -> bool:
    """A real model named as the registry names it, where no folder of that name is in the way."""
    return is_real_model(name) and not Path(name).exists()


def licence_note(name: str | os.PathLike) -> str | None:
    """The line a command says of a real model from the registry (its licence), once every check has held."""
    return licence_line(str(name)) if _registry_name(str(name)) else None


def resolve_model(name: str | os.PathLike) -> Path:
    """A checked local folder for `name`: a bundled short name, an existing folder, or a hub download."""
    name = str(name)
    if _registry_name(name):
        return check_model_folder(real_model_folder(name))
    if (path := model_location(name)) is not None:
        return check_model_folder(path)
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise LpesError(f"model folder not found: {shown(name)}")
    return check_model_folder(_download(name))


def check_model_folder(path: Path) -> Path:
    """`path` if it is a readable model folder with a config and sound safetensors weights, else LpesError."""
    if not path.is_dir():
        raise LpesError(f"{shown(path)} is a file, not a model folder")
    if not os.access(path, os.R_OK | os.X_OK):
        raise LpesError(f"cannot read the model folder {shown(path)} (permission denied)")
    if not (path / "config.json").is_file():
        raise LpesError(f"{shown(path)} is not a Hugging Face model folder (no config.json)")
    check_folder_files(path)
    check_weights(path)
    check_weights_match(path, load_config(path))
    return path


def check_folder_files(folder: Path) -> None:
    """What lpes reads or copies from `folder` besides the weights: its own files, no custom tokenizer code,
    a readable generation_config.json, no quantization (lpes converts plain checkpoints), no FIFO, device or
    socket (foundation/preflight.py)."""
    check_no_special_files(folder, "a model folder")
    for entry in sorted(folder.iterdir()):
        if entry.is_symlink() and not inside_folder(folder, entry):
            raise LpesError(f"{entry} is a symbolic link to {os.readlink(entry)[:120]}, outside the model folder; "
                            "lpes reads and copies only the folder's own files (copy it in with cp -L)")
    tokenizer_config = folder / "tokenizer_config.json"
    if tokenizer_config.is_file() and read_json_object(tokenizer_config).get("auto_map"):
        raise LpesError(f"{tokenizer_config} holds custom tokenizer code (auto_map); lpes runs no code from a model "
                        "folder: remove auto_map if the tokenizer is a built-in one")
    read_generation_config(folder)
    quantization = read_json_object(folder / "config.json").get("quantization_config")
    if quantization:
        method = quantization.get("quant_method") if isinstance(quantization, dict) else None
        raise LpesError(f"{folder / 'config.json'} holds a quantization_config ({str(method)[:40]}); lpes converts "
                        "unquantized checkpoints only (float32, float16 or bfloat16 weights)")


def inside_folder(folder: Path, path: Path) -> bool:
    """Whether `path`, its symbolic links followed, is inside `folder`: or in Hugging Face's cache, where
    snapshots/REVISION/NAME links to ../../blobs/HASH."""
    root, real = os.path.realpath(folder), os.path.realpath(path)
    if real == root or real.startswith(root.rstrip(os.sep) + os.sep):
        return True
    snapshots = Path(root).parent
    blobs = str(snapshots.parent / "blobs")
    return snapshots.name == "snapshots" and real.startswith(blobs + os.sep)


# generation_config.json fields that name token ids: an int, a list of ints, or null.
_TOKEN_ID_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


def read_generation_config(folder: Path) -> dict:
    """`folder`'s generation_config.json ({} when there is none); LpesError (one line) when it is not
    a JSON object or a token id field is not an id or a list of ids."""
    path = Path(folder) / "generation_config.json"
    if not path.exists() and not path.is_symlink():
        return {}
    data = read_json_object(path)
    for name in _TOKEN_ID_FIELDS:
        value = data.get(name)
        ids = value if isinstance(value, list) else [value]
        if value is not None and not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 2**31
                                         for i in ids):
            raise LpesError(f"{path}: {name!r} must be a token id or a list of them, got {str(value)[:40]}")
    return data


def check_weights(folder: Path) -> list[Path]:
    """The safetensors files transformers will read from `folder`, each with a sound header.

    Only the headers are read (8-byte length + JSON, checked by safetensors itself against the
    file size), so this takes milliseconds even for a 70B checkpoint.
    """
    if (folder / SAFETENSORS_INDEX).is_file():
        shards = _index_shards(folder)
    elif (folder / SAFETENSORS).is_file():
        shards = [folder / SAFETENSORS]
    else:
        raise LpesError(_no_weights(folder))
    for shard in [*shards, folder / SAFETENSORS_INDEX]:
        if shard.is_symlink() and not inside_folder(folder, shard):
            raise LpesError(f"{shard} is a symbolic link to {os.readlink(shard)[:120]}, outside the model folder; "
                            "lpes links or copies the weights into its output and refuses files from elsewhere "
                            "(copy it in with cp -L)")
    for shard in shards:
        _check_safetensors_header(shard)
    return shards


# What a checkpoint may hold for a floating-point parameter: float dtypes (transformers casts them).
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
# Checkpoint tensors transformers ignores on load (older Llama checkpoints saved the rotary inv_freq).
_IGNORED_EXTRA = (re.compile(r"(^|\.)rotary_emb\.inv_freq$"),)


def check_weights_match(folder: Path, config) -> None:
    """Every tensor of the model that `config` describes is in `folder`'s safetensors, with its shape and a float
    dtype, and nothing else is there; else LpesError naming the tensor. Headers only: the model is built on
    the meta device (no memory) and no tensor is read. Tied weights may be absent, as may persistent buffers.
    """
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception:  # noqa: BLE001 - a config transformers cannot build is reported where it is used
        return
    expected = model.state_dict()
    may_be_absent = {name for name, _ in model.named_buffers()}
    if getattr(config.get_text_config(), "tie_word_embeddings", False):
        may_be_absent.update(getattr(model, "_tied_weights_keys", None) or {})
    ignored = [*_IGNORED_EXTRA, *(re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_unexpected", None)
                                  or ())]
    rename = _checkpoint_renamer(model, expected)
    found: set[str] = set()
    what = f"{type(model).__name__} as {folder / 'config.json'} describes it"
    for shard, name, shape, dtype in _header_tensors(folder):
        target, converted = rename(name)
        if target not in expected:
            if any(p.search(name) for p in ignored):
                continue
            raise LpesError(f"{shard}: tensor {name[:120]!r} is not a weight of {what}; is config.json the one "
                            "for these weights?")
        found.add(target)
        param = expected[target]
        if param.is_floating_point() and dtype not in FLOAT_DTYPES:
            raise LpesError(f"{shard}: tensor {name[:120]!r} is {dtype}; lpes reads float weights "
                            f"({', '.join(FLOAT_DTYPES)})")
        if not converted and tuple(shape) != tuple(param.shape):
            raise LpesError(f"{shard}: tensor {name[:120]!r} has shape {list(shape)}, but {what} needs "
                            f"{list(param.shape)}")
    missing = [n for n in expected if n not in found and n not in may_be_absent]
    if missing:
        raise LpesError(f"{folder}: the weights lack {missing[0]!r} ({len(missing)} tensor(s) of {what} are "
                        "missing; a loader would fill them with random values)")


def _header_tensors(folder: Path):
    """(shard, tensor name, shape, dtype) of every tensor in the safetensors headers, no data read."""
    from safetensors import safe_open

    for shard in check_weights(folder):
        with safe_open(str(shard), framework="pt") as handle:
            for name in handle.keys():
                piece = handle.get_slice(name)
                yield shard, name, piece.get_shape(), piece.get_dtype()


def _checkpoint_renamer(model, expected: dict):
    """checkpoint key -> (the model's key, whether a conversion merges it with others) as transformers loads it."""
    prefix = model.base_model_prefix
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        mapping = get_model_conversion_mapping(model)
        renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
        converters = [m for m in mapping if isinstance(m, WeightConverter)]
    except (ImportError, AttributeError, TypeError):  # another transformers: the base prefix only
        def rename(name: str) -> tuple[str, bool]:
            if name not in expected and f"{prefix}.{name}" in expected:
                return f"{prefix}.{name}", False
            return name, False
        return rename

    def rename(name: str) -> tuple[str, bool]:
        target, pattern = rename_source_key(name, renamings, converters, prefix, expected)
        if target not in expected and name in expected:
            target, pattern = rename_source_key(name, [], [], prefix, expected)
        return target, pattern is not None

    return rename


def _no_weights(folder: Path) -> str:
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    pickles = [n for n in names if n.endswith(PICKLE_SUFFIXES)]
    if pickles:
        return (f"{folder} has only pickle weights ({pickles[0]}); lpes never unpickles a file (unpickling can run "
                "code) and reads safetensors only: if you trust the file, convert it with transformers, "
                f"AutoModelForCausalLM.from_pretrained(FOLDER).save_pretrained(FOLDER) (writes {SAFETENSORS})")
    others = [n for n in names if n.endswith((".safetensors", ".gguf"))]
    if others:
        return f"{folder} has {others[0]} but no {SAFETENSORS} or {SAFETENSORS_INDEX}, which transformers reads"
    return f"{folder} has no weights ({SAFETENSORS} or {SAFETENSORS_INDEX})"


def _index_shards(folder: Path) -> list[Path]:
    index = folder / SAFETENSORS_INDEX
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise LpesError(f"{index} is not a safetensors index ({type(err).__name__})") from None
    if not names or not all(isinstance(n, str) for n in names):
        raise LpesError(f"{index}: 'weight_map' must map tensor names to shard file names")
    for name in names:
        shard = folder / name
        if Path(name).name != name or not name.endswith(".safetensors"):
            raise LpesError(f"{index} names {name[:80]!r}; shards must be .safetensors files beside it")
        if not shard.is_file():
            raise LpesError(f"{folder}: shard {name} listed in {SAFETENSORS_INDEX} is missing")
    return [folder / n for n in names]


def _check_safetensors_header(path: Path) -> None:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt"):
            pass
    except (SafetensorError, OSError) as err:
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise LpesError(f"{path} is truncated or not safetensors ({why})") from None


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return Path(snapshot_download(repo_id))
    except (HfHubHTTPError, OSError, ValueError) as err:
        raise LpesError(f"cannot fetch {repo_id!r} from the Hub ({type(err).__name__}); pass a local folder") from None


def load_config(path: Path):
    """The transformers config of a built-in architecture; a config that needs custom code is refused."""
    from transformers import AutoConfig

    _refuse_custom_code(path)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError, KeyError) as err:
        raise LpesError(f"cannot read the model config in {path}: {str(err).splitlines()[0]}") from None
    architecture_for(config)  # fails early for non-RoPE models
    return config


@dataclass(frozen=True)
class ResolvedModel:
    """A model folder, its transformers config and a spec with one scale per layer of it: what a command's plan
    resolved once (validation/model_preflight.py) and every stage after it takes as it is."""

    path: Path
    config: Any
    spec: Spec


def resolve_for_spec(model_path: str | os.PathLike, spec: Spec) -> ResolvedModel:
    """The config read and `spec` resolved for its layers: for callers without a plan (the Python API, benchmarks,
    tests). A command resolves once in its plan and hands the result on."""
    config = load_config(Path(model_path))
    return ResolvedModel(Path(model_path), config, spec.for_layers(config.num_hidden_layers))


def _refuse_custom_code(path: Path) -> None:
    """auto_map points transformers at Python files of the folder; lpes never imports them."""
    data = read_json_object(path / "config.json")
    if data.get("auto_map"):
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        hint = ""
        if data.get("model_type") in CONFIG_MAPPING:
            hint = f"; model_type {data['model_type']!r} is built into transformers: remove auto_map to use it"
        raise LpesError(f"{path} holds custom model code (auto_map in config.json); lpes runs no code from a "
                        f"model folder and wraps only built-in transformers models{hint}")


def load_model(path: Path, dtype: str = "float32", for_export: bool = False, device_map: dict | None = None):
    """Load the unpatched causal LM in eval mode (with export-friendly kernels when `for_export`).

    `device_map` (module name -> device) loads it split over several GPUs (search/replicas.py plans it).
    """
    from transformers import AutoModelForCausalLM

    check_dtype(dtype)
    config = load_config(path)
    kwargs = dict(architecture_for(config).export_load_kwargs) if for_export else {}
    if device_map is not None:
        kwargs["device_map"] = device_map
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype), use_safetensors=True,
                                                 trust_remote_code=False, **kwargs)
    return model.eval()


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "tiktoken.model")


def has_tokenizer(path: Path) -> bool:
    """True when `path` holds tokenizer files (weights-only repositories have none)."""
    return any((Path(path) / name).is_file() for name in TOKENIZER_FILES)


def load_tokenizer(path: Path):
    """The tokenizer of a model folder; LpesError (one line) when it has none or it cannot be read."""
    from transformers import AutoTokenizer

    if not has_tokenizer(path):
        raise LpesError(f"{path} has no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...)")
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - the tokenizers library raises a bare Exception for a bad tokenizer.json
        if not isinstance(err, (OSError, ValueError, TypeError, KeyError)) and type(err) is not Exception:
            raise
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise LpesError(f"cannot load the tokenizer of {path}: {first[:200]}") from None


def parameter_count(model_path: Path) -> int:
    """Parameters of the safetensors weights, from their headers alone (no tensor is read)."""
    from safetensors import safe_open

    params = 0
    for shard in check_weights(Path(model_path)):
        with safe_open(str(shard), framework="pt") as handle:
            for name in handle.keys():
                params += math.prod(handle.get_slice(name).get_shape())
    return params


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux: MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
