"""Quiet success (issue 43): the third-party lines a user cannot act on stay off stderr, one lpes line stands
for a warning that means something, and --verbose shows them all.

Each case runs in a process of its own, as a command does (the filters, once installed, last the process), and
triggers the libraries' real warnings: transformers' own generate past max_position_embeddings (its "friendly
reminder") and its own YaRN config check (original_max_position_embeddings against an explicit factor, warned
once per config); numpy's overflow RuntimeWarning as matplotlib's code raises it while placing a steep curve.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = r"""
import sys, warnings
from lpes.foundation.commands import ArgumentParser
ArgumentParser(prog="lpes-x").parse_args(sys.argv[1:])
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import logging
for _ in range(3):  # as the per-layer rotaries of a YaRN model read the config, several times
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         rope_parameters={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16,
                                          "rope_theta": 10000.0})
torch.manual_seed(0)
model = LlamaForCausalLM(config).eval()
model.config.max_position_embeddings = 8  # a 10-token prompt is past it
model.generation_config.pad_token_id = 0
model.generate(torch.arange(1, 11)[None], max_new_tokens=2, do_sample=False)
warnings.warn_explicit("overflow encountered in multiply", RuntimeWarning, "transforms.py", 1,
                       module="matplotlib.transforms")
warnings.warn_explicit("overflow encountered in multiply", RuntimeWarning, "mine.py", 1, module="mine")
logging.get_logger("transformers.modeling_utils").warning("a warning lpes does not know")
"""

NOTE = ("lpes-x: note: transformers ignores this config's RoPE field original_max_position_embeddings (it uses the "
        "explicit factor); the results are for that factor (--verbose shows transformers' warning)")


def run(*flags: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", SCRIPT, *flags], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [line for line in done.stderr.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def quiet() -> list[str]:
    return run()


def test_noise_is_dropped_and_a_meaningful_warning_is_one_lpes_line(quiet):
    assert not any("friendly reminder" in line for line in quiet), quiet
    assert not any("matplotlib" in line or "transforms.py" in line for line in quiet), quiet
    assert not any("explicitly set RoPE scaling factor" in line for line in quiet), quiet
    assert quiet.count(NOTE) == 1, quiet


def test_other_warnings_still_show(quiet):
    assert any("a warning lpes does not know" in line for line in quiet), quiet
    assert any("mine.py" in line and "overflow" in line for line in quiet), quiet  # only matplotlib's is dropped


def test_verbose_shows_the_libraries_own_lines():
    loud = run("--verbose")
    assert any("friendly reminder" in line for line in loud), loud
    assert any("explicitly set RoPE scaling factor" in line for line in loud), loud
    assert any("transforms.py" in line for line in loud), loud
    assert NOTE not in loud
