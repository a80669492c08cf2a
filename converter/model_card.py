"""README.md with Hub front matter for a pre-scaled checkpoint: what it is, what was measured, how to load it.

A Hub visitor should learn in a minute what the scales do, on which task and at which
length they were measured against the length the base model was built for, and how they
compare with the plain baseline (one scale for every layer). The measurements arrive as
plain data (`Measured`, filled in by the validation stage: the converter never imports
validation); without them the card states what the search recorded in the spec.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from lpes.foundation.files import write_text_atomic
from lpes.foundation.provenance import SearchRecord
from lpes.foundation.rope_schemes import SCHEMES
from lpes.foundation.spec import Spec

MODELING_FILE = "modeling_lpes.py"
LENGTHS_PLOT = "lpes_lengths.png"  # the decision's ladder of lengths, drawn (foundation/plots.py plot_lengths)
# A Hub repo id: owner/name, nothing that looks like a path on this machine.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Accuracy:
    """Share of examples answered correctly (0..1), overall and by gold index."""

    overall: float
    by_gold_index: dict[int, float]


@dataclass(frozen=True)
class Measured:
    """What key-value validation measured on the converted model."""

    examples: int
    num_pairs: int
    prompt_tokens: tuple[int, int]  # shortest and longest prompt, in tokens (0, 0: unknown)
    unscaled: Accuracy
    lpes: Accuracy
    uniform: Accuracy | None = None  # the best uniform scale's (the spec's best_uniform_scale), if scored
    exports_agreeing: tuple[str, ...] = ()  # exports that gave the reference's answers within their tolerance
    exports_differing: tuple[str, ...] = ()
    # The stock length-extension RoPE types (YaRN, dynamic NTK), each at its best factor on calibration.
    stock: tuple[tuple[str, Accuracy], ...] = ()


def hub_id(base_model: str) -> str | None:
    """`base_model` when it names a Hub repo (owner/name) rather than a bundled model or a local folder."""
    if not _HUB_ID.match(base_model) or Path(base_model).exists():
        return None
    return base_model


def write_model_card(out_dir: Path, spec: Spec, base_model: str, config, validation_md: str = "",
                     measured: Measured | None = None, verdict: str | None = None, why: str = "",
                     searched_on: str | None = None) -> Path:
    """Write `out_dir/README.md`; `validation_md` is the validation table, `measured` its numbers,
    `verdict` the validation's ("passed", "failed", "not validated"; None: validation did not run), `why`
    what failed or did not run, and `searched_on` the model and/or task the curve was searched on when they
    are not `base_model` and the task measured (validation.report's `searched_on`)."""
    path = Path(out_dir) / "README.md"
    write_text_atomic(path, model_card(spec, base_model, config, validation_md, measured,
                               custom_code=(Path(out_dir) / MODELING_FILE).is_file(), verdict=verdict, why=why,
                               searched_on=searched_on))
    return path


CARD_HEADING = "with LPES per-layer RoPE scaling"  # in every card's title line


def is_model_card(path: Path) -> bool:
    """Whether `path` is a model card lpes wrote (its title line), which lpes-validate may rewrite."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            head = handle.read(4096)
    except OSError:
        return False
    return any(line.startswith("# ") and line.endswith(CARD_HEADING) for line in head.splitlines())


def model_card(spec: Spec, base_model: str, config, validation_md: str = "", measured: Measured | None = None,
               *, custom_code: bool = True, verdict: str | None = None, why: str = "",
               searched_on: str | None = None) -> str:
    """The card's text (see the module docstring)."""
    repo = hub_id(base_model)
    shown = repo or Path(base_model).name  # a local folder by its name only: no paths of this machine
    name = f"{shown.split('/')[-1]}-lpes"
    sections = [s for s in [
        _front_matter(repo),
        f"# {name}: {shown} {CARD_HEADING}",
        _intro(shown, repo, custom_code),
        _decision_section(spec),
        "## What was measured\n\n" + _verdict_text(verdict, why) + _searched_text(searched_on)
        + _measured_text(spec, config, measured, searched_on),
        _load_section(name, custom_code),
        _scales_section(spec),
    ] if s]
    if validation_md:
        sections.append("## Validation\n\n" + validation_md.strip())
    sections.append(f"Made with lpes {spec.provenance.lpes_version or ''}; the full spec is in `lpes_spec.json`.")
    return "\n\n".join(sections) + "\n"


def _decision_section(spec: Spec) -> str:
    """What was shipped and why: lpes-search's held-out decision table (foundation/decision.py). What the folder
    holds is read off the spec's own scales (which validation checks against config.json), not taken from a claim."""
    from lpes.foundation.decision import format_table

    decision = spec.decision
    if decision is None:
        return ("## What ships and why\n\nThe spec records no held-out decision (written before lpes-search made "
                "one, or searched with `--holdout 0`): this folder holds the searched curve as it is.")
    chosen = decision.ship.name
    held = decision.row_computing(spec.scales, spec.rope.rope_type) if spec.scales else None
    if held is not None and held.name == chosen:
        what = f"This folder holds the decision, **{chosen}** (`lpes-convert --ship decision`, the default)."
    elif held is not None and held.kind == "per-layer":
        what = (f"This folder holds the searched curve (`lpes-convert --ship curve`), not the decision's "
                f"**{chosen}**.")
    else:
        what = (f"This folder holds {f'**{held.name}**' if held else 'scales that are none of its candidates'}, "
                f"not the decision's **{chosen}**.")
    return ("## What ships and why\n\n" + what + f" lpes-search scored every option it considered on "
            f"{decision.prompts} held-out prompts ({decision.middle_prompts} with the needed fact in the middle "
            "of the context, 25-75%) and held each against the simpler ones with McNemar's exact test; the "
            "simplest that no more complex option beats ships." + _lengths_text(spec, held) + "\n\n"
            + "\n".join(format_table(decision, shipped=held.name if held else "")))


def _lengths_text(spec: Spec, held) -> str:
    """The lengths the decision covers, the limit this folder carries, and the one warning transformers prints."""
    lengths = spec.decision.lengths
    text = ""
    if lengths is None:
        text = (" It was decided at one prompt length only (a spec from before lpes checked longer ones): "
                "nothing here says how it does on longer prompts.")
    else:
        text = (f" Each option was also checked against the unscaled model on longer prompts, up to "
                f"{lengths.checked:,} tokens (the lengths table below, and [{LENGTHS_PLOT}]({LENGTHS_PLOT})); one "
                "that is significantly worse there is not shipped.")
        if (limit := spec.serving_limit) is not None:
            where = ("its config.json sets `max_position_embeddings` to that" if not spec.rope.length_dependent
                     else "its config.json does not say so (dynamic NTK switches at `max_position_embeddings`)")
            text += (f" **Serve this folder at most {limit:,} tokens** ({where}; vLLM: `--max-model-len {limit}`): "
                     "longer prompts were not checked or were worse than the unscaled model.")
    if held is not None and held.kind in ("uniform", "stock", "per-type"):
        facts = SCHEMES[held.rope_type or "linear"]
        text += f" Served by vLLM, {facts.name} RoPE ({held.name}) computes {facts.vllm}."
    if held is not None and held.kind == "uniform" and held.factor is not None and held.factor < 1:
        text += (f" transformers warns at load that a linear factor should be at least 1 ({held.factor:g} here, a "
                 "compression): that is what was decided, and it computes what was measured.")
    return text


def _front_matter(repo: str | None) -> str:
    # base_model only when the Hub can resolve it; a bundled or local model is named in the text.
    lines = ["---"] + ([f"base_model: {repo}"] if repo else [])
    lines += ["tags:", "- lpes", "- rope", "- long-context", "library_name: transformers",
              "pipeline_tag: text-generation", "---"]
    return "\n".join(lines)


def _intro(base_model: str, repo: str | None, custom_code: bool) -> str:
    if repo:
        base = f"[{repo}](https://huggingface.co/{repo})"
    elif _is_bundled(base_model):
        base = f"`{base_model}` (the tiny model bundled with lpes, not on the Hub)"
    else:
        base = f"`{base_model}` (a local model, not on the Hub)"
    how = ("`modeling_lpes.py` and `lpes_rope.py` (short, auditable, torch and transformers only) apply them"
           if custom_code else "every layer shares one scale, which is stock RoPE: transformers applies it "
           "with no custom code")
    return (f"This is {base} with **Layer-specific Positional Embedding Scaling** (LPES): decoder layer *h* "
            f"uses RoPE `inv_freq / s_h`, so it sees position *i* as *i / s_h* (one scale in every layer is "
            f"stock RoPE scaling). No weight is changed and inference costs the same as the base model. The scales "
            f"sit in `config.json`; {how}.")


def _is_bundled(base_model: str) -> bool:
    from lpes.converter.loading import bundled_models

    return base_model in bundled_models()


def _measured_text(spec: Spec, config, measured: Measured | None, searched_on: str | None = None) -> str:
    search = spec.provenance.search
    trained = getattr(config, "max_position_embeddings", None)
    if measured is None:
        return _from_provenance(spec, search, trained)
    return "\n\n".join([_task_text(measured, trained, search, searched_on),
                        _finding_text(measured, spec.best_uniform_scale, searched_on)])


def _searched_text(searched_on: str | None) -> str:
    """Said first when the curve comes from a search on another model or task: its baselines are not this one's."""
    if not searched_on:
        return ""
    return (f"**These scales were searched on {searched_on}**, not on this model and task: the curve and the "
            "baselines' settings are that search's best, applied here as they are.\n\n")


def _verdict_text(verdict: str | None, why: str) -> str:
    """Said first when validation did not pass: a card must not read as a measurement that was not made."""
    reason = f" ({why.rstrip('.')})" if why else ""
    if verdict == "not validated":
        return (f"**Not validated**{reason}: what was to be checked on this conversion did not all run. Any "
                "accuracy below outside a Validation table is lpes-search's own measurement, not this folder's.\n\n")
    if verdict == "failed":
        return f"**Validation FAILED**{reason}; see the Validation section.\n\n"
    return ""


def _task_text(m: Measured, trained: int | None, search: SearchRecord | None, searched_on: str | None = None) -> str:
    per_index = m.examples // max(len(m.lpes.by_gold_index), 1)
    text = (f"The task is key-value retrieval: each prompt hides {m.num_pairs} key-value facts, then asks for "
            f"the value of one of them; an answer is correct when greedy decoding gives that value. The "
            f"*gold index* is the position of the needed fact among the {m.num_pairs} (0 = the first, farthest "
            f"from the question). Validation used {m.examples} prompts ({per_index} per gold index)")
    low, high = m.prompt_tokens
    if high:
        text += f" of {low} tokens" if low == high else f" of {low} to {high} tokens"
    text += "."
    if trained and high:
        ratio = high / trained
        where = (f"{ratio:.1f}x the length it was made for" if ratio > 1.05
                 else "within the length it was made for")
        text += (f" The base model's config gives {trained} positions (`max_position_embeddings`): "
                 f"the prompts are {where}.")
    examples = search.calibration_examples if search is not None else None
    if examples is not None and searched_on:
        text += (f" The search (on {searched_on}, above) calibrated on {examples} prompts of "
                 "its own, not on these.")
    elif examples is not None:
        text += (f" The scales were found by `lpes-search` on {examples} other prompts "
                 f"of the same task (calibration), so none of these was seen by the search.")
    return text


def _finding_text(m: Measured, uniform_scale: float | None, searched_on: str | None = None) -> str:
    far = min(m.lpes.by_gold_index)
    unscaled, lpes = m.unscaled.overall, m.lpes.overall
    text = (f"Unscaled, the model answers {_pct(unscaled)} of them ({_pct(m.unscaled.by_gold_index[far])} when the "
            f"fact is the farthest, gold index {far}); with the LPES scales, {_pct(lpes)} "
            f"({_pct(m.lpes.by_gold_index[far])}).")
    if m.uniform is not None and uniform_scale is not None:
        uniform = m.uniform.overall
        found = "the one that other search found" if searched_on else "found by the same search"
        text += (f" The first baseline a per-layer curve has to beat is one linear scale for every layer: the "
                 f"best, s = {uniform_scale:g}, {found}, answers {_pct(uniform)}. ")
        text += _verdict(lpes, uniform, m.examples)
    text += _stock_text(m, searched_on)
    if lpes < unscaled:
        text += " **These scales make the model worse than it was unscaled on this task.**"
    if m.exports_agreeing:
        text += f" The exports in this folder ({', '.join(m.exports_agreeing)}) gave the same answers as the reference."
    if m.exports_differing:
        text += f" **{', '.join(m.exports_differing)} answered differently from the reference** (see the table)."
    return text


def _stock_text(m: Measured, searched_on: str | None = None) -> str:
    """The stock RoPE types every runtime has, each at its best factor; said plainly when one beats the curve."""
    if not m.stock:
        return ""
    rows = ", ".join(f"{name} {_pct(a.overall)}" for name, a in m.stock)
    where = ("the factor that other search found best" if searched_on
             else "its best factor on the calibration prompts")
    text = f" The stock length-extension RoPE types, each at {where}: {rows}."
    name, best = max(m.stock, key=lambda row: row[1].overall)
    if (best.overall - m.lpes.overall) * m.examples >= 0.5:
        text += (f" **{name} beats the per-layer curve here** ({_pct(best.overall)} vs {_pct(m.lpes.overall)}): "
                 "on this task that stock setting, which every runtime runs from config.json, is the better choice.")
    return text


def _verdict(lpes: float, uniform: float, examples: int) -> str:
    if abs(lpes - uniform) * examples < 0.5:  # the same number of right answers
        return ("**The per-layer curve matches the uniform baseline here; it does not beat it**: on this task "
                "one scale does as well, and the curve's gain over the unscaled model is what a uniform "
                "scale gives too.")
    if lpes > uniform:
        return f"The per-layer curve beats it by {100 * (lpes - uniform):.1f} points."
    return (f"**The per-layer curve is {100 * (uniform - lpes):.1f} points below it**: on this task the uniform "
            f"scale s is the better choice.")


def _from_provenance(spec: Spec, search: SearchRecord | None, trained: int | None) -> str:
    held = spec.provenance.held_out
    if search is None or held is None:
        return "These scales carry no search record and were not validated here; see `lpes_spec.json`."
    examples = "?" if search.calibration_examples is None else search.calibration_examples
    text = (f"The scales were found by `lpes-search` on {examples} key-value "
            f"retrieval prompts (`{search.data or 'the model folder default task'}`): each hides facts in "
            "a long context and asks for one. ")
    if held.examples == 0:  # --holdout 0: no held-out numbers (null in the spec), none to show
        text += "It held out no prompts (`--holdout 0`), so it measured no held-out accuracy"
    else:
        text += (f"On {'?' if held.examples is None else held.examples} held-out prompts the search measured "
                 f"{_pct(held.unscaled)} correct unscaled and {_pct(held.lpes)} with the scales")
    if spec.best_uniform_scale is not None and search.best_uniform_fitness is not None:
        text += (f"; on its calibration prompts the curve scored {_pct(search.fitness)} and the best single "
                 f"scale for every layer (s = {spec.best_uniform_scale:g}) {_pct(search.best_uniform_fitness)}")
    text += "."
    if trained:
        text += f" The base model's config gives {trained} positions (`max_position_embeddings`)."
    return text


def _load_section(name: str, custom_code: bool) -> str:
    trust = ", trust_remote_code=True" if custom_code else ""
    # trust_remote_code for the tokenizer too: it reads config.json, whose custom model_type would
    # otherwise make transformers stop and ask on the terminal.
    snippet = f"""```python
from transformers import AutoModelForCausalLM, AutoTokenizer

path = "{name}"  # this folder, or the Hub repo it was uploaded to
model = AutoModelForCausalLM.from_pretrained(path{trust})
tokenizer = AutoTokenizer.from_pretrained(path{trust})
```"""
    note = ("\n\nWithout `trust_remote_code=True` loading fails on purpose: the unscaled model must never run "
            "silently in its place." if custom_code else "")
    return "## Load\n\n" + snippet + note


def _scales_section(spec: Spec) -> str:
    curve = spec.curve
    curve_line = (
        f"Bezier curve of degree {curve.degree}, control points {[list(p) for p in curve.control_points]}."
        if curve
        else "Scales given directly (no curve)."
    )
    rows = "\n".join(f"| {h} | {s:.4f} |" for h, s in enumerate(spec.scales))
    return f"## Scales\n\n![LPES curve](lpes_curve.png)\n\n{curve_line}\n\n| layer | scale |\n|---|---|\n{rows}"


def _pct(value) -> str:
    return f"{100 * value:.0f}%" if isinstance(value, (int, float)) else "?"
