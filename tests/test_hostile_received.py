"""Issue 26: received folders are data, weights are checked against the model, interrupts always stop,
lpes-search is as careful as lpes-convert, every parser error is one line.

The regression table (ROWS) has a row per finding of the issue. Each row builds its hostile
input in a sandbox of its own (a copy of the bundled model, a received lpes-convert output
with onnx/ and genai/, a spec, a file of the user's), runs the command's entry point in this
process, and asserts: exit 2, one line on stderr naming the problem, no traceback, every
byte, name and mode of the sandbox as it was, and no file written by injected code (the
rows that plant a native library compile one whose constructor writes a marker).

Interrupts (SIGINT and SIGTERM at each step of a conversion, and one that Python drops
inside a weakref callback) run in child processes: exit 130, nothing written. A staging
folder left by a SIGKILL is reported by the next command with its size and how to remove it.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from test_hostile_cli import tree_digest

from lpes.converter.loading import bundled_models
from lpes.foundation.errors import LpesError

CHILD_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
SPEC = {"version": 1, "scales": [1.0, 1.5, 2.0, 1.0]}
# What lpes's genai export writes (exporters/genai/package.py through onnxruntime-genai's builder), for a 4-layer model.
GENAI_CONFIG = {
    "model": {
        "bos_token_id": 1, "context_length": 512, "eos_token_id": 2, "pad_token_id": 0, "type": "llama",
        "vocab_size": 618,
        "decoder": {
            "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
            "filename": "model.onnx", "head_size": 32, "hidden_size": 128,
            "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                       "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
            "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                        "present_value_names": "present.%d.value"},
            "num_attention_heads": 4, "num_hidden_layers": 4, "num_key_value_heads": 4,
        },
    },
    "search": {"do_sample": False, "max_length": 512, "num_beams": 1, "past_present_share_buffer": True},
}
EVIL_C = r"""
#include <stdio.h>
__attribute__((constructor)) static void ran(void) {
    FILE *f = fopen(MARKER, "w");
    if (f) { fputs("ran", f); fclose(f); }
}
"""


# ---- the received folder, the library, the sandbox ----


@pytest.fixture(scope="module")
def received(tmp_path_factory) -> Path:
    """An lpes-convert output of the bundled model (hf + onnx, per-layer scales) with a genai/ folder beside."""
    from lpes.cli import convert_main

    root = tmp_path_factory.mktemp("received")
    (root / "spec.json").write_text(json.dumps(SPEC))
    assert convert_main(["lpes-tiny-kv", "--curve", str(root / "spec.json"), "--to", "hf,onnx", "--no-validate",
                         "--out", str(root / "out")]) == 0
    genai = root / "out" / "genai"
    genai.mkdir()
    shutil.copyfile(root / "out" / "onnx" / "model.onnx", genai / "model.onnx")
    (genai / "genai_config.json").write_text(json.dumps(GENAI_CONFIG, indent=4))
    (root / "uniform.json").write_text(json.dumps({"version": 1, "scales": [2.0] * 4}))
    assert convert_main(["lpes-tiny-kv", "--curve", str(root / "uniform.json"), "--to", "hf", "--no-validate",
                         "--out", str(root / "stock")]) == 0  # a stock-RoPE Hub folder: no code of lpes
    return root / "out"


def compile_library(folder: Path, marker: Path) -> Path | None:
    """A shared library whose constructor writes `marker` when anything loads it (None without gcc)."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        return None
    (folder / "evil.c").write_text(EVIL_C)
    library = folder / "libevil.so"
    done = subprocess.run([gcc, "-shared", "-fPIC", f"-DMARKER=\"{marker}\"", "-o", str(library),
                           str(folder / "evil.c")], capture_output=True, text=True)
    return library if done.returncode == 0 else None


@pytest.fixture(scope="module")
def evil_library(tmp_path_factory) -> tuple[Path | None, Path]:
    folder = tmp_path_factory.mktemp("lib")
    marker = folder / "LIBRARY-RAN"
    return compile_library(folder, marker), marker


@dataclass
class Box:
    root: Path
    fill: dict[str, str]

    def path(self, key: str) -> Path:
        return Path(self.fill[key])


def make_box(root: Path, received: Path, library: Path | None, marker: Path) -> Box:
    models, work, mine = root / "models", root / "work", root / "mine"
    shutil.copytree(bundled_models()["lpes-tiny-kv"], models / "tiny")
    shutil.copytree(received, root / "recv")
    shutil.copytree(received.parent / "stock", root / "stock")
    work.mkdir()
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work\n")
    (root / "spec.json").write_text(json.dumps(SPEC))
    fill = {"model": models / "tiny", "spec": root / "spec.json", "recv": root / "recv", "onnx": root / "recv" / "onnx",
            "genai": root / "recv" / "genai", "stock": root / "stock",
            "work": work, "out": work / "out", "best": work / "best.json",
            "mine": mine, "lib": library or root / "no-gcc.so", "marker": marker}
    return Box(root, {k: str(v) for k, v in fill.items()})


# ---- setups: each plants one hostile input ----


def _edit_json(key: str, name: str, edit):
    def setup(box: Box) -> None:
        path = box.path(key) / name
        data = json.loads(path.read_text())
        edit(data, box)
        path.write_text(json.dumps(data))
    return setup


def _genai(edit):
    return _edit_json("genai", "genai_config.json", lambda c, box: edit(c["model"]["decoder"], box))


def _session(**options):
    def edit(decoder, box):
        decoder["session_options"].update({k: v.format(lib=box.fill["lib"]) if isinstance(v, str) else v
                                           for k, v in options.items()})
    return _genai(edit)


def _onnx_location(location: str):
    def setup(box: Box) -> None:
        import onnx
        from onnx import numpy_helper

        path = box.path("onnx") / "model.onnx"
        model = onnx.load(str(path))
        tensor = model.graph.initializer[0]
        data = numpy_helper.to_array(tensor)
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", location.format(**box.fill)), ("offset", "0"),
                           ("length", str(data.nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        onnx.save(model, str(path))
    return setup


def _external_data_link_out(box: Box) -> None:
    outside = box.root / "secret.bin"
    outside.write_bytes(b"\0" * 1024)
    _onnx_location("weights.bin")(box)
    (box.path("onnx") / "weights.bin").symlink_to(outside)


def _tensors(folder_key: str, edit):
    def setup(box: Box) -> None:
        from safetensors.torch import load_file, save_file

        path = box.path(folder_key) / "model.safetensors"
        tensors = load_file(path)
        edit(tensors)
        path.unlink()  # the Hub folder's weights are hard links to the model's: never change those in place
        save_file(tensors, path, metadata={"format": "pt"})
    return setup


def _weights_link_out(folder_key: str):
    def setup(box: Box) -> None:
        weights = box.path(folder_key) / "model.safetensors"
        outside = box.root / "elsewhere.safetensors"
        shutil.copyfile(weights, outside)
        weights.unlink()
        weights.symlink_to(outside)
    return setup


def _more_layers(box: Box) -> None:
    path = box.path("model") / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "num_hidden_layers": 6}))


def _engine_with_plugin(box: Box) -> None:
    folder = box.path("recv") / "tensorrt"
    folder.mkdir()
    (folder / "model.engine").write_bytes(b"not an engine")
    (folder / "model.engine.json").write_text(json.dumps({"format": "lpes-tensorrt-engine", "dtype": "float32",
                                                          "plugin_libraries": [box.fill["lib"]]}))


def _write(key: str, name: str, text: str):
    def setup(box: Box) -> None:
        (box.path(key) / name).write_text(text)
    return setup


def _data_file(name: str, data: bytes):
    def setup(box: Box) -> None:
        (box.path("work") / name).write_bytes(data)
    return setup


RECORD = json.dumps({"ordered_kv_records": [["k1", "v1"], ["k2", "v2"]], "key": "k1", "value": "v1"}) + "\n"
GOOD_GZIP = gzip.compress(RECORD.encode() * 40, mtime=0)


def _held_lock(box: Box):
    """What a running lpes-search on the same --out holds (returned: kept open while the row runs)."""
    handle = open(box.path("work") / ".best.json.lpes-lock", "w")
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def _planted(name: str, target_key: str = "mine"):
    def setup(box: Box) -> None:
        (box.path("work") / name).symlink_to(box.path(target_key) / ("new-file" if "lock" in name else ""))
    return setup


def _nan_provenance(box: Box) -> None:
    box.path("spec").write_text('{"version": 1, "scales": [1.0, 1.5, 2.0, 1.0], '
                                '"provenance": {"held_out": {"unscaled": NaN, "lpes": Infinity}}}')


# ---- the table ----


@dataclass(frozen=True)
class Row:
    id: str
    argv: tuple[str, ...]
    message: str  # a part of the one stderr line
    setup: object = None  # a function of the Box; may return a handle kept open while the row runs
    needs_library: bool = False  # skipped without a C compiler
    env: tuple[tuple[str, str], ...] = ()


CONVERT = ("lpes-convert", "{model}", "--curve", "{spec}", "--to", "hf", "--no-validate", "--out", "{out}")
VALIDATE = ("lpes-validate", "{recv}", "--model", "{model}")
GENERATE = ("lpes-generate", "{onnx}", "p3_1 f2 q3", "--max-new-tokens", "1")
SEARCH = ("lpes-search", "{model}", "--population", "2", "--generations", "0", "--out", "{best}")

ROWS = [
    # 1. received folders are data: no library, plugin or outside file that they name is opened
    Row("genai-custom-ops-library", VALIDATE, "custom_ops_library names native code to load",
        _session(custom_ops_library="{lib}"), needs_library=True),
    Row("genai-library-shipped-in-the-folder", VALIDATE, "libevil.so is a native library",
        lambda box: shutil.copyfile(box.fill["lib"], box.path("genai") / "libevil.so"), needs_library=True),
    Row("genai-unknown-session-option", VALIDATE, "enable_profiling is not a session option lpes allows",
        _session(enable_profiling="/tmp/profile")),
    Row("genai-provider-backend-library", VALIDATE, "names execution provider 'qnn'",
        _session(provider_options=[{"qnn": {"backend_path": "{lib}"}}]), needs_library=True),
    Row("genai-provider-option-file", VALIDATE, "cuda.trt_engine_cache_path names a file or library",
        _session(provider_options=[{"cuda": {"trt_engine_cache_path": "/tmp"}}])),
    Row("genai-library-value", VALIDATE, "names a native library",
        _genai(lambda d, box: d.update(extra=box.fill["lib"])), needs_library=True),
    Row("genai-graph-outside", VALIDATE, "model.decoder.filename names '/etc/passwd', outside",
        _genai(lambda d, box: d.update(filename="/etc/passwd"))),
    Row("genai-graph-dotdot", VALIDATE, "names '../onnx/model.onnx', outside",
        _genai(lambda d, box: d.update(filename="../onnx/model.onnx"))),
    Row("onnx-external-data-absolute", GENERATE, "external data of tensor", _onnx_location("{mine}/thesis.tex")),
    Row("onnx-external-data-dotdot", GENERATE, "names '../../mine/thesis.tex', outside",
        _onnx_location("../../mine/thesis.tex")),
    Row("onnx-external-data-device", GENERATE, "names '/dev/zero', outside", _onnx_location("/dev/zero")),
    Row("onnx-external-data-link-out", GENERATE, "weights.bin is a symbolic link", _external_data_link_out),
    Row("onnx-external-data-in-validate", VALIDATE, "external data of tensor", _onnx_location("/dev/zero")),
    Row("tensorrt-plugin", VALIDATE, "plugin_libraries names native code to load", _engine_with_plugin,
        needs_library=True),
    # sidecars the runners trust
    Row("onnx-sidecar-layer-count", GENERATE, "'num_layers' is 7, but model.onnx has 4 layers",
        _edit_json("onnx", "lpes_onnx.json", lambda c, box: c.update(num_layers=7))),
    Row("onnx-sidecar-dtype", GENERATE, "'dtype' is float16, but model.onnx's cache is float32",
        _edit_json("onnx", "lpes_onnx.json", lambda c, box: c.update(dtype="float16"))),
    Row("genai-config-not-json", VALIDATE, "genai_config.json: Expecting", _write("genai", "genai_config.json", "{")),
    Row("genai-config-context-length", VALIDATE, "'model.context_length' must be a positive integer",
        _edit_json("genai", "genai_config.json", lambda c, box: c["model"].update(context_length="long"))),
    Row("generation-config-broken", GENERATE, "generation_config.json", _write("onnx", "generation_config.json", "[")),
    Row("generation-config-eos-text", GENERATE, "'eos_token_id' must be a token id",
        _write("onnx", "generation_config.json", '{"eos_token_id": "</s>"}')),
    # 2. weights against the model the config describes (headers only), at plan time
    Row("hub-weights-mis-shaped", VALIDATE, "tensor 'model.norm.weight' has shape [64], but LlamaForCausalLM",
        _tensors("recv", lambda t: t.update({"model.norm.weight": t["model.norm.weight"][:64].clone()}))),
    Row("hub-weights-missing", VALIDATE, "the weights lack 'model.layers.3.mlp.up_proj.weight'",
        _tensors("recv", lambda t: t.pop("model.layers.3.mlp.up_proj.weight"))),
    Row("hub-weights-link-out", VALIDATE, "model.safetensors is a symbolic link", _weights_link_out("recv")),
    Row("hub-config-lpes-scales-doctored", VALIDATE, "'lpes.scales' is [1.0, -2.0, 2.0, 1.0], but lpes writes",
        _edit_json("recv", "config.json", lambda c, box: c["lpes"].update(scales=[1.0, -2.0, 2.0, 1.0]))),
    Row("hub-config-lpes-path-doctored", VALIDATE, "'lpes.layers_path' is nope.layers, but lpes writes layers",
        _edit_json("recv", "config.json", lambda c, box: c["lpes"].update(layers_path="nope.layers"))),
    Row("stock-hub-weights-extra", ("lpes-validate", "{stock}", "--model", "{model}"),
        "tensor 'extra.weight' is not a weight of LlamaForCausalLM",
        _tensors("stock", lambda t: t.update({"extra.weight": t["model.norm.weight"].clone()}))),
    Row("hub-config-quantized", ("lpes-validate", "{stock}", "--model", "{model}"), "holds a quantization_config",
        _edit_json("stock", "config.json", lambda c, box: c.update(quantization_config={"quant_method": "awq"}))),
    Row("model-weights-missing", CONVERT, "the weights lack 'model.layers.2.self_attn.q_proj.weight'",
        _tensors("model", lambda t: t.pop("model.layers.2.self_attn.q_proj.weight"))),
    Row("model-more-layers-than-weights", CONVERT, "the weights lack 'model.layers.4.", _more_layers),
    Row("model-weights-mis-shaped", CONVERT, "tensor 'lm_head.weight' has shape [600, 128]",
        _tensors("model", lambda t: t.update({"lm_head.weight": t["lm_head.weight"][:600].clone()}))),
    Row("model-weights-extra", CONVERT, "tensor 'model.layers.9.mlp.up_proj.weight' is not a weight",
        _tensors("model", lambda t: t.update({"model.layers.9.mlp.up_proj.weight": t["model.norm.weight"].clone()}))),
    Row("model-weights-integer", CONVERT, "tensor 'model.norm.weight' is I8",
        _tensors("model", lambda t: t.update({"model.norm.weight": t["model.norm.weight"].to(torch.int8)}))),
    Row("model-weights-link-out", CONVERT, "model.safetensors is a symbolic link to", _weights_link_out("model")),
    Row("model-tokenizer-auto-map", CONVERT, "holds custom tokenizer code (auto_map)",
        _edit_json("model", "tokenizer_config.json",
                   lambda c, box: c.update(auto_map={"AutoTokenizer": ["x.T", None]}))),
    Row("model-generation-config-broken", CONVERT, "generation_config.json", _write("model", "generation_config.json",
                                                                                   '{"eos_token_id": [1, "x"]}')),
    Row("model-quantized", CONVERT, "holds a quantization_config (gptq)",
        _edit_json("model", "config.json", lambda c, box: c.update(quantization_config={"quant_method": "gptq"}))),
    # 4. lpes-search: a lock on --out, its files checked before generation 0
    Row("search-out-locked", SEARCH, "another lpes run is writing", _held_lock),
    Row("search-checkpoint-is-a-folder", SEARCH, "best.json.state.json is in the way",
        lambda box: (box.path("work") / "best.json.state.json").mkdir()),
    Row("search-name-too-long-for-the-checkpoint", (*SEARCH[:-1], "{work}/" + "x" * 225 + ".json"),
        "makes a name longer than this filesystem allows"),
    # 5. parsers: one line, exit 2
    Row("data-gzip-truncated", (*SEARCH, "--data", "{work}/kv.jsonl.gz"), "is truncated or corrupt",
        _data_file("kv.jsonl.gz", GOOD_GZIP[:-12])),
    Row("data-gzip-corrupt", (*SEARCH, "--data", "{work}/kv.jsonl.gz"), "is truncated or corrupt",
        _data_file("kv.jsonl.gz", GOOD_GZIP[:20] + bytes(range(256)) * 2)),
    Row("data-deep-nesting", (*SEARCH, "--data", "{work}/kv.jsonl"), "nested too deeply",
        _data_file("kv.jsonl", b"[" * 100_000 + b"]" * 100_000 + b"\n")),
    Row("data-5000-digit-integer", (*SEARCH, "--data", "{work}/kv.jsonl"), "Exceeds the limit (4300 digits)",
        _data_file("kv.jsonl", RECORD[:-2].encode() + b', "n": ' + b"9" * 5000 + b"}\n")),
    Row("task-name-not-a-string", SEARCH, "'task' is ['kv']", _write("model", "lpes_task.json", '{"task": ["kv"]}')),
    Row("task-file-5000-digits", SEARCH, "lpes_task.json is not valid JSON: Exceeds the limit",
        _write("model", "lpes_task.json", '{"task": "tiny-kv", "seed": ' + "9" * 5000 + "}")),
    Row("data-file-one-distinct-record", (*SEARCH, "--data", "{work}/kv.jsonl"), "holds 1 distinct record(s)",
        _data_file("kv.jsonl", RECORD.encode() * 200)),
    Row("data-duplicate-field", (*SEARCH, "--data", "tiny-kv:examples=1,examples=2"),
        "field 'examples' is given twice"),
    Row("push-to-hub-bad-repo-id", (*CONVERT, "--push-to-hub", "not a repo!!"), "is not a Hub repo id"),
    Row("push-to-hub-offline", (*CONVERT, "--push-to-hub", "me/model-lpes"), "HF_HUB_OFFLINE is set"),
    # 6. bounds
    Row("generate-max-new-tokens-1e9", (*GENERATE[:-1], "1000000000"), "--max-new-tokens 1000000000 would reach"),
    Row("generate-prompt-100k-characters", ("lpes-generate", "{onnx}", "f2 " * 33_000),
        "tokens) + 32 new tokens would reach position"),
    Row("search-ray-nothing-listening", (*SEARCH, "--ray", "127.0.0.1:9", "--device", "cpu"), "no Ray cluster at"),
    Row("tensorrt-max-batch-huge", ("lpes-convert", "{model}", "--curve", "{spec}", "--to", "tensorrt", "--out",
                                    "{out}", "--max-batch", str(10**20)), "--max-batch must be at most 65536"),
    # 7. planted files beside --out, accepted-but-wrong values
    Row("planted-lock-symlink", CONVERT, ".out.lpes-lock is not lpes's lock file (a symbolic link)",
        _planted(".out.lpes-lock")),
    Row("planted-old-symlink", CONVERT, ".out.lpes-old is not a folder lpes set aside (a symbolic link)",
        _planted(".out.lpes-old")),
    Row("planted-staging-symlink", CONVERT, ".out.lpes-partial-12345 is not a staging folder lpes made",
        _planted(".out.lpes-partial-12345")),
    Row("planted-search-lock-symlink", SEARCH, ".best.json.lpes-lock is not lpes's lock file",
        _planted(".best.json.lpes-lock")),
    Row("spec-provenance-nan", CONVERT, "NaN is not a JSON value", _nan_provenance),
]


@dataclass(frozen=True)
class Outcome:
    code: int | None
    stderr: str


def run_row(row: Row, box: Box) -> Outcome:
    from lpes import cli

    main = {"lpes-convert": cli.convert_main, "lpes-validate": cli.validate_main, "lpes-generate": cli.generate_main,
            "lpes-search": cli.search_main}[row.argv[0]]
    argv = [a.format(**box.fill) for a in row.argv[1:]]
    stderr, cwd = io.StringIO(), os.getcwd()
    os.chdir(box.fill["work"])
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(argv)
            except SystemExit as exit_:
                code = exit_.code
            except BaseException:  # a traceback where one line was promised
                traceback.print_exc(file=stderr)
                code = None
    finally:
        os.chdir(cwd)
    return Outcome(code, stderr.getvalue())


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_refused_in_one_line_and_nothing_changed(row, received, evil_library, tmp_path, monkeypatch):
    library, marker = evil_library
    if row.needs_library and library is None:
        pytest.skip("no C compiler to build the library the row plants")
    if row.id == "push-to-hub-offline":
        import huggingface_hub.constants

        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    box = make_box(tmp_path, received, library, marker)
    handle = row.setup(box) if row.setup else None
    before = tree_digest(box.root)
    try:
        done = run_row(row, box)
    finally:
        if hasattr(handle, "close"):
            handle.close()
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.code == 2, (done.code, done.stderr[-3000:])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{row.argv[0]}: error: ") and row.message in lines[0], lines[0]
    assert not marker.exists(), "the planted library was loaded"
    after = tree_digest(box.root)
    if hasattr(handle, "close"):  # the row's own lock file, held by the test
        after = {k: v for k, v in after.items() if not k.endswith(".best.json.lpes-lock")}
        before = {k: v for k, v in before.items() if not k.endswith(".best.json.lpes-lock")}
    assert after == before, {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


def test_every_finding_has_a_row():
    ids = {r.id for r in ROWS}
    assert len(ids) == len(ROWS)
    for finding in ("genai-custom-ops-library", "onnx-external-data-absolute", "tensorrt-plugin",
                    "model-weights-missing", "model-more-layers-than-weights", "model-weights-link-out",
                    "search-out-locked", "data-gzip-truncated", "data-deep-nesting", "data-5000-digit-integer",
                    "task-name-not-a-string", "push-to-hub-bad-repo-id", "generate-max-new-tokens-1e9",
                    "search-ray-nothing-listening", "planted-lock-symlink", "planted-old-symlink",
                    "spec-provenance-nan", "data-duplicate-field", "tensorrt-max-batch-huge"):
        assert finding in ids, finding


# ---- what the table relies on ----


def test_an_lpes_output_is_accepted(received):
    from lpes.exporters.received import check_received_folder

    for folder in (received, received / "onnx", received / "genai", received.parent / "stock"):
        check_received_folder(folder)


def test_control_the_library_runs_when_genai_opens_the_folder_unchecked(received, evil_library, tmp_path):
    """What the check prevents: onnxruntime-genai loads custom_ops_library, and its constructor runs."""
    pytest.importorskip("onnxruntime_genai")
    library, _ = evil_library
    if library is None:
        pytest.skip("no C compiler")
    marker = tmp_path / "RAN"
    package = tmp_path / "genai"
    shutil.copytree(received / "genai", package)
    own = compile_library(package, marker)  # shipped inside the folder, where onnxruntime-genai allows it
    config = json.loads((package / "genai_config.json").read_text())
    config["model"]["decoder"]["session_options"]["custom_ops_library"] = str(own)
    (package / "genai_config.json").write_text(json.dumps(config))
    code = f"import onnxruntime_genai as og\ntry:\n    og.Model({str(package)!r})\nexcept Exception:\n    pass\n"
    subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert marker.read_text() == "ran"
    from lpes.exporters.genai.runner import GenaiGreedy

    marker.unlink()
    with pytest.raises(LpesError, match="libevil.so is a native library"):
        GenaiGreedy(package)  # the runner checks before og.Model opens anything
    own.unlink()
    with pytest.raises(LpesError, match="custom_ops_library names native code"):
        GenaiGreedy(package)
    assert not marker.exists()


def test_hugging_face_cache_links_are_the_folders_own(tmp_path):
    """snapshot_download's layout: snapshots/REV/NAME -> ../../blobs/HASH is not a link out of the folder."""
    from lpes.converter.loading import check_model_folder

    repo = tmp_path / "models--me--tiny"
    snapshot, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for source in bundled_models()["lpes-tiny-kv"].iterdir():
        shutil.copyfile(source, blobs / source.name)
        (snapshot / source.name).symlink_to(Path("..", "..", "blobs", source.name))
    assert check_model_folder(snapshot) == snapshot


@pytest.mark.parametrize("model_type, overrides", [("llama", {"tie_word_embeddings": True}), ("mixtral", {}),
                                                   ("gemma2", {})])
def test_weights_of_every_layout_match_their_model(model_type, overrides, tmp_path):
    """Tied embeddings (absent lm_head), fused MoE experts (transformers' own renaming), buffers: accepted."""
    from conftest import tiny_model_dir

    from lpes.converter.loading import check_model_folder

    folder = tiny_model_dir(model_type, tmp_path, **overrides)
    assert check_model_folder(folder) == folder


def test_search_checks_free_space_before_any_work(tmp_path, monkeypatch):
    from lpes.cli import search_main
    from lpes.foundation import preflight

    real = shutil.disk_usage
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = search_main(["lpes-tiny-kv", "--generations", "0", "--out", str(tmp_path / "best.json")])
    assert code == 2
    assert ("has 1000 bytes free; this run writes up to 32.0 MiB there (16.0 MiB estimated, and a margin)"
            in stderr.getvalue())
    assert list(tmp_path.iterdir()) == []


# ---- 3. interrupts ----

CHILD = r'''
import os, sys, time, weakref
from lpes.foundation import outputs
from lpes.converter import hf_folder, loading
from lpes.cli import convert_main

point, argv = sys.argv[1], sys.argv[2:]


def waiting(fn):
    def wrapped(*args, **kwargs):
        print("ready", flush=True)
        time.sleep(60)
        return fn(*args, **kwargs)
    return wrapped


def dropped_in_a_callback(fn):
    """The signal arrives while a weakref callback runs: Python drops what a handler raises there."""
    def wrapped(*args, **kwargs):
        class Thing:
            pass

        def callback(ref):
            print("ready", flush=True)
            time.sleep(5)

        thing = Thing()
        ref = weakref.ref(thing, callback)
        del thing  # the callback runs here
        return fn(*args, **kwargs)
    return wrapped


if point == "plan":
    loading.check_weights_match = waiting(loading.check_weights_match)
if point == "write":
    hf_folder.plot_curve = waiting(hf_folder.plot_curve)
if point == "swap":
    outputs._swap_in = waiting(outputs._swap_in)
if point == "callback":
    hf_folder.plot_curve = dropped_in_a_callback(hf_folder.plot_curve)
sys.exit(convert_main(argv))
'''
POINTS = ("plan", "write", "swap", "callback")


def _interrupted_child(tmp_path: Path, point: str, sig: int) -> tuple[int, str, Path]:
    root = tmp_path / f"{point}-{sig}"
    root.mkdir()
    (root / "spec.json").write_text(json.dumps(SPEC))
    (root / "child.py").write_text(CHILD)
    argv = ["lpes-tiny-kv", "--curve", str(root / "spec.json"), "--to", "hf", "--no-validate", "--out",
            str(root / "out")]
    child = subprocess.Popen([sys.executable, str(root / "child.py"), point, *argv], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=CHILD_ENV)
    assert child.stdout.readline().strip() == "ready", child.stderr.read()[-3000:]
    child.send_signal(sig)
    code = child.wait(timeout=120)
    return code, child.stderr.read(), root


def test_sigint_and_sigterm_end_the_run_at_every_step_with_nothing_written(tmp_path):
    # Each step under one of the two signals, taking turns (one handler serves both: foundation/interrupts.py),
    # and the signal dropped in a callback under both: five children of a full convert each, not eight.
    cases = [("plan", signal.SIGINT), ("write", signal.SIGTERM), ("swap", signal.SIGINT),
             ("callback", signal.SIGTERM), ("callback", signal.SIGINT)]
    assert {point for point, _ in cases} == set(POINTS)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda case: _interrupted_child(tmp_path, *case), cases))
    for (point, sig), (code, stderr, root) in zip(cases, results):
        assert code == 130, (point, sig, code, stderr[-3000:])
        assert "Traceback" not in stderr and "Exception ignored" not in stderr, (point, stderr[-3000:])
        assert stderr.strip().splitlines()[-1] == "lpes-convert: interrupted; nothing was left half-written"
        assert sorted(p.name for p in root.iterdir()) == ["child.py", "spec.json"], point


def test_a_killed_runs_staging_folder_is_said_only_by_the_run_that_writes_its_out(tmp_path):
    """A SIGKILL leaves .out.lpes-partial-PID. --help, --version and a refusal elsewhere say nothing of it (a
    refusal stays the one line on stderr); a run on another --out neither; the run on the same --out removes
    it and says so."""
    import re

    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    killed = ("import os, signal, sys\nfrom lpes.foundation import outputs\nfrom lpes.cli import convert_main\n"
              "outputs._swap_in = lambda staging, out: os.kill(os.getpid(), signal.SIGKILL)\n"
              "sys.exit(convert_main(sys.argv[1:]))\n")

    def convert(out: str, *flags: str, code: str | None = None) -> subprocess.CompletedProcess:
        argv = ["lpes-tiny-kv", "--curve", str(tmp_path / "spec.json"), "--to", "hf", "--no-validate", "--out",
                str(tmp_path / out), *flags]
        return command("convert_main", argv, code)

    def command(main: str, argv: list[str], code: str | None = None) -> subprocess.CompletedProcess:
        code = code or f"import sys\nfrom lpes.cli import {main}\nsys.exit({main}(sys.argv[1:]))\n"
        return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300,
                              cwd=tmp_path, env=CHILD_ENV)

    child = convert("out", code=killed)
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    staging = [p for p in tmp_path.iterdir() if p.name.startswith(".out.lpes-partial-")]
    assert len(staging) == 1
    for main, argv in (("convert_main", ["--help"]), ("convert_main", ["--version"]),
                       ("validate_main", ["--help"]), ("search_main", ["--help"])):
        done = command(main, argv)
        assert done.returncode == 0 and done.stderr == "", (main, argv, done.stderr)
    refused = command("validate_main", [str(tmp_path / "nowhere")])
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [f"lpes-validate: error: folder not found: {tmp_path / 'nowhere'}"]
    elsewhere = convert("other")
    assert elsewhere.returncode == 0, elsewhere.stderr[-3000:]
    assert "lpes-partial" not in elsewhere.stderr and "interrupted" not in elsewhere.stderr
    assert staging[0].is_dir()  # another --out's staging folder is not this run's to remove
    same = convert("out")
    assert same.returncode == 0, same.stderr[-3000:]
    notes = [line for line in same.stderr.splitlines() if staging[0].name in line]
    assert len(notes) == 1 and "left by an interrupted run" in notes[0], same.stderr
    assert re.search(r"\(\d+(\.\d)? (bytes|KiB|MiB|GiB)\)", notes[0]), notes[0]  # its size
    assert not staging[0].exists()


def test_a_full_disk_names_the_destination(capsys):
    """A copy that fills the disk reports its source as filename and its destination as filename2."""
    import errno

    from lpes.foundation.commands import run_command

    def main(argv):
        raise OSError(errno.ENOSPC, "No space left on device", "/model/model.safetensors", None,
                      "/out/model.safetensors")

    assert run_command("lpes-convert", main, []) == 2
    assert capsys.readouterr().err.strip() == ("lpes-convert: error: No space left on device: /out/model.safetensors "
                                               "(the disk is full)")
