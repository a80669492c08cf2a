"""What each RoPE scheme lpes applies or ships is, in one table: how transformers and vLLM compute it, the factors
each takes, and where it is the unscaled model (issue 50). Search, the decision, convert and validation read these
facts here; tests/test_rope_table.py holds every row against transformers' own RoPE functions and vLLM's formulas.

`linear` divides every frequency by the factor (position interpolation): transformers and vLLM alike, vLLM sizing
its cos/sin cache and its default max_model_len at max_position_embeddings x factor (Gemma 3 excepted, whose path
skips that). `yarn` blends interpolated and original frequencies between beta_slow and beta_fast and scales
attention by 0.1 ln(factor) + 1: static in both. `dynamic` (NTK-aware) is where they part: transformers keeps the
model's own frequencies until a sequence passes max_position_embeddings and then grows the base with the
sequence's length; vLLM builds one cache, the base grown for max_position_embeddings x factor, and uses it at
every length (vLLM issue 3488). A config that means two models is not shipped (foundation/decision.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RopeFacts:
    rope_type: str  # config.json's rope_parameters.rope_type, as transformers and vLLM name it
    name: str  # what readers know it as
    parameters: tuple[str, ...]  # the spec's rope_parameters for it (foundation/spec_fields.py)
    least_factor: float  # transformers warns at load below it
    unscaled_at_factor_one: bool  # factor 1 is the model's own RoPE
    unscaled_within_trained: bool  # transformers computes the model's own RoPE up to max_position_embeddings
    length_dependent: bool  # transformers' frequencies follow the sequence's length
    vllm_same: bool  # vLLM computes what transformers does, at every length
    vllm: str  # how vLLM computes it, for the model card

    def same_as_unscaled(self, factor: float, longest: int, trained: int | None) -> bool:
        """Whether transformers computes the model's own RoPE at `factor` on sequences of at most `longest`."""
        if factor == 1.0 and self.unscaled_at_factor_one:
            return True
        return self.unscaled_within_trained and bool(trained) and longest <= trained


SCHEMES: dict[str, RopeFacts] = {
    "linear": RopeFacts("linear", "linear", (), 1.0, True, False, False, True,
                        "the same frequencies; its default max_model_len is max_position_embeddings x factor "
                        "(except Gemma 3)"),
    "yarn": RopeFacts("yarn", "YaRN", ("beta_fast", "beta_slow", "original_max_position_embeddings"), 1.0, True,
                      False, False, True, "the same frequencies and attention factor"),
    "dynamic": RopeFacts("dynamic", "dynamic NTK", (), 1.0, False, True, True, False,
                         "one static cache, the base grown for max_position_embeddings x factor at every length, "
                         "where transformers keeps the model's own RoPE up to max_position_embeddings"),
}

# The stock length-extension types lpes-search scans as baselines (transformers' rope_type -> the name readers know).
STOCK_TYPES = {t: f.name for t, f in SCHEMES.items() if t != "linear"}


@dataclass(frozen=True)
class StockRope:
    """A stock RoPE length extension at one factor, the same in every layer: a baseline for a curve."""

    rope_type: str  # a key of STOCK_TYPES, as config.json's rope_parameters name it
    factor: float

    @property
    def name(self) -> str:
        return f"{STOCK_TYPES[self.rope_type]} f={self.factor:g}"

    @property
    def length_dependent(self) -> bool:
        """Its frequencies follow the sequence length: in a batch the longest row would set them for all."""
        return SCHEMES[self.rope_type].length_dependent

    def same_as_unscaled(self, longest: int, trained: int | None) -> bool:
        """It computes the model's own RoPE on sequences of at most `longest` positions (rope_schemes.py)."""
        return SCHEMES[self.rope_type].same_as_unscaled(self.factor, longest, trained)
