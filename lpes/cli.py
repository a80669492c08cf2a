"""Command-line entry points: lpes-convert, lpes-search, lpes-validate, lpes-generate.

Each parses its flags, calls the Python API, prints what a user needs, and exits
0 on success, 1 when a validation fails (the report says why), 2 on a user error
(one line, no traceback), 3 when validation did not run everything it planned ("not
validated": a check was skipped, e.g. key-value scoring over the time budget).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lpes.foundation.commands import ArgumentParser, run_command
from lpes.foundation.errors import LpesError, shown

# Exit status per verdict (validation.report): a check that did not run is not a pass.
EXIT_STATUS = {"passed": 0, "failed": 1, "not validated": 3}

EXAMPLES_CONVERT = """\
examples:
  lpes-convert lpes-tiny-induction --curve demo-out/best.json --to hf,onnx --out demo-out/next/tiny-lpes
  lpes-convert meta-llama/Llama-3.2-1B --curve best.json --to hf,onnx --out llama-lpes
  lpes-convert ./my-model --curve best.json --to tensorrt --dtype float16 --out engine  # experimental

MODEL is a bundled short name (lpes-tiny-kv), a local Hugging Face folder, or a Hub id
(downloaded when online). The spec (--curve) holds per-layer scales or a Bezier curve
(see docs/search.md, "The spec file"). Targets go into one folder:
{targets}
Unless --no-validate, the folder is then validated as lpes-validate does (see its --help):
the task the curve was searched on (recorded in the spec: --data, chat template, answer
budget; each flag given here replaces its part, and says so), else the model's own task,
e.g. 100 examples (20 per gold index) for lpes-tiny-kv; where that would take over 20
minutes here it is skipped with the command to run it.
Exit status: 0 passed, 1 validation failed (report printed), 2 bad input, or a target this
machine cannot build (tensorrt without tensorrt or a GPU: the rest is written, with the
recipe), 3 not validated (a check was skipped; the report says which and how to run it).
Each target, what is shipped and how to load it: docs/targets.md; validation: docs/validation.md.
{data}"""

EXAMPLES_VALIDATE = """\
examples (README's commands after make demo write the first folder, its lpes-tiny-kv commands the second):
  lpes-validate demo-out/next/lpes-tiny-induction-lpes --data tiny-induction:examples=10,length=1024
  lpes-validate kv-out/lpes-tiny-kv-lpes --data tiny-kv:examples=4,length=2048
  lpes-validate llama-lpes --model meta-llama/Llama-3.2-1B --data kv:pairs=75,examples=10
  lpes-validate llama-lpes --data kv-retrieval-75_keys.jsonl.gz

Without --data: the task the spec was searched on (its --data, chat template and answer
budget), else the model folder's own task, else kv with 75 pairs.
{data}Exit status: 0 passed (every planned check ran and held), 1 failed, 2 bad input, 3 not
validated (a check was skipped: the report says why and prints the command that runs it).
A run that does not pass keeps earlier scored results in DIR (it writes validation.skipped.*
or validation.failed.* beside them). Checks, verdicts, --data forms: docs/validation.md.
"""

EXAMPLES_GENERATE = """\
example, on a conversion of lpes-tiny-kv (README's lpes-tiny-kv commands write it):
  lpes-generate kv-out/lpes-tiny-kv-lpes "p3_1 f2 q3" --max-new-tokens 1

A tokenizer with a chat template (an instruct model's) gets the prompt as the user turn of
it, as a chat model expects; --no-chat-template sends the text as it is. DIR's tokenizer
must know every word of the prompt. The bundled model's words
(validation/tiny_kv.py): p{key}_{value} a fact (key 0-63, value 0-7), f0..f31 filler,
q{key} the query; the answer is a{value}, here a1 (the value of key 3). That model has
no end-of-sequence token, so without --max-new-tokens 1 it writes on past the answer.
What each target's folder holds and what runs it: docs/targets.md.
"""


def _convert_parser() -> argparse.ArgumentParser:
    from lpes.exporters.targets import add_target_arguments, default_targets, registry
    from lpes.validation.tasks import DATA_FLAG, DATA_HELP

    parser = ArgumentParser(
        prog="lpes-convert",
        description="Bake an LPES spec into a model: Hub folder, ONNX, onnxruntime-genai, or TensorRT "
        "(experimental: never built here).",
        epilog=EXAMPLES_CONVERT.format(targets="\n".join(cls.help_line() for cls in registry().values()),
                                       data=DATA_HELP),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", help="bundled short name, local model folder, or Hub id")
    parser.add_argument("--curve", "--spec", dest="spec", required=True, help="spec file (best.json) from lpes-search")
    parser.add_argument("--to", default=default_targets(),
                        help=f"comma-separated targets from {','.join(registry())} (default: {default_targets()})")
    parser.add_argument("--out", required=True, help="output folder (written atomically)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                        help="precision of the ONNX/TensorRT export (default: float32)")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing output folder lpes wrote (a file in it lpes did not write is "
                        "refused, never deleted)")
    parser.add_argument("--ship", default="decision", choices=("decision", "curve"),
                        help="decision: what lpes-search's held-out decision names (a stock RoPE config, no custom "
                        "code, unless the per-layer curve beat every simpler option); curve: the searched curve "
                        "(default %(default)s)")
    parser.add_argument("--no-validate", dest="validate", action="store_false",
                        help="skip parity and key-value validation (not recommended)")
    parser.add_argument("--push-to-hub", metavar="REPO_ID", help="upload the Hub folder to this repo when done")
    parser.add_argument("--data", default=None,
                        help="validation examples: " + DATA_FLAG + "the task the curve was searched on, from the "
                        "spec, else the model's own task")
    add_task_arguments(parser)
    parser.add_argument("--max-minutes", type=float, default=20.0,
                        help="validation: skip the key-value scoring when its estimate is longer, and say how to "
                        "run it elsewhere (0: no limit; default 20)")
    add_target_arguments(parser)
    return parser


def add_task_arguments(parser: argparse.ArgumentParser) -> None:
    """--chat-template / --no-chat-template and --answer-tokens of lpes-validate and lpes-convert."""
    chat = parser.add_mutually_exclusive_group()
    chat.add_argument("--chat-template", dest="chat_template", action="store_const", const=True, default=None,
                      help="wrap prompts in the tokenizer's chat template (default: as the search did, else on)")
    chat.add_argument("--no-chat-template", dest="chat_template", action="store_const", const=False,
                      help="do not wrap prompts in the tokenizer's chat template")
    parser.add_argument("--answer-tokens", type=int, default=None, metavar="N",
                        help="tokens the model may write before the value must have appeared (the benchmark: "
                        "100; default: the search's budget, else the task's: 100 for kv, the value's own tokens "
                        "for the bundled tasks)")


def _max_seconds(minutes: float) -> float | None:
    if not minutes >= 0 or minutes == float("inf"):  # also NaN
        raise LpesError(f"--max-minutes must be a number >= 0 (0: no limit), got {minutes:g}")
    return minutes * 60 or None


def _convert(argv: list[str] | None) -> int:
    from lpes.convert_pipeline import ConvertOptions, execute, plan
    from lpes.exporters.targets import target_options

    args = _convert_parser().parse_args(argv)
    options = ConvertOptions(model=args.model, spec=args.spec, out=args.out, targets=args.to, dtype=args.dtype,
                             force=args.force, validate=args.validate, push_to_hub=args.push_to_hub, data=args.data,
                             max_validation_seconds=_max_seconds(args.max_minutes),
                             chat_template=args.chat_template, answer_tokens=args.answer_tokens,
                             ship=args.ship, target_options=target_options(args))
    result = execute(plan(options))
    for report in result.reports:
        print(report)
    for warning in result.warnings + result.unbuilt:
        print(f"lpes-convert: {warning}", file=sys.stderr)
    print(f"wrote {shown(result.out)}")
    if result.unbuilt and result.verdict != "failed":  # asked for, not made: the README's exit 2 for "no GPU"
        print("lpes-convert: exit 2: not everything asked for was built here (the lines above say what and how "
              "to build it elsewhere)", file=sys.stderr)
        return 2
    if result.verdict == "not validated":
        print(f"lpes-convert: not validated: a planned check did not run (exit {EXIT_STATUS[result.verdict]}); "
              "the report above says which and the command that runs it", file=sys.stderr)
    return EXIT_STATUS[result.verdict]


def _validate_parser() -> argparse.ArgumentParser:
    from lpes.converter.loading import DEFAULT_MODEL
    from lpes.exporters.targets import registry
    from lpes.validation.tasks import DATA_FLAG, DATA_HELP

    exports = ", ".join(f"DIR/{cls.folder}" for cls in registry().values() if cls.folder != ".")
    parser = ArgumentParser(
        prog="lpes-validate",
        description="Key-value retrieval accuracy by gold position for the unscaled model, the LPES reference, "
        f"and every export found in DIR ({exports}). Writes validation.json/.md/.png into DIR, and "
        "rewrites DIR's model card (README.md) with them when they replace the earlier ones.",
        epilog=EXAMPLES_VALIDATE.format(data=DATA_HELP),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dir", type=Path, help="an lpes-convert output folder (holds lpes_spec.json)")
    parser.add_argument("--model", default=None, help=f"base model (default: from the spec, else {DEFAULT_MODEL})")
    parser.add_argument("--data", default=None,
                        help=DATA_FLAG + "the task the curve was searched on, from the spec, else the model "
                        "folder's own task, lpes_task.json, else kv with 75 pairs")
    add_task_arguments(parser)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"],
                        help="precision of the PyTorch reference (default auto: float32 on a CPU, where half "
                        "precision is slow and inexact; bfloat16 on a GPU that has it, else float16)")
    parser.add_argument("--device", default=None, help="torch device of the reference (default: cuda if any, else cpu)")
    parser.add_argument("--max-minutes", type=float, default=20.0,
                        help="skip the key-value scoring when its estimate is longer (0: no limit; default 20)")
    return parser


def _validate(argv: list[str] | None) -> int:
    from lpes.validate_pipeline import ValidateOptions, execute, plan

    args = _validate_parser().parse_args(argv)
    options = ValidateOptions(args.dir, model=args.model, data=args.data, chat_template=args.chat_template,
                              answer_tokens=args.answer_tokens, dtype=args.dtype, device=args.device,
                              max_seconds=_max_seconds(args.max_minutes))
    report = execute(plan(options))
    print(report.format())
    print("wrote " + ", ".join(shown(p) for p in report.files))
    return EXIT_STATUS[report.verdict]


def _generate_parser() -> argparse.ArgumentParser:
    from lpes.exporters.targets import targets_where

    (target,) = targets_where("generates")
    parser = ArgumentParser(
        prog="lpes-generate",
        description="Greedy generation with an lpes ONNX export in onnxruntime (KV cache, tokenizer from DIR).",
        epilog=EXAMPLES_GENERATE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dir", type=Path, help=f"ONNX folder (OUT/{target.folder}) or an lpes-convert output folder")
    parser.add_argument("prompt", help="text for DIR's tokenizer (quote it: it holds spaces)")
    parser.add_argument("--max-new-tokens", type=int, default=32,
                        help="stop after this many tokens, or at the model's end token (default %(default)s)")
    parser.add_argument("--no-chat-template", dest="chat_template", action="store_false",
                        help="send the prompt as typed, not as the user turn of the tokenizer's chat template")
    return parser


def _generate(argv: list[str] | None) -> int:
    from lpes.generate import GenerateOptions, execute, nothing_written, plan

    args = _generate_parser().parse_args(argv)
    planned = plan(GenerateOptions(args.dir, args.prompt, args.max_new_tokens, args.chat_template))
    text = execute(planned)
    print(text)
    if not text.strip():
        print(f"lpes-generate: {nothing_written(planned)}", file=sys.stderr)
    return 0


def _search(argv: list[str] | None) -> int:
    from lpes.search_cli import main

    return main(argv)


def build_parser(prog: str) -> argparse.ArgumentParser:
    """The argument parser of one command (`lpes-convert`, ...): what its --help shows and what it accepts."""
    from lpes.search_cli import build_parser as search_parser

    builders = {"lpes-convert": _convert_parser, "lpes-validate": _validate_parser,
                "lpes-generate": _generate_parser, "lpes-search": search_parser}
    if prog not in builders:
        raise LpesError(f"unknown command {prog!r} (known: {', '.join(builders)})")
    return builders[prog]()


def convert_main(argv: list[str] | None = None) -> int:
    return run_command("lpes-convert", _convert, argv)


def validate_main(argv: list[str] | None = None) -> int:
    return run_command("lpes-validate", _validate, argv)


def generate_main(argv: list[str] | None = None) -> int:
    return run_command("lpes-generate", _generate, argv)


def search_main(argv: list[str] | None = None) -> int:
    return run_command("lpes-search", _search, argv)
