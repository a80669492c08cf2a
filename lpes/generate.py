"""lpes-generate: greedy text from an lpes ONNX export in onnxruntime, with the export's own tokenizer (options ->
plan -> execute, as every command)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lpes.exporters.targets import targets_where
from lpes.foundation.errors import LpesError
from lpes.foundation.spec_file import SPEC_FILE


@dataclass(frozen=True)
class GenerateOptions:
    """What the user asked for (the flags of lpes-generate)."""

    folder: Path  # an ONNX export, or an lpes-convert output folder holding one
    prompt: str
    max_new_tokens: int = 32
    chat_template: bool = True  # the prompt as the user turn of the tokenizer's chat template, where it has one
    provider: str | None = None  # onnxruntime's execution provider (None: the first available)


@dataclass(frozen=True)
class GeneratePlan:
    options: GenerateOptions
    onnx_dir: Path
    tokenizer: Any
    ids: list[int]  # the prompt, encoded as the model reads it
    templated: bool | None  # the prompt went in through the chat template (None: the tokenizer has none)
    notes: tuple[str, ...]  # said once every check has held


def plan(options: GenerateOptions) -> GeneratePlan:
    """Check the flags and the folder, read the tokenizer and encode the prompt; LpesError (one line) at the first
    problem, before the session loads."""
    from lpes.exporters.received import check_received_folder
    from lpes.validation.model_preflight import Request, preflight

    if options.max_new_tokens < 1:
        raise LpesError(f"--max-new-tokens must be at least 1, got {options.max_new_tokens}")
    onnx_dir = export_folder(options.folder)
    preflight(Request("lpes-generate"))  # no base model: the refusals every command makes
    check_received_folder(onnx_dir)  # names no file outside it, no library (exporters/received.py)
    _warn_past_positions(onnx_dir, 0, options.max_new_tokens)  # --max-new-tokens 1000000000: refused first
    from lpes.converter.loading import load_tokenizer  # torch and transformers: after the cheap refusals
    from lpes.validation.kv_data import has_chat_template, wrap_chat
    from lpes.validation.scoring import encode_prompt
    from lpes.validation.vocabulary import check_vocabulary

    tokenizer = load_tokenizer(onnx_dir)
    check_vocabulary(tokenizer, [options.prompt], "the prompt")  # before the session loads: one line
    prompt, notes, templated = options.prompt, [], None
    if has_chat_template(tokenizer):
        templated = options.chat_template
    if templated:
        prompt = wrap_chat(prompt, tokenizer)
        notes.append("the prompt goes in as the user turn of the model's chat template (--no-chat-template: as typed)")
    ids = encode_prompt(tokenizer, prompt)
    notes.append(_warn_past_positions(onnx_dir, len(ids), options.max_new_tokens))
    return GeneratePlan(options, onnx_dir, tokenizer, ids, templated, tuple(note for note in notes if note))


def execute(plan: GeneratePlan) -> str:
    """Say the plan's notes, load the session and decode greedily: the new text."""
    from lpes.exporters.onnx.runner import OrtCausalLM  # onnxruntime and torch: after every check has held

    lm = OrtCausalLM(plan.onnx_dir, plan.options.provider)
    for note in plan.notes:
        print(f"lpes-generate: {note}", file=sys.stderr)
    new = lm.greedy([plan.ids], plan.options.max_new_tokens, _eos_token_id(plan.onnx_dir, plan.tokenizer))[0]
    return plan.tokenizer.decode(new, skip_special_tokens=True)


def generate_text(onnx_dir: Path, prompt: str, max_new_tokens: int = 64, provider: str | None = None,
                  chat_template: bool = False) -> str:
    """Greedy continuation of `prompt` by the export in `onnx_dir` (tokenizer from the same folder): plan and
    execute in one call. `chat_template`: send the prompt as the user turn of the tokenizer's chat template,
    when it has one (lpes-generate's default; it says so on stderr)."""
    return execute(plan(GenerateOptions(Path(onnx_dir), prompt, max_new_tokens, chat_template, provider)))


def nothing_written(plan: GeneratePlan) -> str:
    """The line to say when the model wrote nothing: how the prompt went in, and what to try."""
    if plan.templated:
        hint = "the prompt went in through the chat template; try --no-chat-template"
    elif plan.templated is False:
        hint = "the prompt went in as typed; an instruct model may need its chat template (drop --no-chat-template)"
    else:
        hint = "the tokenizer has no chat template, so the prompt went in as typed"
    return f"the model wrote nothing: its first new token ends the sequence (or decodes to nothing); {hint}"


def export_folder(folder: Path) -> Path:
    """The export lpes-generate runs: in an lpes-convert output folder, or `folder` itself; else LpesError."""
    (target,) = targets_where("generates")
    found = target.find(folder)
    if found is None and (Path(folder) / target.marker).is_file():
        found = Path(folder)
    if found is None:
        raise LpesError(f"no {target.marker} in {folder}")
    return found


def _warn_past_positions(onnx_dir: Path, prompt_tokens: int, max_new_tokens: int) -> str | None:
    """The line to say when generation may run past the positions the model was trained on (config.json); LpesError
    past those its scales cover (trained x the largest scale of lpes_spec.json), or past MAX_POSITIONS."""
    from lpes.foundation.files import read_json_object

    path = onnx_dir / "config.json"
    trained = read_json_object(path).get("max_position_embeddings") if path.is_file() else None
    trained = trained if isinstance(trained, int) and not isinstance(trained, bool) and trained > 0 else None
    last = prompt_tokens + max_new_tokens
    scale = _largest_scale(onnx_dir)
    covered = min(MAX_POSITIONS, int(trained * scale)) if trained else MAX_POSITIONS
    if last > covered:
        what = (f"the prompt ({prompt_tokens} tokens) + {max_new_tokens} new tokens" if prompt_tokens
                else f"--max-new-tokens {max_new_tokens}")
        why = (f"{trained} trained positions x its largest scale {scale:g}" if covered < MAX_POSITIONS
               else "lpes-generate's limit")
        raise LpesError(f"{what} would reach position {last}, past the {covered} this model covers ({why}); "
                        "lower --max-new-tokens or shorten the prompt")
    if trained and last > trained and prompt_tokens:
        return (f"note: the prompt ({prompt_tokens} tokens) + {max_new_tokens} new tokens may reach position {last}, "
                f"past the {trained} the model was trained on (max_position_embeddings)")
    return None


# Positions lpes-generate goes to at most (a KV cache this long is gigabytes even for a small model).
MAX_POSITIONS = 1 << 20


def _largest_scale(onnx_dir: Path) -> float:
    from lpes.foundation.spec import load_spec

    path = onnx_dir / SPEC_FILE
    try:
        return max(1.0, *load_spec(path).scales) if path.is_file() else 1.0
    except (LpesError, ValueError, TypeError):
        return 1.0


def _eos_token_id(onnx_dir: Path, tokenizer) -> int | list[int] | None:
    """The end-of-sequence id(s) from generation_config.json, else the tokenizer's."""
    from lpes.converter.loading import read_generation_config

    eos = read_generation_config(onnx_dir).get("eos_token_id")  # checked: an id, a list of ids, or null
    return eos if eos not in (None, []) else tokenizer.eos_token_id
