# make demo: search -> convert (hf, onnx) -> validate on the bundled model, from a fresh machine.
# make test: install and run ruff and the test suite.
# make compat: a second venv with optimum-onnx on transformers 4.x loads lpes's ONNX folder (not part of make test).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
TORCH  := torch==2.13.0
DEMO   := demo-out

.PHONY: install test lint demo bench compat clean

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

test: install lint
	$(BIN)/python -m pytest -q

demo: install
	$(BIN)/lpes-search lpes-tiny-kv --out $(DEMO)/best.json --data tiny-kv:examples=8 --population 12 --generations 8 --force
	$(BIN)/lpes-convert lpes-tiny-kv --curve $(DEMO)/best.json --to hf,onnx --out $(DEMO)/lpes-tiny-kv-lpes --force
	@echo
	@echo "What you just saw: lpes-search scored RoPE scale curves for the bundled 4-layer model"
	@echo "(trained on contexts of at most 256 positions) on 40 prompts of 1024 positions, each"
	@echo "hiding 16 facts, and kept the best ($(DEMO)/best.json). lpes-convert baked that curve into"
	@echo "a Hub folder and an ONNX export, then scored 100 held-out prompts: the table above gives"
	@echo "accuracy by the position of the needed fact (0 = farthest from the query) for the"
	@echo "unscaled model, the best single scale for every layer, and the LPES curve in PyTorch,"
	@echo "in the Hub folder and in onnxruntime; each export must answer as the PyTorch reference."
	@echo
	@echo "Where to look:"
	@echo "  $(DEMO)/best_curve.png, $(DEMO)/best_fitness.png     the curve, and the search by generation"
	@echo "  $(DEMO)/lpes-tiny-kv-lpes/README.md                   the model card (task, lengths, finding)"
	@echo "  $(DEMO)/lpes-tiny-kv-lpes/validation.png              accuracy by position, one line per variant"
	@echo "  $(DEMO)/lpes-tiny-kv-lpes/validation.json             every prompt's answer per variant"
	@echo "  $(BIN)/lpes-generate $(DEMO)/lpes-tiny-kv-lpes \"p3_1 f2 q3\" --max-new-tokens 1   (prints a1)"

# optimum-onnx 0.1.0 needs transformers < 4.58: its own venv, torch first (CPU build where there is no GPU).
COMPAT     := .venv-compat
COMPAT_OUT := compat-out
compat: install
	test -x $(COMPAT)/bin/python || $(PYTHON) -m venv $(COMPAT)
	$(MAKE) --no-print-directory torch BIN=$(COMPAT)/bin
	$(COMPAT)/bin/pip install --quiet "optimum-onnx[onnxruntime]==0.1.0" "transformers<4.58"
	$(BIN)/lpes-convert lpes-tiny-kv --curve compat/lpes-tiny-kv-spec.json --to hf,onnx --out $(COMPAT_OUT)/lpes-tiny-kv-lpes --force --no-validate
	$(BIN)/python compat/expected_tokens.py $(COMPAT_OUT)/lpes-tiny-kv-lpes $(COMPAT_OUT)/expected.json
	$(COMPAT)/bin/python compat/check_optimum.py $(COMPAT_OUT)/lpes-tiny-kv-lpes/onnx $(COMPAT_OUT)/expected.json

bench: install
	$(BIN)/python bench/bench_onnx_latency.py
	$(BIN)/python bench/bench_search.py

clean:
	rm -rf $(VENV) $(DEMO) $(COMPAT) $(COMPAT_OUT) .pytest_cache .ruff_cache *.egg-info
