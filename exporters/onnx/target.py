"""`--to onnx`: model.onnx with a KV cache, checked for parity against the PyTorch reference."""

from __future__ import annotations

from pathlib import Path

from lpes.exporters.targets import OpenedExport, RunContext, RunnerUnavailable, Target, Written, register, require
from lpes.foundation.errors import LpesError

# Peak RSS per byte of weights, measured on a 1.1B model (bench/RESULTS.md): 1.13 for the export,
# 2.0 for the parity check that follows it (reference and onnxruntime session in one process).
EXPORT_PEAK_PER_WEIGHT_BYTE = 2.0


@register
class OnnxExport(Target):
    name = "onnx"
    folder = "onnx"
    marker = "model.onnx"
    order = 20
    help = "model.onnx with KV cache, checked against the PyTorch reference"
    label = "LPES, ONNX in onnxruntime"
    holds_spec = True
    generates = True

    def check(self) -> None:
        from lpes.exporters.onnx.export import check_exportable

        check_exportable(self.job.config, self.job.spec, self.job.dtype)
        self._check_memory()
        if self.job.validate:
            from lpes.exporters.onnx.runner import check_dtype_supported

            check_dtype_supported(self.job.dtype)

    def write(self, folder: Path) -> Written:
        from lpes.exporters.onnx.export import export_onnx

        job = self.job
        export_onnx(job.resolved, folder, dtype=job.dtype)
        if not job.validate:
            return Written()
        from lpes.exporters.onnx.parity import check_parity

        report = check_parity(job.resolved, folder, job.dtype)
        return Written([report.format()], passed=report.passed)

    @classmethod
    def check_received_file(cls, path: Path) -> None:
        from lpes.exporters.onnx.received import check_received_file

        check_received_file(path)

    @classmethod
    def open(cls, folder: Path, run: RunContext) -> OpenedExport:
        require("onnxruntime", "onnx")
        from lpes.exporters.onnx.runner import OrtCausalLM, check_dtype_supported

        dtype = cls.export_dtype(folder, run)
        try:
            check_dtype_supported(dtype)
        except LpesError as why:  # bfloat16 without a GPU: the export may be fine, this machine cannot run it
            raise RunnerUnavailable(str(why)) from None
        runner = OrtCausalLM(folder)
        return OpenedExport(runner, str(runner.provider), dtype)

    @classmethod
    def export_dtype(cls, folder: Path, run: RunContext) -> str:
        from lpes.exporters.onnx.export import read_metadata

        return read_metadata(folder).get("dtype", "float32")

    def _check_memory(self) -> None:
        """Refuse now an export that would run out of memory later (it holds the weights in --dtype)."""
        from lpes.converter.loading import available_memory, dtype_bytes, parameter_count
        from lpes.foundation.devices import format_bytes

        share = EXPORT_PEAK_PER_WEIGHT_BYTE if self.job.validate else 1.2
        needed = share * parameter_count(self.job.model_path) * dtype_bytes(self.job.dtype)
        available = available_memory()
        if available is not None and needed > available:
            raise LpesError(f"--to onnx needs about {format_bytes(needed)} of memory for this model in "
                            f"{self.job.dtype}; this machine has {format_bytes(available)} available")
