# make demo: search -> convert (hf, onnx) -> validate on the bundled model, from a fresh machine.
# make test: install and run ruff and the test suite.
# make demo-check: make demo in a fresh clone, then README's next steps on its output (nothing of it changes).
# make compat: the compatibility matrix, one venv per transformers release (compat/matrix.py; not part of make test).
# make lm-eval: lm-evaluation-harness on lpes's Hub folders, in a venv of its own (compat/lm_eval_check.py; not in make test).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
TORCH  := torch==2.13.0
DEMO   := demo-out

.PHONY: install test lint demo demo-check real-demo bench compat lm-eval lm-eval-install clean gpu-wheels

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(MAKE) --no-print-directory torch
	$(BIN)/pip install --quiet -e ".[test]"
	touch $@

# torch first, so that nothing later pulls a multi-GB CUDA build onto a machine without a GPU:
# with an NVIDIA GPU, the normal (CUDA) wheel; without one, a CPU wheel that pip's local wheel
# folders hold (torch alone, offline; its dependencies then come from the usual index), else
# the CPU build from PyTorch's own index.
.PHONY: torch
torch:
	@if $(BIN)/python -c "import torch" 2>/dev/null; then echo "torch already installed"; \
	elif command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/pip install --quiet "$(TORCH)"; \
	elif $(BIN)/pip install --quiet --no-index --no-deps "$(TORCH)" 2>/dev/null; then \
	  $(BIN)/pip install --quiet "$(TORCH)"; \
	else $(BIN)/pip install --quiet "$(TORCH)" --index-url https://download.pytorch.org/whl/cpu; fi

lint: install
	$(BIN)/ruff check .

# Two pytest workers (pytest-xdist), a test file each at a time so module fixtures are built once, and one
# torch thread per worker: two processes of torch's default one thread per core oversubscribe the cores,
# and OpenMP's spinning then makes both slower than one. 6.5 min on two cores, against 10 for one worker.
TEST_WORKERS ?= 2
test: install lint
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

demo: install
	$(BIN)/lpes-search lpes-tiny-induction --out $(DEMO)/best.json --data tiny-induction:examples=20 --scale-grid 0.5:4:0.25 --force
	$(BIN)/lpes-convert lpes-tiny-induction --curve $(DEMO)/best.json --to hf,onnx,genai --out $(DEMO)/lpes-tiny-induction-lpes --data tiny-induction:examples=40 --force
	@echo
	@echo "What you just saw: lpes-search scored RoPE scale curves for the bundled 4-layer model"
	@echo "lpes-tiny-induction (trained on contexts of at most 256 positions) on 100 prompts of 512"
	@echo "positions, each hiding 16 facts written 'key, decoy key, value', and kept the best curve. It also"
	@echo "found the best factor of YaRN and of dynamic NTK, the stock RoPE extensions every runtime has."
	@echo "Then it decided, on 200 held-out prompts (its table above; $(DEMO)/best.json, provenance.decision):"
	@echo "each option is held against the simpler ones with McNemar's exact test, and the simplest that no"
	@echo "more complex one beats at p < 0.05 ships. Here YaRN, one setting for every layer, answers more"
	@echo "held-out prompts than the per-layer curve: the decision is YaRN, and the curve is not shipped."
	@echo "lpes-convert shipped that decision (its line 'shipping the decision' says why): a Hub folder whose"
	@echo "config.json is stock YaRN, with no custom code, an ONNX export and an onnxruntime-genai package,"
	@echo "each validated on 200 held-out prompts; each export must answer as the PyTorch reference, and the"
	@echo "table's McNemar rows repeat the test on these prompts. --ship curve would ship the per-layer curve."
	@echo
	@echo "Where to look:"
	@echo "  $(DEMO)/best_curve.png, $(DEMO)/best_fitness.png          the curve, and the search by generation"
	@echo "  $(DEMO)/lpes-tiny-induction-lpes/README.md                 the model card (task, lengths, finding)"
	@echo "  $(DEMO)/lpes-tiny-induction-lpes/validation.png            accuracy by position, one line per variant"
	@echo "  $(DEMO)/lpes-tiny-induction-lpes/validation.json           every prompt's answer per variant"
	@echo "  $(BIN)/lpes-generate $(DEMO)/lpes-tiny-induction-lpes \"f3 k12 k33 v5 f30 k7 k9 v2 f1 q12\" --max-new-tokens 3   (prints v5)"
	@echo "What to try next on this output (it writes under $(DEMO)/next/ and overwrites nothing here): README, \"CLI\"."
	@echo "The first bundled model, lpes-tiny-kv (retrieval only), is in README: there a uniform scale suffices."

# make demo-check: README's block after the demo, run for real on the demo's output in a fresh clone of
# the committed tree (clone, make demo, tests/test_readme_after_demo.py); .ci/run runs it after make test.
CHECK := $(or $(TMPDIR),/tmp)/lpes-demo-check
demo-check:
	rm -rf $(CHECK) && git clone --quiet . $(CHECK)
	$(MAKE) --no-print-directory -C $(CHECK) demo
	cd $(CHECK) && LPES_AFTER_DEMO=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_readme_after_demo.py

# make real-demo: the same pipeline on a real pretrained model, SmolLM2-135M-Instruct from the package
# registry (converted once into ~/.cache/lpes), on its own task (lpes_task.json: 20 pairs of 6-digit
# numbers, 24-token answers, its chat template), lpes-search at its defaults: it scores right/wrong answers,
# ends with the decision on 200 held-out prompts (its table), and lpes-convert ships that decision,
# validated on 20 held-out prompts per variant (the decision's 200 are in best.json).
REAL := real-out
real-demo: install
	$(BIN)/lpes-search smollm2-135m --out $(REAL)/best.json --force
	$(BIN)/lpes-convert smollm2-135m --curve $(REAL)/best.json --to hf,onnx,genai --out $(REAL)/smollm2-135m-lpes --data kv:examples=4 --max-minutes 0 --force
	@echo
	@echo "What you just saw: lpes-search at its defaults on SmolLM2-135M-Instruct (30 layers, trained on"
	@echo "8,192 positions): 40 calibration prompts of about 400 tokens, uniform scales from 0.5 (compression)"
	@echo "to 4 and a per-layer CMA-ES search, then the decision on 200 held-out prompts (its table above):"
	@echo "measured here, one compression, s = 0.75 in every layer, answers 31.5% against 23.0% unscaled"
	@echo "(p = 0.0002), and no per-layer curve beat it. Then the ladder of lengths (its second table): each"
	@echo "option's next-token loss against the unscaled model's on a long text, up to the 8,192 positions the"
	@echo "model serves. s = 0.75 holds to 6,896 tokens and breaks past 0.75 x 8,192 = 6,144 (+0.60 nats/token"
	@echo "at 8,192), so the decision is the unscaled model; --serve-length 6896 would ship s = 0.75 with that"
	@echo "limit in config.json. lpes-convert shipped the decision as a Hub folder, an ONNX export and an"
	@echo "onnxruntime-genai package, each checked against the PyTorch reference on 20 held-out prompts."
	@echo "  $(REAL)/smollm2-135m-lpes/validation.md      the table; validation.json has every generation"

# Each row in a venv of its own, torch first (CPU build where there is no GPU): the Hub folders under
# transformers 5.0.0, the oldest release pyproject.toml declares, vLLM 0.33's range and the newest, against
# lpes's reference computed here; lpes installed and its fast tests run at the oldest declared and in vLLM's
# range; optimum-onnx 0.1.0 (transformers < 4.58, .venv-compat) on lpes's ONNX folder. Prints the matrix.
COMPAT     := .venv-compat
COMPAT_OUT := compat-out
compat: install
	PYTHON=$(PYTHON) $(BIN)/python compat/matrix.py

# lm-evaluation-harness, the tool long-context users evaluate with, in a venv of its own (.venv-lmeval: torch
# first, CPU build where there is no GPU, then lm-eval with its RULER extra and lpes, whose key-value task it
# runs from compat/lm_eval_tasks). Then compat/lm_eval_check.py: lm-eval on the per-layer Hub folder (custom
# code) and the stock-RoPE one lpes writes for lpes-tiny-kv, each prompt by prompt against lpes-validate
# (README, "lm-evaluation-harness"). Offline once installed; the steps and what each costs are printed.
LMEVAL         := .venv-lmeval
LMEVAL_VERSION := 0.4.13
LMEVAL_OUT     := lm-eval-out
lm-eval-install: $(LMEVAL)/.installed

$(LMEVAL)/.installed: pyproject.toml
	test -x $(LMEVAL)/bin/python || $(PYTHON) -m venv $(LMEVAL)
	$(MAKE) --no-print-directory torch BIN=$(LMEVAL)/bin
	$(LMEVAL)/bin/pip install --quiet "lm-eval[hf,ruler]==$(LMEVAL_VERSION)" -e .
	touch $@

lm-eval: install lm-eval-install
	$(BIN)/python compat/lm_eval_check.py --lm-eval $(LMEVAL)/bin/lm_eval --out $(LMEVAL_OUT)

# make gpu-wheels: what bench/gpu/check.sh installs on a GPU machine that has no network (cmaes; setuptools for a
# Python without it), into the ignored bench/gpu/wheels/ that travels with the working tree (bench/RESULTS.md).
gpu-wheels: install
	$(BIN)/pip download --quiet --no-deps --only-binary :all: --dest bench/gpu/wheels "cmaes>=0.10" "setuptools>=68"

bench: install
	$(BIN)/python bench/bench_onnx_latency.py
	$(BIN)/python bench/bench_search.py

clean:
	rm -rf $(VENV) $(DEMO) $(REAL) $(COMPAT) $(COMPAT)-* $(COMPAT_OUT) $(LMEVAL) $(LMEVAL_OUT) .pytest_cache .ruff_cache *.egg-info
