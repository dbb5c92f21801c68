"""benchmarks/bench_caffe_opencv.py on a tiny Caffe net in the form of
published MobileNet v2 prototxts (BatchNorm writing a new top, Scale and
ReLU in place on it, a residual sum): random weights written to a
.caffemodel that OpenCV's Caffe importer reads too, the outputs compared
(the folded net against another implementation), one timing round with
the new-top folding off as the base. And a net in MTCNN's form (PReLU in
place, two heads, one a Softmax) at another input size: every output
compared by name."""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, child_env

cv2 = pytest.importorskip("cv2")
if not hasattr(cv2.dnn, "readNetFromCaffe"):      # OpenCV 5 dropped its Caffe importer
    pytest.skip(f"OpenCV {cv2.__version__} has no Caffe importer", allow_module_level=True)

_W = 'weight_filler { type: "gaussian" std: 0.3 }'
NET = ('name: "tiny" input: "data" input_shape { dim: 1 dim: 8 dim: 9 dim: 8 }\n'
       f'layer {{ name: "c1" type: "Convolution" bottom: "data" top: "c1" '
       f'convolution_param {{ num_output: 8 kernel_size: 1 bias_term: false {_W} }} }}\n'
       'layer { name: "c1/bn" type: "BatchNorm" bottom: "c1" top: "c1/bn" '
       'batch_norm_param { use_global_stats: true } }\n'
       'layer { name: "c1/scale" type: "Scale" bottom: "c1/bn" top: "c1/bn" '
       'scale_param { bias_term: true } }\n'
       'layer { name: "sum" type: "Eltwise" bottom: "c1/bn" bottom: "data" top: "sum" }\n'
       'layer { name: "relu" type: "ReLU" bottom: "sum" top: "sum" }\n'
       'layer { name: "pool" type: "Pooling" bottom: "sum" top: "pool" '
       'pooling_param { pool: AVE global_pooling: true } }\n')


MTCNN_FORM = ('name: "pnet" input: "data" input_shape { dim: 1 dim: 3 dim: 12 dim: 12 }\n'
              f'layer {{ name: "c1" type: "Convolution" bottom: "data" top: "c1" '
              f'convolution_param {{ num_output: 6 kernel_size: 3 {_W} }} }}\n'
              'layer { name: "p1" type: "PReLU" bottom: "c1" top: "c1" }\n'
              f'layer {{ name: "cls" type: "Convolution" bottom: "c1" top: "cls" '
              f'convolution_param {{ num_output: 2 kernel_size: 1 {_W} }} }}\n'
              'layer { name: "prob" type: "Softmax" bottom: "cls" top: "prob" }\n'
              f'layer {{ name: "box" type: "Convolution" bottom: "c1" top: "box" '
              f'convolution_param {{ num_output: 4 kernel_size: 1 {_W} }} }}\n')


def _run(tmp_path, text, *args):
    proto = tmp_path / "tiny.prototxt"
    proto.write_text(text)
    env = child_env()
    p = subprocess.run([sys.executable, os.path.join(str(ROOT), "benchmarks",
                                                     "bench_caffe_opencv.py"),
                        str(proto), "--rounds", "1", "--runs", "1", *args],
                       capture_output=True, text=True, env=env, timeout=300, cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    row = next(line for line in p.stdout.splitlines() if line.startswith("| tiny.prototxt"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # the outputs of the two implementations: close, and actually compared
    assert re.fullmatch(r"\d\.\de[-+]\d\d", cells[-1]) and float(cells[-1]) < 1e-4
    return cells


def test_tiny_net_against_opencv(tmp_path):
    cells = _run(tmp_path, NET, "--ab", "FOLD_NEW_TOPS")
    assert cells[1] == "1x8x9x8" and all(float(c) > 0 for c in cells[2:7])


def test_two_outputs_at_another_size_against_opencv(tmp_path):
    cells = _run(tmp_path, MTCNN_FORM, "--batch", "2", "--size", "17,23")
    assert cells[1] == "2x3x17x23" and all(float(c) > 0 for c in cells[2:5])


def test_detection_rows_compared_without_opencvs_zero_padding():
    """OpenCV returns keep_top_k DetectionOutput rows, the unused ones
    zeros; Caffe's top holds only the detections kept: the comparison
    drops the zero rows, and still reports a difference in the kept ones."""
    import numpy as np
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from bench_caffe_opencv import _as_ours
    ours = np.arange(1, 1 + 3 * 7, dtype=np.float32).reshape(1, 1, 3, 7)
    ref = np.zeros((1, 1, 5, 7), np.float32)
    ref[0, 0, :3] = ours[0, 0]
    assert np.array_equal(_as_ours(ours, ref), ours)
    ref[0, 0, 1, 2] += 1.0
    assert np.abs(_as_ours(ours, ref) - ours).max() == 1.0
    with pytest.raises(ValueError):     # other sizes that differ are not hidden
        _as_ours(ours, np.zeros((1, 1, 5, 6), np.float32))
