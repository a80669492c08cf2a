"""Third-party output a user cannot act on, kept off a successful run's stderr (shown with --verbose).

A run that works should print lpes's own lines and nothing else. The libraries lpes calls say
things that are true but are not the user's to act on: matplotlib's RuntimeWarning overflow while
it places a steep curve (the image is right), transformers' "friendly reminder" that a prompt is
longer than the model's trained context (which is what lpes measures), its warnings about
`original_max_position_embeddings` (once per layer's rotary). Each is matched narrowly, so any
other warning still shows. Where a dropped warning means something the user may want to know (a
RoPE config field transformers ignores), one lpes line says so instead, once per run.

Every lpes command's parser (foundation/commands.ArgumentParser) installs this after parsing its
flags, unless --verbose is given; nothing here runs for --help.
"""

from __future__ import annotations

import logging
import re
import sys
import warnings

# transformers' log messages that are noise to an lpes user (matched with re.search).
_TRANSFORMERS_NOISE = (
    re.compile(r"friendly reminder - the current text generation call has exceeded"),
)
# transformers' log messages that mean something: (pattern, the one lpes line said instead).
_TRANSFORMERS_MEANINGFUL = (
    (re.compile(r"original_max_position_embeddings"),
     "note: transformers ignores this config's RoPE field original_max_position_embeddings (it uses the explicit "
     "factor); the results are for that factor (--verbose shows transformers' warning)"),
)


class _TransformersFilter(logging.Filter):
    """Drops the noise; replaces a meaningful warning by one lpes line (once per run)."""

    def __init__(self, prog: str):
        super().__init__()
        self.prog = prog
        self.said: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(p.search(message) for p in _TRANSFORMERS_NOISE):
            return False
        for pattern, line in _TRANSFORMERS_MEANINGFUL:
            if pattern.search(message):
                if line not in self.said:
                    self.said.add(line)
                    print(f"{self.prog}: {line}", file=sys.stderr, flush=True)
                return False
        return True


_installed: _TransformersFilter | None = None


def quiet_third_party(prog: str) -> None:
    """Filter the third-party output above for the rest of this process (idempotent)."""
    global _installed
    # numpy's overflow inside matplotlib's own code (steep curves, log axes): the figure it saves is right.
    warnings.filterwarnings("ignore", message=r"overflow encountered", category=RuntimeWarning,
                            module=r"matplotlib(\.|$)")
    if _installed is not None:
        _installed.prog = prog
        return
    _installed = _TransformersFilter(prog)
    # On the handlers: a filter on the "transformers" logger would not see its child loggers' records. transformers
    # adds its handler when first imported, which a command refused at once never does (with torch, 3 s): the filter
    # goes on the handlers there now and on each one added later.
    library_logger = logging.getLogger("transformers")
    for handler in library_logger.handlers:
        handler.addFilter(_installed)
    add_handler = library_logger.addHandler

    def add_filtered_handler(handler: logging.Handler) -> None:
        handler.addFilter(_installed)
        add_handler(handler)

    library_logger.addHandler = add_filtered_handler
