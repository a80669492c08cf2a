"""`--to tensorrt` (experimental: never built here): an engine built from the ONNX export.

No machine of this project can install TensorRT, so no engine has been built by lpes
yet; the builder follows the TensorRT 10/11 Python API. Where this machine cannot
build (no tensorrt package or no NVIDIA GPU), the plan says so before any work and the
target writes the trtexec recipe that builds the engine on the deployment machine.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lpes.exporters.targets import OpenedExport, RunContext, RunnerUnavailable, Target, Written, register, require


@register
class TensorrtEngine(Target):
    name = "tensorrt"
    folder = "tensorrt"
    marker = "model.engine"
    order = 30
    needs = ("onnx",)
    help = "engine built from OUT/onnx (experimental: never built here; needs an NVIDIA GPU + tensorrt)"
    label = "LPES, TensorRT engine"
    layout = ("tensorrt, experimental: never built here (no machine of this project has\n"
              "TensorRT): engine built from OUT/onnx on an NVIDIA GPU with tensorrt, else\n"
              "OUT/tensorrt/trtexec.sh to build it there, and exit 2")

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        from lpes.exporters.tensorrt.profiles import add_profile_arguments

        add_profile_arguments(parser)

    @classmethod
    def options_from(cls, args: argparse.Namespace) -> dict[str, Any]:
        from lpes.exporters.tensorrt.profiles import profile_overrides

        return profile_overrides(args)

    def check(self) -> None:
        from lpes.exporters.tensorrt.build import missing_requirements
        from lpes.exporters.tensorrt.profiles import default_profile

        self.profile = default_profile(
            self.job.config.max_position_embeddings, max_scale=max(self.job.spec.scales), **self.options)
        self.missing = missing_requirements()

    def plan_note(self) -> str | None:
        if self.missing is None:
            return None
        return (f"no TensorRT engine will be built here (this machine lacks {self.missing}); "
                f"{self.folder}/ gets the trtexec recipe that builds it on the deployment machine")

    def describe(self) -> str:
        if self.missing is None:
            return "engine built from OUT/onnx (experimental: never built by this project)"
        return f"the trtexec recipe only, no engine (this machine lacks {self.missing})"

    def write(self, folder: Path) -> Written:
        from lpes.exporters.targets import registry
        from lpes.exporters.tensorrt.engine import build_engine_or_explain

        onnx_dir = folder.parent / registry()[self.needs[0]].folder  # the ONNX export it builds from
        note = build_engine_or_explain(onnx_dir, folder, self.job.dtype, profile=self.profile)
        return Written(unbuilt=[note] if note else [])

    @classmethod
    def check_received_file(cls, path: Path) -> None:
        from lpes.exporters.tensorrt.received import check_received_file

        check_received_file(path)

    @classmethod
    def open(cls, folder: Path, run: RunContext) -> OpenedExport:
        require("tensorrt", "tensorrt")
        import torch

        if not torch.cuda.is_available():  # engines run on the GPU they were built for
            raise RunnerUnavailable("a TensorRT engine needs an NVIDIA GPU and a CUDA build of torch")
        from lpes.exporters.tensorrt.runner import TrtCausalLM

        runner = TrtCausalLM(folder)
        return OpenedExport(runner, type(runner).__name__, runner.dtype)

    @classmethod
    def export_dtype(cls, folder: Path, run: RunContext) -> str:
        from lpes.exporters.tensorrt.engine import read_sidecar

        return (read_sidecar(folder) or {}).get("dtype", "float32")
