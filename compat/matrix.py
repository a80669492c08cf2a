"""`make compat`: the compatibility matrix, each row in a venv of its own (not part of `make test`).

The Hub folder's `modeling_lpes.py` and `lpes_rope.py` run inside whatever transformers the
user's runtime brings, and lpes declares `transformers>=5.0,<6` (pyproject.toml). Each row
is one transformers release in `.venv-compat-<version>` (CPU torch first, as `make install`
does, then that release and nothing of lpes):

- the two Hub folders lpes writes for the bundled model, per-layer (custom code,
  trust_remote_code) and uniform (stock RoPE, no custom code), loaded with AutoTokenizer,
  AutoModelForCausalLM and AutoModel, against lpes's reference computed here in lpes's own
  venv (compat/reference_outputs.py -> compat/check_hub.py; logits within 1e-5);
- where a row says so, lpes itself installed there (`pip install .`, the declared
  dependencies resolved against that release) and the fast test subset FAST_TESTS run;
- the last row is optimum-onnx 0.1.0 on transformers 4.x loading lpes's ONNX folder
  (compat/expected_tokens.py -> compat/check_optimum.py, `.venv-compat`).

Prints the matrix (markdown, as README shows it), writes it to compat-out/matrix.md and
exits 1 when a row fails. Run from the repository root with lpes's venv:

    .venv/bin/python compat/matrix.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "compat-out"
BIN = Path(sys.executable).parent  # lpes's venv (make compat runs this with .venv/bin/python)
PYTHON = os.environ.get("PYTHON", "python3")
# Quick and offline, and together they cover what runs inside transformers: the spec, the per-layer
# reference patch, the Hub folder (written, loaded with and without lpes), stock RoPE baselines
# built from config.json, and the calls vLLM's Transformers backend makes.
FAST_TESTS = ("tests/test_spec.py", "tests/test_reference.py", "tests/test_stock_rope.py",
              "tests/test_rope_baselines.py", "tests/test_hf_folder.py", "tests/test_vllm_contract.py")


@dataclass(frozen=True)
class Row:
    name: str  # the venv is .venv-compat-<name>
    requirement: str  # what pip installs
    why: str
    lpes_tests: bool = False  # install lpes there and run FAST_TESTS


ROWS = (
    Row("5.0.0", "transformers==5.0.0", "the first transformers 5 (Hub folders only: lpes needs 5.17)"),
    Row("5.17.0", "transformers==5.17.0", "the oldest lpes declares (pyproject: `>=5.17,<6`)", lpes_tests=True),
    Row("5.20.2", "transformers==5.20.2", "vLLM 0.33 pins `>=5.16.1,<5.21`: its newest", lpes_tests=True),
    Row("newest", "transformers>=5,<6", "the newest transformers 5"),
)
OPTIMUM_VENV = ROOT / ".venv-compat"
OPTIMUM_REQUIREMENTS = ("optimum-onnx[onnxruntime]==0.1.0", "transformers<4.58")


@dataclass
class Result:
    row: str
    transformers: str = "?"
    why: str = ""
    cells: dict[str, str] = field(default_factory=dict)
    passed: bool = True

    def cell(self, column: str, ok: bool, text: str) -> None:
        self.cells[column] = f"{'pass' if ok else '**FAIL**'}: {text}"
        self.passed &= ok


COLUMNS = ("Hub folder, custom code", "Hub folder, stock RoPE", "lpes installed: fast tests", "ONNX folder")


def run(command: list[str], *, capture: bool = False, check: bool = True) -> subprocess.CompletedProcess:
    """Run from the repository root; stream the output (and keep it, with capture)."""
    print("+ " + " ".join(str(c) for c in command), flush=True)
    if not capture:
        return subprocess.run([str(c) for c in command], cwd=ROOT, check=check)
    lines = []
    with subprocess.Popen([str(c) for c in command], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as process:
        for line in process.stdout:
            print(line, end="", flush=True)
            lines.append(line)
    done = subprocess.CompletedProcess(command, process.returncode, "".join(lines), "")
    if check and done.returncode:
        raise subprocess.CalledProcessError(done.returncode, command, done.stdout)
    return done


def venv(name: str, requirements: tuple[str, ...], upgrade: bool = False) -> Path:
    """`.venv-compat-<name>` (or the path given) with CPU torch first, then `requirements`; its bin folder."""
    folder = ROOT / name if name.startswith(".venv") else ROOT / f".venv-compat-{name}"
    if not (folder / "bin" / "python").exists():
        run([PYTHON, "-m", "venv", folder])
    run(["make", "--no-print-directory", "torch", f"BIN={folder / 'bin'}"])  # no CUDA build without a GPU
    run([folder / "bin" / "pip", "install", "--quiet", *(["--upgrade"] if upgrade else []), *requirements])
    return folder / "bin"


def version_in(bin_dir: Path, package: str = "transformers") -> str:
    done = subprocess.run([bin_dir / "python", "-c", f"import {package}; print({package}.__version__)"],
                          capture_output=True, text=True)
    return done.stdout.strip() or "?"


def declared_oldest() -> str:
    """The lower bound of pyproject.toml's transformers requirement, as a release (5.17 -> 5.17.0)."""
    found = re.search(r'"transformers>=([\d.]+)', (ROOT / "pyproject.toml").read_text())
    parts = found.group(1).split(".") if found else ["?"]
    return ".".join(parts + ["0"] * (3 - len(parts)))


def hub_rows(reference: Path) -> list[Result]:
    results = []
    for row in ROWS:
        result = Result(row.name, why=row.why)
        results.append(result)
        try:
            bin_dir = venv(row.name, (row.requirement,), upgrade=row.name == "newest")
        except subprocess.CalledProcessError as err:
            result.cell(COLUMNS[0], False, f"venv not installed ({err})")
            continue
        result.transformers = version_in(bin_dir)
        out = OUT / f"hub-{row.name}.json"
        out.unlink(missing_ok=True)
        run([bin_dir / "python", "compat/check_hub.py", reference, out], check=False)
        checks = json.loads(out.read_text())["checks"] if out.is_file() else {}
        for folder, column in (("custom", COLUMNS[0]), ("stock", COLUMNS[1])):
            mine = {k: v for k, v in checks.items() if k.startswith(f"{folder}:")}
            ok = bool(mine) and all(v["ok"] for v in mine.values())
            worst = [re.search(r"max \|logits - lpes\| (\S+)", v["detail"]) for v in mine.values()]
            worst = next((m.group(1) for m in worst if m), "?")
            failed = [f"{k.split(': ', 1)[1]}: {v['detail']}" for k, v in mine.items() if not v["ok"]]
            result.cell(column, ok, f"{len(mine)} checks, max abs logit diff {worst}" if ok
                        else ("; ".join(failed) or "did not run"))
        if row.lpes_tests:
            lpes_tests(bin_dir, row, result)
        else:  # nothing of lpes in a Hub-folder-only row (a pip install of another row may have left it)
            subprocess.run([bin_dir / "pip", "uninstall", "--quiet", "--yes", "lpes"], capture_output=True)
    return results


def lpes_tests(bin_dir: Path, row: Row, result: Result) -> None:
    """lpes installed in the row's venv (its dependencies resolved with that transformers), FAST_TESTS run there."""
    try:
        run([bin_dir / "pip", "install", "--quiet", ".", "pytest", row.requirement])  # pip reinstalls a folder
    except subprocess.CalledProcessError as err:
        result.cell(COLUMNS[2], False, f"pip install . failed ({err.returncode})")
        return
    where = subprocess.run([bin_dir / "python", "-c", "import lpes, transformers; print(lpes.__file__, "
                            "transformers.__version__)"], cwd="/", capture_output=True, text=True).stdout.strip()
    print(f"lpes and transformers there: {where}")
    started = time.time()
    done = run([bin_dir / "pytest", "-q", "-p", "no:cacheprovider", *FAST_TESTS], capture=True, check=False)
    summary = next((line.strip("= \n") for line in reversed(done.stdout.splitlines())
                    if re.search(r"\d+ (passed|failed|error)", line)), "no summary")
    print(f"fast tests at transformers {row.name}: {summary} ({time.time() - started:.0f} s)")
    result.cell(COLUMNS[2], done.returncode == 0, f"{summary.split(' in ')[0]} ({len(FAST_TESTS)} files)")


def optimum_row() -> Result:
    """optimum-onnx on transformers 4.x loads lpes's ONNX folder and generates lpes's tokens."""
    result = Result("optimum-onnx 0.1.0", why="optimum-onnx 0.1.0 pins `<4.58`")
    folder = OUT / "lpes-tiny-kv-lpes"
    try:
        bin_dir = venv(".venv-compat", OPTIMUM_REQUIREMENTS)
        result.transformers = version_in(bin_dir)
        run([BIN / "lpes-convert", "lpes-tiny-kv", "--curve", "compat/lpes-tiny-kv-spec.json", "--to", "hf,onnx",
             "--out", folder, "--force", "--no-validate"])
        run([BIN / "python", "compat/expected_tokens.py", folder, OUT / "expected.json"])
    except subprocess.CalledProcessError as err:
        result.cell(COLUMNS[3], False, f"set-up failed ({err})")
        return result
    done = run([bin_dir / "python", "compat/check_optimum.py", folder / "onnx", OUT / "expected.json"], capture=True,
               check=False)
    compared = len(re.findall(r": same$", done.stdout, re.M))
    result.cell(COLUMNS[3], done.returncode == 0,
                f"ORTModelForCausalLM.generate gives lpes's greedy tokens ({compared} prompts and batch rows)"
                if done.returncode == 0 else "other tokens or a load error (see the log)")
    return result


def table(results: list[Result]) -> str:
    head = ["transformers", "why this one", *COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        version = r.transformers if r.row in (r.transformers, "newest") else f"{r.transformers} ({r.row})"
        lines.append("| " + " | ".join([version, r.why, *(r.cells.get(c, "-") for c in COLUMNS)]) + " |")
    return "\n".join(lines)


def main() -> int:
    OUT.mkdir(exist_ok=True)
    custom, stock = OUT / "hub-custom", OUT / "hub-stock"
    for spec, folder in (("compat/lpes-tiny-kv-spec.json", custom), ("compat/lpes-tiny-kv-uniform-spec.json", stock)):
        run([BIN / "lpes-convert", "lpes-tiny-kv", "--curve", spec, "--to", "hf", "--out", folder, "--force",
             "--no-validate"])
    reference = OUT / "reference.json"
    run([BIN / "python", "compat/reference_outputs.py", f"custom={custom}", f"stock={stock}",
         reference.with_suffix("")])
    oldest = declared_oldest()
    tested = [r for r in ROWS if r.name == oldest and r.lpes_tests]
    results = hub_rows(reference) + [optimum_row()]
    if not tested:  # the declared range moved without the matrix
        print(f"make compat: pyproject.toml declares transformers >= {oldest}, but no row tests lpes there")
        results.append(Result(f"declared oldest {oldest}", passed=False))
    matrix = table(results)
    (OUT / "matrix.md").write_text(matrix + "\n")
    print(f"\nmake compat: the matrix (lpes's reference: transformers {version_in(BIN)}; "
          f"also in {OUT / 'matrix.md'})\n")
    print(matrix)
    failed = [r.row for r in results if not r.passed]
    print(f"\nmake compat: {'FAILED: ' + ', '.join(failed) if failed else 'OK, every row passes'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
