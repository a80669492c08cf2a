"""Per-layer factors under every RoPE scheme: `rope_type` linear, yarn, dynamic (converter/lpes_rope.py).

The independent reference is transformers itself: a folder whose config.json the test writes
by hand (`rope_parameters` of that type, as a user would), loaded with plain
`from_pretrained`, never through an lpes function. A curve with one factor in every layer
must give that model's logits (bit for bit where the arithmetic is the same, else within
1e-6); a per-layer curve must give each layer the RoPE of its own factor, through a config
copy of its own (the research code shared one config object, so every layer got the factor
written last). Dynamic NTK must follow each call's true length, as a freshly loaded stock
model does, with no state kept between sequences.
"""

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import tiny_model_dir
from transformers import AutoModelForCausalLM

from lpes.cli import convert_main
from lpes.converter.reference import apply
from lpes.converter.trust import check_hub_code
from lpes.foundation.errors import LpesError
from lpes.foundation.spec import RopeScheme, Spec, dump_spec
from lpes.validation.checks import rope_check


def uses_custom_code(folder: Path) -> bool:
    """The written Hub folder needs trust_remote_code (its config.json names LPES code in auto_map)."""
    return bool(json.loads((Path(folder) / "config.json").read_text()).get("auto_map"))


TRAINED = 16  # max_position_embeddings of the test models: the sequences below go well past it
YARN, DYNAMIC = RopeScheme("yarn"), RopeScheme("dynamic")
# Partial rotary at half of an 8-wide head: dynamic NTK's exponent dim / (dim - 2) needs dim > 2.
PARTIAL = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _model(folder):
    return AutoModelForCausalLM.from_pretrained(folder).eval()


def written_by_hand(folder, tmp_path, rope_type, factor, **extra):
    """A copy of `folder` whose config.json says `rope_type` at `factor`, edited as a user would edit it."""
    out = tmp_path / f"{folder.name}-{rope_type}-{factor:g}"
    shutil.copytree(folder, out)
    config = json.loads((out / "config.json").read_text())
    own = config["rope_parameters"]
    rope = {"rope_type": rope_type, "rope_theta": own["rope_theta"], "factor": factor, **extra}
    if "partial_rotary_factor" in own:
        rope["partial_rotary_factor"] = own["partial_rotary_factor"]
    if rope_type == "yarn":
        rope.setdefault("original_max_position_embeddings", config["max_position_embeddings"])
    config["rope_parameters"] = rope
    if config.get("head_dim", 0) is None:  # Mixtral: transformers' yarn/dynamic need it written out
        config["head_dim"] = config["hidden_size"] // config["num_attention_heads"]
    (out / "config.json").write_text(json.dumps(config))
    return out


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def ids_of(length, seed=0, batch=1):
    return torch.randint(4, 100, (batch, length), generator=torch.Generator().manual_seed(seed))


def assert_same(ours, theirs):
    """Bit for bit where the arithmetic is the same, always within 1e-6."""
    assert (ours - theirs).abs().max().item() <= 1e-6


@pytest.mark.parametrize("model_type, overrides, rope_type, factor", [
    ("llama", {}, "yarn", 2.5),
    ("llama", {}, "yarn", 1.0),
    ("llama", {}, "dynamic", 2.0),
    ("llama", {}, "dynamic", 1.0),  # still a change: the base grows past the trained length
    ("qwen3", {}, "yarn", 3.0),
    ("stablelm", PARTIAL, "yarn", 2.0),
    ("stablelm", PARTIAL, "dynamic", 3.0),
    ("mixtral", {}, "dynamic", 2.0),
], ids=lambda v: v if isinstance(v, str) else None)
def test_one_factor_everywhere_is_the_stock_config_json(tmp_path, model_type, overrides, rope_type, factor):
    folder = tiny_model_dir(model_type, tmp_path, max_position_embeddings=TRAINED, **overrides)
    stock = written_by_hand(folder, tmp_path, rope_type, factor)
    layers = _model(folder).config.num_hidden_layers
    ours = apply(_model(folder), Spec.from_scales([factor] * layers, rope=RopeScheme(rope_type)))
    # Longest first: a reused stock dynamic model would keep the first length; ours keeps nothing.
    for length, seed in ((70, 0), (40, 1), (TRAINED - 4, 2)):
        ids = ids_of(length, seed)
        assert_same(logits(ours, ids), logits(_model(stock), ids))  # the stock model loaded afresh per sequence
    if factor != 1.0 or rope_type == "dynamic":
        assert not torch.allclose(logits(ours, ids_of(70)), logits(_model(folder), ids_of(70)), atol=1e-3)


def test_yarns_own_parameters_are_those_of_the_config_json(tmp_path):
    folder = tiny_model_dir("llama", tmp_path, max_position_embeddings=TRAINED)
    # A ramp over frequencies 0..2 of the 4, where the defaults ramp over 0..1.
    extra = {"beta_fast": 2.0, "beta_slow": 0.25, "original_max_position_embeddings": 64}
    stock = written_by_hand(folder, tmp_path, "yarn", 3.0, **extra)
    scheme = RopeScheme("yarn", 2.0, 0.25, 64)
    ids = ids_of(60)
    ours = logits(apply(_model(folder), Spec.from_scales([3.0] * 3, rope=scheme)), ids)
    assert_same(ours, logits(_model(stock), ids))
    default = logits(apply(_model(folder), Spec.from_scales([3.0] * 3, rope=YARN)), ids)
    assert not torch.allclose(ours, default, atol=1e-3)  # the parameters are used, not left at the defaults


def _layer_inputs(model):
    """Per decoder layer, the (cos, sin) it computes with (after LPES's swap)."""
    seen = [{} for _ in model.model.layers]
    for layer, store in zip(model.model.layers, seen):
        layer.register_forward_pre_hook(
            lambda m, a, kw, store=store: store.__setitem__("cos_sin", kw["position_embeddings"]), with_kwargs=True)
    return seen


@pytest.mark.parametrize("rope_type", ["yarn", "dynamic"])
def test_each_layer_gets_its_own_factor_through_a_config_of_its_own(tmp_path, rope_type):
    """The research code's bug: one config object for every layer, so layers meant for 1, 2, 4, 8 all got 8."""
    factors = [1.0, 2.0, 4.0, 8.0]
    folder = tiny_model_dir("llama", tmp_path, max_position_embeddings=TRAINED, num_hidden_layers=4)
    model = apply(_model(folder), Spec.from_scales(factors, rope=RopeScheme(rope_type)))
    rotary = model.model.rotary_emb
    configs = [rope.config for rope in rotary.layer_ropes.values()]
    assert len({id(c) for c in configs}) == len(configs) and all(c is not model.config for c in configs)
    assert len({id(c.rope_parameters) for c in configs}) == len(configs)
    assert model.config.rope_parameters["rope_type"] == "default"  # the model's own is untouched
    seen = _layer_inputs(model)
    ids = ids_of(60)
    logits(model, ids)
    logits(model, ids_of(30, 1))  # another call in between: nothing a layer holds may move
    logits(model, ids)
    for h, factor in enumerate(factors):
        key = (None, factor)
        if key in rotary.layer_ropes:
            assert rotary.layer_ropes[key].factor == factor  # still its own after every call
        stock = _model(written_by_hand(folder, tmp_path, rope_type, factor)).model.rotary_emb
        with torch.no_grad():
            expected = stock(torch.zeros(1), torch.arange(60)[None])
        assert all(torch.equal(a, b) for a, b in zip(seen[h]["cos_sin"], expected)), f"layer {h} (factor {factor})"
    assert len({seen[h]["cos_sin"][0].sum().item() for h in range(4)}) == 4  # four different RoPEs


def test_a_per_layer_curve_changes_only_its_layers_and_yarn_at_one_is_the_model_itself(tmp_path):
    folder = tiny_model_dir("llama", tmp_path, max_position_embeddings=TRAINED)
    ids = ids_of(50)
    plain = logits(_model(folder), ids)
    assert torch.equal(logits(apply(_model(folder), Spec.from_scales([1.0] * 3, rope=YARN)), ids), plain)
    model = apply(_model(folder), Spec.from_scales([1.0, 3.0, 1.0], rope=YARN))
    assert [len(layer._lpes_hooks) for layer in model.model.layers] == [0, 1, 0]
    dynamic = apply(_model(folder), Spec.from_scales([1.0, 3.0, 1.0], rope=DYNAMIC))
    assert [len(layer._lpes_hooks) for layer in dynamic.model.layers] == [1, 1, 1]  # factor 1 moves past 16
    assert not torch.allclose(logits(dynamic, ids), plain, atol=1e-3)
    within = ids_of(TRAINED - 2)  # within the trained length dynamic NTK is plain RoPE at every factor
    assert_same(logits(dynamic, within), logits(_model(folder), within))


def test_dynamic_follows_each_calls_length_and_keeps_no_state(tmp_path):
    folder = tiny_model_dir("llama", tmp_path, max_position_embeddings=TRAINED)
    spec = Spec.from_scales([2.0, 1.5, 4.0], rope=DYNAMIC)
    model = apply(_model(folder), spec)
    short, long = ids_of(30, 1), ids_of(80, 2)
    alone = logits(apply(_model(folder), spec), short)
    logits(model, long)
    assert torch.equal(logits(model, short), alone)  # the long sequence before it changed nothing


def test_dynamic_through_the_kv_cache_is_what_a_fresh_stock_model_generates(tmp_path):
    """Decoding past the trained length: every step's base from its own length, as transformers' module grows."""
    folder = tiny_model_dir("llama", tmp_path, max_position_embeddings=TRAINED)
    stock = _model(written_by_hand(folder, tmp_path, "dynamic", 2.0))
    ours = apply(_model(folder), Spec.from_scales([2.0] * 3, rope=DYNAMIC))
    prompt = ids_of(TRAINED - 6, 3)  # starts within the trained length, decodes past it
    kwargs = {"max_new_tokens": 16, "do_sample": False, "output_logits": True, "return_dict_in_generate": True,
              "pad_token_id": 0}
    with torch.no_grad():
        theirs, mine = stock.generate(prompt, **kwargs), ours.generate(prompt, **kwargs)
    assert torch.equal(mine.sequences, theirs.sequences)
    for a, b in zip(mine.logits, theirs.logits):
        assert_same(a, b)


@pytest.mark.parametrize("model_type, overrides, why", [
    ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}},
     "own RoPE is 'linear'"),
    ("gemma3_text", {"head_dim": 8}, "one RoPE per layer type"),
    ("stablelm", {}, "dynamic RoPE fails on this config"),  # 2 rotated dims: NTK's exponent divides by zero
])
def test_a_model_that_cannot_take_the_scheme_is_refused_in_one_line(tmp_path, model_type, overrides, why):
    folder = tiny_model_dir(model_type, tmp_path, **overrides)
    rope_type = "dynamic" if "dynamic" in why else "yarn"
    with pytest.raises(LpesError, match=f"per-layer .*rope_type '{rope_type}'.*{why}") as info:
        apply(_model(folder), Spec.from_scales([2.0] * 3, rope=RopeScheme(rope_type)))
    assert "\n" not in str(info.value)
    dump_spec(Spec.from_scales([2.0] * 3, rope=RopeScheme(rope_type)), tmp_path / "spec.json")
    out = tmp_path / "out"
    assert convert_main([str(folder), "--curve", str(tmp_path / "spec.json"), "--to", "hf", "--out", str(out),
                         "--no-validate"]) == 2
    assert not out.exists()


@pytest.mark.parametrize("rope", [YARN, DYNAMIC], ids=lambda r: r.rope_type)
def test_the_rope_check_holds_each_layer_to_transformers_own_rotary(tmp_path, rope):
    folder = tiny_model_dir("llama", tmp_path, max_position_embeddings=TRAINED)
    config = _model(folder).config
    check = rope_check(config, Spec.from_scales([1.0, 2.0, 3.5], rope=rope), 200)
    assert check.status == "passed" and rope.name in check.detail, check.detail


# ---- the Hub folder ----------------------------------------------------------------------------------------


def convert(base, spec, out):
    dump_spec(spec, out.parent / f"{out.name}.json")
    return convert_main([str(base), "--curve", str(out.parent / f"{out.name}.json"), "--to", "hf", "--out", str(out),
                         "--no-validate"])


@pytest.mark.parametrize("rope_type, factor", [("yarn", 2.5), ("dynamic", 2.0), ("dynamic", 1.0)])
def test_a_uniform_curve_of_either_scheme_is_a_stock_folder(tmp_path, rope_type, factor):
    base = tiny_model_dir("llama", tmp_path, max_position_embeddings=TRAINED)
    out = tmp_path / "out"
    assert convert(base, Spec.from_scales([factor] * 3, rope=RopeScheme(rope_type)), out) == 0
    assert not uses_custom_code(out) and not (out / "modeling_lpes.py").exists()
    by_hand = json.loads((written_by_hand(base, tmp_path, rope_type, factor) / "config.json").read_text())
    written = json.loads((out / "config.json").read_text())
    assert written["rope_parameters"] == by_hand["rope_parameters"] and written["model_type"] == "llama"
    loaded = _model(out)  # no trust_remote_code
    for length, seed in ((60, 0), (30, 1)):
        ids = ids_of(length, seed)
        assert_same(logits(_model(out), ids), logits(_model(tmp_path / f"{base.name}-{rope_type}-{factor:g}"), ids))
    assert loaded.config.rope_parameters["rope_type"] == rope_type


def test_yarn_at_one_everywhere_is_the_base_models_own_config(tmp_path):
    base = tiny_model_dir("llama", tmp_path, max_position_embeddings=TRAINED)
    out = tmp_path / "out"
    assert convert(base, Spec.from_scales([1.0] * 3, rope=YARN), out) == 0
    assert json.loads((out / "config.json").read_text())["rope_parameters"]["rope_type"] == "default"


@pytest.mark.parametrize("rope", [YARN, DYNAMIC], ids=lambda r: r.rope_type)
def test_a_per_layer_curve_of_either_scheme_is_custom_code_equal_to_the_reference(tmp_path, rope):
    base = tiny_model_dir("llama", tmp_path, max_position_embeddings=TRAINED)
    out = tmp_path / "out"
    spec = Spec.from_scales([2.0, 1.0, 3.5], rope=rope)
    assert convert(base, spec, out) == 0
    assert uses_custom_code(out)
    check_hub_code(out)  # the folder's code is lpes's own, byte for byte
    assert json.loads((out / "config.json").read_text())["lpes"]["rope"] == {"rope_type": rope.rope_type}
    hub = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    reference = apply(_model(base), spec)
    for length, seed in ((60, 0), (30, 1)):
        ids = ids_of(length, seed, batch=2)
        assert torch.equal(logits(hub, ids), logits(reference, ids))
    linear = apply(_model(base), Spec.from_scales([2.0, 1.0, 3.5]))
    assert not torch.allclose(logits(hub, ids_of(60)), logits(linear, ids_of(60)), atol=1e-3)


def test_a_spec_with_the_scheme_survives_the_folder(tmp_path):
    from lpes.foundation.spec import load_spec

    base = tiny_model_dir("llama", tmp_path, max_position_embeddings=TRAINED)
    out = tmp_path / "out"
    spec = Spec.from_scales([2.0, 1.0, 3.5], rope=RopeScheme("yarn", 16.0, 1.0, 12))
    assert convert(base, spec, out) == 0
    assert load_spec(out / "lpes_spec.json").rope == spec.rope
    data = json.loads((out / "config.json").read_text())["lpes"]["rope"]
    assert data == {"rope_type": "yarn", "beta_fast": 16.0, "beta_slow": 1.0, "original_max_position_embeddings": 12}
    hub = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    ids = ids_of(40)
    assert torch.equal(logits(hub, ids), logits(apply(_model(base), spec), ids))


def test_configs_copied_per_layer_are_deep_copies():
    """What LayerRope copies: mutating the source config afterwards reaches no layer."""
    from conftest import tiny_config

    from lpes.converter.lpes_rope import LayerRope

    config = tiny_config("llama", max_position_embeddings=TRAINED)
    parameters = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    rope = LayerRope(config, parameters)
    parameters["factor"] = 8.0
    config.rope_parameters["rope_theta"] = 1.0
    config.max_position_embeddings = 10_000
    assert rope.factor == 2.0 and rope.config.rope_parameters["rope_theta"] == 10000.0
    assert rope.config.max_position_embeddings == TRAINED
    assert copy.deepcopy(rope).config is not rope.config


def test_the_shipped_file_and_the_spec_know_the_same_schemes():
    """lpes_rope.py runs with torch and transformers alone, so it keeps its own copy of the scheme table."""
    from lpes.converter import lpes_rope
    from lpes.foundation.spec import ROPE_SCHEMES

    assert lpes_rope.SCHEMES == ROPE_SCHEMES
    source = open(lpes_rope.__file__).read()
    assert "import lpes" not in source and "from lpes" not in source
