"""Before lpes-validate loads a model: every file its report may write into DIR can be written there.

The report is written at the end, after every prompt is scored; a validation.json that is a folder,
a read-only DIR or a full disk would then throw the scoring away. So the names it may write
(validation.json/.md/.png, their .skipped/.failed variants, the model card README.md) are checked
first, with a test write beside them and the free space (foundation/preflight.py).
"""

from __future__ import annotations

from pathlib import Path

from lpes.foundation.preflight import check_room
from lpes.validation.results import JSON_FILE, MARKDOWN_FILE, PLOT_FILE

MODEL_CARD = "README.md"  # rewritten with the validation when it is an lpes model card
# What a report writes at most: the JSON, the table, the plot and the card (tens of KiB on a 200-prompt run).
REPORT_BYTES = 4 * 2**20


def report_names() -> list[str]:
    """Every file name a validation report may write into its folder."""
    names = []
    for stem in ("", ".skipped", ".failed"):  # the verdict's, or beside earlier results it keeps (write_report)
        names += [name.replace("validation.", f"validation{stem}.") for name in (JSON_FILE, MARKDOWN_FILE, PLOT_FILE)]
    return names + [MODEL_CARD]


def check_report_room(out_dir: Path) -> str:
    """LpesError (one line) unless the report can be written into `out_dir`; the plan line when it can."""
    return check_room([Path(out_dir) / name for name in report_names()], REPORT_BYTES,
                      hint="free some space there, or validate a copy of the folder elsewhere")
