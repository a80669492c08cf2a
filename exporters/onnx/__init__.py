"""`--to onnx`: the target class (`target.py`), the export (`export.py`), its input and output names (`graph_io.py`),
the logit parity check against the PyTorch reference (`parity.py`), the onnxruntime runner (`runner.py`) and
what a received ONNX folder may name (`received.py`)."""
