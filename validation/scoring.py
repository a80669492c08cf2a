"""Scoring retrieval examples: the benchmark's verdict, and a one-pass shortcut where it is the same.

(a) `greedy_correct`: greedy decoding within the example's answer budget, then the
    benchmark's test, `best_subspan_em` of lost-in-the-middle's `metrics.py`: normalise
    prediction and value (lowercase, drop punctuation, articles and extra whitespace) and
    look for the value inside the prediction. Validation uses this on every variant
    (torch, ONNX Runtime, TensorRT, onnxruntime-genai).
(b) `teacher_forced_correct`: one forward pass over prompt + answer; correct iff
    every answer token is the argmax given the prompt and the answer tokens before
    it. That is exactly "greedy decoding starts with the answer tokens", at the
    cost of one prefill instead of a prefill plus a decode loop.
(c) `calibration_correct`, what search scores with: (b) where every example's budget is
    the answer's own token count (`Example.answer_tokens` None: the bundled tasks, whose
    models answer with the value and stop), else (a).

The answer budget (`Example.answer_tokens`): None gives exactly the answer's token
count, so a value can never be "found" in text generated after a wrong answer; an
integer N lets the model write up to N tokens (stopping at its end-of-turn token), as
the benchmark does with 100: an instruction-tuned model answers "\n2f12..." or "The
value corresponding to the key ... is ...", which (a) counts right and (b) cannot.

How the answer is tokenized: the answer follows the prompt after one space, or
directly when the prompt ends in whitespace (a chat template's assistant header
ends in a newline; the plain benchmark prompt ends in "value:"). Its tokens are
those of `prompt + sep + answer` past the prompt's own tokens, so a tokenizer that
marks word starts (Llama's "\u2581", GPT-2's "\u0120") gives the tokens greedy decoding
would have to produce.

Why (b) is used only with the exact budget: with it, (b) correct means greedy decoding
emits the answer's tokens, so (a) is correct; (a) correct means the output, exactly as
many tokens as the answer, contains the value, which for the bundled tasks' one-token
answers means it is the value's token, so (b) is correct. Where they can still differ:

- A near-tie between two tokens: (a) runs a KV-cached decode loop, (b) one
  full-sequence pass; float rounding differs between the two, so an argmax
  decided by less than ~1e-5 (fp32) can flip.
- The output spells the value with other tokens than its canonical tokenization
  (e.g. "3f" "2a" instead of "3f2a"): (a) correct, (b) wrong. With budgets (a) decides.
- RoPE variants whose frequencies depend on the sequence length (dynamic NTK,
  LongRoPE) pick them in transformers from the longest row of a batch, and (a)'s
  cache keeps keys rotated with the frequencies of the prefill: for those, a row's
  verdict can depend on its batch, and (a) and (b) can differ near the switch
  length. Use batch_size=1 where that matters. Plain RoPE (default, linear,
  llama3, yarn) depends on position differences only and is unaffected.

All return `Scores`: per-example records (example id = index in the list given,
gold index, generated text as decoded, verdict) and the number of token positions the
model computed (padding included), which search uses for its cost benchmark.
"""

from __future__ import annotations

import inspect
import re
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from lpes.exporters.runners import TorchGreedy, model_device, torch_left_pad
from lpes.foundation.errors import LpesError
from lpes.validation.examples import Example
from lpes.validation.shared_greedy import DraftPool, SharedPrefixGreedy, usable

Progress = Callable[[int], None]  # called with the number of examples just scored
# Padded token positions per batch. Activation memory follows tokens (and attention their
# square), so a batch of 5-6k-token prompts must hold one or two, not eight.
MAX_BATCH_TOKENS = 8192


@dataclass(frozen=True)
class ExampleResult:
    example_id: int  # index in the examples given to the scorer
    gold_index: int
    generated: str  # greedy: the decoded output; teacher forcing: the argmax tokens, decoded
    correct: bool


@dataclass(frozen=True)
class Scores:
    results: tuple[ExampleResult, ...]
    forward_tokens: int  # token positions the model computed, padding included

    @property
    def accuracy(self) -> float:
        return sum(r.correct for r in self.results) / len(self.results) if self.results else 0.0

    def accuracy_by_gold_index(self) -> dict[int, float]:
        groups: dict[int, list[bool]] = {}
        for result in self.results:
            groups.setdefault(result.gold_index, []).append(result.correct)
        return {index: sum(v) / len(v) for index, v in sorted(groups.items())}


@dataclass(frozen=True)
class EncodedExample:
    prompt_ids: list[int]
    answer_ids: list[int]


# ---- the benchmark's verdict ----

_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation, as lost-in-the-middle's `metrics.normalize_answer`: lowercase, no
    punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def answer_found(prediction: str, answer: str) -> bool:
    """lost-in-the-middle's `best_subspan_em(prediction, [answer]) == 1.0`."""
    return normalize_answer(answer) in normalize_answer(prediction)


# ---- tokenization shared by both scorers and every runtime ----


def prompt_has_bos(tokenizer, prompt: str) -> bool:
    """True when the prompt text already starts with the BOS token (a rendered chat template)."""
    bos = getattr(tokenizer, "bos_token", None)
    return bool(bos) and prompt.startswith(bos)


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    """The prompt's token ids, with the tokenizer's special tokens unless the text already has its BOS."""
    return tokenizer(prompt, add_special_tokens=not prompt_has_bos(tokenizer, prompt))["input_ids"]


def answer_separator(prompt: str) -> str:
    return "" if prompt[-1:].isspace() else " "


def answer_ids(tokenizer, prompt: str, answer: str) -> list[int]:
    """The tokens of `answer` as they follow `prompt` (see the module docstring)."""
    text = prompt + answer_separator(prompt) + answer
    prompt_only = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    full = tokenizer(text, add_special_tokens=False)["input_ids"]
    if full[: len(prompt_only)] == prompt_only:
        return full[len(prompt_only) :]
    # The answer's first token merged with the prompt's last one: the best we can do is standalone.
    return tokenizer(answer_separator(prompt) + answer, add_special_tokens=False)["input_ids"]


def encode_examples(tokenizer, examples: Sequence[Example]) -> list[EncodedExample]:
    encoded = []
    for i, example in enumerate(examples):
        answer = answer_ids(tokenizer, example.prompt, example.answer)
        if not answer:
            raise LpesError(f"example {i} has an empty answer")
        encoded.append(EncodedExample(encode_prompt(tokenizer, example.prompt), answer))
    return encoded


def eos_token_ids(model, tokenizer) -> list[int]:
    """The ids that end generation: the model's generation config, else the tokenizer's EOS."""
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in eos] if isinstance(eos, (list, tuple)) else [int(eos)]


def pad_token_id(model, tokenizer) -> int:
    for source in (tokenizer, getattr(model, "generation_config", None), getattr(model, "config", None)):
        value = getattr(source, "pad_token_id", None)
        if value is not None:
            return int(value)
    eos = eos_token_ids(model, tokenizer)
    return eos[0] if eos else 0  # any id works: padded positions are masked out


# ---- batching ----


def _batches(lengths: Sequence[int], batch_size: int, max_tokens: int = MAX_BATCH_TOKENS) -> list[list[int]]:
    """Example indices grouped by similar length (longest first), so batches carry little padding.

    A batch holds at most `batch_size` examples and at most `max_tokens` padded positions
    (always at least one example): memory follows tokens, so long prompts go fewer at a time.
    """
    if batch_size < 1:
        raise LpesError(f"batch size must be at least 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:  # longest first: a batch's first row sets its padded width
        if batches and len(batches[-1]) < batch_size and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= max_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


# ---- (b) teacher forcing ----


def teacher_forced_correct(
    model,
    tokenizer,
    examples: Sequence[Example],
    batch_size: int = 8,
    progress: Progress | None = None,
    max_batch_tokens: int = MAX_BATCH_TOKENS,
) -> Scores:
    """One forward pass per batch: correct iff every answer token is the argmax (see module docstring)."""
    encoded = encode_examples(tokenizer, examples)
    rows = [e.prompt_ids + e.answer_ids[:-1] for e in encoded]
    pad_id = pad_token_id(model, tokenizer)
    keep_logits = _accepts_logits_to_keep(model)
    device = model_device(model)
    results: dict[int, ExampleResult] = {}
    forward_tokens = 0
    for batch in _batches([len(r) for r in rows], batch_size, max_batch_tokens):
        ids, mask, positions = torch_left_pad([rows[i] for i in batch], pad_id)
        forward_tokens += ids.numel()
        # Left padding aligns every row's end, so the answer positions are the last ones.
        keep = max(len(encoded[i].answer_ids) for i in batch)
        kwargs = {"logits_to_keep": keep} if keep_logits else {}
        with torch.inference_mode():
            logits = model(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                position_ids=positions.to(device),
                use_cache=False,
                **kwargs,
            ).logits[:, -keep:]
        predicted = logits.argmax(-1).cpu()
        for row, i in enumerate(batch):
            n = len(encoded[i].answer_ids)
            tokens = predicted[row, keep - n :].tolist()
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            results[i] = ExampleResult(i, examples[i].gold_index, text, tokens == encoded[i].answer_ids)
        if progress is not None:
            progress(len(batch))
    return Scores(tuple(results[i] for i in range(len(examples))), forward_tokens)


# ---- (d) the gold answer's log-likelihood: the continuous objective ----


@dataclass(frozen=True)
class AnswerLogprob:
    """One example's mean log-likelihood per gold answer token, teacher-forced (a 0-d tensor that autograd
    can follow with `grad=True`), and whether every answer token was the argmax (the verdict (b) gives)."""

    example_id: int
    logprob: torch.Tensor
    argmax_correct: bool
    # The answer's worst token: its log-probability minus the best other token's. Positive iff every answer
    # token is the argmax, so its sign is the verdict; a 0-d tensor, as `logprob`.
    margin: torch.Tensor | None = None


def answer_logprob_batches(model, tokenizer, examples: Sequence[Example], batch_size: int = 8, *,
                           grad: bool = False, max_batch_tokens: int = MAX_BATCH_TOKENS, batches=None):
    """Per batch: ([AnswerLogprob] of its examples, token positions computed), one forward pass each.

    The same rows as teacher forcing (prompt + answer without its last token, left-padded), so the
    objective sees exactly the positions the verdict does. `grad`: keep the graph (the caller runs
    backward per batch, so one batch's activations are alive at a time). `batches`: the example ids of
    each batch (default: grouped by length); a gradient search fixes them so that where a batch runs
    never changes its rounding.
    """
    encoded = encode_examples(tokenizer, examples)
    rows = [e.prompt_ids + e.answer_ids[:-1] for e in encoded]
    pad_id = pad_token_id(model, tokenizer)
    keep_logits = _accepts_logits_to_keep(model)
    device = model_device(model)
    for batch in batches if batches is not None else _batches([len(r) for r in rows], batch_size, max_batch_tokens):
        ids, mask, positions = torch_left_pad([rows[i] for i in batch], pad_id)
        keep = max(len(encoded[i].answer_ids) for i in batch)
        kwargs = {"logits_to_keep": keep} if keep_logits else {}
        with torch.inference_mode(not grad), torch.set_grad_enabled(grad):
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                           position_ids=positions.to(device), use_cache=False, **kwargs).logits[:, -keep:]
            logprobs = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)
        out = []
        for row, i in enumerate(batch):
            answer = encoded[i].answer_ids
            at_answer, gold = logprobs[row, keep - len(answer):], torch.tensor(answer, device=device)
            token_logprobs = at_answer.gather(-1, gold[:, None])
            argmax = at_answer.argmax(-1).tolist() == answer
            out.append(AnswerLogprob(i, token_logprobs.mean(), argmax, _worst_margin(at_answer, gold)))
        yield out, ids.numel()


def _worst_margin(logprobs: torch.Tensor, answer: torch.Tensor) -> torch.Tensor:
    """min over answer tokens of (the token's log-probability - the best other token's); `answer`: [n] ids."""
    chosen = logprobs.gather(-1, answer[:, None]).squeeze(-1)
    best_other = logprobs.scatter(-1, answer[:, None], float("-inf")).max(-1).values
    return (chosen - best_other).min()


def answer_logprobs(model, tokenizer, examples: Sequence[Example], batch_size: int = 8,
                    progress: Progress | None = None) -> tuple[list[float], list[bool], int]:
    """Every example's mean gold-token log-likelihood and teacher-forced verdict, and the positions computed."""
    values: dict[int, AnswerLogprob] = {}
    tokens = 0
    for batch, positions in answer_logprob_batches(model, tokenizer, examples, batch_size):
        values.update((r.example_id, r) for r in batch)
        tokens += positions
        if progress is not None:
            progress(len(batch))
    ordered = [values[i] for i in range(len(examples))]
    return [float(r.logprob) for r in ordered], [r.argmax_correct for r in ordered], tokens


def _accepts_logits_to_keep(model) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


# ---- (a) greedy generation ----


def greedy_correct(
    model,
    tokenizer,
    examples: Sequence[Example],
    batch_size: int = 8,
    max_new_tokens: int | None = None,
    progress: Progress | None = None,
    eos_token_id: int | list[int] | None = None,
    max_batch_tokens: int = MAX_BATCH_TOKENS,
    prefill_tokens: int | None = None,
    drafts: DraftPool | None = None,
) -> Scores:
    """Greedy decoding within each example's budget, and the benchmark's `best_subspan_em` test.

    `model` is a transformers model or any `GreedyRunner` (ONNX Runtime, TensorRT).
    `max_new_tokens` overrides every example's budget; None: `Example.answer_tokens`, and
    where that is None too, as many tokens as the answer has. `eos_token_id` defaults to
    the model's own. `prefill_tokens`: a transformers model prefills in chunks of about that many positions
    (TorchGreedy), so a batch may hold more rows than one prefill pass would. `drafts`: decode with
    `SharedPrefixGreedy` where the model allows it (shared prefixes once, earlier answers as drafts, this batch's
    answers added), the search's many verdicts on the same prompts.
    """
    encoded = encode_examples(tokenizer, examples)
    if eos_token_id is None:
        eos = eos_token_ids(model, tokenizer)
    else:
        eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    runner = _runner(model, pad_token_id(model, tokenizer), prefill_tokens, drafts)
    budgets = _budgets(examples, encoded, max_new_tokens)
    results: dict[int, ExampleResult] = {}
    forward_tokens = 0
    lengths = [len(e.prompt_ids) + budget for e, budget in zip(encoded, budgets)]
    for batch in _batches(lengths, batch_size, max_batch_tokens):
        steps = max(budgets[i] for i in batch)
        outputs = runner.greedy([encoded[i].prompt_ids for i in batch], steps, _runner_eos(runner, eos))
        # What generate computes: a prefill over the padded prompts, then one position per row per further step
        # (SharedPrefixGreedy computes fewer; the search's tokens and tokens/s count these either way).
        prefill = max(len(encoded[i].prompt_ids) for i in batch)
        decode_steps = max(max((len(o) for o in outputs), default=0) - 1, 0)
        forward_tokens += len(batch) * (prefill + decode_steps)
        for i, tokens in zip(batch, outputs, strict=True):
            tokens = _until_eos(list(tokens), eos)[: budgets[i]]
            text = tokenizer.decode(tokens, skip_special_tokens=True)
            results[i] = ExampleResult(i, examples[i].gold_index, text, answer_found(text, examples[i].answer))
        if progress is not None:
            progress(len(batch))
    return Scores(tuple(results[i] for i in range(len(examples))), forward_tokens)


def _runner(model, pad_id: int, prefill_tokens: int | None, drafts: DraftPool | None):
    if hasattr(model, "greedy"):
        return model
    if drafts is not None and usable(model):
        return SharedPrefixGreedy(model, pad_id, prefill_tokens, drafts)
    return TorchGreedy(model, pad_id, prefill_tokens)


def _budgets(examples: Sequence[Example], encoded: Sequence[EncodedExample], max_new_tokens: int | None) -> list[int]:
    """How many tokens greedy decoding generates for each example (greedy_correct's docstring)."""
    return [max_new_tokens or example.answer_tokens or len(e.answer_ids) for example, e in zip(examples, encoded)]


def longest_sequence(tokenizer, examples: Sequence[Example], max_new_tokens: int | None = None) -> int:
    """The longest prompt + generated tokens `greedy_correct` runs on `examples` (0 for none)."""
    encoded = encode_examples(tokenizer, examples)
    budgets = _budgets(examples, encoded, max_new_tokens)
    return max((len(e.prompt_ids) + budget for e, budget in zip(encoded, budgets)), default=0)


def calibration_correct(
    model, tokenizer, examples: Sequence[Example], batch_size: int = 8, progress: Progress | None = None,
    drafts: DraftPool | None = None, greedy: Mapping[str, int] | None = None,
) -> Scores:
    """The search's verdicts: teacher forcing where it is the benchmark's verdict, else greedy decoding.

    `greedy`: greedy_correct's batching keywords where it decodes (default: batches of `batch_size`)."""
    if all(example.answer_tokens is None for example in examples):
        return teacher_forced_correct(model, tokenizer, examples, batch_size, progress)
    return greedy_correct(model, tokenizer, examples, progress=progress, drafts=drafts,
                          **(greedy or {"batch_size": batch_size}))


def _runner_eos(runner, eos: list[int]) -> int | list[int] | None:
    # transformers' generate stops on any of several ids; the GreedyRunner protocol takes one
    # (the outputs are cut at the first of any of them afterwards).
    if isinstance(runner, (TorchGreedy, SharedPrefixGreedy)):
        return eos or None
    return eos[0] if eos else None


def _until_eos(tokens: list[int], eos: list[int]) -> list[int]:
    for n, token in enumerate(tokens):
        if token in eos:
            return tokens[:n]
    return tokens
