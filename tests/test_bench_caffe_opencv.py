"""benchmarks/bench_caffe_opencv.py on a tiny Caffe net in the form of
published MobileNet v2 prototxts (BatchNorm writing a new top, Scale and
ReLU in place on it, a residual sum): random weights written to a
.caffemodel that OpenCV's Caffe importer reads too, the outputs compared
(the folded net against another implementation), one timing round with
the new-top folding off as the base."""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

pytest.importorskip("cv2")

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


def test_tiny_net_against_opencv(tmp_path):
    proto = tmp_path / "tiny.prototxt"
    proto.write_text(NET)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, os.path.join(str(ROOT), "benchmarks",
                                                     "bench_caffe_opencv.py"),
                        str(proto), "--rounds", "1", "--runs", "1", "--ab", "FOLD_NEW_TOPS"],
                       capture_output=True, text=True, env=env, timeout=300, cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    row = next(line for line in p.stdout.splitlines() if line.startswith("| tiny.prototxt"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "1" and all(float(c) > 0 for c in cells[2:7])
    # the outputs of the two implementations: close, and actually compared
    assert re.fullmatch(r"\d\.\de[-+]\d\d", cells[7]) and float(cells[7]) < 1e-4
