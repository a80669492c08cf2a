"""Running an lpes ONNX export with stock onnxruntime: one step, greedy generation, text in/text out.

The cache stays inside onnxruntime between steps (`present` OrtValues are fed back
as `past`), so generation costs no copies and works for every dtype, bfloat16
included, which numpy cannot hold.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lpes.exporters.onnx import graph_io
from lpes.exporters.onnx.export import MODEL_FILE, read_metadata
from lpes.exporters.runners import KVCacheGreedy, greedy_decode
from lpes.foundation.devices import gpu_info
from lpes.foundation.errors import LpesError

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


class OrtCausalLM(KVCacheGreedy):
    """An lpes ONNX export folder, loaded into one onnxruntime session."""

    def __init__(self, onnx_dir: Path, provider: str | None = None, threads: int | None = None):
        import onnxruntime as ort

        from lpes.exporters.received import check_received_folder

        self.onnx_dir = Path(onnx_dir)
        check_received_folder(self.onnx_dir)  # no external data outside the folder (exporters/received.py)
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
        self._past_names = graph_io.past_names(self.num_layers)
        self._present_names = graph_io.present_names(self.num_layers)

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
        for name, array in ((graph_io.INPUT_IDS, input_ids), (graph_io.ATTENTION_MASK, attention_mask),
                            (graph_io.POSITION_IDS, position_ids)):
            value = np.ascontiguousarray(array, dtype=np.int64)
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value))
        for name, value in zip(self._past_names, past):
            binding.bind_ortvalue_input(name, value)
        binding.bind_output(graph_io.LOGITS, "cpu")
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
