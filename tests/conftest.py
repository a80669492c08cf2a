"""Shared fixtures: tiny random-weight models of the architectures lpes supports.

`tiny_model_dir(model_type, tmp_path)` builds a model small enough for a unit test
(hidden 32-64, 2-3 layers, vocabulary 100), saves it with a word-level tokenizer,
and returns the folder. `plain_greedy` is the independent greedy reference. Other test
files import them:

    from conftest import plain_greedy, tiny_model_dir

Each call builds the same weights (fixed seed), so two folders of one type are
interchangeable.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

# torch's structured-trace logger ("torch.__trace") logs an empty DEBUG record per interned
# string during torch.export; outside pytest nothing handles them (it does not propagate and its
# lazy handler removes itself without TORCH_TRACE), but pytest attaches its capture handler to
# every non-propagating logger, so a failing export test printed dozens of empty
# "DEBUG torch.__trace" lines. Disabled for the test session only; TORCH_TRACE still works elsewhere.
logging.getLogger("torch.__trace").disabled = True

IS_ROOT = os.geteuid() == 0
# Root ignores file permissions through these two capabilities; without them it is an owner like any other.
DROP_PERMISSION_BYPASS = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def permission_prefix() -> list[str] | None:
    """What to put before a command so that file permissions deny it: nothing unless the tests run as root,
    setpriv dropping root's bypass if they do, None where that cannot be done (no setpriv here)."""
    if not IS_ROOT:
        return []
    return DROP_PERMISSION_BYPASS if shutil.which("setpriv") else None


VOCAB_SIZE = 100
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2

_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "pad_token_id": PAD_ID,
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "tie_word_embeddings": False,
}

# What each architecture adds to the common shape; small sliding windows so that
# a 64-token prefill actually crosses them.
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {"sliding_window": 16},
    "qwen2": {},
    "qwen3": {"head_dim": 8},
    "gemma2": {
        "head_dim": 8,
        "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    },
    # Partial rotary: only part of each head is rotated.
    "phi3": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
    "stablelm": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
}


def tiny_config(model_type: str, **overrides: Any):
    """A transformers config of `model_type` with the tiny shape (plus `overrides`)."""
    from transformers import AutoConfig

    kwargs = {**_COMMON, **TINY_CONFIGS.get(model_type, {}), **overrides}
    return AutoConfig.for_model(model_type, **kwargs)


def tiny_tokenizer():
    """A whitespace word-level tokenizer over VOCAB_SIZE words: <pad> <bos> <eos> <unk> w4 .. w99.

    Every word is one token and decodes back to itself; it adds no <bos>.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{i}" for i in range(4, VOCAB_SIZE)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


def tiny_model_dir(model_type: str, tmp_path: Path, seed: int = 0, **overrides: Any) -> Path:
    """Save a random tiny `model_type` causal LM (and tokenizer) under `tmp_path`; returns the folder."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    folder = Path(tmp_path) / f"tiny-{model_type}"
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, **overrides))
    _spread_weights(model)
    model.generation_config = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def _spread_weights(model: torch.nn.Module) -> None:
    """Larger random weights than the default init (std 0.02): logits of a tiny model then
    differ clearly between tokens, so greedy decoding has no near-ties that float noise could flip,
    and a wrong RoPE changes the argmax instead of hiding under the noise."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.3 if "embed" in name else 1.0 / param.shape[-1] ** 0.5)


def plain_greedy(model: torch.nn.Module, ids: list[int], steps: int) -> list[int]:
    """Greedy decoding the slow, obvious way: one unpadded full forward per token, no cache.

    The independent reference for every greedy path under test (batched, left-padded, cached,
    onnxruntime, genai): it shares no padding, position or cache code with them.
    """
    ids, new = list(ids), []
    with torch.no_grad():
        for _ in range(steps):
            new.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
            ids.append(new[-1])
    return new


@pytest.fixture
def make_tiny_model(tmp_path):
    """Fixture form: `make_tiny_model("llama")` -> folder."""

    def make(model_type: str, **overrides: Any) -> Path:
        return tiny_model_dir(model_type, tmp_path, **overrides)

    return make
