"""Every example in every --help, in the README and in docs/*.md pastes into bash and is accepted by lpes itself.

An example line is checked three ways:

- bash: the line, with its command replaced by `printf '%s\\0'`, runs in an empty folder
  with `failglob` and `pipefail`; the words it prints must equal `shlex.split(line)`
  minus the command. A `|`, `;`, `&`, `>`, `$(...)`, backtick or unquoted glob would
  make bash fail or pass other words, so the line pastes as written;
- argparse: the command's own parser (`lpes.cli.build_parser`) accepts the words;
- data: a `--data` description parses (`validation.tasks.parse_description`) and, on
  the bundled model, resolves to a valid task; an `lpes-generate` prompt for the
  bundled model tokenizes with its vocabulary.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from lpes.cli import build_parser

COMMANDS = ("lpes-convert", "lpes-search", "lpes-validate", "lpes-generate")
# First words of README shell lines (lpes commands plus the make/python lines around them).
SHELL_WORDS = (*COMMANDS, "make", "python")
README = Path(__file__).resolve().parents[1] / "README.md"
# The pages README links to: their command lines are held to the same checks as README's.
DOCS = sorted((README.parent / "docs").glob("*.md"))
BUNDLED = "lpes-tiny-kv"


def help_examples(prog: str) -> list[str]:
    """The lines of `prog --help` that start with the command: its examples."""
    text = build_parser(prog).format_help()
    return [line.strip() for line in text.splitlines() if line.strip().startswith(prog + " ")]


def readme_shell_lines(text: str) -> list[str]:
    """Lines of markdown code blocks (indented, or fenced without a non-shell language) that start a command."""
    lines, fence = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            fence = None if fence is not None else (line[3:].strip() or "sh")
            continue
        if fence is not None:
            code = line if fence in ("sh", "bash", "console") else None
        else:
            code = line[4:] if line.startswith("    ") else None
        if code and code.split()[0] in SHELL_WORDS:
            lines.append(code.strip())
    return lines


ALL_EXAMPLES = [(prog, line) for prog in COMMANDS for line in help_examples(prog)]
README_LINES = readme_shell_lines(README.read_text())
DOC_LINES = [(page.name, line) for page in DOCS for line in readme_shell_lines(page.read_text())]


def bash_words(line: str, cwd: Path) -> list[str]:
    """The arguments bash passes to the line's command (the command itself left out)."""
    command = shlex.split(line, comments=True)[0]
    rest = line[line.index(command) + len(command):]
    script = "shopt -s failglob\nset -o pipefail\nprintf '%s\\0'" + rest
    done = subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"}, timeout=30)
    assert done.returncode == 0 and not done.stderr, f"bash fails on: {line}\n{done.stderr}"
    return done.stdout.split("\0")[:-1]


def check_pastes(line: str, cwd: Path) -> list[str]:
    words = shlex.split(line, comments=True)
    assert bash_words(line, cwd) == words[1:], f"bash reads other words than intended: {line}"
    return words


def check_accepted(prog: str, args: list[str]) -> None:
    parser = build_parser(prog)
    try:
        parsed = parser.parse_args(args)
    except SystemExit:
        pytest.fail(f"{prog} rejects its own example: {shlex.join([prog, *args])}")
    data = getattr(parsed, "data", None)
    if data:
        check_data(data, getattr(parsed, "model", None) or getattr(parsed, "dir", None))
    if prog == "lpes-generate" and BUNDLED in str(parsed.dir):
        check_bundled_prompt(parsed.prompt)


def check_data(data: str, model: object) -> None:
    from lpes.converter.loading import resolve_model
    from lpes.validation.tasks import parse_description, task_config

    if data.endswith((".jsonl", ".jsonl.gz")) or "file=" in data:
        return  # a benchmark file the user brings; not here
    parse_description(data)
    if str(model) == BUNDLED or BUNDLED in str(model):
        task_config(resolve_model(BUNDLED), data)  # every field valid for the bundled model's task


def check_bundled_prompt(prompt: str) -> None:
    from lpes.converter.loading import load_tokenizer, resolve_model

    vocab = load_tokenizer(resolve_model(BUNDLED)).get_vocab()
    unknown = [w for w in prompt.split() if w not in vocab]
    assert not unknown, f"the bundled tokenizer does not know {unknown} in {prompt!r}"


@pytest.mark.parametrize("prog", COMMANDS)
def test_every_command_has_examples(prog):
    assert help_examples(prog), f"{prog} --help shows no example"


@pytest.mark.parametrize(("prog", "line"), ALL_EXAMPLES, ids=[line for _, line in ALL_EXAMPLES])
def test_help_example_pastes_and_parses(prog, line, tmp_path):
    words = check_pastes(line, tmp_path)
    check_accepted(prog, words[1:])


@pytest.mark.parametrize("line", README_LINES)
def test_readme_line_pastes_and_parses(line, tmp_path):
    words = check_pastes(line, tmp_path)
    if words[0] in COMMANDS:
        check_accepted(words[0], words[1:])


@pytest.mark.parametrize(("page", "line"), DOC_LINES, ids=[f"{page}: {line}" for page, line in DOC_LINES])
def test_docs_line_pastes_and_parses(page, line, tmp_path):
    words = check_pastes(line, tmp_path)
    if words[0] in COMMANDS:
        check_accepted(words[0], words[1:])


def test_the_docs_hold_command_lines_to_check():
    """A page moved or a block's indentation lost would otherwise leave the test above with nothing to check."""
    pages = {page for page, _ in DOC_LINES}
    assert {"search.md", "targets.md", "validation.md", "real-models.md"} <= pages, pages


def test_readme_has_an_example_of_every_command():
    firsts = {line.split()[0] for line in README_LINES}
    assert set(COMMANDS) <= firsts, f"no README example of {set(COMMANDS) - firsts}"


@pytest.mark.parametrize("line", [
    "lpes-search m --out b.json --data kv:gold=0|24",
    "lpes-generate d The capital of France is; echo",
    "lpes-validate $HOME/out",
    "lpes-convert m --curve best*.json --to hf --out o",
    "lpes-convert m --curve `ls` --to hf --out o",
])
def test_the_bash_check_catches_what_does_not_paste(line, tmp_path):
    with pytest.raises(AssertionError):
        check_pastes(line, tmp_path)


def test_generate_example_answers_as_its_help_says():
    """The help's example prompt gets the answer the help names, from the bundled model itself."""
    import torch
    from transformers import AutoModelForCausalLM

    from lpes.converter.loading import load_tokenizer, resolve_model

    text = build_parser("lpes-generate").format_help()
    prompt = shlex.split(help_examples("lpes-generate")[0])[2]
    named = re.search(r"here (a\d+)", text).group(1)
    folder = resolve_model(BUNDLED)
    tokenizer = load_tokenizer(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        logits = model(**tokenizer(prompt, return_tensors="pt")).logits[0, -1]
    assert tokenizer.convert_ids_to_tokens(int(logits.argmax())) == named


# -- what the README says a command does, checked by running it (or against what runs it) --------

MAKEFILE = README.parent / "Makefile"
DEMO_OUT = "demo-out"


def block_after(text: str, marker: str) -> list[str]:
    """The lines of the first indented code block after the line holding `marker`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if marker in line)
    block: list[str] = []
    for line in lines[start + 1:]:
        if line.startswith("    "):
            block.append(line.strip())
        elif block and line.strip():
            break
    return block


def make_demo_commands() -> list[str]:
    """The lpes commands of the Makefile's demo target, as a user types them (no $(BIN)/, $(DEMO) spelled out)."""
    lines = MAKEFILE.read_text().splitlines()
    start = lines.index("demo: install")
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return [line.replace("$(BIN)/", "").replace("$(DEMO)", DEMO_OUT) for line in recipe
            if line.startswith("$(BIN)/lpes-")]


def test_readme_lists_what_make_demo_runs():
    block = block_after(README.read_text(), "`make demo` runs (")
    assert block == make_demo_commands()


def test_readme_lines_after_the_demo_continue_on_its_output_and_overwrite_none_of_it():
    """They use the demo's model and folder, and write (--out, lpes-validate's DIR) only under demo-out/next/."""
    block = block_after(README.read_text(), "Then, on its output")
    assert {shlex.split(line)[0] for line in block} >= {"lpes-generate", "lpes-convert", "lpes-validate"}
    demo_model = shlex.split(make_demo_commands()[0])[1]
    for line in block:
        words = shlex.split(line)
        args = build_parser(words[0]).parse_args(words[1:])
        if words[0] == "lpes-generate":  # writes nothing; reads the demo's folder
            assert str(args.dir).startswith(f"{DEMO_OUT}/"), line
            continue
        written = args.dir if words[0] == "lpes-validate" else args.out  # validate writes validation.* into DIR
        assert str(written).startswith(f"{DEMO_OUT}/next/"), f"would write into the demo's output: {line}"
        assert not getattr(args, "force", False), line
        if words[0] != "lpes-validate":
            assert args.model == demo_model, f"switches model: {line}"


VALIDATION_DOC = README.parent / "docs" / "validation.md"  # the page of the --data forms
TARGETS_DOC = README.parent / "docs" / "targets.md"  # the page of --to tensorrt


def test_every_data_form_make_demo_uses_is_documented():
    tasks = {shlex.split(line)[shlex.split(line).index("--data") + 1].split(":")[0]
             for line in make_demo_commands() if "--data" in line}
    data_page = VALIDATION_DOC.read_text()
    search_help = build_parser("lpes-search").format_help()
    for task in tasks:
        assert re.search(rf"^\| `{task}:", data_page, re.M), f"docs/validation.md's Data table has no {task} row"
        assert re.search(rf"^\s+{task}:", search_help, re.M), f"lpes-search --help names no {task} form"


def test_tensorrt_without_a_gpu_does_what_readme_and_help_say(tmp_path, monkeypatch, capsys):
    """No engine (no tensorrt, or no GPU): the recipe, the ONNX export kept, the exit status docs/targets.md names."""
    from conftest import tiny_model_dir

    from lpes.cli import convert_main
    from lpes.exporters.tensorrt import build as tensorrt_build
    from lpes.foundation.spec import Spec, dump_spec

    page = " ".join(TARGETS_DOC.read_text().split())
    said = re.search(r"keeps the ONNX export and exits (\d)", page)
    assert said, "docs/targets.md no longer says how lpes-convert --to tensorrt ends without a GPU"
    assert re.search(r"trtexec\.sh to build it there, and exit (\d)", " ".join(
        build_parser("lpes-convert").format_help().split())).group(1) == said.group(1)
    monkeypatch.setattr(tensorrt_build, "missing_requirements", lambda: "an NVIDIA GPU (the CUDA driver reports none)")
    model = tiny_model_dir("llama", tmp_path)
    dump_spec(Spec.from_scales([2.0, 1.0, 4.0]), tmp_path / "spec.json")
    out = tmp_path / "out"
    code = convert_main([str(model), "--curve", str(tmp_path / "spec.json"), "--to", "tensorrt", "--out", str(out),
                         "--no-validate"])
    captured = capsys.readouterr()
    assert code == int(said.group(1)), captured.err[-2000:]
    assert "engine built" not in captured.err  # no line claims what was not done
    assert "writing tensorrt: the trtexec recipe only, no engine (this machine lacks an NVIDIA GPU" in captured.err
    assert "TensorRT engine not built: this machine lacks an NVIDIA GPU" in captured.err
    assert "trtexec \\\n    --onnx=../onnx/model.onnx" in captured.err  # the command, printed
    assert (out / "onnx" / "model.onnx").is_file()  # the ONNX export is kept
    assert sorted(p.name for p in (out / "tensorrt").iterdir()) == ["README.md", "trtexec.sh"]
