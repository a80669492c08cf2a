"""Greedy scoring (a) and teacher-forced scoring (b) against an independent greedy loop."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import EOS_ID, plain_greedy, tiny_model_dir, tiny_tokenizer
from transformers import AutoModelForCausalLM

from lpes.converter.loading import resolve_model
from lpes.converter.reference import apply
from lpes.exporters.runners import prefill_chunk, torch_left_pad
from lpes.foundation.spec import Spec
from lpes.validation import kv_data, scoring, shared_greedy, tiny_kv
from lpes.validation.examples import Example

torch.set_num_threads(1)


# tiny_kv's word-level tokenizer: every word is one token and decodes back to itself, no unknown token.
WORDS = tiny_kv.vocabulary()[2:]  # all but <pad> <bos>


def load_model(folder):
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    model.generation_config.eos_token_id = None  # tiny_kv has no end token
    return model


@pytest.fixture(scope="module")
def model_and_tokenizer(tmp_path_factory):
    tokenizer = tiny_kv.build_tokenizer()
    folder = tiny_model_dir("llama", tmp_path_factory.mktemp("scoring"), vocab_size=len(tokenizer))
    return load_model(folder), tokenizer


def random_prompts(count: int, seed: int, lo: int = 5, hi: int = 40) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randrange(lo, hi))) for _ in range(count)]


def constructed_examples(model, tokenizer, prompts, steps=3):
    """For each prompt: the model's own greedy answer (correct), and two near misses (wrong)."""
    examples, expected = [], []
    for n, prompt in enumerate(prompts):
        greedy = plain_greedy(model, scoring.encode_prompt(tokenizer, prompt), steps)
        if min(greedy) < 2:
            continue  # <pad> <bos>: not words an answer can hold
        words = tokenizer.convert_ids_to_tokens(greedy)
        other = [WORDS[(WORDS.index(w) + 1) % len(WORDS)] for w in words]
        for answer, correct in (
            (words, True),
            (words[:-1] + other[-1:], False),  # right until the last token: every token must match
            (other[:1] + words[1:], False),
        ):
            examples.append(Example(prompt, " ".join(answer), gold_index=n % 3, num_pairs=3))
            expected.append(correct)
    return examples, expected


@pytest.mark.parametrize("scales", [None, [4.0, 1.0, 0.5]])
def test_both_scorers_match_an_independent_greedy_loop(model_and_tokenizer, scales):
    model, tokenizer = model_and_tokenizer
    if scales is not None:  # the LPES reference, where correct positions matter most
        model = apply(load_model(model.name_or_path), Spec.from_scales(scales))
    examples, expected = constructed_examples(model, tokenizer, random_prompts(8, seed=1))
    assert len(examples) >= 18
    greedy = scoring.greedy_correct(model, tokenizer, examples, batch_size=5)
    forced = scoring.teacher_forced_correct(model, tokenizer, examples, batch_size=5)
    assert [r.correct for r in greedy.results] == expected
    assert [r.correct for r in forced.results] == expected
    for example, g, f in zip(examples, greedy.results, forced.results, strict=True):
        assert g.gold_index == f.gold_index == example.gold_index
        if f.correct:
            assert f.generated == g.generated == example.answer


def test_padded_batches_equal_one_example_at_a_time(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    prompts = random_prompts(6, seed=2, lo=3, hi=60)  # very different lengths: heavy left padding
    examples = [Example(p, "f5 f6 f7", 0, 1) for p in prompts]
    for scorer in (scoring.teacher_forced_correct, scoring.greedy_correct):
        alone = scorer(model, tokenizer, examples, batch_size=1)
        batched = scorer(model, tokenizer, examples, batch_size=6)
        assert [r.generated for r in batched.results] == [r.generated for r in alone.results]
    # RoPE scores depend on position differences only, so shifted positions would hardly change the
    # logits above; check directly that every row's real tokens get positions 0, 1, 2, ...
    seen = []
    def capture(module, args, kwargs, output):
        seen.append((args[1] if len(args) > 1 else kwargs["position_ids"]).clone())

    hook = model.model.rotary_emb.register_forward_hook(capture, with_kwargs=True)
    scoring.teacher_forced_correct(model, tokenizer, examples, batch_size=6)
    hook.remove()
    lengths = [len(e.prompt_ids) + len(e.answer_ids) - 1 for e in scoring.encode_examples(tokenizer, examples)]
    (positions,) = seen
    real = sorted((row[-n:].tolist() for row, n in zip(positions, sorted(lengths, reverse=True))), key=len)
    assert real == [list(range(n)) for n in sorted(lengths)]
    # The logits themselves, at every answer position, through the same left padding the scorer uses.
    encoded = scoring.encode_examples(tokenizer, examples)
    rows = [e.prompt_ids + e.answer_ids[:-1] for e in encoded]
    ids, mask, positions = torch_left_pad(rows, pad_id=0)
    with torch.no_grad():
        batched_logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        for b, row in enumerate(rows):
            single = model(input_ids=torch.tensor([row])).logits[0]
            torch.testing.assert_close(batched_logits[b, -len(row) :], single, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("scales", [None, [4.0, 1.0, 0.5]])
def test_a_chunked_prefill_generates_what_one_example_at_a_time_does(model_and_tokenizer, scales):
    """The held-out decision prefills in sequence chunks (TorchGreedy's prefill_tokens): across heavy left
    padding and the LPES reference, each row's tokens are the independent greedy loop's, one prompt alone."""
    model, tokenizer = model_and_tokenizer
    if scales is not None:
        model = apply(load_model(model.name_or_path), Spec.from_scales(scales))
    prompts = random_prompts(7, seed=5, lo=3, hi=70)
    examples = [Example(p, "f5 f6 f7 f8 f9", 0, 1) for p in prompts]
    encoded = scoring.encode_examples(tokenizer, examples)
    steps = len(encoded[0].answer_ids)
    chunked = scoring.TorchGreedy(model, 0, prefill_tokens=7 * 40)  # chunks of 40 positions, 2 or 3 per prompt
    assert prefill_chunk(7 * 40, 7, max(len(e.prompt_ids) for e in encoded)) == 40
    out = chunked.greedy([e.prompt_ids for e in encoded], steps, None)
    assert out == [plain_greedy(model, e.prompt_ids, steps) for e in encoded]
    scores = scoring.greedy_correct(model, tokenizer, examples, batch_size=7, prefill_tokens=7 * 40)
    alone = scoring.greedy_correct(model, tokenizer, examples, batch_size=1)
    assert [r.generated for r in scores.results] == [r.generated for r in alone.results]


def test_left_pad_positions_count_real_tokens_only():
    ids, mask, positions = torch_left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert positions.tolist() == [[0, 1, 2], [1, 1, 0]]  # padded slots as transformers' generate has them


def test_batches_are_bounded_by_tokens_not_only_by_examples():
    lengths = [5000, 5600, 300, 200, 6000, 250]
    batches = scoring._batches(lengths, batch_size=8, max_tokens=8192)
    assert sorted(i for b in batches for i in b) == list(range(6))
    for batch in batches:  # each batch's padded size stays within the budget, or is one example
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= 8192
    assert [len(b) for b in batches] == [1, 1, 1, 3]
    assert scoring._batches(lengths, batch_size=2, max_tokens=10**9) == [[4, 1], [0, 2], [5, 3]]


def test_forward_token_count(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    examples = [Example(p, "f5 f6", 0, 1) for p in random_prompts(4, seed=3)]
    lengths = [len(scoring.encode_prompt(tokenizer, e.prompt)) + 1 for e in examples]  # + answer - 1
    assert scoring.teacher_forced_correct(model, tokenizer, examples, batch_size=1).forward_tokens == sum(lengths)
    assert scoring.teacher_forced_correct(model, tokenizer, examples, batch_size=4).forward_tokens == 4 * max(lengths)


class ScriptedRunner:
    """A GreedyRunner that returns fixed outputs (what an ONNX or TensorRT runner would hand back)."""

    def __init__(self, outputs):
        self.outputs = outputs
        self.calls = []

    def greedy(self, input_ids, max_new_tokens, eos_token_id):
        self.calls.append((len(input_ids), max_new_tokens, eos_token_id))
        return [self.outputs[len(ids)] for ids in input_ids]


def test_greedy_with_a_runner_cuts_at_eos_and_matches_case_insensitively():
    tokenizer = tiny_tokenizer()
    ids = tokenizer.convert_tokens_to_ids
    examples = [Example("w4", "W5", 0, 1), Example("w4 w4", "w6", 0, 1), Example("w4 w4 w4", "w7", 0, 1)]
    # Prompt lengths 1, 2, 3 (this tokenizer adds no <bos>) select the outputs.
    runner = ScriptedRunner({1: ids(["w5", "w9"]), 2: ids(["<eos>", "w6"]), 3: ids(["w8", "w7"])})
    scores = scoring.greedy_correct(runner, tokenizer, examples, batch_size=3, eos_token_id=EOS_ID)
    assert [r.generated for r in scores.results] == ["w5", "", "w8"]  # own budget: 1 token each
    assert [r.correct for r in scores.results] == [True, False, False]
    assert runner.calls == [(3, 1, EOS_ID)]
    # With the benchmark's longer budget the value may appear later and still counts (see scoring's docstring).
    later = scoring.greedy_correct(runner, tokenizer, examples, max_new_tokens=2, eos_token_id=EOS_ID)
    assert [r.correct for r in later.results] == [True, False, True]


def test_prompt_with_its_own_bos_gets_no_second_one():
    tokenizer = tiny_kv.build_tokenizer()  # prepends <bos>, like most causal LM tokenizers
    ids = scoring.encode_prompt(tokenizer, "f1 q2")
    assert ids == tokenizer.convert_tokens_to_ids(["<bos>", "f1", "q2"])
    assert scoring.encode_prompt(tokenizer, "<bos> f1 q2") == ids


# ---- real key-value prompts with a byte-level BPE tokenizer ----


def bpe_tokenizer(texts):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<pad>", "<bos>", "<eos>"]
    )
    bpe.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")


@pytest.fixture(scope="module")
def kv_model(tmp_path_factory):
    records = kv_data.generate_records(4, 30, seed=0)
    tokenizer = bpe_tokenizer([kv_data.kv_prompt(r) + " " + r.value for r in records])
    folder = tiny_model_dir("llama", tmp_path_factory.mktemp("kv"), vocab_size=len(tokenizer))
    return load_model(folder), tokenizer


def test_answer_tokens_are_the_canonical_tokens_of_the_full_text(kv_model):
    _, tokenizer = kv_model
    example = kv_data.make_examples(kv_data.generate_records(4, 1, seed=5), [2])[0]
    prompt_ids = scoring.encode_prompt(tokenizer, example.prompt)
    answer = scoring.answer_ids(tokenizer, example.prompt, example.answer)
    assert prompt_ids + answer == tokenizer(example.prompt + " " + example.answer)["input_ids"]
    assert tokenizer.decode(answer) == " " + example.answer
    chat_prompt = example.prompt + "\n"  # a chat template's assistant header ends in a newline: no space
    assert tokenizer.decode(scoring.answer_ids(tokenizer, chat_prompt, example.answer)) == example.answer


def test_teacher_forcing_agrees_with_greedy_on_kv_prompts(kv_model):
    """(b) == (a) wherever the greedy output starts with the value; both wrong where it lacks it."""
    model, tokenizer = kv_model
    base = kv_data.make_examples(kv_data.generate_records(4, 6, seed=7), [0, 3])
    # Plain prompts ("...value:", answer after a space) and chat-like ones (ending in a newline).
    base += [Example(e.prompt + "\n", e.answer, e.gold_index, e.num_pairs) for e in base]
    examples = list(base)
    for e in base:  # the model's own 5-token continuation as the value, so that some are correct
        output = plain_greedy(model, scoring.encode_prompt(tokenizer, e.prompt), 5)
        text = tokenizer.decode(output)
        if text.strip() and min(output) > 2:  # no <pad> <bos> <eos>: greedy decoding stops at <eos>
            examples.append(Example(e.prompt, text.removeprefix(" "), e.gold_index, e.num_pairs))
    greedy = scoring.greedy_correct(model, tokenizer, examples, batch_size=4, max_new_tokens=8)
    forced = scoring.teacher_forced_correct(model, tokenizer, examples, batch_size=4)
    starts = 0
    for example, g, f in zip(examples, greedy.results, forced.results, strict=True):
        canonical = scoring.answer_ids(tokenizer, example.prompt, example.answer)
        output = plain_greedy(model, scoring.encode_prompt(tokenizer, example.prompt), len(canonical))
        if output == canonical:  # greedy decoding starts with the value, token for token
            starts += 1
            assert f.correct and g.correct, example.answer
        elif example.answer.lower() not in g.generated.lower():
            assert not f.correct and not g.correct
        else:  # the value appears, spelled with other tokens (e.g. no space after "value:")
            assert g.correct and not f.correct
    assert starts >= 12, "too few examples where the greedy output starts with the value"


def test_bundled_model_teacher_forcing_agrees_with_greedy():
    """The trained tiny model on its own task: real right and wrong answers, one verdict per example."""
    folder = resolve_model("lpes-tiny-kv")
    from transformers import AutoTokenizer

    from lpes.validation.tasks import load_examples

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    examples = load_examples(folder, "tiny-kv:examples=6")
    greedy = scoring.greedy_correct(model, tokenizer, examples, batch_size=8)
    forced = scoring.teacher_forced_correct(model, tokenizer, examples, batch_size=8)
    assert [r.correct for r in forced.results] == [r.correct for r in greedy.results]
    assert [r.generated for r in forced.results] == [r.generated for r in greedy.results]
    assert 0 < greedy.accuracy  # a trained model finds some values


# ---- the search's greedy runner: shared prefixes once, earlier answers as drafts ----


def prompt_tree(seed: int) -> list[list[int]]:
    """Token prompts that share prefixes at several depths, as one kv example does at its gold positions: a common
    head, groups under it, subgroups, a prompt that is another's prefix, and two identical prompts."""
    rng = random.Random(seed)

    def words(n):
        return [rng.randrange(2, len(WORDS) + 2) for _ in range(n)]

    head = words(20)
    prompts = []
    for _ in range(3):
        group = head + words(rng.randrange(1, 15))
        for _ in range(3):
            sub = group + words(rng.randrange(0, 10))
            prompts += [sub + words(rng.randrange(1, 20)) for _ in range(2)]
    prompts += [words(30), prompts[0][:-3], list(prompts[4])]
    rng.shuffle(prompts)
    return prompts


@pytest.mark.parametrize("scales", [None, [4.0, 1.0, 0.5]])
def test_shared_prefix_greedy_writes_what_each_prompt_alone_does(model_and_tokenizer, scales, monkeypatch):
    """Every row's tokens are the independent greedy loop's, one prompt alone, whatever the drafts: the pool's
    exact answers, wrong ones, right ones that turn wrong, and none; prefixes shared at several depths, chunked."""
    model, _ = model_and_tokenizer
    if scales is not None:
        model = apply(load_model(model.name_or_path), Spec.from_scales(scales))
    monkeypatch.setattr(shared_greedy, "MIN_SHARED_POSITIONS", 2)  # the tiny prompts share a few dozen positions
    prompts, steps = prompt_tree(seed=3), 6
    expected = [plain_greedy(model, p, steps) for p in prompts]
    pool = shared_greedy.DraftPool()
    pool.add(prompts[0], expected[0])
    pool.add(prompts[1], [(t + 1) % 50 + 2 for t in expected[1]])  # wrong from the first token
    pool.add(prompts[2], expected[2][:3] + [(t + 1) % 50 + 2 for t in expected[2][3:]])  # right, then wrong
    positions = []
    hook = model.register_forward_pre_hook(lambda m, a, k: positions.append(k["input_ids"].numel()), with_kwargs=True)
    runner = shared_greedy.SharedPrefixGreedy(model, 0, prefill_tokens=len(prompts) * 8, drafts=pool)
    out = runner.greedy(prompts, steps, None)
    hook.remove()
    assert out == expected
    assert sum(positions) < sum(map(len, prompts))  # the prefixes were computed once (prefill + answers: fewer)
    assert pool.continuation(prompts[1], expected[1][:1]) == expected[1][1:]  # the answers joined the pool


def test_exact_drafts_decode_in_one_pass(model_and_tokenizer):
    """With every prompt's answer in the pool, the answers are checked in one pass after the prefill."""
    model, _ = model_and_tokenizer
    prompts, steps = prompt_tree(seed=4), 5
    pool = shared_greedy.DraftPool()
    runner = shared_greedy.SharedPrefixGreedy(model, 0, drafts=pool)
    first = runner.greedy(prompts, steps, None)  # no drafts but the n-gram ones: fills the pool
    assert first == [plain_greedy(model, p, steps) for p in prompts]
    widths = []
    hook = model.register_forward_pre_hook(lambda m, a, k: widths.append(k["input_ids"].shape), with_kwargs=True)
    prefill = runner._prefill
    runner._prefill = lambda rows: (prefill(rows), widths.clear())[0]
    again = runner.greedy(prompts, steps, None)
    hook.remove()
    assert again == first
    assert widths == [(len(prompts), steps)]  # one round: each row's last prompt token's pick and 4 drafted


def test_greedy_correct_with_drafts_gives_the_same_verdicts(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    examples, expected = constructed_examples(model, tokenizer, random_prompts(8, seed=6))
    pool = shared_greedy.DraftPool()
    for _ in range(2):  # the second time every answer is a draft
        scores = scoring.greedy_correct(model, tokenizer, examples, batch_size=5, drafts=pool)
        assert [r.correct for r in scores.results] == expected


def test_shared_prefixes_are_the_longest_common_ones():
    """Any two prompts' deepest shared prefix ends where they part (never past either's next-to-last token)."""
    for seed in range(5):
        prompts = prompt_tree(seed)
        deepest = {}
        nodes = list(shared_greedy.shared_prefixes(prompts))
        while nodes:  # parents before children: a child's end overwrites its parent's
            node = nodes.pop(0)
            deepest.update(((a, b), node.end) for a in node.rows for b in node.rows)
            nodes += node.children
        for a, pa in enumerate(prompts):
            for b, pb in enumerate(prompts):
                if a != b:
                    common = 0
                    while common < min(len(pa), len(pb)) - 1 and pa[common] == pb[common]:
                        common += 1
                    assert deepest.get((a, b), 0) == common


def test_draft_pool_continues_the_latest_answer_that_fits():
    pool = shared_greedy.DraftPool()
    prompt = [5, 6, 7, 8, 9, 10]
    assert pool.continuation(prompt, [1]) == []
    pool.add(prompt, [1, 2, 3, 4])
    pool.add(prompt, [1, 2, 9, 9])
    assert pool.continuation(prompt, [1, 2]) == [9, 9]  # the latest first
    assert pool.continuation(prompt, [1, 2, 3]) == [4]
    pool.add([40, 41], [20, 21, 22, 23, 24])  # another prompt's answer: its wording after the last tokens written
    assert pool.continuation(prompt, [7, 21, 22]) == [23, 24]
    assert pool.continuation(prompt, [30, 7, 8]) == [9, 10]  # else the prompt's own tokens
    assert pool.continuation(prompt, [30, 31, 8]) == []  # one token in common: no draft
    for answer in range(10):
        pool.add(prompt, [answer])
    assert len(pool._answers[tuple(prompt)]) == shared_greedy.ANSWERS_KEPT


def test_shared_prefix_greedy_only_for_full_attention():
    from types import SimpleNamespace

    from lpes.foundation.spec import StockRope
    from lpes.search.replica import _length_dependent

    assert shared_greedy.usable(SimpleNamespace(config=SimpleNamespace(sliding_window=None)))
    assert not shared_greedy.usable(SimpleNamespace(config=SimpleNamespace(sliding_window=512)))
    assert not shared_greedy.usable(SimpleNamespace(config=SimpleNamespace(
        sliding_window=None, layer_types=["full_attention", "sliding_attention"])))
    assert _length_dependent(StockRope("dynamic", 2.0)) and not _length_dependent(StockRope("yarn", 2.0))
