"""`--to tensorrt` (experimental: never built here): the target class (`target.py`), the builder and its
command `python -m lpes.exporters.tensorrt` (`engine.py`, `__main__.py`) with its steps (`ops.py`, `profiles.py`,
`cast.py`, `recipe.py`, `build.py`), the engine runner (`runner.py`) and what a received engine folder may name
(`received.py`)."""
