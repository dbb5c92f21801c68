"""benchmarks/ab_prototxt.py and benchmarks/profile_prototxt_kernels.py on
a tiny net in MTCNN R-Net's form: the A/B of a
setting whose rewrite keeps the same floats (the PReLU epilogue: outputs
equal to the bit), the A/B of a rule constant, a constant that does not
exist refused; the kernel profile's per-type line and costliest kernels."""
import os
import re
import subprocess
import sys

from conftest import ROOT, child_env

_W = 'weight_filler { type: "gaussian" std: 0.3 }'
# MTCNN's R-Net form: convolution -> PReLU in place, a fully-connected
# layer -> PReLU into a new top, two heads
NET = ('name: "rnet" input: "data" input_shape { dim: 1 dim: 3 dim: 12 dim: 12 }\n'
       f'layer {{ name: "c1" type: "Convolution" bottom: "data" top: "c1" '
       f'convolution_param {{ num_output: 6 kernel_size: 3 {_W} }} }}\n'
       'layer { name: "p1" type: "PReLU" bottom: "c1" top: "c1" }\n'
       f'layer {{ name: "fc" type: "InnerProduct" bottom: "c1" top: "fc" '
       f'inner_product_param {{ num_output: 16 {_W} }} }}\n'
       'layer { name: "p2" type: "PReLU" bottom: "fc" top: "fc/p" }\n'
       f'layer {{ name: "cls" type: "InnerProduct" bottom: "fc/p" top: "cls" '
       f'inner_product_param {{ num_output: 2 {_W} }} }}\n'
       'layer { name: "prob" type: "Softmax" bottom: "cls" top: "prob" }\n'
       f'layer {{ name: "box" type: "InnerProduct" bottom: "fc/p" top: "box" '
       f'inner_product_param {{ num_output: 4 {_W} }} }}\n')


def _script(tmp_path, name, *args, env_extra=None):
    proto = tmp_path / "tiny.prototxt"
    proto.write_text(NET)
    env = child_env(**(env_extra or {}))
    return subprocess.run([sys.executable, os.path.join(str(ROOT), "benchmarks", name),
                           str(proto), *args],
                          capture_output=True, text=True, env=env, timeout=300,
                          cwd=str(tmp_path))


def _row(p):
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    row = next(line for line in p.stdout.splitlines() if line.startswith("| tiny.prototxt"))
    return [c.strip() for c in row.strip("|").split("|")]


def test_ab_of_a_setting_and_of_a_constant(tmp_path):
    cells = _row(_script(tmp_path, "ab_prototxt.py", "--setting", "FUSE_PRELU",
                         "--rounds", "1", "--runs", "1", "--batch", "2"))
    assert cells[1] == "2x3x12x12" and all(float(c) > 0 for c in cells[2:5])
    assert float(cells[5]) == 0.0           # the same operations, fused or not
    cells = _row(_script(tmp_path, "ab_prototxt.py", "--patch",
                         "conv.FWD_SPLITK_WIDE_MIN_KTILES=1e9", "--rounds", "1", "--runs", "1"))
    assert float(cells[4]) > 0 and float(cells[5]) < 1e-5
    p = _script(tmp_path, "ab_prototxt.py", "--patch", "conv.NO_SUCH_RULE=1")
    assert p.returncode != 0 and "has no NO_SUCH_RULE" in p.stderr


def test_kernel_profile(tmp_path):
    p = _script(tmp_path, "profile_prototxt_kernels.py", "--rounds", "1", "--runs", "1",
                "--iters", "1", "--top", "3", env_extra={"CAFFE_OCL_PROFILE": "1"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert re.search(r"## tiny.prototxt input 1x3x12x12: forward [\d.]+ ms, gated [\d.]+ ms, "
                     r"\d+ launches", p.stdout), p.stdout
    assert re.search(r"kernels [\d.]+ ms; by layer type: .*Convolution", p.stdout), p.stdout
    assert len(re.findall(r"^\s+[\d.]+ us \S+", p.stdout, re.M)) == 3, p.stdout
