"""Data descriptions (validation/tasks.py): held-out records never calibrate, lists paste into bash, sane bounds.

REAL holds the first 12 records of the benchmark's own kv-retrieval-75_keys.jsonl.gz
(nelson-liu/lost-in-the-middle, MIT; tests/data/NOTICE).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lpes.foundation.errors import LpesError
from lpes.validation import kv_data, tasks, tiny_kv, vocabulary

REAL = Path(__file__).parent / "data" / "kv-retrieval-75_keys.first12.jsonl.gz"


def values(examples) -> set[str]:
    """The records behind examples: a record's gold value is a UUID of its own."""
    return {e.answer for e in examples}


def load(data: str, split: str) -> list:
    return tasks.load_examples(None, data, use_chat_template=False, split=split)


def test_the_excerpt_reads_and_writes_back_byte_for_byte(tmp_path):
    records = kv_data.read_jsonl(REAL)
    assert len(records) == 12 and {r.num_pairs for r in records} == {75}
    assert REAL.stat().st_size < 200_000
    kv_data.write_jsonl(records, tmp_path / "copy.jsonl")
    assert (tmp_path / "copy.jsonl").read_bytes() == gzip.decompress(REAL.read_bytes())


def test_calibration_and_held_out_never_share_a_record_of_a_benchmark_file():
    calibration, held_out = load(str(REAL), "search"), load(str(REAL), "validation")
    all_values = {r.value for r in kv_data.read_jsonl(REAL)}
    assert values(calibration) and values(held_out)
    assert not values(calibration) & values(held_out)
    assert values(calibration) | values(held_out) == all_values  # nothing is lost either
    assert len(values(calibration)) == len(values(held_out)) == 6
    # lpes-validate and lpes-convert read the default split: the held-out half, never the calibration one.
    assert tasks.load_examples(None, str(REAL), use_chat_template=False) == held_out
    assert not values(load(f"kv:file={REAL},gold=0+74", "validation")) & values(calibration)


def test_the_split_is_the_same_in_another_process_and_in_any_record_order(tmp_path):
    """Another interpreter (another PYTHONHASHSEED: no dependence on hash()) and the records reversed give the
    halves this process gives."""
    records = kv_data.read_jsonl(REAL)
    reversed_file = tmp_path / "reversed.jsonl"
    kv_data.write_jsonl(records[::-1], reversed_file)
    code = ("import json, sys; from lpes.validation import tasks; print(json.dumps({s: sorted(e.answer for e in "
            "tasks.load_examples(None, sys.argv[1], use_chat_template=False, split=s)) for s in tasks.SPLITS}))")
    other = subprocess.run([sys.executable, "-c", code, str(REAL)], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "12345"})
    elsewhere = json.loads(other.stdout)
    for split in tasks.SPLITS:
        assert set(elsewhere[split]) == values(load(str(REAL), split))
        assert values(load(str(reversed_file), split)) == values(load(str(REAL), split))


def test_copies_of_a_record_stay_on_one_side(tmp_path):
    records = kv_data.read_jsonl(REAL)
    path = tmp_path / "dup.jsonl"
    kv_data.write_jsonl([records[0], records[1], records[2], records[0]], path)
    calibration, held_out = kv_data.split_records(kv_data.read_jsonl(path))
    assert (0 in calibration) == (3 in calibration) and (0 in held_out) == (3 in held_out)
    assert not set(calibration) & set(held_out)


def test_a_file_with_one_record_cannot_be_split(tmp_path):
    path = tmp_path / "one.jsonl"
    kv_data.write_jsonl(kv_data.read_jsonl(REAL)[:1], path)
    with pytest.raises(LpesError, match="calibration and held-out need one each"):
        load(str(path), "validation")


def test_examples_takes_the_first_records_of_a_half_and_says_when_it_caps(capsys):
    calibration = kv_data.split_records(kv_data.read_jsonl(REAL))[0]
    records = kv_data.read_jsonl(REAL)
    two = load(f"kv:file={REAL},examples=2,gold=3", "search")
    assert two == kv_data.make_examples([records[i] for i in calibration[:2]], [3])
    assert capsys.readouterr().err == ""
    capped = load(f"kv:file={REAL},examples=100,gold=3", "search")
    assert len(capped) == 6
    note = capsys.readouterr().err.strip().splitlines()
    assert len(note) == 1 and "asks for 100 records" in note[0] and "holds 6 (of 12): using 6" in note[0]


def test_split_provenance_names_the_records_of_each_half():
    config = tasks.task_config(None, str(REAL))
    calibration = tasks.split_provenance(config, "search")
    held_out = tasks.split_provenance(config, "validation", used=2)
    assert calibration["source"] == held_out["source"] == f"split of {REAL.name}"
    assert calibration["records"] == kv_data.split_records(kv_data.read_jsonl(REAL))[0]
    assert held_out["records"] == kv_data.split_records(kv_data.read_jsonl(REAL))[1][:2]
    assert "/" not in json.dumps(held_out)  # the file's name only, not the machine's path
    generated = tasks.task_config(None, "kv:pairs=4,examples=2,seed=3")
    assert "seed 6" in tasks.split_provenance(generated, "search")["source"]
    assert "seed 7" in tasks.split_provenance(generated, "validation")["source"]


# ---- lists that paste into bash ----


def test_plus_joins_a_list_and_bash_leaves_it_alone():
    described = "kv:pairs=10,examples=2,gold=0+5+9"
    echoed = subprocess.run(["bash", "-c", f"printf '%s' {described}"], capture_output=True, text=True, check=True)
    assert echoed.stdout == described  # unquoted, as pasted from --help
    assert tasks.task_config(None, described).gold_indices == (0, 5, 9)
    with pytest.raises(LpesError, match="gold"):  # '|' is not a separator: bash would read it as a pipe
        tasks.task_config(None, "kv:pairs=10,examples=2,gold=0|5|9")


# ---- typos and absurd sizes: one line, before anything is built ----


@pytest.mark.parametrize("data, message", [
    ("kv:pair=75", r"unknown field 'pair' for kv \(did you mean 'pairs'\?"),
    ("kv:exampels=3", "did you mean 'examples'"),
    ("tiny-kv:lenght=64", "did you mean 'length'"),
    ("tinykv:examples=2", r"unknown task 'tinykv' \(did you mean 'tiny-kv'\?"),
    (f"kv:pairs={10**9}", r"'num_pairs' \(pairs\) must be in 2..10000"),
    (f"kv:examples={10**12}", r"'examples_per_index' \(examples\) must be in 1..100000"),
    (f"tiny-kv:pairs={10**9}", r"\(pairs\) must be in 2..64"),
    (f"tiny-kv:length={10**9}", "'length' must be in 18..1048576"),
    ("kv:pairs=10000,examples=100000,gold=0", "GiB of prompts"),
    ("tiny-kv:gold=0+4+0", "lists 0 twice"),
    ("kv:gold=0+x", "'gold' must be an integer, got 'x'"),
    (f"kv:seed={'9' * 5000}", "'seed' must be an integer"),
])
def test_bad_descriptions_are_refused_in_one_line(data, message):
    with pytest.raises(LpesError, match=message) as err:
        tasks.task_config(None, data)
    assert "\n" not in str(err.value)


def test_task_file_typo_is_named_with_a_hint(tmp_path):
    (tmp_path / "lpes_task.json").write_text(json.dumps({"task": "tiny-kv", "gold_indice": [0]}))
    with pytest.raises(LpesError, match=r"unknown field 'gold_indice' \(did you mean 'gold_indices'\?"):
        tasks.load_examples(tmp_path, None)


# ---- words the model cannot tokenize ----


def test_check_vocabulary_names_the_first_unknown_word():
    tokenizer = tiny_kv.build_tokenizer()
    vocabulary.check_vocabulary(tokenizer, ["p3_1 f2 q3", "a5"], "--data")  # the task's own words pass
    with pytest.raises(LpesError, match=r"^the prompt: the word 'capital' is not in the model's vocabulary"):
        vocabulary.check_vocabulary(tokenizer, ["p3_1 f2 q3", "p3_1 capital France"], "the prompt")


def test_a_file_description_ending_in_jsonl_gz_is_a_description_and_published_without_its_path():
    config = tasks.task_config(None, f"kv:file={REAL}")  # ends in .jsonl.gz, yet not a path of its own
    assert (config.file, config.num_pairs) == (str(REAL), 75)
    assert tasks.portable_description(f"kv:file={REAL},gold=0+74") == f"kv:file={REAL.name},gold=0+74"
    assert tasks.portable_description(str(REAL)) == REAL.name
    assert tasks.portable_description("tiny-kv:examples=8") == "tiny-kv:examples=8"
