"""Which examples to score: a data description, a benchmark file, or the model folder's defaults.

Search (calibration) and validation (held-out evaluation) both call `load_examples`.

A data description is ``TASK:field=value,...``:

    kv:pairs=75,examples=25,gold=0|24|49|74,seed=0     UUID key-value retrieval (kv_data)
    kv:file=kv-retrieval-75_keys.jsonl.gz,gold=0|74     the benchmark's own records
    tiny-kv:pairs=16,length=1024,gold=0|8|15            the bundled tiny model's task (tiny_kv)
    path/to/records.jsonl[.gz]                          same as kv:file=...

Fields left out come from the model folder's `lpes_task.json` when it names the
same task (e.g. {"task": "tiny-kv", "num_pairs": 16, "length": 1024,
"gold_indices": [0, 4, 8, 12, 15]}), then from the task's built-in defaults.
`examples` counts examples per gold index.

`split` keeps calibration and evaluation apart: the same seed gives different
examples for "search" and "validation" (seed 2*S and 2*S+1), so a curve is never
validated on the examples it was searched on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from lpes.errors import LpesError
from lpes.validation import kv_data
from lpes.validation.examples import Example

TASK_FILE = "lpes_task.json"
SPLITS = ("search", "validation")


@dataclass(frozen=True)
class TaskConfig:
    """Everything that determines the examples of a task."""

    task: str = "kv"
    num_pairs: int = 75
    gold_indices: tuple[int, ...] | None = None  # None: kv_data.default_gold_indices(num_pairs)
    examples_per_index: int = 25
    seed: int = 0
    length: int | None = None  # tiny-kv only: positions per prompt
    file: str | None = None  # kv only: the benchmark's JSONL records instead of generated ones

    def resolved_gold_indices(self) -> tuple[int, ...]:
        if self.gold_indices is not None:
            return self.gold_indices
        return tuple(kv_data.default_gold_indices(self.num_pairs))


TASK_DEFAULTS = {
    "kv": TaskConfig(),
    "tiny-kv": TaskConfig(task="tiny-kv", num_pairs=16, examples_per_index=20, length=1024),
}
# Description field -> TaskConfig field, per task.
_COMMON_FIELDS = {
    "pairs": "num_pairs", "examples": "examples_per_index", "gold": "gold_indices", "seed": "seed"
}
_DESCRIPTION_FIELDS = {
    "kv": {**_COMMON_FIELDS, "file": "file"},
    "tiny-kv": {**_COMMON_FIELDS, "length": "length"},
}
# lpes_task.json keys -> TaskConfig fields ("task" selects the task).
_TASK_FILE_FIELDS = ("num_pairs", "gold_indices", "examples_per_index", "seed", "length", "file")


def load_examples(
    model_path: Path,
    data: str | None = None,
    *,
    tokenizer=None,
    use_chat_template: bool = True,
    split: str = "validation",
) -> list[Example]:
    """The examples for `model_path` (a local model folder), described by `data` or the folder's defaults.

    `tokenizer` is only needed for the chat template of the kv task; it is loaded
    from `model_path` when not given.
    """
    config = task_config(model_path, data)
    return examples_for(
        config, model_path, tokenizer=tokenizer, use_chat_template=use_chat_template, split=split
    )


def task_config(model_path: Path | None, data: str | None) -> TaskConfig:
    """The resolved task: description fields over the model folder's defaults over built-in defaults."""
    defaults = _model_defaults(model_path)
    if data is None:
        config = defaults
    else:
        task, overrides = parse_description(data)
        base = defaults if defaults.task == task else TASK_DEFAULTS[task]
        config = replace(base, **overrides)
    _check(config)
    return config


def examples_for(
    config: TaskConfig,
    model_path: Path | None = None,
    *,
    tokenizer=None,
    use_chat_template: bool = True,
    split: str = "validation",
) -> list[Example]:
    """Build the examples of a resolved task."""
    if split not in SPLITS:
        raise LpesError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    seed = 2 * config.seed + SPLITS.index(split)
    gold = list(config.resolved_gold_indices())
    if config.task == "tiny-kv":
        from lpes.validation import tiny_kv

        try:
            return tiny_kv.make_examples(
                config.num_pairs, config.length, gold, config.examples_per_index, seed
            )
        except ValueError as err:  # tiny_kv's own limits (at most 64 keys)
            raise LpesError(f"tiny-kv data: {err}") from None
    if config.file is not None:
        records = kv_data.read_jsonl(config.file)[: config.examples_per_index]
    else:
        records = kv_data.generate_records(config.num_pairs, config.examples_per_index, seed)
    for record in records:
        if max(gold) >= record.num_pairs:
            raise LpesError(f"kv data: 'gold' index {max(gold)} is outside a {record.num_pairs}-pair record")
    if use_chat_template and tokenizer is None and model_path is not None:
        tokenizer = _load_tokenizer(model_path)
    return kv_data.make_examples(records, gold, tokenizer, use_chat_template)


def parse_description(data: str) -> tuple[str, dict[str, Any]]:
    """`kv:pairs=75,gold=0|74` -> ("kv", {"num_pairs": 75, "gold_indices": (0, 74)}); a path -> kv file."""
    if ":" not in data or data.endswith((".jsonl", ".jsonl.gz")):
        if not Path(data).is_file():
            raise LpesError(f"--data {data!r} is neither a description (TASK:field=value,...) nor a file")
        return "kv", _file_fields(data)
    task, _, rest = data.partition(":")
    if task not in _DESCRIPTION_FIELDS:
        raise LpesError(f"--data: unknown task {task!r} (known: {', '.join(_DESCRIPTION_FIELDS)})")
    overrides: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq:
            raise LpesError(f"--data: {item!r} must be field=value")
        if name not in _DESCRIPTION_FIELDS[task]:
            known = ", ".join(_DESCRIPTION_FIELDS[task])
            raise LpesError(f"--data: unknown field {name!r} for {task} (known: {known})")
        overrides[_DESCRIPTION_FIELDS[task][name]] = _parse_value(name, value.strip())
    if "file" in overrides:
        overrides = {**_file_fields(overrides["file"]), **overrides}
    return task, overrides


def _file_fields(path: str) -> dict[str, Any]:
    """A benchmark file's own pair count and record count (all records unless `examples` is given)."""
    records = kv_data.read_jsonl(path)
    return {"file": path, "num_pairs": records[0].num_pairs, "examples_per_index": len(records)}


def _parse_value(name: str, value: str) -> Any:
    if name == "file":
        if not Path(value).is_file():
            raise LpesError(f"--data: 'file' {value!r} not found")
        return value
    if name == "gold":
        return tuple(_parse_int(name, v) for v in value.split("|"))
    return _parse_int(name, value)


def _parse_int(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise LpesError(f"--data: '{name}' must be an integer, got {value!r}") from None


def _model_defaults(model_path: Path | None) -> TaskConfig:
    """The model folder's `lpes_task.json` over its task's built-in defaults; the kv task without one."""
    path = None if model_path is None else Path(model_path) / TASK_FILE
    if path is None or not path.is_file():
        return TASK_DEFAULTS["kv"]
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise LpesError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise LpesError(f"{path}: top level must be a JSON object")
    task = data.get("task", "kv")
    if task not in TASK_DEFAULTS:
        raise LpesError(f"{path}: 'task' is {task!r} (known: {', '.join(TASK_DEFAULTS)})")
    unknown = set(data) - {"task", *_TASK_FILE_FIELDS}
    if unknown:
        known = ", ".join(_TASK_FILE_FIELDS)
        raise LpesError(f"{path}: unknown field {sorted(unknown)[0]!r} (known: task, {known})")
    overrides = {name: data[name] for name in _TASK_FILE_FIELDS if name in data}
    if "gold_indices" in overrides:
        gold = overrides["gold_indices"]
        if not isinstance(gold, list):
            raise LpesError(f"{path}: 'gold_indices' must be a list of integers")
        overrides["gold_indices"] = tuple(gold)
    config = replace(TASK_DEFAULTS[task], **overrides)
    _check(config, where=str(path))
    return config


def _check(config: TaskConfig, where: str = "--data") -> None:
    """Every field of a resolved task is valid; the message names the field."""
    for f in fields(TaskConfig):
        value = getattr(config, f.name)
        if f.name in ("num_pairs", "examples_per_index", "seed", "length") and value is not None:
            if isinstance(value, bool) or not isinstance(value, int):
                raise LpesError(f"{where}: '{f.name}' must be an integer, got {value!r}")
    if config.num_pairs < 2:
        raise LpesError(f"{where}: 'num_pairs' (pairs) must be at least 2, got {config.num_pairs}")
    if config.examples_per_index < 1:
        count = config.examples_per_index
        raise LpesError(f"{where}: 'examples_per_index' (examples) must be at least 1, got {count}")
    if config.seed < 0:
        raise LpesError(f"{where}: 'seed' must be >= 0, got {config.seed}")
    gold = config.resolved_gold_indices()
    if not gold:
        raise LpesError(f"{where}: 'gold_indices' (gold) must name at least one index")
    for index in gold:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < config.num_pairs:
            last = config.num_pairs - 1
            raise LpesError(f"{where}: 'gold_indices' (gold) entry {index!r} is outside 0..{last}")
    if config.task == "tiny-kv" and (config.length is None or config.length < config.num_pairs + 2):
        least = config.num_pairs + 2
        raise LpesError(f"{where}: 'length' must be at least pairs + 2 = {least}, got {config.length}")


def _load_tokenizer(model_path: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_path)
    except (OSError, ValueError) as err:
        raise LpesError(f"cannot load the tokenizer of {model_path}: {str(err).splitlines()[0]}") from None
