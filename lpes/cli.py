"""Command-line entry points: lpes-convert, lpes-search, lpes-validate, lpes-generate.

Each parses its flags, calls the Python API, prints what a user needs, and exits
0 on success, 1 when a validation fails (the report says why), 2 on a user error
(one line, no traceback).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from lpes.errors import LpesError

EXAMPLES_CONVERT = """\
examples:
  lpes-convert lpes-tiny-kv --curve best.json --to hf --out tiny-lpes
  lpes-convert meta-llama/Llama-3.2-1B --curve best.json --to hf,onnx --out llama-lpes
  lpes-convert ./my-model --curve best.json --to tensorrt --dtype float16 --out engine-dir

MODEL is a bundled short name (lpes-tiny-kv), a local Hugging Face folder, or a Hub id
(downloaded when online). The spec (--curve) holds per-layer scales or a Bezier curve
(see README, "The spec file"). Targets go into one folder:
  OUT/           hf: the Hub folder (load with trust_remote_code=True)
  OUT/onnx/      onnx: model.onnx with KV cache, checked against the PyTorch reference
  OUT/tensorrt/  tensorrt: engine built from OUT/onnx (needs an NVIDIA GPU + tensorrt)
  OUT/genai/     genai: onnxruntime-genai package with per-layer RoPE caches
Exit status: 0 ok, 1 validation failed (report printed), 2 bad input.
"""


def _run(prog: str, main: Callable[[list[str] | None], int], argv: list[str] | None) -> int:
    try:
        return main(argv)
    except LpesError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; nothing was left half-written", file=sys.stderr)
        return 130


def _convert(argv: list[str] | None) -> int:
    from lpes.convert_pipeline import TARGETS, execute, plan
    from lpes.exporters.tensorrt_profiles import add_profile_arguments, profile_overrides

    parser = argparse.ArgumentParser(
        prog="lpes-convert",
        description="Bake an LPES spec into a model: Hub folder, ONNX, TensorRT or onnxruntime-genai.",
        epilog=EXAMPLES_CONVERT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", help="bundled short name, local model folder, or Hub id")
    parser.add_argument("--curve", "--spec", dest="spec", required=True, help="spec file (best.json) from lpes-search")
    parser.add_argument("--to", default="hf", help=f"comma-separated targets from {','.join(TARGETS)} (default: hf)")
    parser.add_argument("--out", required=True, help="output folder (written atomically)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                        help="precision of the ONNX/TensorRT export (default: float32)")
    parser.add_argument("--force", action="store_true", help="replace an existing output folder")
    parser.add_argument("--no-validate", dest="validate", action="store_false",
                        help="skip parity and key-value validation (not recommended)")
    parser.add_argument("--push-to-hub", metavar="REPO_ID", help="upload the Hub folder to this repo when done")
    parser.add_argument("--genai-precision", default="fp32", choices=["fp32", "fp16", "bf16", "int8", "int4"],
                        help="onnxruntime-genai builder precision (default fp32; fp16/bf16 need --genai-provider cuda)")
    parser.add_argument("--genai-provider", default="cpu", choices=["cpu", "cuda", "dml", "webgpu"],
                        help="execution provider the genai package is built for (default cpu)")
    add_profile_arguments(parser)
    args = parser.parse_args(argv)
    the_plan = plan(args.model, args.spec, args.out, args.to, args.dtype, args.force, args.validate, args.push_to_hub,
                    profile_overrides(args), (args.genai_precision, args.genai_provider))
    result = execute(the_plan)
    for report in result.reports:
        print(report)
    for warning in result.warnings:
        print(f"lpes-convert: {warning}", file=sys.stderr)
    print(f"wrote {result.out}")
    if not result.passed:
        return 1
    return 2 if result.warnings else 0


def _validate(argv: list[str] | None) -> int:
    from lpes.converter.loading import DEFAULT_MODEL, resolve_model
    from lpes.validation.report import find_spec, validate

    parser = argparse.ArgumentParser(
        prog="lpes-validate",
        description="Key-value retrieval accuracy by gold position for the unscaled model, the LPES reference, "
        "and every export found in DIR (DIR/onnx, DIR/tensorrt). Writes validation.json/.md/.png into DIR.",
    )
    parser.add_argument("dir", type=Path, help="an lpes-convert output folder (holds lpes_spec.json)")
    parser.add_argument("--model", default=None, help=f"base model (default: from the spec, else {DEFAULT_MODEL})")
    parser.add_argument("--data", default=None,
                        help="kv:pairs=N,examples=M,... or FILE.jsonl (default: the model's own task)")
    parser.add_argument("--no-chat-template", dest="chat_template", action="store_false",
                        help="do not wrap prompts in the tokenizer's chat template")
    args = parser.parse_args(argv)
    spec = find_spec(args.dir)
    model = args.model or spec.provenance.get("base_model") or DEFAULT_MODEL
    report = validate(resolve_model(model), args.dir, spec, data=args.data, chat_template=args.chat_template)
    print(report.format())
    return 0 if report.passed else 1


def _generate(argv: list[str] | None) -> int:
    from lpes.validation.ort_runner import generate_text

    parser = argparse.ArgumentParser(
        prog="lpes-generate",
        description="Greedy generation with an lpes ONNX export in onnxruntime (KV cache, tokenizer from DIR).",
        epilog='example: lpes-generate out/onnx "The capital of France is"',
    )
    parser.add_argument("dir", type=Path, help="ONNX folder (OUT/onnx) or an lpes-convert output folder")
    parser.add_argument("prompt")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    onnx_dir = args.dir / "onnx" if (args.dir / "onnx" / "model.onnx").is_file() else args.dir
    if not (onnx_dir / "model.onnx").is_file():
        raise LpesError(f"no model.onnx in {args.dir}")
    print(generate_text(onnx_dir, args.prompt, args.max_new_tokens))
    return 0


def _search(argv: list[str] | None) -> int:
    from lpes.search.cli import main

    return main(argv)


def convert_main(argv: list[str] | None = None) -> int:
    return _run("lpes-convert", _convert, argv)


def validate_main(argv: list[str] | None = None) -> int:
    return _run("lpes-validate", _validate, argv)


def generate_main(argv: list[str] | None = None) -> int:
    return _run("lpes-generate", _generate, argv)


def search_main(argv: list[str] | None = None) -> int:
    return _run("lpes-search", _search, argv)
