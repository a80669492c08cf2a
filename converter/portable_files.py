"""Config and tokenizer files that transformers 4.x and 5 both read the same way.

A folder saved by transformers 5 reads back wrong, or not at all, in the 4.x clients users
still run (optimum-onnx needs transformers < 4.58):

- `tokenizer_config.json` names `TokenizersBackend`, a class 4.x does not have; for a
  tokenizer backed by `tokenizer.json` that class is what 4.x calls `PreTrainedTokenizerFast`.
- Without `model_input_names`, 4.x's `PreTrainedTokenizerFast` also returns `token_type_ids`,
  which `generate(**encoded)` refuses. 5.x's own value is written down, so both agree.
- 5.x keeps RoPE in `rope_parameters`; 4.x reads `rope_theta` and `rope_scaling` beside it
  (and `partial_rotary_factor`) and silently falls back to defaults without them.

Both writers take the source files as they are and change only these fields.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lpes.foundation.files import write_bytes_atomic, write_text_atomic

COPIED_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)
# transformers 5's generic tokenizers-backed class, and its name in transformers 4.x.
GENERIC_TOKENIZER_CLASS = "TokenizersBackend"
GENERIC_TOKENIZER_CLASS_4X = "PreTrainedTokenizerFast"
# Keys of rope_parameters that 4.x keeps at the top level of the config, not in rope_scaling.
_TOP_LEVEL_ROPE_KEYS = ("rope_theta", "partial_rotary_factor")


def write_tokenizer_files(src: Path, dst: Path) -> list[str]:
    """Copy the tokenizer files of `src` into `dst`, tokenizer_config.json made portable; returns the names."""
    written = []
    for name in COPIED_TOKENIZER_FILES:
        source = Path(src) / name
        if not source.is_file():
            continue
        if name == "tokenizer_config.json":
            data = portable_tokenizer_config(json.loads(source.read_text()), (Path(src) / "tokenizer.json").is_file())
            write_text_atomic(Path(dst) / name, json.dumps(data, indent=2) + "\n")
        else:
            write_bytes_atomic(Path(dst) / name, source.read_bytes())
        written.append(name)
    return written


def portable_tokenizer_config(data: dict[str, Any], has_tokenizer_json: bool) -> dict[str, Any]:
    """`data` (a tokenizer_config.json) with a class name and input names that 4.x and 5 read alike."""
    import transformers

    data = dict(data)
    if data.get("tokenizer_class") == GENERIC_TOKENIZER_CLASS and has_tokenizer_json:
        data["tokenizer_class"] = GENERIC_TOKENIZER_CLASS_4X
    if "model_input_names" not in data:
        # What transformers 5 uses for this class, written down so that 4.x does the same.
        cls = getattr(transformers, data.get("tokenizer_class") or GENERIC_TOKENIZER_CLASS, None)
        names = getattr(cls, "model_input_names", None) or ["input_ids", "attention_mask"]
        data["model_input_names"] = list(names)
    return data


def with_legacy_rope(config: dict[str, Any]) -> dict[str, Any]:
    """`config` (a config.json) with 4.x's rope_theta / rope_scaling / partial_rotary_factor beside rope_parameters.

    transformers 5 reads `rope_scaling` in preference to `rope_parameters`, then fills
    `rope_theta` and `partial_rotary_factor` in from the top level, so the mirror must hold
    the same values: it is rope_parameters minus those two keys, which go to the top level.
    Per-layer-type RoPE (Gemma 3) has no 4.x form that 5 would read back the same (a flat
    rope_scaling would replace the nested dict), so such configs are returned unchanged.
    """
    rope = config.get("rope_parameters")
    if not isinstance(rope, dict) or any(isinstance(value, dict) for value in rope.values()):
        return dict(config)
    config = dict(config)
    for key in _TOP_LEVEL_ROPE_KEYS:
        if key in rope:
            config[key] = rope[key]
    if rope.get("rope_type", "default") == "default":
        config.pop("rope_scaling", None)  # 4.x: no rope_scaling means default RoPE with rope_theta
    else:
        config["rope_scaling"] = {k: v for k, v in rope.items() if k not in _TOP_LEVEL_ROPE_KEYS}
    return config


def write_config_json(config: dict[str, Any], path: Path) -> None:
    """Write a config.json with the legacy RoPE fields mirrored (atomically)."""
    write_text_atomic(Path(path), json.dumps(with_legacy_rope(config), indent=2) + "\n")
