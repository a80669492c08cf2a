"""`--to genai`: the target class (`target.py`), the onnxruntime-genai package (`package.py`) with its per-layer
RoPE caches (`rope.py`), its runner (`runner.py`) and what a received package may name (`received.py`)."""
