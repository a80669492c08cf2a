"""`--to hf`: the Hub folder (weights linked, scales in config.json, the per-layer RoPE code beside them)."""

from __future__ import annotations

from pathlib import Path

from lpes.exporters.targets import ExportJob, OpenedExport, RunContext, Target, Validated, Written, register


@register
class HubFolder(Target):
    name = "hf"
    folder = "."
    marker = "config.json"
    order = 10
    help = "the Hub folder (a stock RoPE config where one scale per rotary is exact, else LPES code)"
    label = "LPES, Hub folder"
    layout = "hf: the Hub folder (load with trust_remote_code=True)"
    default = True
    holds_spec = True
    uploads = True

    def output_bytes(self, out: Path) -> int:
        from lpes.converter.hf_folder import hf_folder_bytes

        return hf_folder_bytes(self.job.model_path, out)

    def write(self, folder: Path) -> Written:
        from lpes.converter.hf_folder import write_hf_folder
        from lpes.foundation.version import __version__

        job: ExportJob = self.job
        written = write_hf_folder(job.resolved, folder, job.model_name, __version__, model_card=False)
        return Written(reports=[f"Hub folder: {written.note}"])

    def finish(self, folder: Path, validation: Validated | None) -> None:
        """The model card, once: with the validation table and its numbers when validation ran."""
        from lpes.converter.model_card import write_model_card

        job = self.job
        if validation is None:  # --no-validate: nothing was checked, and the card says so
            from lpes.converter.fingerprint import other_model_searched

            searched_on = other_model_searched(job.spec.searched_model, job.model_path, job.config, job.model_name)
            write_model_card(folder, job.spec, job.model_name, job.config, verdict="not validated",
                             why="converted with --no-validate", searched_on=searched_on)
        else:
            write_model_card(folder, job.spec, job.model_name, job.config, validation.markdown(),
                             validation.measured(), validation.verdict, validation.verdict_reason(),
                             searched_on=validation.searched_on)

    @classmethod
    def open(cls, folder: Path, run: RunContext) -> OpenedExport:
        from transformers import AutoModelForCausalLM

        from lpes.converter.loading import torch_dtype
        from lpes.exporters.runners import TorchGreedy

        custom_code = (folder / "modeling_lpes.py").is_file()
        if custom_code:  # run only the code this lpes version writes, byte for byte
            from lpes.converter.trust import check_hub_code

            check_hub_code(folder)
        # What a user of the folder runs: its own modeling_lpes.py + lpes_rope.py, or a stock config.
        model = AutoModelForCausalLM.from_pretrained(
            folder, trust_remote_code=custom_code, dtype=torch_dtype(run.reference_dtype), use_safetensors=True
        )
        note = "PyTorch, trust_remote_code" if custom_code else "PyTorch, stock transformers"
        return OpenedExport(TorchGreedy(model.eval().to(run.device), run.pad_token_id), note, run.reference_dtype)

    @classmethod
    def export_dtype(cls, folder: Path, run: RunContext) -> str:
        return run.reference_dtype
