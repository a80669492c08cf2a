"""lpes's key-value task inside lm-evaluation-harness: the prompts, budgets and verdicts of lpes-validate.

The prompts are built by lpes (`lpes.validation.tasks.examples_for`) exactly as lpes-validate builds them for
the folder lm-eval loads (`--model_args pretrained=DIR`): for an lpes-convert output folder, the task its curve
was searched on (its `lpes_spec.json`) with the base model's tokenizer and chat template, held-out split; for
any other folder, its own `lpes_task.json`, else lpes's kv task. Each prompt gets lpes's answer budget (the
task's `answer_tokens`, else the answer's own token count) and lpes's verdict: lost-in-the-middle's
best_subspan_em (`lpes.validation.scoring.answer_found`). lm-eval sends the prompt as text; it adds the
tokenizer's special tokens unless the text starts with its BOS, which is what lpes does (`encode_prompt`),
so both score the same token ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets
from lm_eval.api.task import ConfigurableTask

from lpes.validation.scoring import answer_found, answer_ids, answer_separator

# --metadata keys, each as the lpes-validate flag of the same name.
OPTIONS = ("data", "chat_template", "answer_tokens", "base_model")


def lpes_examples(folder: str | Path, data: str | None = None, chat_template: bool | None = None,
                  answer_tokens: int | None = None, base_model: str | None = None) -> list[dict[str, Any]]:
    """lpes-validate's examples for `folder`, in its order, each with its answer budget (`max_gen_toks`)."""
    from lpes.converter.loading import DEFAULT_MODEL, load_tokenizer, resolve_model
    from lpes.foundation.errors import LpesError
    from lpes.validation.report import find_spec, resolve_task
    from lpes.validation.tasks import examples_for

    try:
        spec = find_spec(Path(folder))
    except LpesError:  # not an lpes-convert output folder: the folder's own task
        spec = None
    model = base_model or ((spec.provenance.get("base_model") or DEFAULT_MODEL) if spec else folder)
    model_path = resolve_model(model)
    task = resolve_task(model_path, spec, data, chat_template, answer_tokens)
    tokenizer = load_tokenizer(model_path)
    examples = examples_for(task.config, model_path, tokenizer=tokenizer, use_chat_template=task.chat_template,
                            split="validation")
    return [{"example_id": i, "prompt": e.prompt, "answer": e.answer, "gold_index": e.gold_index,
             "max_gen_toks": e.answer_tokens or len(answer_ids(tokenizer, e.prompt, e.answer)),
             "continuation": answer_separator(e.prompt) + e.answer}  # lpes_kv_tf's target, as lpes tokenizes it
            for i, e in enumerate(examples)]


def dataset(**metadata: Any) -> dict[str, datasets.Dataset]:
    """lm-eval's `custom_dataset`: called with `--model_args` and `--metadata` merged."""
    folder = metadata.get("pretrained") or metadata.get("tokenizer")
    if not folder:
        raise ValueError("lpes_kv needs the model folder: --model_args pretrained=DIR")
    options = {name: metadata[name] for name in OPTIONS if metadata.get(name) is not None}
    return {"test": datasets.Dataset.from_list(lpes_examples(folder, **options))}


def process_results(doc: dict[str, Any], results: list[str]) -> dict[str, float]:
    return {"best_subspan_em": float(answer_found(results[0], doc["answer"]))}


def process_loglikelihood(doc: dict[str, Any], results: list[tuple[float, bool]]) -> dict[str, float]:
    """lpes_kv_tf: right iff every answer token is the argmax after the prompt and the answer before it."""
    _, is_greedy = results[0]
    return {"teacher_forced_em": float(is_greedy)}


class LpesKvTask(ConfigurableTask):
    """The YAML's task, with each prompt's own answer budget (lm-eval's YAML holds one for every prompt)."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        super().__init__(config={k: v for k, v in (config or {}).items() if k != "class"})

    def construct_requests(self, doc: dict[str, Any], ctx: str, **kwargs: Any):
        request = super().construct_requests(doc, ctx, **kwargs)
        if self.OUTPUT_TYPE == "generate_until":
            request.arguments[1]["max_gen_toks"] = doc["max_gen_toks"]
        return request
