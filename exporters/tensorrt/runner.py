"""Running an lpes TensorRT engine: one step, and greedy generation through its KV cache.

Experimental: never run here (no machine of this project can install TensorRT). The same
interface as `onnx/runner.py`'s `OrtCausalLM` (`greedy`, `greedy_with_logits`, `forward`, `provider`),
so the key-value validation (`lpes-validate`) runs on an engine unchanged; the logit parity
check (`exporters/onnx/parity.py`) runs on the ONNX export in onnxruntime only.

Buffers are torch CUDA tensors: TensorRT reads and writes device memory by address, and
torch is already a dependency, so no second CUDA binding is needed. Each step's `present`
tensors are fed back as the next step's `past` without leaving the GPU. An engine built
by `trtexec.sh` has no sidecar; everything needed to run it is read off the engine itself.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lpes.exporters.onnx import graph_io
from lpes.exporters.runners import KVCacheGreedy, greedy_decode
from lpes.exporters.tensorrt.engine import ENGINE_FILE, read_sidecar
from lpes.foundation.errors import LpesError

# TensorRT needs a non-null, 256-byte aligned address even for an empty tensor (past length 0).
_EMPTY_BYTES = 256


class TrtCausalLM(KVCacheGreedy):
    """An lpes TensorRT engine folder (`model.engine`, optionally `model.engine.json`) on one GPU."""

    def __init__(self, engine_dir: Path, device: int = 0):
        trt, torch = _import_runtime()
        self._torch = torch
        from lpes.exporters.received import check_received_folder

        self.engine_dir = Path(engine_dir)
        check_received_folder(self.engine_dir)  # its sidecar names no plugin or library (exporters/received.py)
        self.sidecar = read_sidecar(self.engine_dir)
        path = self.engine_dir / ENGINE_FILE
        if not path.is_file():
            raise LpesError(f"no TensorRT engine at {path}; build it with {self.engine_dir / 'trtexec.sh'}")
        self._check_built_here(trt.__version__, torch.cuda.get_device_capability(device))
        self.device = torch.device("cuda", device)
        self._load(trt, path)
        self._read_interface(trt)
        self.provider = f"TensorRT {trt.__version__} on {torch.cuda.get_device_name(device)}"
        self._empty = torch.empty(_EMPTY_BYTES, dtype=torch.uint8, device=self.device)

    def _load(self, trt, path: Path) -> None:
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        # An engine may embed plugin libraries (host code) that deserialising would load: a received
        # engine is data, so never (lpes builds engines without plugins).
        if hasattr(self._runtime, "engine_host_code_allowed"):
            self._runtime.engine_host_code_allowed = False
        with self._torch.cuda.device(self.device):
            self.engine = self._runtime.deserialize_cuda_engine(path.read_bytes())
            if self.engine is None:
                raise LpesError(f"TensorRT {trt.__version__} cannot load {path} (see its log above); rebuild it here")
            self.context = self.engine.create_execution_context()

    def _read_interface(self, trt) -> None:
        """I/O names, types, cache shape and profile limits, read off the engine itself."""
        engine = self.engine
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        self._dtypes = {n: _torch_dtype(trt, self._torch, engine.get_tensor_dtype(n)) for n in names}
        self.num_layers = sum(1 for n in self.inputs if n.startswith("past_key_values.") and n.endswith(".key"))
        if self.num_layers == 0:
            raise LpesError(f"{self.engine_dir / ENGINE_FILE} has no past_key_values inputs: no KV cache to run")
        first_past = graph_io.past_names(self.num_layers)[0]
        cache_shape = tuple(engine.get_tensor_shape(first_past))  # [batch, kv_heads, past, head_dim]
        self.num_kv_heads, self.head_dim = cache_shape[1], cache_shape[3]
        self.dtype = (self.sidecar or {}).get("dtype") or str(self._dtypes[first_past]).removeprefix("torch.")
        self.max_batch = self._profile_max(graph_io.INPUT_IDS, 0)
        self.max_total = self._profile_max(graph_io.ATTENTION_MASK, 1)

    def _check_built_here(self, version: str, capability: tuple[int, int]) -> None:
        # An engine from another TensorRT version or GPU architecture does not load (or worse).
        if not self.sidecar:
            return
        built_with, gpu = self.sidecar.get("tensorrt"), self.sidecar.get("gpu") or {}
        if built_with and built_with != version:
            raise LpesError(
                f"{self.engine_dir / ENGINE_FILE} was built by TensorRT {built_with}, this is {version}: "
                "engines are tied to their TensorRT version; rebuild with trtexec.sh"
            )
        here = f"{capability[0]}.{capability[1]}"
        if gpu.get("compute_capability") and gpu["compute_capability"] != here:
            raise LpesError(
                f"{self.engine_dir / ENGINE_FILE} was built for a {gpu.get('name')} (compute capability "
                f"{gpu['compute_capability']}); this GPU is {here}: rebuild the engine here with trtexec.sh"
            )

    def _profile_max(self, name: str, axis: int) -> int:
        return int(self.engine.get_tensor_profile_shape(name, 0)[2][axis])

    # -- one step ---------------------------------------------------------------------------

    def forward(self, input_ids, attention_mask, position_ids, past=None):
        """One engine call over numpy arrays; returns (logits float32 [b, s, vocab], present).

        `past`/`present` are lists of (key, value) per layer; `past=None` is a prefill.
        float32 and float16 engines only (numpy has no bfloat16; `greedy` works for all).
        """
        torch = self._torch
        if self.dtype == "bfloat16":
            raise LpesError("forward() exchanges numpy arrays, which cannot hold bfloat16; use greedy()")
        batch = np.asarray(input_ids).shape[0]
        if past is None:
            flat = self.empty_past(batch)
        else:
            flat = [torch.from_numpy(np.ascontiguousarray(t)).to(self.device) for kv in past for t in kv]
        outputs = self._run(self._device_ids(input_ids, attention_mask, position_ids), flat)
        present = [(outputs[1 + 2 * i].cpu().numpy(), outputs[2 + 2 * i].cpu().numpy()) for i in range(self.num_layers)]
        return outputs[0].float().cpu().numpy(), present

    def empty_past(self, batch: int) -> list:
        """The cache before a prefill: past length 0 for every layer."""
        shape = (batch, self.num_kv_heads, 0, self.head_dim)
        return [self._torch.empty(shape, dtype=self._dtypes[n], device=self.device) for n in self._past_names]

    @property
    def _past_names(self) -> list[str]:
        return graph_io.past_names(self.num_layers)

    def _device_ids(self, input_ids, attention_mask, position_ids) -> list:
        names = (graph_io.INPUT_IDS, graph_io.ATTENTION_MASK, graph_io.POSITION_IDS)
        arrays = (input_ids, attention_mask, position_ids)
        return [
            self._torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(self.device, self._dtypes[n])
            for n, a in zip(names, arrays)
        ]

    def _run(self, ids: list, flat_past: list) -> list:
        """Set shapes and addresses, run on torch's current stream; returns [logits, *present] on the GPU."""
        torch = self._torch
        feeds = dict(zip((graph_io.INPUT_IDS, graph_io.ATTENTION_MASK, graph_io.POSITION_IDS), ids))
        feeds.update(zip(self._past_names, flat_past))
        with torch.cuda.device(self.device):
            for name in self.inputs:
                tensor = feeds[name].contiguous()
                feeds[name] = tensor
                if not self.context.set_input_shape(name, tuple(tensor.shape)):
                    raise LpesError(self._outside_profile(name, tuple(tensor.shape)))
                self.context.set_tensor_address(name, self._address(tensor))
            outputs = []
            for name in self.outputs:
                shape = tuple(self.context.get_tensor_shape(name))
                out = torch.empty(shape, dtype=self._dtypes[name], device=self.device)
                self.context.set_tensor_address(name, self._address(out))
                outputs.append(out)
            if not self.context.execute_async_v3(torch.cuda.current_stream(self.device).cuda_stream):
                raise LpesError("TensorRT failed to run the engine (see its log above)")
        by_name = dict(zip(self.outputs, outputs))
        return [by_name[graph_io.LOGITS], *(by_name[n] for n in graph_io.present_names(self.num_layers))]

    def _address(self, tensor) -> int:
        return tensor.data_ptr() if tensor.numel() else self._empty.data_ptr()

    def _outside_profile(self, name: str, shape: tuple[int, ...]) -> str:
        low, _, high = self.engine.get_tensor_profile_shape(name, 0)
        return (
            f"{name} of shape {list(shape)} is outside the engine's profile ({list(low)} to {list(high)}); "
            "rebuild the engine with larger --max-* flags"
        )

    # -- generation -------------------------------------------------------------------------

    def greedy_with_logits(
        self, input_ids: list[list[int]], max_new_tokens: int, eos_token_id: int | list[int] | None = None
    ) -> tuple[list[list[int]], list[np.ndarray]]:
        """`greedy`, plus the float32 logits [batch, vocab] each step chose from.

        Batches larger than the engine's profile run in chunks of its largest batch.
        """
        if not input_ids or any(len(row) == 0 for row in input_ids):
            raise LpesError("greedy: every prompt needs at least one token")
        longest = max(len(row) for row in input_ids) + max(max_new_tokens - 1, 0)
        if longest > self.max_total:
            raise LpesError(
                f"greedy: {longest} positions (prompt + new tokens) exceed the engine's --max-total {self.max_total}"
            )
        tokens, logits = [], []
        for start in range(0, len(input_ids), self.max_batch):
            chunk_tokens, chunk_logits = self._greedy_batch(input_ids[start : start + self.max_batch],
                                                            max_new_tokens, eos_token_id)
            tokens += chunk_tokens
            logits.append(chunk_logits)
        steps = max(len(c) for c in logits)
        return tokens, [np.concatenate([_step(c, i) for c in logits]) for i in range(steps)]

    def _greedy_batch(self, rows, max_new_tokens, eos_token_id):
        def last_logits(ids, mask, positions, past):
            outputs = self._run(self._device_ids(ids, mask, positions), past)
            return outputs[0][:, -1, :].float().cpu().numpy(), outputs[1:]

        return greedy_decode(last_logits, rows, self.empty_past(len(rows)), max_new_tokens, eos_token_id)


def _step(chunk_logits: list[np.ndarray], i: int) -> np.ndarray:
    # A chunk whose rows all stopped early has no logits for the later steps: NaN rows.
    return chunk_logits[i] if i < len(chunk_logits) else np.full_like(chunk_logits[-1], np.nan)


def _import_runtime():
    try:
        import tensorrt as trt
    except (ImportError, OSError) as err:
        raise LpesError(f"the TensorRT runner needs the tensorrt package ({err}); pip install 'tensorrt>=10'") from None
    import torch

    if not torch.cuda.is_available():
        raise LpesError("the TensorRT runner keeps its buffers in torch CUDA tensors; it needs an NVIDIA GPU "
                        "and a CUDA build of torch")
    return trt, torch


def _torch_dtype(trt, torch, data_type):
    table = {
        trt.DataType.FLOAT: torch.float32,
        trt.DataType.HALF: torch.float16,
        trt.DataType.BF16: torch.bfloat16,
        trt.DataType.INT32: torch.int32,
        trt.DataType.INT64: torch.int64,
        trt.DataType.BOOL: torch.bool,
        trt.DataType.UINT8: torch.uint8,
    }
    if data_type not in table:
        raise LpesError(f"the TensorRT runner cannot exchange tensors of type {data_type}")
    return table[data_type]
