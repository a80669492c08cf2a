"""Before lpes loads a Hub folder with trust_remote_code=True: is its code exactly lpes's own?

A Hub folder runs `modeling_lpes.py` (which imports `lpes_rope.py`) when loaded. A folder
someone published may hold anything there, and validating such a folder is what a careful
user does before trusting it. So lpes renders the `modeling_lpes.py` this version writes for
the folder's config, compares bytes, compares `lpes_rope.py` with lpes's own, and refuses
any other Python file or any auto_map entry that would reach one, before transformers
imports a line of it.
"""

from __future__ import annotations

import re
from pathlib import Path

from lpes.foundation.errors import LpesError
from lpes.foundation.files import read_json_object
from lpes.foundation.spec_file import SPEC_FILE

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
    from lpes.converter.loading import check_weights
    from lpes.foundation.version import __version__

    folder = Path(folder)
    entries = _auto_map_entries(folder)
    if not (folder / MODELING).exists() and not entries:
        return
    for file_name, entry in entries:
        if not _AUTO_MAP_ENTRY.fullmatch(entry):
            raise LpesError(f"{folder / file_name}: auto_map entry {entry[:80]!r} points at code lpes did not write; "
                            "refusing to load the folder")
    config = read_folder_json(folder / "config.json")
    expected = {
        MODELING: _expected_modeling(folder, config, __version__),
        ROPE: Path(__file__).with_name(ROPE).read_bytes(),  # lpes's own, beside this file (not imported: torch)
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
        auto_map = read_folder_json(path).get("auto_map")
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


def read_folder_json(path: Path) -> dict:
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


def check_lpes_fields(folder: Path) -> None:
    """A per-layer Hub folder's config.json `lpes` fields are exactly those lpes writes for its lpes_spec.json
    and base config: modeling_lpes.py runs on them (scales, module paths), so other values would run another model
    than the one validated, or fail inside it."""
    from transformers import AutoConfig

    from lpes.converter.architectures import architecture_for
    from lpes.converter.hf_folder import _lpes_config
    from lpes.foundation.spec import load_spec

    path = folder / "config.json"
    data = read_folder_json(path)
    fields = data.get("lpes")
    if not isinstance(fields, dict) or "base_model_type" not in fields:
        return  # a stock-RoPE folder: plain transformers reads it
    if not (folder / SPEC_FILE).is_file():
        raise LpesError(f"{folder} has per-layer scales in config.json but no lpes_spec.json; it is not a folder "
                        "lpes-convert wrote")
    base = {k: v for k, v in data.items() if k not in ("auto_map", "lpes", "architectures", "model_type")}
    try:
        config = AutoConfig.for_model(str(fields["base_model_type"]), **base)
        config.architectures = [str(fields.get("base_architecture"))]
        spec = load_spec(folder / SPEC_FILE).for_layers(config.num_hidden_layers)
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


def check_hub_weights(folder: Path) -> None:
    """The Hub folder's safetensors against the model its config.json describes (per-layer folders: the base)."""
    from transformers import AutoConfig

    from lpes.converter.loading import check_weights, check_weights_match

    check_weights(folder)
    data = read_folder_json(folder / "config.json")
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
