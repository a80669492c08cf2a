"""The Hub folder against vLLM's Transformers backend contract, called the way the backend calls it.

vLLM itself needs a GPU build, so its calls are emulated from its source
(vllm/model_executor/models/transformers/base.py and registry.py):

- the architecture is not a transformers class, so the class comes from the first
  `auto_map` key starting with "AutoModel" (after "AutoConfig"), and must report
  `is_backend_compatible()` (`_supports_attention_backend`);
- it builds that base model (`AutoModel.from_config`) with `config._attn_implementation`
  set to its own registered attention function, and calls it as
  `model(input_ids=..., position_ids=..., use_cache=False, attention_instances=..., return_dict=False)`;
- its attention function finds the layer's KV-cache attention as
  `attention_instances[module.layer_idx]` and never looks at the attention mask (the backend
  is causal by itself).

Here that function is registered with transformers' AttentionInterface, computes causal
SDPA itself, and records every layer_idx it is called with. Hidden states must equal the
reference (`reference.apply` on the stock model), with positions starting anywhere.
"""

import json

import pytest
import torch
from conftest import tiny_model_dir
from transformers import AttentionInterface, AutoConfig, AutoModel, AutoModelForCausalLM

from lpes.cli import convert_main
from lpes.converter.reference import apply
from lpes.foundation.spec import Spec, dump_spec

SCALES = [2.0, 1.0, 3.5]
SPEC = Spec.from_scales(SCALES)
PROBE = "lpes_vllm_probe"
MODELS = {
    "llama": {},
    "qwen3": {},
    "mixtral": {},  # fused experts: needs the conversions registered for the custom class
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "head_dim": 8},
}


class LayerAttention:
    """Stands in for vLLM's per-layer `Attention` instance: causal SDPA, and a log of its calls."""

    def __init__(self, layer_idx: int, calls: list[int]):
        self.layer_idx, self.calls = layer_idx, calls

    def forward(self, query, key, value, scaling):
        self.calls.append(self.layer_idx)
        groups = query.shape[1] // key.shape[1]
        key, value = (t.repeat_interleave(groups, dim=1) for t in (key, value))
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling)
        return out.transpose(1, 2).contiguous()


def vllm_like_attention(module, query, key, value, attention_mask, scaling=None, attention_instances=None, **kwargs):
    """The shape of vLLM's `vllm_flash_attention_forward`: the instance by module.layer_idx, mask ignored."""
    return attention_instances[module.layer_idx].forward(query, key, value, scaling), None


AttentionInterface.register(PROBE, vllm_like_attention)


def resolve_like_vllm(folder):
    """vLLM's registry `_try_resolve_transformers`: config class first, then the first AutoModel* class."""
    import transformers
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    config = json.loads((folder / "config.json").read_text())
    assert getattr(transformers, config["architectures"][0], None) is None  # so vLLM turns to auto_map
    auto_map = config["auto_map"]
    assert next(iter(auto_map)) == "AutoConfig"
    name = next(key for key in auto_map if key.startswith("AutoModel"))
    model_class = get_class_from_dynamic_module(auto_map[name], str(folder))
    assert model_class.is_backend_compatible()  # _supports_attention_backend
    return model_class


def hub_folder(tmp_path, model_type, spec=SPEC, **overrides):
    base = tiny_model_dir(model_type, tmp_path, **{**MODELS[model_type], **overrides})
    dump_spec(spec, tmp_path / "spec.json")
    out = tmp_path / "out"
    assert convert_main([str(base), "--curve", str(tmp_path / "spec.json"), "--to", "hf", "--out", str(out),
                         "--no-validate"]) == 0
    return base, out


def reference_hidden(base, input_ids, position_ids, spec=SPEC):
    model = apply(AutoModelForCausalLM.from_pretrained(base).eval(), spec)
    calls = []
    instances = {i: LayerAttention(i, calls) for i in range(len(SCALES))}
    model.config._attn_implementation = PROBE
    with torch.no_grad():
        return model.model(input_ids=input_ids, position_ids=position_ids, use_cache=False,
                           attention_instances=instances).last_hidden_state


@pytest.mark.parametrize("model_type", list(MODELS))
def test_base_model_runs_lpes_through_the_attention_interface(tmp_path, model_type):
    base, out = hub_folder(tmp_path, model_type)
    assert resolve_like_vllm(out).__name__ == "LpesModel"

    model = AutoModel.from_pretrained(out, trust_remote_code=True, attn_implementation=PROBE).eval()
    assert type(model).__name__ == "LpesModel"
    assert type(model.rotary_emb).__name__ == "LayerScaledRotary"  # the folder's own lpes_rope.py

    seq, start = 40, 100  # a later chunk: RoPE must follow position_ids, not the chunk's own indices
    input_ids = torch.randint(0, 100, (1, seq), generator=torch.Generator().manual_seed(0))
    position_ids = torch.arange(start, start + seq)[None]
    calls = []
    instances = {i: LayerAttention(i, calls) for i in range(len(SCALES))}
    with torch.no_grad():
        hidden = model(input_ids=input_ids, position_ids=position_ids, use_cache=False,
                       attention_instances=instances, return_dict=False)[0]
    assert calls == list(range(len(SCALES)))
    expected = reference_hidden(base, input_ids, position_ids)
    assert (hidden - expected).abs().max().item() <= 1e-5
    unscaled = AutoModel.from_pretrained(base, attn_implementation=PROBE).eval()
    with torch.no_grad():
        plain = unscaled(input_ids=input_ids, position_ids=position_ids, use_cache=False,
                         attention_instances=instances).last_hidden_state
    assert (plain - expected).abs().max().item() > 1e-3  # the scales matter at these positions


def test_backend_builds_the_base_model_from_config_on_meta(tmp_path):
    """vLLM: AutoModel.from_config(config, trust_remote_code=True) on the meta device, then its own weights."""
    _, out = hub_folder(tmp_path, "llama")
    config = AutoConfig.from_pretrained(out, trust_remote_code=True)
    config._attn_implementation = PROBE
    with torch.device("meta"):
        model = AutoModel.from_config(config, trust_remote_code=True)
    assert type(model).__name__ == "LpesModel"
    assert type(model.rotary_emb).__name__ == "LayerScaledRotary"  # the folder's own lpes_rope.py
    assert [len(layer._lpes_hooks) for layer in model.layers] == [1, 0, 1]


def test_causal_lm_holds_the_same_patch(tmp_path):
    base, out = hub_folder(tmp_path, "qwen3")
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    assert type(model.model.rotary_emb).__name__ == "LayerScaledRotary"
    ids = torch.randint(0, 100, (2, 30), generator=torch.Generator().manual_seed(1))
    reference = apply(AutoModelForCausalLM.from_pretrained(base).eval(), Spec.from_scales(SCALES))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)


def test_base_model_compiles_without_graph_breaks(tmp_path):
    """vLLM compiles the base model class (support_torch_compile); the LPES hooks must trace in one graph."""
    base, out = hub_folder(tmp_path, "llama")
    model = AutoModel.from_pretrained(out, trust_remote_code=True, attn_implementation=PROBE).eval()
    input_ids = torch.randint(0, 100, (1, 24), generator=torch.Generator().manual_seed(2))
    position_ids = torch.arange(24)[None]
    calls = []
    instances = {i: LayerAttention(i, calls) for i in range(len(SCALES))}
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        hidden = compiled(input_ids=input_ids, position_ids=position_ids, use_cache=False,
                          attention_instances=instances, return_dict=False)[0]
    expected = reference_hidden(base, input_ids, position_ids)
    assert (hidden - expected).abs().max().item() <= 1e-5


@pytest.mark.parametrize("rope_type", ["yarn", "dynamic"])
def test_per_layer_yarn_and_dynamic_run_through_the_backend_and_compile(tmp_path, rope_type):
    """A spec's rope_type reaches the folder's LpesModel; the backend's chunk at positions 100.. (past the
    trained 64) gets each layer's RoPE at its factor, eager and compiled in one graph."""
    from lpes.foundation.spec import RopeScheme

    spec = Spec.from_scales(SCALES, rope=RopeScheme(rope_type))
    base, out = hub_folder(tmp_path, "llama", spec, max_position_embeddings=64)
    model = AutoModel.from_pretrained(out, trust_remote_code=True, attn_implementation=PROBE).eval()
    assert model.rotary_emb.rope["rope_type"] == rope_type
    input_ids = torch.randint(0, 100, (1, 40), generator=torch.Generator().manual_seed(3))
    position_ids = torch.arange(100, 140)[None]
    instances = {i: LayerAttention(i, []) for i in range(len(SCALES))}
    kwargs = {"input_ids": input_ids, "position_ids": position_ids, "use_cache": False,
              "attention_instances": instances, "return_dict": False}
    expected = reference_hidden(base, input_ids, position_ids, spec)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        assert (model(**kwargs)[0] - expected).abs().max().item() <= 1e-5
        assert (compiled(**kwargs)[0] - expected).abs().max().item() <= 1e-5
    linear = reference_hidden(base, input_ids, position_ids)
    assert (linear - expected).abs().max().item() > 1e-3  # the scheme matters at these positions
