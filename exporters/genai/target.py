"""`--to genai`: an onnxruntime-genai package with per-layer RoPE caches."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from lpes.exporters.genai.builds import BUILDS
from lpes.exporters.targets import OpenedExport, RunContext, Target, Written, register, require


@register
class GenaiPackage(Target):
    name = "genai"
    folder = "genai"
    marker = "genai_config.json"
    order = 40
    help = "onnxruntime-genai package with per-layer RoPE caches"
    label = "LPES, onnxruntime-genai"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        precisions = list(dict.fromkeys(p for ps in BUILDS.values() for p in ps))
        group = parser.add_argument_group("onnxruntime-genai (--to genai)")
        group.add_argument("--genai-precision", default="fp32", choices=precisions,
                           help="builder precision (default fp32; fp16/bf16 need --genai-provider cuda)")
        group.add_argument("--genai-provider", default="cpu", choices=list(BUILDS),
                           help="execution provider the package is built for (default cpu)")

    @classmethod
    def options_from(cls, args: argparse.Namespace) -> dict[str, Any]:
        return {"precision": args.genai_precision, "execution_provider": args.genai_provider}

    def check(self) -> None:
        from lpes.exporters.genai.package import check_genai

        self.plan = check_genai(self.job.resolved, min_context=self.job.validation_tokens, **self.options)

    def output_bytes(self, out: Path) -> int:
        from lpes.exporters.genai.package import package_bytes

        return package_bytes(self.plan)

    def write(self, folder: Path) -> Written:
        from lpes.exporters.genai.package import write_genai

        write_genai(self.plan, folder)
        return Written()

    @classmethod
    def check_received_file(cls, path: Path) -> None:
        from lpes.exporters.genai.received import check_received_file

        check_received_file(path)

    @classmethod
    def open(cls, folder: Path, run: RunContext) -> OpenedExport:
        require("onnxruntime_genai", "genai")
        from lpes.exporters.genai.runner import GenaiGreedy

        return OpenedExport(GenaiGreedy(folder), "onnxruntime-genai", cls.export_dtype(folder, run))

    @classmethod
    def export_dtype(cls, folder: Path, run: RunContext) -> str:
        import json

        from lpes.exporters.genai.package import SIDECAR_FILE

        sidecar = folder / SIDECAR_FILE
        return json.loads(sidecar.read_text()).get("dtype", "float32") if sidecar.is_file() else "float32"
