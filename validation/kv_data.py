"""The "lost in the middle" key-value retrieval task (Liu et al. 2023; docs/method.md, section 4).

One record of the benchmark's JSONL files (`kv-retrieval-75_keys.jsonl.gz` ...)::

    {"ordered_kv_records": [["<uuid4>", "<uuid4>"], ...], "key": "<uuid4>", "value": "<uuid4>"}

The benchmark draws the gold pair at a random position when it writes a file,
then, per evaluated gold index, pops the gold pair and inserts it at that index
(`get_kv_responses_from_*.py`), so the same records are scored at every gold
index. `KvRecord.with_gold_at` does the same pop/insert; `make_examples` scores
every record at every requested gold index.

The prompt is the benchmark's `prompts/kv_retrieval.prompt` filled in by its
`get_kv_retrieval_prompt`: the JSON object written one pair per line,
``{"k1": "v1",\\n "k2": "v2"}``. Instruction-tuned models get the prompt as
the user turn of their chat template (the benchmark did the same for its chat
models), unless `use_chat_template=False`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import uuid
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lpes.foundation.errors import LpesError
from lpes.foundation.files import write_bytes_atomic
from lpes.validation.examples import Example

PROMPT_TEMPLATE = (
    "Extract the value corresponding to the specified key in the JSON object below.\n"
    "\n"
    "JSON data:\n"
    "{formatted_kv_records}\n"
    "\n"
    'Key: "{key}"\n'
    "Corresponding value:"
)

# lost-in-the-middle's scripts generate up to 100 tokens per answer (`--max-new-tokens 100`).
BENCHMARK_ANSWER_TOKENS = 100
# What keys and values are: the benchmark's UUID4 strings, or 6-digit decimal numbers, which
# models of 100-300M parameters can copy (they lose track inside UUIDs' 30-odd tokens).
KEY_KINDS = ("uuid", "number")

# The gold indices the paper reports for its three context sizes.
PAPER_GOLD_INDICES = {
    75: [0, 24, 49, 74],
    140: [0, 34, 69, 104, 139],
    300: [0, 49, 99, 149, 199, 249, 299],
}


@dataclass(frozen=True)
class KvRecord:
    """One benchmark record: the pairs in context order, and the gold pair."""

    ordered_kv_records: tuple[tuple[str, str], ...]
    key: str
    value: str

    @property
    def num_pairs(self) -> int:
        return len(self.ordered_kv_records)

    @property
    def gold_index(self) -> int:
        return self.ordered_kv_records.index((self.key, self.value))

    def with_gold_at(self, index: int) -> KvRecord:
        """The same record with the gold pair moved to `index` (the benchmark's pop + insert)."""
        if not 0 <= index < self.num_pairs:
            raise LpesError(f"gold index {index} is outside 0..{self.num_pairs - 1} ({self.num_pairs} pairs)")
        pairs = list(self.ordered_kv_records)
        gold = pairs.pop(self.gold_index)
        pairs.insert(index, gold)
        return KvRecord(tuple(pairs), self.key, self.value)

    def to_json(self) -> dict[str, Any]:
        # Key order and list-of-lists pairs as the benchmark's writer emits them.
        return {
            "ordered_kv_records": [list(pair) for pair in self.ordered_kv_records],
            "key": self.key,
            "value": self.value,
        }


def random_uuid4(rng: random.Random) -> str:
    """A UUID4 string drawn from `rng` (uuid.uuid4() reads the OS entropy and cannot be seeded)."""
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def random_number(rng: random.Random) -> str:
    """A 6-digit decimal number (no leading zero) drawn from `rng`."""
    return str(rng.randrange(100_000, 1_000_000))


def generate_records(num_pairs: int, num_records: int, seed: int, keys: str = "uuid") -> list[KvRecord]:
    """Records like the benchmark's `make_kv_retrieval_data.py`, deterministic for `seed`.

    Keys are distinct; the gold pair sits at a random position (move it with `with_gold_at`).
    `keys` (KEY_KINDS) says what keys and values are drawn as: UUID4s (the benchmark's) or numbers.
    """
    if keys not in KEY_KINDS:
        raise LpesError(f"kv data: 'keys' must be one of {', '.join(KEY_KINDS)}, got {keys!r}")
    draw = random_uuid4 if keys == "uuid" else random_number
    if num_pairs < 2:
        raise LpesError(f"kv data: 'pairs' must be at least 2, got {num_pairs}")
    if num_records < 1:
        raise LpesError(f"kv data: 'examples' must be at least 1, got {num_records}")
    rng = random.Random(seed)
    records = []
    for _ in range(num_records):
        pairs: dict[str, str] = {}
        while len(pairs) != num_pairs:
            pairs[draw(rng)] = draw(rng)
        ordered = tuple(pairs.items())
        key, value = ordered[rng.randrange(num_pairs)]
        records.append(KvRecord(ordered, key, value))
    return records


def format_kv_records(pairs: Sequence[tuple[str, str]]) -> str:
    """The JSON object, one pair per line, exactly as the benchmark's `get_kv_retrieval_prompt` writes it."""
    lines = [f'"{key}": "{value}"' for key, value in pairs]
    return "{" + ",\n ".join(lines) + "}"


def kv_prompt(record: KvRecord) -> str:
    """The benchmark's prompt for `record`, with its pairs in their current order."""
    formatted = format_kv_records(record.ordered_kv_records)
    return PROMPT_TEMPLATE.format(formatted_kv_records=formatted, key=record.key)


def wrap_chat(prompt: str, tokenizer) -> str:
    """`prompt` as the user turn of the tokenizer's chat template, ready for the assistant's answer."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )


def has_chat_template(tokenizer) -> bool:
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


def make_examples(
    records: Sequence[KvRecord],
    gold_indices: Sequence[int],
    tokenizer=None,
    use_chat_template: bool = True,
    answer_tokens: int | None = BENCHMARK_ANSWER_TOKENS,
) -> list[Example]:
    """Every record at every gold index (grouped by gold index, records in order), each answered
    within `answer_tokens` tokens (None: exactly the value's own tokens)."""
    chat = use_chat_template and has_chat_template(tokenizer)
    examples = []
    for gold_index in gold_indices:
        for record in records:
            moved = record.with_gold_at(gold_index)
            prompt = kv_prompt(moved)
            if chat:
                prompt = wrap_chat(prompt, tokenizer)
            examples.append(Example(prompt, moved.value, gold_index, moved.num_pairs, answer_tokens))
    return examples


def default_gold_indices(num_pairs: int) -> list[int]:
    """The paper's gold indices for 75/140/300 pairs; otherwise 5 evenly spaced, both ends included."""
    if num_pairs in PAPER_GOLD_INDICES:
        return list(PAPER_GOLD_INDICES[num_pairs])
    count = min(5, num_pairs)
    return sorted({round(i * (num_pairs - 1) / (count - 1)) for i in range(count)})


def record_digest(record: KvRecord) -> str:
    """SHA-256 of the record as the benchmark writes it: the same record has it in every file."""
    return hashlib.sha256(json.dumps(record.to_json()).encode("utf-8")).hexdigest()


def split_records(records: Sequence[KvRecord]) -> tuple[list[int], list[int]]:
    """(calibration, held-out) indices of `records`, in file order; the two never share a record.

    Distinct records are ranked by `record_digest`: even ranks calibrate the search, odd
    ranks are held out. The rule reads only the records themselves, not their order or how
    many are asked for, so every command that reads the same file draws the same two halves,
    and copies of one record always fall on the same side.
    """
    digests = [record_digest(record) for record in records]
    rank = {digest: i for i, digest in enumerate(sorted(set(digests)))}
    calibration = [i for i, digest in enumerate(digests) if rank[digest] % 2 == 0]
    held_out = [i for i, digest in enumerate(digests) if rank[digest] % 2 == 1]
    return calibration, held_out


def read_jsonl(path: str | os.PathLike) -> list[KvRecord]:
    """Read a benchmark file (.jsonl or .jsonl.gz); every error names the line and field."""
    path = Path(path)
    if not path.is_file():
        raise LpesError(f"kv data file not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    records = []
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    records.append(_parse_record(line, f"{path}:{number}"))
    except (OSError, UnicodeDecodeError) as err:
        raise LpesError(f"cannot read kv data file {path}: {err}") from None
    except (EOFError, zlib.error) as err:  # a gzip file cut short, or corrupt inside
        raise LpesError(f"kv data file {path} is truncated or corrupt ({str(err).splitlines()[0][:80]})") from None
    if not records:
        raise LpesError(f"kv data file {path} holds no records")
    return records


def write_jsonl(records: Iterable[KvRecord], path: str | os.PathLike) -> None:
    """Write records in the benchmark's format (gzip when the name ends in .gz), atomically."""
    path = Path(path)
    text = "".join(json.dumps(record.to_json()) + "\n" for record in records)
    data = text.encode("utf-8")
    if path.suffix == ".gz":
        data = gzip.compress(data, mtime=0)  # mtime=0: the same records give the same bytes
    write_bytes_atomic(path, data)


def _parse_record(line: str, where: str) -> KvRecord:
    try:
        data = json.loads(line)
    except ValueError as err:  # JSONDecodeError, and integers of over 4300 digits
        raise LpesError(f"{where}: not valid JSON ({str(err)[:100]})") from None
    except RecursionError:
        raise LpesError(f"{where}: not a record (nested too deeply)") from None
    if not isinstance(data, dict):
        raise LpesError(f"{where}: a record must be a JSON object")
    for name in ("ordered_kv_records", "key", "value"):
        if name not in data:
            raise LpesError(f"{where}: missing '{name}'")
    pairs = data["ordered_kv_records"]
    if not isinstance(pairs, list) or len(pairs) < 2:
        raise LpesError(f"{where}: 'ordered_kv_records' must be a list of at least 2 [key, value] pairs")
    for i, pair in enumerate(pairs):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(s, str) for s in pair)):
            raise LpesError(f"{where}: 'ordered_kv_records[{i}]' must be a [key, value] pair of strings")
    key, value = data["key"], data["value"]
    if not isinstance(key, str) or not isinstance(value, str):
        raise LpesError(f"{where}: 'key' and 'value' must be strings")
    ordered = tuple((k, v) for k, v in pairs)
    if (key, value) not in ordered:
        raise LpesError(f"{where}: the pair ['key', 'value'] is not in 'ordered_kv_records'")
    if len({k for k, _ in ordered}) != len(ordered):
        raise LpesError(f"{where}: 'ordered_kv_records' has duplicate keys")
    return KvRecord(ordered, key, value)
