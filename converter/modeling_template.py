"""The `modeling_lpes.py` that lpes-convert writes next to the weights of a Hub folder.

It is short on purpose: a user should audit it before passing trust_remote_code=True.
The RoPE work is in `lpes_rope.py`, copied verbatim beside it.

LPES lives in the base model (`LpesModel`, mapped as `AutoModel`), because vLLM's
Transformers backend builds the model through `auto_map["AutoModel"]` and adds its own
head; `LpesForCausalLM` applies the same patch to the base model inside it. Attention stays
the base class's own, which calls `ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`
with the caller's kwargs and the layer's `layer_idx`: what that backend needs.
"""

MODELING_LPES = '''\
"""LPES (Layer-specific Positional Embedding Scaling) for a {base_class} checkpoint.

Written by lpes-convert {lpes_version}. Needs only torch and transformers; never touches
the network. Each decoder layer h uses RoPE inv_freq / config.lpes["scales"][h] (or, with
config.lpes["rope"], transformers' YaRN / dynamic NTK at that factor); the weights are
the base model's, unchanged. See lpes_rope.py for the per-layer RoPE.
"""

import transformers
from transformers.conversion_mapping import (
    get_checkpoint_conversion_mapping,
    register_checkpoint_conversion_mapping,
)
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from .lpes_rope import apply_layer_scales

BASE_MODEL_TYPE = "{base_model_type}"
BASE_CLASS = "{base_class}"
BASE_MODEL_CLASS = "{base_model_class}"


class LpesConfig(CONFIG_MAPPING[BASE_MODEL_TYPE]):
    model_type = "{lpes_model_type}"


def _apply_lpes(base_model, config):
    lpes = config.lpes
    apply_layer_scales(
        base_model,
        lpes["scales"],
        layers_path=lpes["layers_path"],
        rotary_path=lpes["rotary_path"],
        layer_types=lpes["layer_types"],
        interleaved=lpes["interleaved"],
        rope=lpes.get("rope"),
    )


def _register_conversions(lpes_class, base_class):
    # Custom-code classes get none of transformers' checkpoint conversions (renamed or fused
    # weights, MoE experts) unless registered under their own name; without this such weights
    # load as random. Done at construction, just before from_pretrained looks them up, because
    # another lpes folder in the same process registers the same class name for its own base.
    conversions = get_checkpoint_conversion_mapping(base_class) or get_checkpoint_conversion_mapping(BASE_MODEL_TYPE)
    if conversions:
        register_checkpoint_conversion_mapping(lpes_class, conversions, overwrite=True)


class LpesModel(getattr(transformers, BASE_MODEL_CLASS)):
    config_class = LpesConfig

    def __init__(self, config):
        _register_conversions("LpesModel", BASE_MODEL_CLASS)
        super().__init__(config)
        _apply_lpes(self, config)


class LpesForCausalLM(getattr(transformers, BASE_CLASS)):
    config_class = LpesConfig

    def __init__(self, config):
        _register_conversions("LpesForCausalLM", BASE_CLASS)
        super().__init__(config)
        _apply_lpes(self.base_model, config)
'''
