"""Whether a tokenizer knows a task's words: every prompt and answer encodes to tokens, else one line that
names the tokenizer and the first word it fails on (before any model is loaded or run)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from lpes.foundation.errors import LpesError


def check_vocabulary(tokenizer, texts: Sequence[str], what: str, source: str | None = None) -> None:
    """Every text encodes, to at least one token, else LpesError naming the tokenizer and what it failed on.

    A word-level vocabulary without an unknown token (the bundled model's) cannot encode a
    word it lacks; a tokenizer that drops what it has no token for encodes a text to nothing
    (transformers may build a model type's own tokenizer class over a saved tokenizer.json, e.g.
    Qwen2Tokenizer's BPE over a word-level vocabulary). Found before any model is loaded or run,
    either gives one line, not a traceback or an "empty answer" later. `source`: the model as the
    user named it (default: the folder the tokenizer was loaded from).
    """
    named = _tokenizer_name(tokenizer, source)
    try:
        encoded = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    except Exception as err:  # the tokenizers library raises a bare Exception
        failure = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    else:
        empty = next((text for text, ids in zip(texts, encoded) if text.strip() and not ids), None)
        if empty is not None:
            raise LpesError(f"{what}: {named} encodes {empty[:50]!r} to no tokens{_why_empty(tokenizer)}")
        return
    for text in texts:
        for word in text.split():
            try:
                tokenizer(word, add_special_tokens=False)
            except Exception:
                raise LpesError(f"{what}: the word {word[:60]!r} is not in the model's vocabulary "
                                f"({named} has no unknown token)") from None
    raise LpesError(f"{what}: {named} cannot encode it ({failure})")


def _tokenizer_name(tokenizer, source: str | None) -> str:
    """'the tokenizer of lpes-tiny-kv (TokenizersBackend)'."""
    where = source or getattr(tokenizer, "name_or_path", "") or "the model"
    return f"the tokenizer of {where} ({type(tokenizer).__name__})"


def _why_empty(tokenizer) -> str:
    """Why a tokenizer gives no tokens: the class transformers chose replaced the saved tokenizer.json's model."""
    saved = None
    path = Path(getattr(tokenizer, "name_or_path", "") or ".") / "tokenizer.json"
    try:
        saved = json.loads(path.read_text()).get("model", {}).get("type")
    except (OSError, ValueError, AttributeError):
        pass
    backend = getattr(tokenizer, "backend_tokenizer", None)
    built = type(backend.model).__name__ if backend is not None else None
    if saved and built and saved != built:
        return (f": transformers built it as {type(tokenizer).__name__}, a {built} tokenizer, in place of the "
                f"{saved} model its tokenizer.json holds (the class follows config.json's model_type), and that "
                "drops every word it has no token for; the model needs the tokenizer it was trained with")
    return ": it drops every word it has no token for (no unknown token); is it this model's tokenizer?"
