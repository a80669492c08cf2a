"""lpes-convert --to hf: a Hub-ready folder that loads with trust_remote_code and matches the reference."""

import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from lpes.cli import convert_main
from lpes.converter.hub import push_folder
from lpes.converter.reference import apply
from lpes.foundation.spec import Spec, dump_spec

SMALL = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def save_tiny(path, model_type="llama", **overrides):
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **{**SMALL, **overrides})
    config.architectures = [AutoModelForCausalLM._model_mapping[type(config)].__name__]
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


@pytest.fixture
def spec_file(tmp_path):
    spec = Spec.from_curve([[0, 2.0], [1, 0.8], [2, 3.0]], 3)
    dump_spec(spec, tmp_path / "best.json")
    return tmp_path / "best.json"


def convert(*args):
    return convert_main([*map(str, args), "--no-validate"])


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "phi3", "gpt_neox"])
def test_hub_folder_loads_and_matches_reference(tmp_path, spec_file, model_type):
    extra = {"rotary_pct": 0.5} if model_type == "gpt_neox" else {}
    base = save_tiny(tmp_path / "base", model_type, **extra)
    assert convert(base, "--curve", spec_file, "--to", "hf", "--out", tmp_path / "out") == 0
    out = tmp_path / "out"
    ids = torch.randint(0, 97, (2, 50), generator=torch.Generator().manual_seed(0))
    reference = apply(AutoModelForCausalLM.from_pretrained(base).eval(), Spec.from_scales(
        json.loads(spec_file.read_text())["scales"]))
    hub = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
    with torch.no_grad():
        assert torch.equal(hub(ids).logits, reference(ids).logits)
    assert type(hub).__name__ == "LpesForCausalLM"


def test_folder_layout_and_weights_untouched(tmp_path, spec_file):
    base = save_tiny(tmp_path / "base")
    (base / "tokenizer_config.json").write_text("{}")
    (base / "chat_template.jinja").write_text("{{ messages }}")
    assert convert(base, "--curve", spec_file, "--to", "hf", "--out", tmp_path / "out") == 0
    out = tmp_path / "out"
    for name in ["config.json", "modeling_lpes.py", "lpes_rope.py", "model.safetensors", "generation_config.json",
                 "tokenizer_config.json", "chat_template.jinja", "lpes_spec.json", "lpes_curve.png", "README.md"]:
        assert (out / name).is_file(), name
    assert (out / "model.safetensors").read_bytes() == (base / "model.safetensors").read_bytes()
    assert os.stat(out / "model.safetensors").st_ino == os.stat(base / "model.safetensors").st_ino
    card = (out / "README.md").read_text()
    # A local base folder is no Hub id: no base_model in the front matter (the Hub would not resolve it).
    assert card.startswith("---\ntags:") and "- lpes" in card and "library_name: transformers" in card
    assert "| 2 | 3.0000 |" in card
    from lpes.converter import lpes_rope
    assert (out / "lpes_rope.py").read_text() == open(lpes_rope.__file__).read()


def test_plain_load_fails_loudly(tmp_path, spec_file):
    base = save_tiny(tmp_path / "base")
    convert(base, "--curve", spec_file, "--to", "hf", "--out", tmp_path / "out")
    with pytest.raises(ValueError, match="trust_remote_code"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "out", trust_remote_code=False)


def test_sharded_checkpoint_keeps_its_index(tmp_path, spec_file):
    torch.manual_seed(0)
    config = AutoConfig.for_model("llama", **SMALL)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "base", max_shard_size="20KB")
    shards = sorted(p.name for p in (tmp_path / "base").glob("*.safetensors"))
    assert len(shards) > 1
    convert(tmp_path / "base", "--curve", spec_file, "--to", "hf", "--out", tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").glob("*.safetensors")) == shards
    assert (tmp_path / "out" / "model.safetensors.index.json").is_file()
    AutoModelForCausalLM.from_pretrained(tmp_path / "out", trust_remote_code=True)


def test_hub_folder_runs_without_lpes_installed(tmp_path, spec_file):
    base = save_tiny(tmp_path / "base")
    convert(base, "--curve", spec_file, "--to", "hf", "--out", tmp_path / "out")
    code = (
        "import sys, builtins\n"
        "real = builtins.__import__\n"
        "def guard(name, *a, **k):\n"
        "    if name == 'lpes' or name.startswith('lpes.'): raise ImportError('lpes hidden')\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = guard\n"
        "import torch\n"
        "from transformers import AutoModelForCausalLM\n"
        f"m = AutoModelForCausalLM.from_pretrained({str(tmp_path / 'out')!r}, trust_remote_code=True)\n"
        "print(type(m).__name__)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "LpesForCausalLM" in done.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["{base}", "--curve", "{tmp}/missing.json", "--to", "hf"], "spec file not found"),
        (["{tmp}/nope", "--curve", "{spec}", "--to", "hf"], "model folder not found"),
        (["{base}", "--curve", "{spec}", "--to", "tflite"], "--to takes"),
        (["{gpt2}", "--curve", "{spec}", "--to", "hf"], "no RoPE"),
        (["{base4}", "--curve", "{spec}", "--to", "hf"], "3 entries but the model has 4 layers"),
    ],
)
def test_user_errors_exit_2_with_one_line(tmp_path, spec_file, capsys, args, message):
    base = save_tiny(tmp_path / "base")
    save_tiny(tmp_path / "base4", num_hidden_layers=4)
    gpt2 = AutoConfig.for_model("gpt2", n_layer=3, n_embd=32, n_head=2)
    AutoModelForCausalLM.from_config(gpt2).save_pretrained(tmp_path / "gpt2")
    fmt = {"base": base, "tmp": tmp_path, "spec": spec_file, "gpt2": tmp_path / "gpt2", "base4": tmp_path / "base4"}
    argv = [a.format(**fmt) for a in args] + ["--out", str(tmp_path / "out")]
    capsys.readouterr()  # drop the fixtures' progress output
    assert convert_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out").exists()


def test_existing_output_needs_force_and_failure_leaves_nothing(tmp_path, spec_file, monkeypatch):
    base = save_tiny(tmp_path / "base")
    (tmp_path / "out").mkdir()
    assert convert(base, "--curve", spec_file, "--to", "hf", "--out", tmp_path / "out") == 2
    from lpes.converter import hf_folder

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(hf_folder, "plot_curve", boom)  # interrupted half-way through writing the folder
    assert convert(base, "--curve", spec_file, "--to", "hf", "--out", tmp_path / "new") == 130
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "best.json", "out"]


def test_push_to_hub_uploads_the_folder(tmp_path):
    calls = []

    class FakeApi:
        def create_repo(self, repo_id, **kwargs):
            calls.append(("create", repo_id, kwargs["exist_ok"]))

        def upload_folder(self, folder_path, repo_id, **kwargs):
            calls.append(("upload", repo_id, sorted(os.listdir(folder_path))))
            return "https://hub/commit/1"

    (tmp_path / "config.json").write_text("{}")
    assert push_folder(tmp_path, "me/model-lpes", api=FakeApi()) == "https://hub/commit/1"
    assert calls == [("create", "me/model-lpes", True), ("upload", "me/model-lpes", ["config.json"])]


def test_spec_from_another_model_warns(tmp_path, capsys):
    base = save_tiny(tmp_path / "base")
    spec = Spec.from_scales([1.0, 2.0, 1.0], {"model": {"architecture": "MistralForCausalLM"}})
    dump_spec(spec, tmp_path / "other.json")
    assert convert(base, "--curve", tmp_path / "other.json", "--to", "hf", "--out", tmp_path / "out") == 0
    assert "searched on another model (different architecture)" in capsys.readouterr().err


def test_tokenizer_files_read_the_same_in_transformers_4_and_5(tmp_path, spec_file):
    """TokenizersBackend (a transformers-5 name) becomes PreTrainedTokenizerFast, with 5's input names."""
    from conftest import tiny_model_dir
    from transformers import AutoTokenizer

    base = tiny_model_dir("llama", tmp_path)
    assert json.loads((base / "tokenizer_config.json").read_text())["tokenizer_class"] == "TokenizersBackend"
    assert convert(base, "--curve", spec_file, "--to", "hf", "--out", tmp_path / "out") == 0
    written = json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())
    assert written["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert written["model_input_names"] == ["input_ids", "attention_mask"]
    text = "w5 w17 w99 w4"
    theirs, ours = AutoTokenizer.from_pretrained(base)(text), AutoTokenizer.from_pretrained(tmp_path / "out")(text)
    assert dict(ours) == dict(theirs) and sorted(ours) == ["attention_mask", "input_ids"]
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()


def test_legacy_rope_fields_mirror_rope_parameters(tmp_path, spec_file):
    """transformers 4.x reads rope_theta / rope_scaling; 5 reads rope_scaling first, so both must agree."""
    rope = {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0}
    base = save_tiny(tmp_path / "base", rope_parameters=rope)
    assert convert(base, "--curve", spec_file, "--to", "hf", "--out", tmp_path / "out") == 0
    data = json.loads((tmp_path / "out" / "config.json").read_text())
    assert data["rope_theta"] == 5000.0 and data["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    reread = AutoConfig.from_pretrained(tmp_path / "out", trust_remote_code=True).rope_parameters
    assert dict(reread) == dict(AutoConfig.from_pretrained(base).rope_parameters)


def test_legacy_rope_mirror_rules():
    from lpes.converter.portable_files import with_legacy_rope

    default = with_legacy_rope({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "rope_scaling": None})
    assert default["rope_theta"] == 1e6 and "rope_scaling" not in default
    partial = with_legacy_rope({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                    "partial_rotary_factor": 0.5}})
    assert partial["partial_rotary_factor"] == 0.5
    # Per-layer-type RoPE: a flat rope_scaling would replace the nested dict in transformers 5.
    nested = {"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                                  "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    assert with_legacy_rope(nested) == nested


def test_recommended_load_snippet_runs_without_a_prompt(tmp_path, spec_file):
    """The card's snippet (NOTES-hub.md): run as written, stdin closed, no trust_remote_code prompt."""
    base = save_tiny(tmp_path / "base")
    from conftest import tiny_tokenizer

    tiny_tokenizer().save_pretrained(base)
    convert(base, "--curve", spec_file, "--to", "hf", "--out", tmp_path / "out")
    snippet = (
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "model = AutoModelForCausalLM.from_pretrained('out', trust_remote_code=True)\n"
        "tokenizer = AutoTokenizer.from_pretrained('out', trust_remote_code=True)\n"
        "print(type(model).__name__, type(tokenizer).__name__)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    done = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, env=env, cwd=tmp_path,
                          stdin=subprocess.DEVNULL, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["LpesForCausalLM", "TokenizersBackend"]  # 5's PreTrainedTokenizerFast
    assert "Do you wish to run the custom code" not in done.stdout + done.stderr
