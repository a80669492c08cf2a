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
from importlib.resources import files
from pathlib import Path

import torch

from lpes.converter.architectures import architecture_for
from lpes.errors import LpesError
from lpes.files import read_json_object

BUNDLED_MODELS_DIR = Path(str(files("lpes") / "models"))  # package data of lpes, editable or wheel
DEFAULT_MODEL = "lpes-tiny-kv"

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
# Weights stored as Python pickles: unpickling can run arbitrary code, so lpes neither reads nor copies them.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def check_dtype(dtype: str) -> str:
    """`dtype` if it names one of DTYPES, else LpesError listing them."""
    if dtype not in DTYPES:
        raise LpesError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return dtype


def bundled_models() -> dict[str, Path]:
    """Short name -> folder of the models that ship inside lpes."""
    if not BUNDLED_MODELS_DIR.is_dir():
        return {}
    return {p.name: p for p in sorted(BUNDLED_MODELS_DIR.iterdir()) if (p / "config.json").is_file()}


def model_label(name: str) -> str:
    """How published files name the model: a Hub id or bundled name as given, a local folder by its name only."""
    path = Path(name).expanduser()
    return name if name in bundled_models() or not path.exists() else path.resolve().name


def resolve_model(name: str | os.PathLike) -> Path:
    """A checked local folder for `name`: a bundled short name, an existing folder, or a hub download."""
    name = str(name)
    if name in bundled_models():
        return check_model_folder(bundled_models()[name])
    path = Path(name).expanduser()
    if path.exists():
        return check_model_folder(path)
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise LpesError(f"model folder not found: {name}")
    return check_model_folder(_download(name))


def check_model_folder(path: Path) -> Path:
    """`path` if it is a readable model folder with a config and sound safetensors weights, else LpesError."""
    if not path.is_dir():
        raise LpesError(f"{path} is a file, not a model folder")
    if not os.access(path, os.R_OK | os.X_OK):
        raise LpesError(f"cannot read the model folder {path} (permission denied)")
    if not (path / "config.json").is_file():
        raise LpesError(f"{path} is not a Hugging Face model folder (no config.json)")
    check_weights(path)
    return path


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
    for shard in shards:
        _check_safetensors_header(shard)
    return shards


def _no_weights(folder: Path) -> str:
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    pickles = [n for n in names if n.endswith(PICKLE_SUFFIXES)]
    if pickles:
        return (f"{folder} has only pickle weights ({pickles[0]}); lpes reads safetensors only, which cannot run "
                "code: re-save the model with save_pretrained() (writes model.safetensors)")
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
    model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype], use_safetensors=True,
                                                 trust_remote_code=False, **kwargs)
    return model.eval()


def model_fingerprint(config) -> dict:
    """What a spec records about the model it was made for."""
    return {
        "architecture": (config.architectures or [type(config).__name__])[0],
        "model_type": config.model_type,
        "num_hidden_layers": config.num_hidden_layers,
        "rope_parameters": _plain(config.rope_parameters),
    }


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


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
    except (OSError, ValueError, TypeError, KeyError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise LpesError(f"cannot load the tokenizer of {path}: {first}") from None


def check_device(name: str | None) -> str:
    """A torch device this machine has (default: cuda when there is one, else cpu); LpesError otherwise."""
    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise LpesError(f"--device {name!r} is not a torch device (cpu, cuda, cuda:1, mps ...)") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise LpesError(f"--device {name}: this machine has no CUDA GPU (or torch is a CPU build)")
        if device.index is not None and device.index >= count:
            raise LpesError(f"--device {name}: this machine has {count} CUDA GPU(s), cuda:0..cuda:{count - 1}")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise LpesError(f"--device {name}: MPS is not available here")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise LpesError(f"--device {name}: lpes runs on cpu, cuda or mps, not {device.type}")
    return str(device)


def default_dtype(device: str) -> str:
    """float32 on a CPU (half-precision matmuls there are slow and inexact); bfloat16 on a GPU that has it."""
    if torch.device(device).type == "cpu":
        return "float32"
    if torch.device(device).type == "cuda" and not torch.cuda.is_bf16_supported():
        return "float16"
    return "bfloat16"


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
