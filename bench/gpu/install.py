"""Install lpes from the working tree into a folder of its own, without network (bench/gpu/check.sh runs it).

The GPU machines this check is for have torch, transformers, safetensors, huggingface_hub, matplotlib, tqdm and
onnx preinstalled but no network and no cmaes (lpes-search's default optimizer): what is missing travels as wheels
in bench/gpu/wheels/ (ignored by git; `make gpu-wheels` downloads them): cmaes, and setuptools for a Python that
lacks the build backend. lpes itself is built from a copy of the tree (pip writes build/ and *.egg-info beside the
source; a copy keeps the working tree clean) and installed with --no-deps into SITE, so that the machine's own
torch and transformers are used. Where pip itself is missing, the wheels are unpacked and lpes's packages copied
into SITE by pyproject.toml's package-dir, with a launcher per console script: the same layout, no metadata.

Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ROOT / "bench" / "gpu" / "wheels"
# Import name -> the distribution its wheel is named by: what lpes needs that the GPU machines lack.
NEEDED = {"cmaes": "cmaes"}
SOURCE = ("pyproject.toml", "README.md", "foundation", "converter", "exporters", "validation", "search", "lpes")


def missing_modules(names: dict[str, str] = NEEDED) -> list[str]:
    """The distributions of `names` whose module this Python cannot import."""
    return [dist for module, dist in names.items() if importlib.util.find_spec(module) is None]


def has_pip() -> bool:
    return importlib.util.find_spec("pip") is not None


def copy_source(dest: Path) -> Path:
    """The files a build of lpes reads, copied to `dest` (no caches)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in SOURCE:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                            dirs_exist_ok=True)
        else:
            shutil.copy2(source, dest / name)
    return dest


def pip_install(site: Path, work: Path, wheels: Path = WHEELS) -> None:
    """cmaes (if missing) from the wheels, then lpes from a copy of the tree, into `site`, offline."""
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--target", str(site),
           "--find-links", str(wheels)]
    missing = missing_modules()
    if missing:
        subprocess.run([*pip, *missing], check=True)
    # A setuptools here that reads pyproject.toml's license string builds lpes; else pip builds in isolation with
    # the setuptools wheel of `wheels` (Python 3.11's bundled 65.5 refuses the string: measured).
    isolation = ["--no-build-isolation"] if setuptools_major() >= SETUPTOOLS_LICENSE_STRING else []
    subprocess.run([*pip, *isolation, str(copy_source(work / "src"))], check=True)


# The first setuptools that reads `license = "Apache-2.0"` (PEP 639) in [project]; older ones fail on it.
SETUPTOOLS_LICENSE_STRING = 77


def setuptools_major() -> int:
    """The major version of this Python's setuptools, 0 without one."""
    from importlib import metadata

    try:
        return int(metadata.version("setuptools").split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return 0


def copy_install(site: Path, wheels: Path = WHEELS) -> None:
    """Without pip: the missing wheels unpacked, lpes's packages copied by package-dir, a launcher per script."""
    for dist in missing_modules():
        wheel = find_wheel(dist, wheels)
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
    pyproject = (ROOT / "pyproject.toml").read_text()
    for package, folder in package_dirs(pyproject).items():
        shutil.copytree(ROOT / folder, site / Path(*package.split(".")),
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), dirs_exist_ok=True)
    (site / "bin").mkdir(parents=True, exist_ok=True)
    for name, target in console_scripts(pyproject).items():
        module, function = target.split(":")
        launcher = site / "bin" / name
        launcher.write_text(f"#!{sys.executable}\nimport sys\nfrom {module} import {function}\n"
                            f"sys.exit({function}())\n")
        launcher.chmod(0o755)


def find_wheel(dist: str, wheels: Path = WHEELS) -> Path:
    found = sorted(wheels.glob(f"{dist}-*.whl"))
    if not found:
        raise SystemExit(f"install: {dist} is not installed and {wheels} has no {dist} wheel: run make gpu-wheels "
                         "on a machine with network, and carry the folder")
    return found[-1]


def package_dirs(pyproject: str) -> dict[str, str]:
    """pyproject.toml's [tool.setuptools] package-dir: package -> folder (one line, as lpes writes it)."""
    line = re.search(r"^package-dir\s*=\s*\{(.*)\}\s*$", pyproject, re.MULTILINE)
    if line is None:
        raise SystemExit("install: no package-dir line in pyproject.toml")
    return dict(re.findall(r'"([\w.]+)"\s*=\s*"([\w./-]+)"', line.group(1)))


def console_scripts(pyproject: str) -> dict[str, str]:
    """pyproject.toml's [project.scripts]: command -> module:function."""
    section = re.search(r"^\[project\.scripts\]\n(.*?)(?:\n\[|\Z)", pyproject, re.MULTILINE | re.DOTALL)
    if section is None:
        raise SystemExit("install: no [project.scripts] in pyproject.toml")
    return dict(re.findall(r'^([\w-]+)\s*=\s*"([\w.:]+)"', section.group(1), re.MULTILINE))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=Path, required=True, help="folder to install into (goes on PYTHONPATH)")
    parser.add_argument("--work", type=Path, required=True, help="scratch folder (the copy of the tree)")
    parser.add_argument("--no-pip", action="store_true", help="install by copying, as where pip is missing")
    args = parser.parse_args(argv)
    wheels = missing_modules()  # what comes from bench/gpu/wheels (the rest of lpes's dependencies are here)
    if args.no_pip or not has_pip():
        copy_install(args.site)
        how = "copied by package-dir (no pip)"
    else:
        pip_install(args.site, args.work)
        how = "pip install --no-index --no-deps"
    print(f"install: lpes into {args.site} ({how}); from wheels: {', '.join(wheels) or 'nothing (all present)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
