"""The key-value retrieval data (kv_data) and the task descriptions that select it (tasks)."""

from __future__ import annotations

import gzip
import json
import uuid
from pathlib import Path

import pytest
from conftest import tiny_tokenizer

from lpes.foundation.errors import LpesError
from lpes.validation import kv_data, tasks, tiny_kv
from lpes.validation.kv_data import KvRecord


def benchmark_file(path: Path, num_keys: int, num_examples: int) -> None:
    """A file as the benchmark's make_kv_retrieval_data.py writes it (OS-random UUIDs, its own json.dumps)."""
    import random

    with open(path, "w") as fout:
        for _ in range(num_examples):
            kv_records = {}
            while len(kv_records) != num_keys:
                kv_records[str(uuid.uuid4())] = str(uuid.uuid4())
            ordered_kv_records = list(kv_records.items())
            key, value = random.choice(ordered_kv_records)
            example = {"ordered_kv_records": ordered_kv_records, "key": key, "value": value}
            fout.write(json.dumps(example) + "\n")


def test_benchmark_file_round_trips_byte_for_byte(tmp_path):
    original = tmp_path / "kv-retrieval-5_keys.jsonl"
    benchmark_file(original, num_keys=5, num_examples=4)
    records = kv_data.read_jsonl(original)
    copy = tmp_path / "copy.jsonl"
    kv_data.write_jsonl(records, copy)
    assert copy.read_bytes() == original.read_bytes()


def test_gzipped_benchmark_file_reads_the_same_records(tmp_path):
    plain = tmp_path / "kv.jsonl"
    benchmark_file(plain, num_keys=3, num_examples=2)
    packed = tmp_path / "kv.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert kv_data.read_jsonl(packed) == kv_data.read_jsonl(plain)
    rewritten = tmp_path / "again.jsonl.gz"
    kv_data.write_jsonl(kv_data.read_jsonl(packed), rewritten)
    assert gzip.decompress(rewritten.read_bytes()) == plain.read_bytes()


def test_generated_records_are_written_in_the_benchmark_format(tmp_path):
    records = kv_data.generate_records(num_pairs=4, num_records=3, seed=0)
    path = tmp_path / "gen.jsonl"
    kv_data.write_jsonl(records, path)
    lines = path.read_text().splitlines()
    for line, record in zip(lines, records, strict=True):
        data = json.loads(line)
        assert list(data) == ["ordered_kv_records", "key", "value"]
        assert line == json.dumps(
            {"ordered_kv_records": [list(p) for p in record.ordered_kv_records], "key": record.key,
             "value": record.value}
        )
    assert kv_data.read_jsonl(path) == records


def test_prompt_matches_the_benchmark_test():
    # The expected text is the benchmark's own tests/test_prompting.py::test_get_kv_retrieval_prompt.
    record = KvRecord((("test key1", "test value1"), ("test key2", "test value2"), ("test key3", "test value3")),
                      "test key2", "test value2")
    gold = "\n".join(
        [
            "Extract the value corresponding to the specified key in the JSON object below.",
            "",
            "JSON data:",
            '{"test key1": "test value1",',
            ' "test key2": "test value2",',
            ' "test key3": "test value3"}',
            "",
            'Key: "test key2"',
            "Corresponding value:",
        ]
    )
    assert kv_data.kv_prompt(record) == gold


def _json_object(prompt: str) -> list[tuple[str, str]]:
    start, end = prompt.index("{"), prompt.index("}") + 1
    return list(json.loads(prompt[start:end]).items())


@pytest.mark.parametrize("num_pairs", [2, 7])
def test_gold_pair_sits_at_exactly_the_requested_index(num_pairs):
    records = kv_data.generate_records(num_pairs, num_records=3, seed=1)
    gold_indices = list(range(num_pairs))
    examples = kv_data.make_examples(records, gold_indices)
    assert len(examples) == num_pairs * len(records)
    for n, example in enumerate(examples):
        record = records[n % len(records)]
        pairs = _json_object(example.prompt)
        assert pairs[example.gold_index] == (record.key, record.value)
        assert example.gold_index == gold_indices[n // len(records)]
        assert example.answer == record.value and example.num_pairs == num_pairs
        assert example.prompt.endswith(f'Key: "{record.key}"\nCorresponding value:')
        # The other pairs keep their order, as the benchmark's pop + insert does.
        others = [p for p in record.ordered_kv_records if p[0] != record.key]
        assert [p for p in pairs if p[0] != record.key] == others


def test_records_are_deterministic_uuid4_with_distinct_keys():
    a = kv_data.generate_records(20, 5, seed=3)
    assert a == kv_data.generate_records(20, 5, seed=3)
    assert a != kv_data.generate_records(20, 5, seed=4)
    for record in a:
        keys = [k for k, _ in record.ordered_kv_records]
        assert len(set(keys)) == len(keys)
        for text in (*keys, *(v for _, v in record.ordered_kv_records)):
            assert str(uuid.UUID(text)) == text and uuid.UUID(text).version == 4
    assert len({r.gold_index for r in kv_data.generate_records(20, 40, seed=0)}) > 5  # gold drawn at random


def test_chat_template_wraps_the_prompt_unless_disabled():
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}" \
        "{% if add_generation_prompt %}<assistant>\n{% endif %}"
    records = kv_data.generate_records(3, 1, seed=0)
    plain = kv_data.make_examples(records, [1], tokenizer, use_chat_template=False)[0].prompt
    chat = kv_data.make_examples(records, [1], tokenizer)[0].prompt
    assert plain == kv_data.kv_prompt(records[0].with_gold_at(1))
    assert chat == f"<user>{plain}</user><assistant>\n"
    tokenizer.chat_template = None
    assert kv_data.make_examples(records, [1], tokenizer)[0].prompt == plain


@pytest.mark.parametrize(
    "line, field",
    [
        ('{"key": "a", "value": "b"}', "ordered_kv_records"),
        ('{"ordered_kv_records": [["a", "b"], ["c", "d"]], "key": "a", "value": "x"}', "not in"),
        ('{"ordered_kv_records": [["a", "b"], ["a", "d"]], "key": "a", "value": "b"}', "duplicate"),
        ('{"ordered_kv_records": [["a", "b"], ["c"]], "key": "a", "value": "b"}', "ordered_kv_records[1]"),
        ("not json", "not valid JSON"),
    ],
)
def test_bad_records_name_line_and_field(tmp_path, line, field):
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(LpesError, match=f"bad.jsonl:1: .*{field}".replace("[", r"\[").replace("]", r"\]")):
        kv_data.read_jsonl(path)


def test_default_gold_indices():
    assert kv_data.default_gold_indices(75) == [0, 24, 49, 74]
    assert kv_data.default_gold_indices(140) == [0, 34, 69, 104, 139]
    assert kv_data.default_gold_indices(9) == [0, 2, 4, 6, 8]
    assert kv_data.default_gold_indices(3) == [0, 1, 2]


# ---- tasks ----


def test_description_selects_generated_kv_examples():
    examples = tasks.load_examples(None, "kv:pairs=10,examples=3,gold=0+5+9,seed=2")
    assert [e.gold_index for e in examples] == [0] * 3 + [5] * 3 + [9] * 3
    assert {e.num_pairs for e in examples} == {10}
    expected = kv_data.make_examples(kv_data.generate_records(10, 3, seed=2 * 2 + 1), [0, 5, 9])
    assert examples == expected


def test_search_and_validation_splits_differ():
    search = tasks.load_examples(None, "kv:pairs=4,examples=3,gold=1", split="search")
    validation = tasks.load_examples(None, "kv:pairs=4,examples=3,gold=1")
    assert not {e.prompt for e in search} & {e.prompt for e in validation}


def test_file_description_uses_the_benchmark_records(tmp_path):
    path = tmp_path / "kv.jsonl"
    benchmark_file(path, num_keys=6, num_examples=4)
    records = kv_data.read_jsonl(path)
    held_out = [records[i] for i in kv_data.split_records(records)[1]]  # validation reads the held-out half
    examples = tasks.load_examples(None, str(path))
    assert examples == kv_data.make_examples(held_out, kv_data.default_gold_indices(6))
    two = tasks.load_examples(None, f"kv:file={path},examples=2,gold=3")
    assert two == kv_data.make_examples(held_out[:2], [3])


def test_model_folder_task_file_selects_tiny_kv(tmp_path):
    (tmp_path / "lpes_task.json").write_text(
        json.dumps({"task": "tiny-kv", "num_pairs": 6, "length": 40, "gold_indices": [0, 5]})
    )
    examples = tasks.load_examples(tmp_path, None)
    assert examples == tiny_kv.make_examples(6, 40, [0, 5], 20, 1)
    # A description of the same task overrides only the fields it names.
    fewer = tasks.load_examples(tmp_path, "tiny-kv:examples=2")
    assert fewer == tiny_kv.make_examples(6, 40, [0, 5], 2, 1)


def test_without_task_file_the_kv_benchmark_defaults_apply(tmp_path):
    config = tasks.task_config(tmp_path, None)
    assert (config.task, config.num_pairs, config.resolved_gold_indices()) == ("kv", 75, (0, 24, 49, 74))


@pytest.mark.parametrize(
    "data, message",
    [
        ("kv:pairs=ten", "'pairs' must be an integer"),
        ("kv:colour=3", "unknown field 'colour'"),
        ("kv:pairs=10,gold=0+10", "'gold_indices' .* 10 is outside 0..9"),
        ("kv:pairs=1", "'num_pairs'"),
        ("kv:examples=0", "'examples_per_index'"),
        ("kv:length=5", "unknown field 'length'"),
        ("nope:pairs=3", "unknown task 'nope'"),
        ("tiny-kv:pairs=10,length=8", "'length'"),
        ("kv:pairs", "field=value"),
        ("missing.jsonl", "neither"),
    ],
)
def test_bad_descriptions_name_the_field(data, message):
    with pytest.raises(LpesError, match=message):
        tasks.load_examples(None, data)
