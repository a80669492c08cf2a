"""Running an lpes ONNX export with stock onnxruntime: one step, greedy generation, text in/text out.

The cache stays inside onnxruntime between steps (`present` OrtValues are fed back
as `past`), so generation costs no copies and works for every dtype, bfloat16
included, which numpy cannot hold.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from lpes.devices import gpu_info
from lpes.errors import LpesError
from lpes.exporters import onnx_io
from lpes.exporters.onnx_export import MODEL_FILE, read_metadata
from lpes.validation.padding import left_pad

CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"
_PROVIDER_ALIASES = {"cpu": CPU, "cuda": CUDA, CPU.lower(): CPU, CUDA.lower(): CUDA}
# onnx TensorProto element types of the cache tensors, by --dtype.
_ONNX_ELEMENT_TYPE = {"float32": 1, "float16": 10, "bfloat16": 16}


def default_provider() -> str:
    """CUDA when onnxruntime-gpu is installed and sees a GPU, else CPU."""
    import onnxruntime as ort

    # onnxruntime-gpu lists CUDA even on a machine without a GPU; ask the driver.
    if CUDA in ort.get_available_providers() and gpu_info() is not None:
        return CUDA
    return CPU


def check_dtype_supported(dtype: str, provider: str | None = None) -> None:
    """Refuse early what onnxruntime cannot run: bfloat16 graphs need the CUDA provider."""
    provider = _PROVIDER_ALIASES.get((provider or default_provider()).lower(), provider)
    if dtype == "bfloat16" and provider != CUDA:
        raise LpesError(
            "onnxruntime's CPU provider has no bfloat16 kernels, so a bfloat16 export cannot be validated here; "
            "use --dtype float16 or float32, or a machine with onnxruntime-gpu and a GPU"
        )


class OrtCausalLM:
    """An lpes ONNX export folder, loaded into one onnxruntime session."""

    def __init__(self, onnx_dir: Path, provider: str | None = None, threads: int | None = None):
        import onnxruntime as ort

        from lpes.converter.trust import check_received_folder

        self.onnx_dir = Path(onnx_dir)
        check_received_folder(self.onnx_dir)  # no external data outside the folder (converter/trust.py)
        self.metadata = read_metadata(self.onnx_dir)
        self.num_layers = self.metadata["num_layers"]
        self.num_kv_heads = self.metadata["num_key_value_heads"]
        self.head_dim = self.metadata["head_dim"]
        self.dtype = self.metadata["dtype"]
        requested = _resolve_provider(provider)
        check_dtype_supported(self.dtype, requested)
        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        providers = [requested, CPU] if requested != CPU else [CPU]
        path = self.onnx_dir / MODEL_FILE
        try:
            self.session = ort.InferenceSession(str(path), options, providers=providers)
        except Exception as err:  # onnxruntime raises its own Fail/NotImplemented types
            raise LpesError(f"onnxruntime cannot load {path}: {str(err).splitlines()[0]}") from None
        # What actually runs: onnxruntime falls back to CPU when CUDA cannot start.
        self.provider = self.session.get_providers()[0]
        self._device = "cuda" if self.provider == CUDA else "cpu"
        self._past_names = onnx_io.past_names(self.num_layers)
        self._present_names = onnx_io.present_names(self.num_layers)

    # -- one step ---------------------------------------------------------------------------

    def forward(self, input_ids, attention_mask, position_ids, past=None):
        """One model call over numpy arrays; returns (logits float32 [b, s, vocab], present).

        `past` and `present` are lists of (key, value) per layer, [b, kv_heads, length, head_dim];
        `past=None` is the empty cache of a prefill. float32 and float16 exports only
        (numpy has no bfloat16; `step` and `greedy` work for all dtypes).
        """
        if self.dtype == "bfloat16":
            raise LpesError("forward() exchanges numpy arrays, which cannot hold bfloat16; use step() or greedy()")
        batch = np.asarray(input_ids).shape[0]
        flat = self.empty_past(batch) if past is None else [self._ort_value(np.asarray(t)) for kv in past for t in kv]
        logits, present = self.step(input_ids, attention_mask, position_ids, flat, cache_device="cpu")
        return logits, [(present[2 * i].numpy(), present[2 * i + 1].numpy()) for i in range(self.num_layers)]

    def step(self, input_ids, attention_mask, position_ids, past: list, cache_device: str | None = None):
        """One model call with the cache as onnxruntime values: (logits float32 numpy, present OrtValues).

        `past` is flat (key, value of layer 0, key, value of layer 1, ...), as `empty_past` and
        `present` are. The present tensors stay where the provider computed them (on the GPU
        under CUDA), so feeding them back as `past` copies nothing; `cache_device="cpu"` moves them.
        """
        import onnxruntime as ort

        binding = self.session.io_binding()
        for name, array in ((onnx_io.INPUT_IDS, input_ids), (onnx_io.ATTENTION_MASK, attention_mask),
                            (onnx_io.POSITION_IDS, position_ids)):
            value = np.ascontiguousarray(array, dtype=np.int64)
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value))
        for name, value in zip(self._past_names, past):
            binding.bind_ortvalue_input(name, value)
        binding.bind_output(onnx_io.LOGITS, "cpu")
        for name in self._present_names:
            binding.bind_output(name, cache_device or self._device)
        self.session.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        return outputs[0].numpy(), list(outputs[1:])

    def empty_past(self, batch: int) -> list:
        """The cache before a prefill: past length 0 for every layer (flat, as `step` takes it)."""
        shape = (batch, self.num_kv_heads, 0, self.head_dim)
        return [self._ort_value(np.zeros(shape, dtype=np.uint16 if self.dtype == "bfloat16" else self.dtype))
                for _ in range(2 * self.num_layers)]

    def _ort_value(self, array: np.ndarray):
        import onnxruntime as ort

        if self.dtype == "bfloat16":  # raw bits in uint16, typed by onnx element type
            return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array, _ONNX_ELEMENT_TYPE["bfloat16"])
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array, dtype=self.dtype))

    # -- generation -------------------------------------------------------------------------

    def greedy(
        self, input_ids: list[list[int]], max_new_tokens: int, eos_token_id: int | list[int] | None = None
    ) -> list[list[int]]:
        """Greedy continuation of each prompt (rows may differ in length; they are left-padded).

        Returns the new tokens of each row only; a row stops after an end token (`eos_token_id`,
        one id or several), which it keeps.
        """
        tokens, _ = self.greedy_with_logits(input_ids, max_new_tokens, eos_token_id)
        return tokens

    def greedy_with_logits(
        self, input_ids: list[list[int]], max_new_tokens: int, eos_token_id: int | list[int] | None = None
    ) -> tuple[list[list[int]], list[np.ndarray]]:
        """`greedy`, plus the logits [batch, vocab] each step chose from."""
        if not input_ids or any(len(row) == 0 for row in input_ids):
            raise LpesError("greedy: every prompt needs at least one token")

        def last_logits(ids, mask, positions, past):
            logits, present = self.step(ids, mask, positions, past)
            return logits[:, -1, :], present

        return greedy_decode(last_logits, input_ids, self.empty_past(len(input_ids)), max_new_tokens, eos_token_id)


def greedy_decode(step, rows: list[list[int]], past, max_new_tokens: int, eos_token_id: int | list[int] | None):
    """Greedy decoding through a KV cache, shared by the onnxruntime and TensorRT runners.

    `step(ids, mask, positions, past) -> (last-position logits [batch, vocab] as numpy, present)`.
    Rows are left-padded; a row stops at its first end token. Returns the new tokens per
    row and the logits each step chose from.
    """
    ids, mask, positions = left_pad(rows)
    new_tokens: list[list[int]] = [[] for _ in rows]
    done = np.zeros(len(rows), dtype=bool)
    step_logits = []
    stop = set() if eos_token_id is None else {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id)
    for _ in range(max_new_tokens):
        logits, present = step(ids, mask, positions, past)
        step_logits.append(logits)
        chosen = logits.argmax(axis=-1)
        for row, token in enumerate(chosen):
            if not done[row]:
                new_tokens[row].append(int(token))
                done[row] = int(token) in stop
        if done.all():
            break
        past = present
        ids = chosen[:, None].astype(np.int64)
        positions = positions[:, -1:] + 1
        mask = np.concatenate([mask, np.ones((len(rows), 1), dtype=np.int64)], axis=1)
    return new_tokens, step_logits


def _resolve_provider(provider: str | None) -> str:
    if provider is None:
        return default_provider()
    resolved = _PROVIDER_ALIASES.get(provider.lower())
    if resolved is None:
        raise LpesError(f"unknown onnxruntime provider {provider!r}; use 'cpu' or 'cuda'")
    if resolved == CUDA:
        import onnxruntime as ort

        if CUDA not in ort.get_available_providers():
            raise LpesError("the CUDA provider needs onnxruntime-gpu (pip install onnxruntime-gpu)")
    return resolved


def generate_text(onnx_dir: Path, prompt: str, max_new_tokens: int = 64, provider: str | None = None,
                  chat_template: bool = False) -> str:
    """Greedy continuation of `prompt` by the export in `onnx_dir` (tokenizer from the same folder).

    `chat_template`: send the prompt as the user turn of the tokenizer's chat template, when it has one
    (lpes-generate's default; it says so on stderr).
    """
    from lpes.converter.loading import load_tokenizer
    from lpes.validation.kv_data import has_chat_template, wrap_chat
    from lpes.validation.scoring import encode_prompt
    from lpes.validation.tasks import check_vocabulary

    onnx_dir = Path(onnx_dir)
    _warn_past_positions(onnx_dir, 0, max_new_tokens)  # --max-new-tokens 1000000000: refused before any work
    tokenizer = load_tokenizer(onnx_dir)
    check_vocabulary(tokenizer, [prompt], "the prompt")  # before the session loads: one line, not a traceback
    if chat_template and has_chat_template(tokenizer):
        prompt = wrap_chat(prompt, tokenizer)
        print("lpes-generate: the prompt goes in as the user turn of the model's chat template "
              "(--no-chat-template: as typed)", file=sys.stderr)
    ids = encode_prompt(tokenizer, prompt)
    _warn_past_positions(onnx_dir, len(ids), max_new_tokens)
    lm = OrtCausalLM(onnx_dir, provider)
    new = lm.greedy([ids], max_new_tokens, _eos_token_id(onnx_dir, tokenizer))[0]
    return tokenizer.decode(new, skip_special_tokens=True)


def _warn_past_positions(onnx_dir: Path, prompt_tokens: int, max_new_tokens: int) -> None:
    """One line when generation may run past the positions the model was trained on (config.json); LpesError
    past those its scales cover (trained x the largest scale of lpes_spec.json), or past MAX_POSITIONS."""
    from lpes.files import read_json_object

    path = onnx_dir / "config.json"
    trained = read_json_object(path).get("max_position_embeddings") if path.is_file() else None
    trained = trained if isinstance(trained, int) and not isinstance(trained, bool) and trained > 0 else None
    last = prompt_tokens + max_new_tokens
    scale = _largest_scale(onnx_dir)
    covered = min(MAX_POSITIONS, int(trained * scale)) if trained else MAX_POSITIONS
    if last > covered:
        what = (f"the prompt ({prompt_tokens} tokens) + {max_new_tokens} new tokens" if prompt_tokens
                else f"--max-new-tokens {max_new_tokens}")
        why = (f"{trained} trained positions x its largest scale {scale:g}" if covered < MAX_POSITIONS
               else "lpes-generate's limit")
        raise LpesError(f"{what} would reach position {last}, past the {covered} this model covers ({why}); "
                        "lower --max-new-tokens or shorten the prompt")
    if trained and last > trained and prompt_tokens:
        print(f"lpes-generate: note: the prompt ({prompt_tokens} tokens) + {max_new_tokens} new tokens may reach "
              f"position {last}, past the {trained} the model was trained on (max_position_embeddings)",
              file=sys.stderr)


# Positions lpes-generate goes to at most (a KV cache this long is gigabytes even for a small model).
MAX_POSITIONS = 1 << 20


def _largest_scale(onnx_dir: Path) -> float:
    from lpes.spec import load_spec

    path = onnx_dir / "lpes_spec.json"
    try:
        return max(1.0, *load_spec(path).scales) if path.is_file() else 1.0
    except (LpesError, ValueError, TypeError):
        return 1.0


def _eos_token_id(onnx_dir: Path, tokenizer) -> int | list[int] | None:
    """The end-of-sequence id(s) from generation_config.json, else the tokenizer's."""
    from lpes.converter.loading import read_generation_config

    eos = read_generation_config(onnx_dir).get("eos_token_id")  # checked: an id, a list of ids, or null
    return eos if eos not in (None, []) else tokenizer.eos_token_id
