"""lpes's key-value task for lm-evaluation-harness (compat/lm_eval_tasks) loads in lm-eval's task manager and
serves lpes-validate's prompts, in its order, with lpes's answer budgets.

lm-eval is not in the test venv (it brings datasets, pyarrow, pandas, scipy and scikit-learn, about 500 MB):
the check runs in the venv `make lm-eval-install` makes (.venv-lmeval), else in this one if lm_eval is
importable here, else it is skipped with that reason. What lpes expects is computed here, by lpes in this venv.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lpes.converter.loading import load_tokenizer, resolve_model
from lpes.validation.scoring import answer_ids, answer_separator
from lpes.validation.tasks import load_examples

ROOT = Path(__file__).resolve().parent.parent
TASKS = ROOT / "compat" / "lm_eval_tasks"
LMEVAL_PYTHON = ROOT / ".venv-lmeval" / "bin" / "python"
DATA = "tiny-kv:examples=1,seed=3"

# Run in lm-eval's venv: build both tasks through lm-eval's TaskManager, as `lm_eval --include_path` does, and
# print what each serves.
PROBE = """
import json, sys
from lm_eval.tasks import TaskManager
folder, data, include = sys.argv[1:4]
manager = TaskManager(include_path=include, include_defaults=False,  # lpes's tasks alone: seconds, not a minute
                      metadata={"pretrained": folder, "data": data})
loaded = manager.load(["lpes_kv", "lpes_kv_tf"])
out = {}
for name, task in loaded["tasks"].items():
    docs = list(task.test_docs())
    out[name] = {"output_type": task.OUTPUT_TYPE, "metrics": sorted(task._metric_fn_list),
                 "docs": docs, "context": task.doc_to_text(docs[0]), "target": task.doc_to_target(docs[0]),
                 "requests": [list(task.construct_requests(doc, task.doc_to_text(doc), metadata=(name, i, 1)).arguments)
                              for i, doc in enumerate(docs[:2])]}
print(json.dumps(out))
"""


def _python_with_lm_eval() -> str:
    if LMEVAL_PYTHON.is_file():
        return str(LMEVAL_PYTHON)
    if importlib.util.find_spec("lm_eval") is not None:
        return sys.executable
    pytest.skip("lm-eval is not installed (make lm-eval-install makes .venv-lmeval; it is not in the test extra)")


def test_lm_eval_loads_lpes_kv_with_lpes_validates_prompts_and_budgets():
    python = _python_with_lm_eval()
    folder = resolve_model("lpes-tiny-kv")
    done = subprocess.run([python, "-c", PROBE, str(folder), DATA, str(TASKS)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    tasks = json.loads(done.stdout.strip().splitlines()[-1])

    examples = load_examples(folder, DATA)  # what lpes-validate scores on this folder with --data DATA
    tokenizer = load_tokenizer(folder)
    assert len(examples) == 5  # one per gold index
    for name in ("lpes_kv", "lpes_kv_tf"):
        docs = tasks[name]["docs"]
        assert [d["prompt"] for d in docs] == [e.prompt for e in examples]
        assert [d["answer"] for d in docs] == [e.answer for e in examples]
        assert [d["gold_index"] for d in docs] == [e.gold_index for e in examples]
        assert tasks[name]["context"] == examples[0].prompt
    generative, forced = tasks["lpes_kv"], tasks["lpes_kv_tf"]
    assert generative["output_type"] == "generate_until" and generative["metrics"] == ["best_subspan_em"]
    assert forced["output_type"] == "loglikelihood" and forced["metrics"] == ["teacher_forced_em"]
    # Each request's budget is the answer's own token count (the bundled task: one token), not the YAML's 100.
    for (context, kwargs), example in zip(generative["requests"], examples):
        assert context == example.prompt
        assert kwargs["max_gen_toks"] == len(answer_ids(tokenizer, example.prompt, example.answer)) == 1
    # Teacher forcing scores the answer as lpes tokenizes it after the prompt.
    assert forced["target"] == answer_separator(examples[0].prompt) + examples[0].answer == " " + examples[0].answer
