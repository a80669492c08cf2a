"""The task validation scores: each of --data, --chat-template, --answer-tokens over what the curve's search
used, over the model folder's own task; whether its words encode with the model's tokenizer; and how it is
named in the report and in a published command."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lpes.foundation.errors import LpesError
from lpes.foundation.spec import Spec
from lpes.validation.examples import Example


@dataclass(frozen=True)
class ResolvedTask:
    """The examples' task, the chat-template choice, and how they relate to the task the curve was searched on."""

    config: Any  # tasks.TaskConfig
    chat_template: bool
    data: str | None  # the description used (None: the model folder's own task)
    source: str  # "the search's", "--data", "the model's own"
    searched: Any = None  # spec.SearchTask, or None
    override: str | None = None  # one line when a flag replaces what the search used
    other_task: bool = False  # a flag makes it another task than the curve was searched on (not just fewer examples)


def check_answer_tokens(value: int | None) -> None:
    """--answer-tokens, the same for lpes-search, lpes-validate and lpes-convert."""
    from lpes.foundation.spec import MAX_ANSWER_TOKENS

    if value is not None and not 1 <= value <= MAX_ANSWER_TOKENS:
        raise LpesError(f"--answer-tokens must be in 1..{MAX_ANSWER_TOKENS}, got {value}")


def resolve_task(model_path: Path, spec: Spec | None, data: str | None = None, chat_template: bool | None = None,
                 answer_tokens: int | None = None) -> ResolvedTask:
    """The task validation scores: each of `data`, `chat_template`, `answer_tokens` (the user's flags), where
    given, over what the spec's search used (`Spec.search_task`), over the model folder's own task.

    LpesError when the search's data cannot be read here (a file that is not where the search read it).
    """
    from lpes.validation.tasks import task_config

    searched = spec.search_task if spec is not None else None
    used = data if data is not None else (searched.data if searched is not None else None)
    try:
        config = task_config(model_path, used)
    except LpesError as err:
        if data is None and used is not None:
            raise LpesError(f"the curve was searched on --data {used}, which cannot be read here ({err}); pass "
                            "--data to validate on it (or on another task)") from None
        raise
    if data is None and searched is not None:
        config = replace(config, answer_tokens=searched.answer_tokens)
    if answer_tokens is not None:
        config = replace(config, answer_tokens=answer_tokens)
    chat = chat_template if chat_template is not None else (searched.chat_template if searched else True)
    changed, other_task = [], False
    if searched is not None:
        if data is not None and data != searched.data:
            same = _same_task_but_size(model_path, data, searched.data)
            other_task |= not same
            changed.append(f"--data {data} (searched on {searched.data or 'the model folder task'}"
                           f"{': the same task, other example counts' if same else ''})")
        if chat_template is not None and chat_template != searched.chat_template:
            other_task = True
            changed.append(f"chat template {_on(chat_template)} (searched with it {_on(searched.chat_template)})")
        if answer_tokens is not None and answer_tokens != searched.answer_tokens:
            other_task = True
            changed.append(f"--answer-tokens {answer_tokens} (searched with {_budget(searched.answer_tokens)})")
    override = None
    if changed:
        override = f"validating on {'; '.join(changed)}" + (": not the task the curve was searched on"
                                                             if other_task else "")
    source = "--data" if data is not None else ("the search's" if searched is not None else "the model's own")
    return ResolvedTask(config, chat, used, source, searched, override, other_task)


def check_task_encodes(model_path: Path, config, task: ResolvedTask, source: str | None = None) -> int:
    """The task's prompts and answers encode with the model's tokenizer (`vocabulary.check_vocabulary`, as lpes-search
    checks its data), else LpesError in one line: lpes-convert calls it at plan time, before any export.
    Returns the longest sequence validation generates (prompt + answer budget, in tokens), which an export with
    a fixed context (genai) must hold; 0 without tokenizer files (key-value scoring is then skipped, and says why).
    The task's sizes are bounded first (validation/sizes.py): its prompts against memory before they are built,
    their positions against the model's trained length (a bundled task's from its description, before)."""
    from lpes.converter.loading import has_tokenizer, load_tokenizer
    from lpes.validation.scoring import longest_sequence
    from lpes.validation.sizes import check_positions, check_prompt_memory
    from lpes.validation.tasks import examples_for

    if not has_tokenizer(model_path):
        return 0
    flag = _flag(task)
    model = source or Path(model_path).name
    if task.config.length is not None:  # a bundled model's task: `length` is the positions a prompt takes
        check_positions(config, task.config.length + (task.config.answer_tokens or 1), flag, model,
                        "ask for a shorter length")
    check_prompt_memory([(flag, task.config)])  # before any prompt is built
    tokenizer = load_tokenizer(model_path)
    examples = examples_for(task.config, model_path, tokenizer=tokenizer, use_chat_template=task.chat_template,
                            split="validation")
    check_examples_encode(tokenizer, examples, task, source)
    longest = longest_sequence(tokenizer, examples)
    check_positions(config, longest, flag, model, "ask for fewer pairs or a shorter length")
    return longest


def _flag(task: ResolvedTask) -> str:
    """What a refusal of the task's sizes names: --data, or the task the curve was searched on."""
    if task.source == "--data":
        return "--data"
    return f"validation on {shareable_data(task.data) or 'the model folder task'} ({task.source} task)"


_TASK_SOURCES = {"--data": "from --data", "the search's": "the task the curve was searched on",
                 "the model's own": "the model's own task"}


def check_examples_encode(tokenizer, examples: Sequence[Example], task: ResolvedTask | None,
                          source: str | None = None) -> None:
    """Every prompt and answer of `examples` encodes to tokens; else LpesError naming the tokenizer and the task."""
    from lpes.validation.vocabulary import check_vocabulary

    if task is None:
        what = "the validation examples"
    elif task.data is None:
        what = f"validation on the model folder's own task ({task.config.task})"
    elif task.source == "--data":
        what = f"validation on --data {shareable_data(task.data)}"
    else:
        what = f"validation on {shareable_data(task.data)} ({_TASK_SOURCES.get(task.source, task.source)})"
    try:
        check_vocabulary(tokenizer, [e.prompt for e in examples] + [e.answer for e in examples], what, source)
    except LpesError as err:
        if task is not None and task.source == "the search's":
            raise LpesError(f"{err}; pass --data for a task in this model's words") from None
        raise


def _same_task_but_size(model_path: Path, data: str, searched: str | None) -> bool:
    """The two descriptions give the same task but for how many examples per gold index."""
    from lpes.validation.tasks import task_config

    try:
        mine, theirs = task_config(model_path, data), task_config(model_path, searched)
    except LpesError:
        return False
    return replace(mine, examples_per_index=None) == replace(theirs, examples_per_index=None)


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def _budget(tokens: int | None) -> str:
    return "the value's own tokens" if tokens is None else f"{tokens} tokens"


def task_line(task: ResolvedTask | None, tokenizer, prompt_tokens: Sequence[int]) -> str:
    """The report's line on the task: its data, where it came from, chat template, answer budget, prompt lengths."""
    if task is None:
        return "examples given by the caller"
    from lpes.validation.kv_data import has_chat_template

    data = shareable_data(task.data) or f"the model folder's own ({task.config.task})"
    chat = (_on(task.chat_template) if tokenizer is None or has_chat_template(tokenizer)
            else "none (the tokenizer has none)")
    line = f"{data} ({task.source} task), chat template {chat}, answer budget {_budget(task.config.answer_tokens)}"
    if prompt_tokens:
        line += f", prompts of {token_span(min(prompt_tokens), max(prompt_tokens))} tokens"
    searched = task.searched.prompt_tokens if task.searched is not None else None
    if searched:
        line += f" (the search's: {token_span(*searched)})"
    return line


def token_span(low: int, high: int) -> str:
    return str(low) if low == high else f"{low}-{high}"


def shareable_data(data: str | None) -> str | None:
    """--data as a published file may hold it: a relative file path as given (convert and validate, run
    where the search ran, read the same file), an absolute one by its name alone (no path of this machine)."""
    from lpes.validation.tasks import _is_description

    if data is None:
        return None
    if not _is_description(data):
        return shown_path(data)
    task, _, rest = data.partition(":")
    items = [f"file={shown_path(item.strip()[5:])}" if item.strip().startswith("file=") else item
             for item in rest.split(",")]
    return f"{task}:{','.join(items)}"


def shown_path(path: str) -> str:
    return Path(path).name if Path(path).expanduser().is_absolute() else path
