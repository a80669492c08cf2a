"""Which examples to score: a data description, a benchmark file, or the model folder's defaults.

Search (calibration) and validation (held-out evaluation) both call `load_examples`.

A data description is ``TASK:field=value,...``; lists are joined by ``+``, which no shell
interprets (every command's --help prints `DATA_HELP`):

    tiny-kv:examples=8                                  the bundled tiny model's task (tiny_kv)
    tiny-kv:pairs=16,length=1024,gold=0+8+15            ... with its fields
    tiny-induction:examples=40                          the second bundled model's task (tiny_induction)
    kv:pairs=75,examples=25,gold=0+24+49+74,seed=0      UUID key-value retrieval, generated (kv_data)
    kv:pairs=20,keys=number,answer_tokens=24            6-digit numbers instead of UUIDs, 24-token answers
    kv:file=kv-retrieval-75_keys.jsonl.gz,gold=0+74     the benchmark's own records
    path/to/records.jsonl[.gz]                          same as kv:file=...

Fields left out come from the model folder's `lpes_task.json` when it names the
same task (e.g. {"task": "tiny-kv", "num_pairs": 16, "length": 1024,
"gold_indices": [0, 4, 8, 12, 15]}), then from the task's built-in defaults.
`examples` counts examples per gold index (tiny-kv:examples=8 with 5 gold indices
is 8 x 5 = 40 prompts); with a file it counts records, each scored at every gold
index (default: all of them).

`split` keeps calibration and evaluation apart, so a curve is never validated on
the examples it was searched on:
- generated examples: the same seed gives "search" seed 2*S and "validation" seed 2*S+1;
- a benchmark file: its records are split in two halves that never share a record
  (`kv_data.split_records`, by the SHA-256 of each record): "search" reads one half,
  "validation" (lpes-search's held-out examples, lpes-validate, lpes-convert) the other.
"""

from __future__ import annotations

import difflib
import importlib
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from lpes.foundation.devices import format_bytes
from lpes.foundation.errors import LpesError
from lpes.validation import kv_data
from lpes.validation.examples import Example

TASK_FILE = "lpes_task.json"
SPLITS = ("search", "validation")
SPLIT_NAMES = {"search": "calibration", "validation": "held-out"}

# Sane bounds, checked before anything is built: beyond them a typo would allocate for hours.
MAX_PAIRS = 10_000  # kv: about 800 KB of prompt, 500k+ tokens (the paper stops at 300)
MAX_EXAMPLES_PER_INDEX = 100_000
MAX_LENGTH = 1 << 20  # positions per prompt of a bundled model's task
MAX_PROMPT_BYTES = 1 << 30  # all prompts together, estimated from the description
_KV_BYTES_PER_PAIR = 82  # '"<uuid>": "<uuid>",\n ' as kv_data formats it
_TINY_BYTES_PER_POSITION = 5  # 'f12 ', 'p40_1 ' ...
LIST_SEPARATOR = "+"  # joins a list field's values (gold=0+24+49+74): needs no quoting in a shell

# --data, as every command's --help explains it (lpes-search, lpes-convert, lpes-validate).
DATA_HELP = """\
--data TASK:field=value,... or FILE.jsonl[.gz] (lists joined by +, which needs no quoting).
Fields left out come from the model folder's lpes_task.json when it names the same task,
then from the task's defaults. The forms, with the values a field left out gets:
  tiny-kv:pairs=16,length=1024,examples=20,gold=0+4+8+12+15,seed=0
        the bundled model's task (these values: lpes-tiny-kv's lpes_task.json;
        validation/tiny_kv.py): pairs facts among filler, prompts of length positions
  tiny-induction:pairs=16,length=512,examples=20,gold=0+4+8+12+15,seed=0
        the second bundled model's task (lpes-tiny-induction's, make demo's): facts written
        "k{key} k{decoy} v{value}" among filler, prompts of length positions
  kv:pairs=75,examples=25,gold=0+24+49+74,seed=0
        the lost-in-the-middle task: UUID keys and values, generated as the benchmark does
  kv:file=FILE.jsonl,examples=N or FILE.jsonl (or .jsonl.gz)
        the benchmark's own records: one half of the file calibrates lpes-search, the other
        is held out for validation (all of a half, or its first N)
examples counts examples per gold index: lpes-tiny-kv has 5 gold indices (0 4 8 12 15), so
tiny-kv:examples=8 is 8 x 5 = 40 prompts. gold (the positions of the needed pair, 0 = first)
defaults to the model's lpes_task.json, else the paper's indices for 75, 140 or 300 pairs
(0+24+49+74 for 75), else 5 evenly spaced. Calibration and validation never share an
example: generated ones come from seed 2*seed for lpes-search's calibration and 2*seed+1 for
held-out examples and validation; a benchmark file is split in two halves that share no
record (by the SHA-256 of each record).
"""
DATA_FLAG = "TASK:field=value,... or FILE.jsonl[.gz] (forms below); default: "  # + the command's own default


@dataclass(frozen=True)
class TaskConfig:
    """Everything that determines the examples of a task."""

    task: str = "kv"
    num_pairs: int = 75
    gold_indices: tuple[int, ...] | None = None  # None: kv_data.default_gold_indices(num_pairs)
    examples_per_index: int | None = 25  # None (a file only): every record of its split
    seed: int = 0
    length: int | None = None  # bundled models' tasks (BUNDLED_TASKS) only: positions per prompt
    file: str | None = None  # kv only: the benchmark's JSONL records instead of generated ones
    keys: str = "uuid"  # kv only, generated: what keys and values are (kv_data.KEY_KINDS)
    # Tokens the model may write before the value must have appeared (Example.answer_tokens):
    # None = exactly the answer's own tokens (the bundled models answer with the value, then stop).
    answer_tokens: int | None = None

    def resolved_gold_indices(self) -> tuple[int, ...]:
        if self.gold_indices is not None:
            return self.gold_indices
        return tuple(kv_data.default_gold_indices(self.num_pairs))


TASK_DEFAULTS = {
    "kv": TaskConfig(answer_tokens=kv_data.BENCHMARK_ANSWER_TOKENS),
    "tiny-kv": TaskConfig(task="tiny-kv", num_pairs=16, examples_per_index=20, length=1024),
    "tiny-induction": TaskConfig(task="tiny-induction", num_pairs=16, examples_per_index=20, length=512),
}
# The bundled models' compact word-level tasks -> their module in lpes.validation; each has
# make_examples(num_pairs, length, gold_indices, examples_per_index, seed), NUM_KEYS, min_length(num_pairs).
BUNDLED_TASKS = {"tiny-kv": "tiny_kv", "tiny-induction": "tiny_induction"}
# Description field -> TaskConfig field, per task.
_COMMON_FIELDS = {
    "pairs": "num_pairs", "examples": "examples_per_index", "gold": "gold_indices", "seed": "seed"
}
_DESCRIPTION_FIELDS = {
    "kv": {**_COMMON_FIELDS, "file": "file", "keys": "keys", "answer_tokens": "answer_tokens"},
    "tiny-kv": {**_COMMON_FIELDS, "length": "length", "answer_tokens": "answer_tokens"},
    "tiny-induction": {**_COMMON_FIELDS, "length": "length", "answer_tokens": "answer_tokens"},
}
# lpes_task.json keys -> TaskConfig fields ("task" selects the task).
_TASK_FILE_FIELDS = ("num_pairs", "gold_indices", "examples_per_index", "seed", "length", "file", "keys",
                     "answer_tokens")
MAX_ANSWER_TOKENS = 4096


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
    if config.task in BUNDLED_TASKS:
        try:
            examples = _bundled_task(config.task).make_examples(
                config.num_pairs, config.length, gold, config.examples_per_index, seed
            )
        except ValueError as err:  # the task's own limits (at most 64 keys)
            raise LpesError(f"{config.task} data: {err}") from None
        return [replace(e, answer_tokens=config.answer_tokens) for e in examples]
    if config.file is not None:
        records = file_records(config, split)
    else:
        records = kv_data.generate_records(config.num_pairs, config.examples_per_index, seed, config.keys)
    for record in records:
        if max(gold) >= record.num_pairs:
            raise LpesError(f"kv data: 'gold' index {max(gold)} is outside a {record.num_pairs}-pair record")
    if use_chat_template and tokenizer is None and model_path is not None:
        from lpes.converter.loading import load_tokenizer

        tokenizer = load_tokenizer(model_path)
    return kv_data.make_examples(records, gold, tokenizer, use_chat_template, config.answer_tokens)


def file_records(config: TaskConfig, split: str) -> list[kv_data.KvRecord]:
    """The records of `config.file` in `split`'s half, the first `examples` of them (all when None)."""
    records = kv_data.read_jsonl(config.file)
    half = kv_data.split_records(records)[SPLITS.index(split)]
    name = Path(config.file).name
    if not half:
        distinct = len({kv_data.record_digest(record) for record in records})
        raise LpesError(f"kv data file {name} holds {distinct} distinct record(s): calibration and held-out "
                        "need one each (the file is split in two halves that share no record)")
    wanted = config.examples_per_index
    if wanted is not None and wanted > len(half):
        print(f"lpes: --data asks for {wanted} records; the {SPLIT_NAMES[split]} half of {name} holds "
              f"{len(half)} (of {len(records)}): using {len(half)}", file=sys.stderr)
    return [records[i] for i in half[:wanted]]


def split_provenance(config: TaskConfig, split: str, used: int | None = None) -> dict[str, Any]:
    """How the examples of `split` were kept apart from the other split, as best.json records it.

    `used`: how many of the split's records were scored (the first ones), None: all drawn.
    """
    if config.file is None:
        return {"source": f"generated {config.task} examples, seed {2 * config.seed + SPLITS.index(split)}",
                "rule": "calibration uses seed 2*seed, held-out 2*seed+1"}
    records = kv_data.read_jsonl(config.file)
    half = kv_data.split_records(records)[SPLITS.index(split)][: config.examples_per_index][:used]
    return {"source": f"split of {Path(config.file).name}",
            "rule": "records ranked by SHA-256: even ranks calibrate, odd ranks are held out",
            "records": half}


def portable_description(data: str | None) -> str | None:
    """`data` with each file named by its name alone, for files others read (no path of this machine)."""
    if data is None:
        return None
    if not _is_description(data):
        return Path(data).name
    task, _, rest = data.partition(":")
    items = [f"file={Path(item[5:]).name}" if item.strip().startswith("file=") else item for item in rest.split(",")]
    return f"{task}:{','.join(items)}"


def parse_description(data: str) -> tuple[str, dict[str, Any]]:
    """`kv:pairs=75,gold=0+74` -> ("kv", {"num_pairs": 75, "gold_indices": (0, 74)}); a path -> kv file."""
    if not _is_description(data):
        if not _names_a_file(data):
            raise LpesError(f"--data {data!r} is neither a description (TASK:field=value,...) nor a file")
        return "kv", _file_fields(data)
    task, _, rest = data.partition(":")
    if task not in _DESCRIPTION_FIELDS:
        raise LpesError(f"--data: unknown task {task!r}{_hint(task, _DESCRIPTION_FIELDS)}")
    overrides: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq:
            raise LpesError(f"--data: {item!r} must be field=value")
        if name not in _DESCRIPTION_FIELDS[task]:
            raise LpesError(f"--data: unknown field {name!r} for {task}{_hint(name, _DESCRIPTION_FIELDS[task])}")
        if _DESCRIPTION_FIELDS[task][name] in overrides:
            raise LpesError(f"--data: field {name!r} is given twice; give each field once")
        overrides[_DESCRIPTION_FIELDS[task][name]] = _parse_value(name, value.strip())
    if "file" in overrides:
        overrides = {**_file_fields(overrides["file"]), **overrides}
    return task, overrides


def data_files(data: str | None) -> list[str]:
    """The files a --data value names (itself, or a description's file=), without reading them."""
    if data is None:
        return []
    if not _is_description(data):
        return [data]
    fields = (item.partition("=") for item in data.partition(":")[2].split(","))
    return [value.strip() for name, eq, value in fields if eq and name.strip() == "file"]


def _is_description(data: str) -> bool:
    """TASK:... unless it names a file (kv:file=x.jsonl is a description; C:/x.jsonl or x.jsonl a file)."""
    if _names_a_file(data) or ":" not in data:
        return False
    return data.partition(":")[0] in _DESCRIPTION_FIELDS or not data.endswith((".jsonl", ".jsonl.gz"))


def _names_a_file(text: str) -> bool:
    try:
        return Path(text).is_file()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        return False


def _hint(name: str, known: Sequence[str]) -> str:
    """' (did you mean 'pairs'?; known: ...)' for a misspelt name."""
    close = difflib.get_close_matches(name, list(known), n=1)
    guess = f"did you mean {close[0]!r}?; " if close else ""
    return f" ({guess}known: {', '.join(known)})"


def _file_fields(path: str) -> dict[str, Any]:
    """A benchmark file's own pair count; every record of a split unless `examples` is given."""
    records = kv_data.read_jsonl(path)
    return {"file": path, "num_pairs": records[0].num_pairs, "examples_per_index": None}


def _parse_value(name: str, value: str) -> Any:
    if name == "file":
        if not _names_a_file(value):
            raise LpesError(f"--data: 'file' {value!r} not found")
        return value
    if name == "gold":
        return tuple(_parse_int(name, v) for v in value.split(LIST_SEPARATOR))
    if name == "keys":
        return value
    return _parse_int(name, value)


def _parse_int(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise LpesError(f"--data: '{name}' must be an integer, got {value[:40]!r}") from None


def _model_defaults(model_path: Path | None) -> TaskConfig:
    """The model folder's `lpes_task.json` over its task's built-in defaults; the kv task without one."""
    path = None if model_path is None else Path(model_path) / TASK_FILE
    if path is None or not path.is_file():
        return TASK_DEFAULTS["kv"]
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError, OSError) as err:  # ValueError: also integers of over 4300 digits
        raise LpesError(f"{path} is not valid JSON: {str(err)[:100]}") from None
    except RecursionError:
        raise LpesError(f"{path} is not valid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise LpesError(f"{path}: top level must be a JSON object")
    task = data.get("task", "kv")
    if not isinstance(task, str) or task not in TASK_DEFAULTS:
        raise LpesError(f"{path}: 'task' is {task!r} (known: {', '.join(TASK_DEFAULTS)})")
    unknown = set(data) - {"task", *_TASK_FILE_FIELDS}
    if unknown:
        name = sorted(unknown)[0]
        raise LpesError(f"{path}: unknown field {name!r}{_hint(name, ('task', *_TASK_FILE_FIELDS))}")
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
    """Every field of a resolved task is valid and within bounds; the message names the field."""
    for f in fields(TaskConfig):
        value = getattr(config, f.name)
        if f.name in ("num_pairs", "examples_per_index", "seed", "length", "answer_tokens") and value is not None:
            if isinstance(value, bool) or not isinstance(value, int):
                raise LpesError(f"{where}: '{f.name}' must be an integer, got {value!r}")
    _check_range(where, "num_pairs", "pairs", config.num_pairs, 2, _max_pairs(config.task))
    if config.examples_per_index is None:
        if config.file is None:
            raise LpesError(f"{where}: 'examples_per_index' (examples) must be given")
    else:
        _check_range(where, "examples_per_index", "examples", config.examples_per_index, 1, MAX_EXAMPLES_PER_INDEX)
    if config.seed < 0:
        raise LpesError(f"{where}: 'seed' must be >= 0, got {config.seed}")
    if config.answer_tokens is not None:
        _check_range(where, "answer_tokens", "answer_tokens", config.answer_tokens, 1, MAX_ANSWER_TOKENS)
    if config.keys not in kv_data.KEY_KINDS:
        raise LpesError(f"{where}: 'keys' is {str(config.keys)[:40]!r}{_hint(str(config.keys), kv_data.KEY_KINDS)}")
    if config.keys != "uuid" and (config.task != "kv" or config.file is not None):
        raise LpesError(f"{where}: 'keys' applies to generated kv data only")
    gold = config.resolved_gold_indices()
    if not gold:
        raise LpesError(f"{where}: 'gold_indices' (gold) must name at least one index")
    for index in gold:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < config.num_pairs:
            last = config.num_pairs - 1
            raise LpesError(f"{where}: 'gold_indices' (gold) entry {index!r} is outside 0..{last}")
    if len(set(gold)) != len(gold):
        twice = next(i for i in gold if gold.count(i) > 1)
        raise LpesError(f"{where}: 'gold_indices' (gold) lists {twice} twice")
    if config.task in BUNDLED_TASKS:
        least = _bundled_task(config.task).min_length(config.num_pairs)
        if config.length is None or config.length < least:
            raise LpesError(f"{where}: 'length' must be at least {least} for {config.num_pairs} pairs, "
                            f"got {config.length}")
        _check_range(where, "length", "length", config.length, least, MAX_LENGTH)
    _check_total_size(config, len(gold), where)


def _max_pairs(task: str) -> int:
    if task in BUNDLED_TASKS:
        return _bundled_task(task).NUM_KEYS  # a bundled model's vocabulary has 64 keys
    return MAX_PAIRS


def _bundled_task(task: str):
    """The module of a bundled model's task, imported only when that task is used."""
    return importlib.import_module(f"lpes.validation.{BUNDLED_TASKS[task]}")


def _check_range(where: str, name: str, short: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        label = f"'{name}'" if name == short else f"'{name}' ({short})"
        raise LpesError(f"{where}: {label} must be in {low}..{high}, got {value}")


def _check_total_size(config: TaskConfig, num_gold: int, where: str) -> None:
    """Refuse a description whose prompts would not fit in memory (a file is as large as it is)."""
    if config.file is not None:
        return
    if config.task in BUNDLED_TASKS:
        per_prompt = _TINY_BYTES_PER_POSITION * config.length
    else:
        per_prompt = _KV_BYTES_PER_PAIR * config.num_pairs
    total = per_prompt * config.examples_per_index * num_gold
    if total > MAX_PROMPT_BYTES:
        raise LpesError(f"{where}: {config.examples_per_index} examples x {num_gold} gold indices of this size make "
                        f"about {format_bytes(total)} of prompts (at most {format_bytes(MAX_PROMPT_BYTES)}); "
                        "ask for fewer examples, pairs or positions")
