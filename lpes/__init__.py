"""lpes: per-layer RoPE scaling (LPES) from a searched curve to Hub, ONNX and TensorRT artifacts.

    import lpes
    spec = lpes.load_spec("best.json")
    model = lpes.apply(model, spec)                    # the PyTorch reference, in place
    lpes.convert("lpes-tiny-kv", spec, "out", targets=["hf", "onnx"])
"""

from lpes.foundation.errors import LpesError
from lpes.foundation.spec import Curve, RopeScheme, Spec, dump_spec, load_spec
from lpes.foundation.version import __version__


def apply(model, spec: Spec):
    """Patch a loaded transformers causal LM so layer h uses inv_freq / s_h (returns it).

    Under the spec's `rope` (RopeScheme "yarn" / "dynamic") layer h gets transformers' YaRN or
    dynamic NTK at factor s_h instead.
    """
    from lpes.converter.reference import apply as apply_reference

    return apply_reference(model, spec)


def convert(model: str, spec: Spec | str, out: str, targets=None, **options):
    """Python form of `lpes-convert` (`targets` None: its default, the Hub folder); see
    lpes.convert_pipeline.convert for the options."""
    from lpes.convert_pipeline import convert as run

    return run(model, spec, out, targets=targets, **options)


__all__ = ["Curve", "LpesError", "RopeScheme", "Spec", "__version__", "apply", "convert", "dump_spec", "load_spec"]
