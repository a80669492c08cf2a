import json
import os
import stat
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from lpes.foundation import bezier
from lpes.foundation.errors import LpesError
from lpes.foundation.files import save_atomic, write_bytes_atomic, write_text_atomic
from lpes.foundation.spec import Spec, dump_spec, load_spec, parse_spec


def de_casteljau(points, t):
    pts = [np.array(p, dtype=float) for p in points]
    while len(pts) > 1:
        pts = [(1 - t) * a + t * b for a, b in zip(pts, pts[1:])]
    return pts[0]


@pytest.mark.parametrize("seed", range(5))
def test_bernstein_matches_de_casteljau(seed):
    rng = np.random.default_rng(seed)
    points = np.column_stack([np.sort(rng.uniform(0, 31, 4)), rng.uniform(0.5, 4, 4)])
    ts = rng.uniform(0, 1, 50)
    ours = bezier.bernstein(points, ts)
    direct = np.array([de_casteljau(points, t) for t in ts])
    np.testing.assert_allclose(ours, direct, rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_each_layer_gets_the_t_that_hits_its_x(seed):
    rng = np.random.default_rng(seed)
    points = np.column_stack([np.sort(rng.integers(0, 32, 4)).astype(float), rng.uniform(0.5, 4, 4)])
    points[0, 0], points[-1, 0] = 0, 31
    t = bezier.layer_parameters(points, 32)
    x = bezier.bernstein(points, t)[:, 0]
    np.testing.assert_allclose(x, np.arange(32), atol=1e-9)
    assert np.all(np.diff(t) >= 0)


def test_end_points_are_exact():
    points = [[0, 1.1], [3, 0.3], [5, 2.2], [7, 1.7]]
    scales = bezier.layer_scales(points, 8)
    assert scales[0] == 1.1 and scales[-1] == 1.7


def test_degree_one_gives_linear_scales():
    scales = bezier.layer_scales([[0, 1.0], [9, 4.0]], 10)
    np.testing.assert_allclose(scales, np.linspace(1.0, 4.0, 10), atol=1e-12)


def test_equal_y_gives_constant_scales():
    assert bezier.layer_scales([[0, 2.5], [2, 2.5], [5, 2.5], [11, 2.5]], 12) == [2.5] * 12


def test_round_trip(tmp_path):
    spec = Spec.from_curve([[0, 2.0], [1, 1.0], [2, 1.5], [3, 1.0]], 4, {"search": {"seed": 3}})
    dump_spec(spec, tmp_path / "best.json")
    again = load_spec(tmp_path / "best.json")
    assert again == spec
    data = json.loads((tmp_path / "best.json").read_text())
    assert data["format"] == "lpes-spec" and data["version"] == 1 and data["num_layers"] == 4


def test_scales_only_and_curve_only_files(tmp_path):
    (tmp_path / "s.json").write_text(json.dumps({"scales": [1, 2, 3]}))
    assert load_spec(tmp_path / "s.json", num_layers=3).scales == (1.0, 2.0, 3.0)
    (tmp_path / "c.json").write_text(json.dumps({"control_points": [[0, 1], [5, 3]]}))
    spec = load_spec(tmp_path / "c.json", num_layers=6)
    np.testing.assert_allclose(spec.scales, np.linspace(1, 3, 6))


@pytest.mark.parametrize(
    "data, field",
    [
        ({"scales": [1, float("nan")]}, "scales[1]"),
        ({"scales": [1, -2]}, "scales[1]"),
        ({"scales": [1, "2"]}, "scales[1]"),
        ({"scales": []}, "scales"),
        ({"scales": [1, 2], "num_layers": 3}, "scales"),
        ({"control_points": [[0, 1], [5, 2], [3, 1]]}, "control_points"),
        ({"control_points": [[0, 1], [5, 0]]}, "control_points[1]"),
        ({"curve": {"degree": 2, "control_points": [[0, 1], [5, 2]]}}, "degree"),
        ({"version": 9, "scales": [1]}, "version"),
        ({}, "scales"),
        ([1, 2], "top level"),
    ],
)
def test_errors_name_the_field(data, field):
    with pytest.raises(LpesError, match=field.replace("[", r"\[").replace("]", r"\]")) as err:
        parse_spec(data)
    assert "\n" not in str(err.value)


def test_layer_count_mismatch(tmp_path):
    (tmp_path / "s.json").write_text(json.dumps({"scales": [1, 2, 3]}))
    with pytest.raises(LpesError, match="3 entries but the model has 4 layers"):
        load_spec(tmp_path / "s.json", num_layers=4)


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(LpesError, match="not found"):
        load_spec(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(LpesError, match="not valid JSON"):
        load_spec(tmp_path / "bad.json")


def test_scales_that_disagree_with_curve_are_refused():
    with pytest.raises(LpesError, match="do not match the curve"):
        parse_spec({"scales": [1, 1.2, 3], "curve": {"control_points": [[0, 1], [2, 3]]}})


def readme_spec_example() -> dict:
    """The JSON block of docs/search.md's "The spec file" section, as a user would copy it."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "search.md").read_text()
    section = page.split("## The spec file", 1)[1]
    return json.loads(section.split("```json", 1)[1].split("```", 1)[0])


def test_the_readme_example_loads(tmp_path):
    example = readme_spec_example()
    (tmp_path / "best.json").write_text(json.dumps(example))
    spec = load_spec(tmp_path / "best.json")
    assert list(spec.scales) == example["scales"]
    # The scales are the curve's, computed independently of lpes.foundation.bezier (de Casteljau at t = h / 3,
    # where B_x(t) = 3t because the control-point x are 0, 1, 2, 3).
    points = example["curve"]["control_points"]
    assert [p[0] for p in points] == [0, 1, 2, 3]
    np.testing.assert_allclose(spec.scales, [de_casteljau(points, h / 3)[1] for h in range(4)], rtol=1e-12)


def test_provenance_is_free_form_and_survives_the_round_trip(tmp_path):
    provenance = {"search": {"seed": 7, "best_uniform_scale": 2.5, "scale": "typo-like keys are fine here",
                             "history": [{"generation": 0, "fitness": 0.5}]},
                  "held_out": {"unscaled": 0.25, "lpes": 0.75}, "base_model": "org/model", "anything": [1, {"a": None}]}
    spec = Spec.from_curve([[0, 4.0], [1, 2.25], [2, 1.25], [3, 1.0]], 4, provenance)
    dump_spec(spec, tmp_path / "best.json")
    again = load_spec(tmp_path / "best.json")
    assert again == spec
    assert again.best_uniform_scale == 2.5 and again.base_model == "org/model"
    assert Spec.from_scales([1.0]).best_uniform_scale is None and Spec.from_scales([1.0]).base_model is None


def test_a_byte_order_mark_is_accepted(tmp_path):
    (tmp_path / "best.json").write_bytes(b"\xef\xbb\xbf" + json.dumps({"scales": [1.5, 2]}).encode())
    assert load_spec(tmp_path / "best.json").scales == (1.5, 2.0)


def test_the_sane_ranges_include_their_bounds():
    from lpes.foundation.spec import MAX_DEGREE, MAX_LAYERS, MAX_SCALE, MIN_SCALE

    assert Spec.from_scales([MIN_SCALE, 0.5, 1, MAX_SCALE]).scales == (MIN_SCALE, 0.5, 1.0, MAX_SCALE)
    points = [[i, MIN_SCALE if i % 2 else MAX_SCALE] for i in range(MAX_DEGREE + 1)]
    scales = Spec.from_curve(points, MAX_LAYERS).scales
    assert len(scales) == MAX_LAYERS and min(scales) >= MIN_SCALE and max(scales) <= MAX_SCALE
    with pytest.raises(LpesError, match="degree must be at most"):
        Spec.from_curve(points + [[MAX_DEGREE + 1, 1.0]], 8)
    with pytest.raises(LpesError, match="lpes supports 1..4096"):
        Spec.from_scales([1.0]).for_layers(0)


def test_dump_refuses_what_load_would_refuse(tmp_path):
    from lpes.foundation.provenance import Provenance

    with pytest.raises(LpesError, match="best_uniform_scale"):  # the provenance is checked as the spec is built
        Spec.from_scales([1.0, 2.0], {"search": {"best_uniform_scale": "2"}})
    unchecked = Spec((1.0, 2.0), provenance=Provenance({"search": {"best_uniform_scale": "2"}}))
    with pytest.raises(LpesError, match="best_uniform_scale"):  # and again as it is written
        dump_spec(unchecked, tmp_path / "best.json")
    assert list(tmp_path.iterdir()) == []


@contextmanager
def umask(mask):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_follow_the_umask(tmp_path, mask, mode):
    with umask(mask):
        write_text_atomic(tmp_path / "a.json", "{}\n")
        write_bytes_atomic(tmp_path / "sub" / "b.bin", b"\0")
        save_atomic(tmp_path / "c.png", lambda tmp: tmp.write_bytes(b"png"))
        dump_spec(Spec.from_scales([1.0]), tmp_path / "best.json")
    for name in ("a.json", "sub/b.bin", "c.png", "best.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode, name
    assert (tmp_path / "a.json").read_text() == "{}\n" and (tmp_path / "c.png").read_bytes() == b"png"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "best.json", "c.png", "sub"]  # no temp files


def test_a_failed_save_leaves_the_old_file_and_no_temp_file(tmp_path):
    target = tmp_path / "plot.png"
    target.write_bytes(b"old")
    seen = []

    def broken(tmp):
        seen.append(tmp.suffix)  # matplotlib picks the format from the temporary name's suffix
        tmp.write_bytes(b"half")
        raise RuntimeError("savefig failed")

    with pytest.raises(RuntimeError):
        save_atomic(target, broken)
    assert target.read_bytes() == b"old" and seen == [".png"]
    assert [p.name for p in tmp_path.iterdir()] == ["plot.png"]


def test_unwritable_destinations_are_one_line(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("")
    with pytest.raises(LpesError, match="cannot write .*taken") as err:
        write_text_atomic(tmp_path / "taken", "{}")  # a non-empty directory where the file should go
    assert "\n" not in str(err.value)
    (tmp_path / "file").write_text("")
    with pytest.raises(LpesError, match="cannot write"):
        write_text_atomic(tmp_path / "file" / "x.json", "{}")  # a file where a folder should be
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "taken"]


# -- rope_type: how each layer applies its scale -------------------------------------------------------------


def test_a_file_without_rope_type_is_linear_and_linear_writes_none(tmp_path):
    from lpes.foundation.spec import RopeScheme

    (tmp_path / "old.json").write_text(json.dumps({"scales": [1, 2, 3]}))
    assert load_spec(tmp_path / "old.json").rope == RopeScheme("linear")
    dump_spec(Spec.from_scales([1.0, 2.0]), tmp_path / "best.json")
    data = json.loads((tmp_path / "best.json").read_text())
    assert "rope_type" not in data and "rope_parameters" not in data  # byte for byte what lpes wrote before


@pytest.mark.parametrize("rope", [("yarn", None, None, None), ("yarn", 16.0, 2.0, 4096), ("yarn", 64.0, None, None),
                                  ("dynamic", None, None, None)], ids=str)
def test_the_scheme_and_its_parameters_survive_the_round_trip(tmp_path, rope):
    from lpes.foundation.spec import RopeScheme

    scheme = RopeScheme(*rope)
    spec = Spec.from_curve([[0, 1.0], [1, 2.5], [3, 4.0]], 4, {"search": {"seed": 1}}, rope=scheme)
    dump_spec(spec, tmp_path / "best.json")
    data = json.loads((tmp_path / "best.json").read_text())
    assert data["rope_type"] == rope[0]
    assert data.get("rope_parameters", {}) == scheme.parameters
    again = load_spec(tmp_path / "best.json")
    assert again == spec and again.rope == scheme


def test_yarns_parameters_resolve_to_transformers_defaults_and_the_trained_length():
    from types import SimpleNamespace

    from lpes.foundation.spec import RopeScheme

    model = SimpleNamespace(max_position_embeddings=2048)
    assert RopeScheme("yarn").resolved(model) == RopeScheme("yarn", 32.0, 1.0, 2048)
    assert RopeScheme("yarn", 8.0, None, 512).resolved(model) == RopeScheme("yarn", 8.0, 1.0, 512)
    assert RopeScheme("dynamic").resolved(model) == RopeScheme("dynamic")


@pytest.mark.parametrize("data, message", [
    ({"rope_type": "ntk"}, "'rope_type' must be one of linear, yarn, dynamic, got 'ntk' (transformers has no static"),
    ({"rope_type": "YaRN"}, "'rope_type' must be one of linear, yarn, dynamic, got 'YaRN'"),
    ({"rope_type": True}, "'rope_type' must be one of"),
    ({"rope_type": "yarn", "rope_parameters": {"beta_fst": 8}}, "unknown key 'beta_fst' in 'rope_parameters' "
                                                                 "(did you mean 'beta_fast'?)"),
    ({"rope_type": "yarn", "rope_parameters": [1]}, "'rope_parameters' must be an object"),
    ({"rope_type": "dynamic", "rope_parameters": {"beta_fast": 8}}, "no fields for rope_type 'dynamic'"),
    ({"rope_parameters": {"beta_fast": 8}}, "no fields for rope_type 'linear'"),
    ({"rope_type": "yarn", "rope_parameters": {"beta_fast": 1, "beta_slow": 2}}, "must be greater than beta_slow"),
    ({"rope_type": "yarn", "rope_parameters": {"beta_slow": 40}}, "must be greater than beta_slow"),  # fast: 32
    ({"rope_type": "yarn", "rope_parameters": {"beta_fast": True}}, "'rope_parameters.beta_fast' must be a number"),
    ({"rope_type": "yarn", "rope_parameters": {"beta_slow": -1}}, "'rope_parameters.beta_slow' must be a number"),
    ({"rope_type": "yarn", "rope_parameters": {"beta_fast": float("inf")}}, "beta_fast' must be a number"),
    ({"rope_type": "yarn", "rope_parameters": {"original_max_position_embeddings": 64.0}}, "must be an integer"),
    ({"rope_type": "yarn", "rope_parameters": {"original_max_position_embeddings": 0}}, "must be an integer"),
    ({"rope_type": "yarn", "scales": [1.0, 0.5]}, "'scales[1]' is 0.5; a YaRN factor (rope_type 'yarn') must be at "
                                                  "least 1"),
    ({"rope_type": "dynamic", "num_layers": 3, "control_points": [[0, 1.0], [2, 0.5]]},
     "the curve gives layer 1 the scale 0.75; a dynamic NTK factor"),
])
def test_rope_errors_name_the_field(data, message):
    data = {"scales": [1.0, 2.0], **data} if "control_points" not in data else data
    with pytest.raises(LpesError, match=re_escape(message)) as err:
        parse_spec(data)
    assert "\n" not in str(err.value)


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


def test_a_curve_only_spec_checks_the_schemes_range_when_it_meets_the_model():
    from lpes.foundation.spec import RopeScheme

    spec = parse_spec({"rope_type": "yarn", "control_points": [[0, 1.0], [1, 0.5]]})  # no layer count yet
    assert spec.rope == RopeScheme("yarn") and spec.scales is None
    with pytest.raises(LpesError, match="the curve gives layer 1 the scale 0.75"):
        spec.for_layers(3)
    with pytest.raises(LpesError, match=r"'scales\[0\]' is 0.9"):
        Spec.from_scales([0.9, 2.0], rope=RopeScheme("dynamic"))
    assert Spec.from_scales([0.9, 2.0]).rope.linear  # linear scales go below 1 as before


# ---- issue 43: curves float64 cannot evaluate are refused, in one line naming the point ----


def _exact_reference(points, num_layers: int) -> list[float]:
    """The curve evaluated in exact rational arithmetic, written here independently of lpes's own: bisection on
    B_x(t) = x_h to 2^-80 (far past what a 1e-9 comparison needs), then B_y there."""
    from fractions import Fraction
    from math import comb

    pts = [(Fraction(x), Fraction(y)) for x, y in points]
    d = len(pts) - 1

    def b(t, i):
        return sum(comb(d, k) * t**k * (1 - t) ** (d - k) * p[i] for k, p in enumerate(pts))

    out = []
    for h in range(num_layers):
        target = pts[0][0] + (pts[-1][0] - pts[0][0]) * Fraction(h, num_layers - 1)
        lo, hi = Fraction(0), Fraction(1)
        for _ in range(80):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if b(mid, 0) < target else (lo, mid)
        out.append(float(b((lo + hi) / 2, 1)))
    return out


@pytest.mark.parametrize("offset", [0.0, 1e6, 1e15, -1e15])
def test_a_curve_far_from_zero_gives_the_same_scales_as_at_zero(offset):
    """x = 1e15 + (0, 2, 4) is the same curve as x = 0, 2, 4 (float64 tells 1e15 + 4/3 from 1e15 + 8/3)."""
    points = [[offset, 4.0], [offset + 2, 2.0], [offset + 4, 1.0]]
    scales = list(Spec.from_curve(points, 4).scales)
    assert scales == pytest.approx(_exact_reference([[0, 4.0], [2, 2.0], [4, 1.0]], 4), abs=1e-9)
    assert scales == pytest.approx(_exact_reference(points, 4), abs=1e-9)


def test_a_curve_whose_layers_float64_cannot_place_apart_is_refused():
    """x = 1e16, 1e16 + 2, 1e16 + 4 (main wrote [4.0, 3.0625, 3.0625, 1.0]): layers 1 and 2 get one position."""
    with pytest.raises(LpesError, match=r"control point P0 \(x 1e\+16\) is too far from 0 .* layers 1 and 2 of 4"):
        Spec.from_curve([[1e16, 4.0], [1e16 + 2, 2.0], [1e16 + 4, 1.0]], 4)
    with pytest.raises(LpesError, match=r"control point P1 \(x 5e-324\) is too close to P0"):
        Spec.from_curve([[0, 4.0], [5e-324, 1.0]], 4)
    assert len(Spec.from_curve([[0, 4.0], [5e-324, 1.0]], 2).scales) == 2  # two layers do have two positions


def test_a_point_float64_cannot_hold_is_refused_naming_it(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text('{"version": 1, "curve": {"control_points": [[10000000000000000, 4], [10000000000000001, 2], '
                    '[10000000000000004, 1]]}, "num_layers": 4}')
    with pytest.raises(LpesError, match=r"^spec: 'curve.control_points\[1\]' has x 10000000000000001, which "
                                        r"float64 cannot represent exactly$"):
        load_spec(path)
    path.write_text('{"version": 1, "control_points": [[0, 4], [1' + "0" * 26 + '1, 1]], "num_layers": 4}')
    with pytest.raises(LpesError, match=r"^spec: 'control_points\[1\]' has x 1000.*01, which float64 cannot "
                                        r"represent exactly$"):
        load_spec(path)
    path.write_text('{"version": 1, "control_points": [[0, 4], [1' + "0" * 400 + ', 1]], "num_layers": 4}')
    with pytest.raises(LpesError, match=r"^spec: 'control_points\[1\]\[0\]' is an integer of 401 digits"):
        load_spec(path)


def test_a_curve_float64_evaluates_wrongly_is_refused(monkeypatch):
    """The exact check itself: a float64 evaluation off by more than 1e-9 is refused, one within it passes."""
    points = [[0, 1.0], [0.3, 3.0], [0.7, 0.5], [1, 2.0]]
    good = list(Spec.from_curve(points, 12).scales)
    assert good == pytest.approx(_exact_reference(points, 12), abs=1e-9)
    real = bezier.layer_scales
    monkeypatch.setattr(bezier, "layer_scales", lambda p, n, t=None: [s + (2e-9 if h == 5 else 0.0)
                                                                      for h, s in enumerate(real(p, n, t))])
    with pytest.raises(LpesError, match=r"the curve gives layer 5 of 12 the scale .* evaluated exactly"):
        Spec.from_curve(points, 12)
    monkeypatch.setattr(bezier, "layer_scales", lambda p, n, t=None: [s + (5e-10 if h == 5 else 0.0)
                                                                      for h, s in enumerate(real(p, n, t))])
    assert Spec.from_curve(points, 12).scales[5] == pytest.approx(good[5] + 5e-10, abs=1e-15)


@pytest.mark.parametrize("seed", range(5))
def test_random_curves_match_their_exact_evaluation(seed):
    rng = np.random.default_rng(seed)
    degree = int(rng.integers(1, 6))
    xs = np.sort(rng.uniform(-50, 50, degree + 1))
    points = [[float(x), float(y)] for x, y in zip(xs, rng.uniform(0.5, 4, degree + 1))]
    layers = int(rng.integers(2, 40))
    assert list(Spec.from_curve(points, layers).scales) == pytest.approx(_exact_reference(points, layers), abs=1e-9)
