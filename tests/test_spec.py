import json

import numpy as np
import pytest

from lpes import bezier
from lpes.errors import LpesError
from lpes.spec import Spec, dump_spec, load_spec, parse_spec


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
