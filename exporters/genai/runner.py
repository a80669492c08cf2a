"""Greedy decoding through onnxruntime-genai itself (`og.Model`, `og.Generator`).

`GenaiGreedy` is a `scoring.GreedyRunner`, so parity tests and the key-value
accuracy report run a `--to genai` package exactly as a user would.

End of sequence is decided here, not by the runtime: `eos_token_id=None` means
"generate exactly max_new_tokens tokens". The runtime stops at the package's own
EOS token (genai_config.json) and does not keep it; the runner then feeds that
token back and goes on, which is what a model that just emitted it would see.
(The runtime's `min_length` would forbid EOS instead and so change the argmax.)
"""

from __future__ import annotations

import json
from pathlib import Path

from lpes.foundation.errors import LpesError


class GenaiGreedy:
    """Greedy generation with an onnxruntime-genai package folder, one prompt at a time."""

    def __init__(self, package_dir: Path):
        try:
            import onnxruntime_genai as og
        except ImportError:
            raise LpesError("validating a genai package needs onnxruntime-genai: pip install 'lpes[genai]'") from None
        from lpes.exporters.received import check_received_folder

        check_received_folder(Path(package_dir))  # no library or outside file that the package names is opened
        self._og = og
        self.model = og.Model(str(package_dir))
        genai_config = json.loads((Path(package_dir) / "genai_config.json").read_text())
        self.context_length = int(genai_config["model"]["context_length"])

    def greedy(
        self, input_ids: list[list[int]], max_new_tokens: int, eos_token_id: int | None = None
    ) -> list[list[int]]:
        """The new tokens of each prompt: `max_new_tokens` of them, or up to and including `eos_token_id`."""
        return [self._one(list(ids), max_new_tokens, eos_token_id) for ids in input_ids]

    def _one(self, prompt: list[int], max_new_tokens: int, eos_token_id: int | None) -> list[int]:
        if max_new_tokens < 1 or not prompt:
            return []
        total = len(prompt) + max_new_tokens
        if total > self.context_length:
            raise LpesError(
                f"prompt ({len(prompt)}) + {max_new_tokens} new tokens exceed the package's "
                f"context length {self.context_length}"
            )
        params = self._og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, num_beams=1, max_length=total)
        generator = self._og.Generator(self.model, params)
        generator.append_tokens(prompt)
        new: list[int] = []
        while len(new) < max_new_tokens:
            if generator.is_done():  # stopped at its own EOS (max_length is not reached yet)
                generator.append_tokens(new[-1:])
            generator.generate_next_token()
            new.append(int(generator.get_next_tokens()[0]))
            if new[-1] == eos_token_id:
                break
        return new
