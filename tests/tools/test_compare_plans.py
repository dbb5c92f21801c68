"""tools/compare_plans.py: a prototxt's optimised TEST plan against the plain
one, across reshapes; the check that found the Concat-in-place reshape bug
on BVLC GoogLeNet (plan/concat.py SliceTarget)."""
import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import compare_plans  # noqa: E402

# an inception-like module: BN/Scale/ReLU to fold, three branches (1x1,
# 3x3, 5x5) into a Concat, a Softmax output
NET = """name: "mini" layer { name: "data" type: "Input" top: "data"
  input_param { shape { dim: 1 dim: 3 dim: 9 dim: 9 } } }
layer { name: "c0" type: "Convolution" bottom: "data" top: "c0"
  convolution_param { num_output: 6 kernel_size: 3 pad: 1 } }
layer { name: "bn" type: "BatchNorm" bottom: "c0" top: "c0" }
layer { name: "sc" type: "Scale" bottom: "c0" top: "c0" scale_param { bias_term: true } }
layer { name: "r0" type: "ReLU" bottom: "c0" top: "c0" }
layer { name: "b1" type: "Convolution" bottom: "c0" top: "b1"
  convolution_param { num_output: 4 kernel_size: 1 } }
layer { name: "b3" type: "Convolution" bottom: "c0" top: "b3"
  convolution_param { num_output: 5 kernel_size: 3 pad: 1 } }
layer { name: "b5" type: "Convolution" bottom: "c0" top: "b5"
  convolution_param { num_output: 3 kernel_size: 5 pad: 2 } }
layer { name: "cat" type: "Concat" bottom: "b1" bottom: "b3" bottom: "b5" top: "cat" }
layer { name: "fc" type: "InnerProduct" bottom: "cat" top: "fc" inner_product_param { num_output: 7 } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""


def test_optimised_plan_matches_plain_across_reshapes(tmp_path, capsys):
    path = tmp_path / "mini.prototxt"
    path.write_text(NET)
    rows = compare_plans.compare(str(path), [1, 3, 2])
    assert {(b, n) for b, n, _ in rows} == {(b, n) for b in (1, 3, 2) for n in ("prob", "fc")}
    assert max(r for _, _, r in rows) < 1e-5
    assert compare_plans.main([str(path), "--batches", "2,1"]) == 0
    assert ": ok (" in capsys.readouterr().out


def test_broken_model_is_reported(tmp_path, capsys):
    path = tmp_path / "bad.prototxt"
    path.write_text(NET.replace('bottom: "b5" top: "cat"', 'bottom: "nope" top: "cat"'))
    assert compare_plans.main([str(path), "--batches", "1"]) == 1
    assert "ERROR" in capsys.readouterr().out
