"""README.md with Hub front matter for a pre-scaled checkpoint."""

from __future__ import annotations

from pathlib import Path

from lpes.spec import Spec

CARD = """\
---
base_model: {base_model}
tags:
- lpes
- rope
- long-context
library_name: transformers
pipeline_tag: text-generation
---

# {name} with LPES per-layer RoPE scaling

This is {base_link} with **Layer-specific Positional Embedding Scaling** (LPES):
decoder layer *h* uses RoPE `inv_freq / s_h`, so positions act as `i / s_h`. No weight is
changed and inference costs the same as the base model. The scales sit in `config.json`
(`lpes.scales`); `modeling_lpes.py` and `lpes_rope.py` (short, auditable, torch and
transformers only) apply them.

## Load

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("{name}", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("{name}")
```

Without `trust_remote_code=True` loading fails on purpose: the unscaled model must never run
silently in its place.

## Scales

![LPES curve](lpes_curve.png)

{curve_line}

| layer | scale |
|---|---|
{rows}
{validation}
Made with lpes {lpes_version}; the full spec is in `lpes_spec.json`.
"""


def write_model_card(out_dir: Path, spec: Spec, base_model: str, config, validation_md: str = "") -> Path:
    curve = spec.curve
    curve_line = (
        f"Bezier curve of degree {curve.degree}, control points {[list(p) for p in curve.control_points]}."
        if curve
        else "Scales given directly (no curve)."
    )
    rows = "\n".join(f"| {h} | {s:.4f} |" for h, s in enumerate(spec.scales))
    validation = f"\n## Validation\n\n{validation_md}\n" if validation_md else ""
    text = CARD.format(
        base_model=base_model,
        # Only a Hub id (owner/name) gets a link; a local folder or bundled name does not resolve there.
        base_link=f"[{base_model}](https://huggingface.co/{base_model})" if base_model.count("/") == 1 else base_model,
        name=out_dir.name if not base_model else f"{base_model.split('/')[-1]}-lpes",
        curve_line=curve_line,
        rows=rows,
        validation=validation,
        lpes_version=spec.provenance.get("lpes_version", ""),
    )
    path = out_dir / "README.md"
    path.write_text(text)
    return path
