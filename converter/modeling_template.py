"""The `modeling_lpes.py` that lpes-convert writes next to the weights of a Hub folder.

It is short on purpose: a user should audit it before passing trust_remote_code=True.
The RoPE work is in `lpes_rope.py`, copied verbatim beside it.
"""

MODELING_LPES = '''\
"""LPES (Layer-specific Positional Embedding Scaling) for a {base_class} checkpoint.

Written by lpes-convert {lpes_version}. Needs only torch and transformers; never touches
the network. Each decoder layer h uses RoPE inv_freq / config.lpes["scales"][h]; the
weights are the base model's, unchanged. See lpes_rope.py for the per-layer RoPE.
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


class LpesConfig(CONFIG_MAPPING[BASE_MODEL_TYPE]):
    model_type = "{lpes_model_type}"


class LpesForCausalLM(getattr(transformers, BASE_CLASS)):
    config_class = LpesConfig

    def __init__(self, config):
        super().__init__(config)
        lpes = config.lpes
        apply_layer_scales(
            self,
            lpes["scales"],
            layers_path=lpes["layers_path"],
            rotary_path=lpes["rotary_path"],
            layer_types=lpes["layer_types"],
            interleaved=lpes["interleaved"],
        )


# Custom-code classes get none of transformers' checkpoint conversions (renamed or fused
# weights) unless registered under their own name; without this, such weights load as random.
_conversions = get_checkpoint_conversion_mapping(BASE_CLASS) or get_checkpoint_conversion_mapping(BASE_MODEL_TYPE)
if _conversions:
    register_checkpoint_conversion_mapping("LpesForCausalLM", _conversions, overwrite=True)
'''
