"""Greedy decoding for the search, which asks for many verdicts on the same prompts: a prompt prefix that several
rows of a batch share is computed once, and the answers given earlier on a prompt are drafts, checked many
tokens a pass.

The tokens are greedy's: a draft token is kept only where it is the argmax the model computes at its place, so a
wrong draft costs time, never a token. What may differ from transformers' `generate` is the last bit of a logit
(the same positions computed in passes of other shapes, as chunked prefill does); the default SmolLM2 search gave
the same 600 held-out verdicts either way (bench/RESULTS.md).

Why it pays on a CPU: a decode step reads every weight for one token a row (SmolLM2-135M, 8 rows: 120 ms a step
on 2 cores, 23 steps an answer), where checking a 24-token draft is one pass; the kv-retrieval prompts of one
example at its gold positions share a third of their tokens. Its cache grows in place and its attention reads
each key/value head once (cache_and_attention.py): the same numbers without transformers' copies.

Rows keep their own positions (RoPE sees exactly the positions a row would see alone); a cache slot that holds no
token of the row (padding, a shared prefix shorter than another row's, a rejected draft token) is masked out.
Hence not for a RoPE that follows the sequence length (dynamic NTK: a pass of k tokens sees its longest) nor a
sliding-window attention (its window counts cache slots): `usable` says when, the caller falls back to
`TorchGreedy` otherwise.
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lpes.exporters.runners import end_tokens, model_device, prefill_chunk, torch_left_pad

# A prefix is computed apart (one pass of its own) only when sharing it saves at least this many positions: a pass
# reads every weight once, which costs about as much as computing this many positions in a batch.
MIN_SHARED_POSITIONS = 64
ANSWERS_KEPT = 4  # per prompt, the latest distinct answers
RECENT_ANSWERS = 64  # on any prompt, where a draft's wording is looked up
NGRAM = 3  # a looked-up draft follows the last 3 (else 2) tokens written
NGRAM_DRAFT = 8  # tokens a looked-up draft proposes: a wrong one costs a wider pass
FULL = "full_attention"  # transformers' layer_types name of a layer that attends to every position before it



def cache_keyword(model) -> str:
    """The name forward takes its KV cache by: transformers renamed `past_key_values` to `cache` (5.25 warns on
    the old name; 5.17 knows only it)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

class DraftPool:
    """The answers given so far, the latest first: drafts for the next candidate's answers.

    A draft is the rest of the latest answer on the same prompt that begins as the row's answer does; failing
    that, what followed the row's last `NGRAM` tokens (else its last two) in another answer or in the prompt:
    answers share their wording ("The value corresponding to the key ...") and copy from the prompt.
    """

    def __init__(self) -> None:
        self._answers: dict[tuple[int, ...], list[list[int]]] = {}
        self._recent: deque[list[int]] = deque(maxlen=RECENT_ANSWERS)

    def continuation(self, prompt: Sequence[int], written: list[int]) -> list[int]:
        """Tokens that may follow `written` in the answer to `prompt`; [] when nothing suggests any."""
        mine = self._answers.get(tuple(prompt), ())
        for answer in mine:
            if len(answer) > len(written) and answer[: len(written)] == written:
                return answer[len(written):]
        for n in range(min(NGRAM, len(written)), 1, -1):
            for source in (*mine, *self._recent, prompt):
                if rest := _after(source, written[-n:]):
                    return rest[:NGRAM_DRAFT]
        return []

    def add(self, prompt: Sequence[int], answer: list[int]) -> None:
        answers = self._answers.setdefault(tuple(prompt), [])
        if answer in answers:
            answers.remove(answer)
        answers.insert(0, list(answer))
        del answers[ANSWERS_KEPT:]
        self._recent.appendleft(list(answer))


def _after(tokens: Sequence[int], pattern: list[int]) -> Sequence[int]:
    """What follows the last occurrence of `pattern` in `tokens` (empty when it does not occur or ends them)."""
    n = len(pattern)
    for start in range(len(tokens) - n - 1, -1, -1):
        if tokens[start] == pattern[0] and list(tokens[start: start + n]) == pattern:
            return tokens[start + n:]
    return ()


def usable(model) -> bool:
    """Whether `SharedPrefixGreedy` decodes this model as greedy does: full attention in every layer."""
    config = getattr(model, "config", None)
    types = set(getattr(config, "layer_types", None) or [FULL])
    return config is not None and not getattr(config, "sliding_window", None) and types == {FULL}


@dataclass
class _Prefix:
    """A span of prompt positions [start, end) that every one of `rows` holds, below its parent's span."""

    start: int
    end: int
    rows: list[int]
    children: list[_Prefix] = field(default_factory=list)


def shared_prefixes(prompts: Sequence[Sequence[int]], rows: list[int] | None = None, depth: int = 0) -> list[_Prefix]:
    """The prefixes two or more of `prompts` share past `depth`, as a tree (a row's last token is never shared:
    its logits pick the first answer token)."""
    groups: dict[int, list[int]] = {}
    for row in range(len(prompts)) if rows is None else rows:
        if len(prompts[row]) - 1 > depth:
            groups.setdefault(prompts[row][depth], []).append(row)
    prefixes = []
    for group in groups.values():
        if len(group) < 2:
            continue
        end, limit = depth + 1, min(len(prompts[row]) - 1 for row in group)
        while end < limit and len({prompts[row][end] for row in group}) == 1:
            end += 1
        prefixes.append(_Prefix(depth, end, group, shared_prefixes(prompts, group, end)))
    return prefixes


class SharedPrefixGreedy:
    """`GreedyRunner` over a transformers model: shared prefixes computed once, drafts from `drafts` checked in one
    pass, and the answers added to `drafts`. `prefill_tokens`: as `TorchGreedy`'s."""

    def __init__(self, model, pad_token_id: int, prefill_tokens: int | None = None,
                 drafts: DraftPool | None = None):
        self.model, self.pad_token_id, self.prefill_tokens = model, pad_token_id, prefill_tokens
        self.drafts = drafts if drafts is not None else DraftPool()
        self._cache_keyword = cache_keyword(model)

    def greedy(self, input_ids: list[list[int]], max_new_tokens: int,
               eos_token_id: int | list[int] | None) -> list[list[int]]:
        import torch

        from lpes.validation.cache_and_attention import grouped_attention

        with torch.inference_mode(), grouped_attention(self.model):
            batch = self._prefill(input_ids)
            answers = self._decode(input_ids, batch, max_new_tokens, end_tokens(eos_token_id))
        for prompt, answer in zip(input_ids, answers):
            self.drafts.add(prompt, answer)
        return answers

    # ---- prefill ----

    def _prefill(self, prompts: list[list[int]]) -> _Batch:
        """Every prompt in the cache, each shared prefix worth it computed once; the logits of each last token.

        The prefix tree is computed a level at a time, each level's prefixes in one pass (one pass each would read
        every weight as often), and the rest of each prompt in groups of rows of about its length (one padded pass
        would compute every row at the longest rest, giving back what sharing saved)."""
        held = [0] * len(prompts)  # per row: the positions its cache holds from a shared prefix
        kv: list = [None] * len(prompts)
        level = [(prefix, 0, None) for prefix in shared_prefixes(prompts)]  # (prefix, its ancestor's end and cache)
        while level:
            worth = [job for job in level if (len(job[0].rows) - 1) * (job[0].end - job[1]) >= MIN_SHARED_POSITIONS]
            computed = {}
            for group in _similar_lengths([prefix.end - start for prefix, start, _ in worth]):
                jobs = [worth[i] for i in group]
                part = self._extend([cache for _, _, cache in jobs], [start for _, start, _ in jobs],
                                    [prompts[p.rows[0]][start: p.end] for p, start, _ in jobs], group)
                computed.update((id(prefix), part.row_cache(i)) for i, (prefix, _, _) in enumerate(jobs))
            below = []
            for prefix, start, cache in level:
                if id(prefix) in computed:
                    start, cache = prefix.end, computed[id(prefix)]
                    for row in prefix.rows:
                        held[row], kv[row] = start, cache
                below += [(child, start, cache) for child in prefix.children]
            level = below
        rest = [len(prompt) - h for prompt, h in zip(prompts, held)]
        return _Batch.joined([self._extend([kv[r] for r in rows], [held[r] for r in rows],
                                           [prompts[r][held[r]:] for r in rows], rows)
                              for rows in _similar_lengths(rest)])

    def _extend(self, caches: list, held: list[int], spans: list[list[int]], rows: list[int]) -> _Batch:
        """One pass (in chunks past `prefill_tokens`): each of `spans` computed over its cache of `held` positions
        (None, 0: from the start); the batch these rows make, with the logits of each one's last token."""
        import torch

        device = model_device(self.model)
        cache, mask = _stacked(caches, held)
        ids, fresh, positions = torch_left_pad(spans, self.pad_token_id)
        width, length = mask.shape[1], ids.shape[1]
        positions = positions + torch.tensor(held)[:, None]  # each span goes on from its cache's positions
        mask = torch.cat([mask, fresh], 1)
        chunk = prefill_chunk(self.prefill_tokens, len(spans), length) or length
        for start in range(0, length, chunk):
            stop = min(start + chunk, length)
            logits = self.model(input_ids=ids[:, start:stop].to(device),
                                attention_mask=mask[:, : width + stop].to(device),
                                position_ids=positions[:, start:stop].to(device), use_cache=True,
                                logits_to_keep=1, **{self._cache_keyword: cache}).logits[:, -1]
        return _Batch(cache, mask, torch.tensor(held) + torch.tensor([len(span) for span in spans]), logits, rows)

    # ---- decoding ----

    def _decode(self, prompts, batch: _Batch, budget: int, stop: set[int]) -> list[list[int]]:
        """Rounds of one pass each: every open row feeds its last token and its draft's rest; the draft is kept up
        to the first token greedy would not write, and greedy's token there is the row's next."""
        import torch

        answers: list[list[int]] = [[] for _ in prompts]
        chosen = batch.logits.argmax(-1).tolist()
        going = [not _write(answers[row], [token], budget, stop) for row, token in zip(batch.rows, chosen)]
        device = model_device(self.model)
        while any(going):
            batch.keep(going)
            drafts = [self.drafts.continuation(prompts[r], answers[r])[: budget - len(answers[r])] for r in batch.rows]
            width = 1 + max(len(d) for d in drafts)
            ids = torch.full((len(drafts), width), self.pad_token_id, dtype=torch.long)
            fed = torch.zeros((len(drafts), width), dtype=torch.long)
            for i, (row, draft) in enumerate(zip(batch.rows, drafts)):
                ids[i, : 1 + len(draft)] = torch.tensor([answers[row][-1]] + draft)
                fed[i, : 1 + len(draft)] = 1
            start = batch.mask.shape[1]
            batch.mask = torch.cat([batch.mask, fed], 1)
            logits = self.model(input_ids=ids.to(device), attention_mask=batch.mask.to(device),
                                position_ids=(batch.next_position[:, None] + torch.arange(width)).to(device),
                                use_cache=True, **{self._cache_keyword: batch.cache}).logits
            greedy = logits.argmax(-1).tolist()
            going = []
            for i, (row, draft) in enumerate(zip(batch.rows, drafts)):
                agreed = 0
                while agreed < len(draft) and greedy[i][agreed] == draft[agreed]:
                    agreed += 1
                batch.mask[i, start + 1 + agreed:] = 0  # the rejected draft tokens' slots
                batch.next_position[i] += 1 + agreed
                going.append(not _write(answers[row], draft[:agreed] + [greedy[i][agreed]], budget, stop))
        return answers


@dataclass
class _Batch:
    """Rows being decoded: their cache, the mask of the slots that hold their tokens, each one's next position, the
    logits of its last token (after the prefill), and which prompt each one is."""

    cache: Any
    mask: Any
    next_position: Any
    logits: Any
    rows: list[int]

    def keep(self, going: list[bool]) -> None:
        """Only the rows still `going`, in the cache and everywhere else."""
        import torch

        if all(going):
            return
        index = torch.tensor([i for i, g in enumerate(going) if g])
        self.cache.batch_select_indices(index)  # moved to each layer's device by transformers
        self.mask, self.next_position = self.mask[index], self.next_position[index]
        self.rows = [self.rows[i] for i in index.tolist()]

    def row_cache(self, i: int) -> list:
        """Row i's cache alone, without the slots it does not hold: [(keys, values)] per layer."""
        held = self.mask[i].bool()
        out = []
        for layer in self.cache.layers:
            slots = held.to(layer.keys.device)
            out.append((layer.keys[i: i + 1, :, slots], layer.values[i: i + 1, :, slots]))
        return out

    @staticmethod
    def joined(parts: list[_Batch]) -> _Batch:
        """One batch of `parts`, each part's slots right-aligned (left-padded) in the widest one's."""
        import torch
        from torch.nn.functional import pad

        from lpes.validation.cache_and_attention import growing_cache

        if len(parts) == 1:
            return parts[0]
        width = max(p.mask.shape[1] for p in parts)
        layers = []
        for n in range(len(parts[0].cache.layers)):
            layers.append(tuple(torch.cat([pad(getattr(p.cache.layers[n], kind), (0, 0, width - p.mask.shape[1], 0))
                                           for p in parts]) for kind in ("keys", "values")))
            for p in parts:  # a layer at a time: the parts' caches are not held twice
                p.cache.layers[n].keys = p.cache.layers[n].values = p.cache.layers[n].buffers = None
        return _Batch(growing_cache(layers), torch.cat([pad(p.mask, (width - p.mask.shape[1], 0)) for p in parts]),
                      torch.cat([p.next_position for p in parts]), torch.cat([p.logits for p in parts]),
                      [r for p in parts for r in p.rows])


def _stacked(kv: list, held: list[int]):
    """A cache of each row's shared prefix (`kv`, `held` positions; None, 0: none), right-aligned in one width, and
    the mask of the slots each row holds."""
    import torch

    from lpes.validation.cache_and_attention import growing_cache

    width = max(held)
    mask = torch.zeros((len(held), width), dtype=torch.long)
    for row, h in enumerate(held):
        mask[row, width - h:] = 1  # h = 0: no slot
    if width == 0:
        return growing_cache(), mask
    layers = []
    for layer, (keys, values) in enumerate(next(k for k in kv if k is not None)):
        shape = (len(held), keys.shape[1], width, keys.shape[3])
        stacked_keys, stacked_values = keys.new_zeros(shape), values.new_zeros(shape)
        for row, (mine, h) in enumerate(zip(kv, held)):
            if h:
                stacked_keys[row, :, width - h:] = mine[layer][0][0]
                stacked_values[row, :, width - h:] = mine[layer][1][0]
        layers.append((stacked_keys, stacked_values))
    return growing_cache(layers), mask


def _similar_lengths(lengths: list[int]) -> list[list[int]]:
    """Row indices grouped so that padding each group to its longest wastes at most an eighth of it."""
    groups: list[list[int]] = []
    for row in sorted(range(len(lengths)), key=lambda r: -lengths[r]):
        if groups and lengths[row] * 8 >= lengths[groups[-1][0]] * 7:
            groups[-1].append(row)
        else:
            groups.append([row])
    return groups


def _write(answer: list[int], tokens: list[int], budget: int, stop: set[int]) -> bool:
    """Append `tokens` to `answer` up to an end token or the budget; whether the answer is finished."""
    for token in tokens:
        answer.append(token)
        if token in stop or len(answer) >= budget:
            return True
    return False
