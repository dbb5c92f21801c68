"""caffe.set_deterministic(True) / CAFFE_OCL_DETERMINISTIC=1: the same
image gives the same output bits at every batch size (a CaffeNet-like net,
batch 1 vs 10: the convolution algorithm, GEMM panels and K splits must not
depend on the batch)."""
import dataclasses

import numpy as np
import pytest

import caffe
from caffe_ocl import config
from caffe_ocl.ops import conv as conv_ops
from caffe_ocl.ops import gemm as gemm_ops
from caffe_ocl.ops import gemm_splitk

NET = """
layer { name: "data" type: "Input" top: "data"
  input_param { shape { dim: %(n)d dim: 3 dim: %(s)d dim: %(s)d } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 32 kernel_size: 11 stride: 4
    weight_filler { type: "gaussian" std: 0.05 }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "norm1" type: "LRN" bottom: "pool1" top: "norm1"
  lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 } }
layer { name: "conv2" type: "Convolution" bottom: "norm1" top: "conv2"
  convolution_param { num_output: 64 pad: 2 kernel_size: 5 group: 2
    weight_filler { type: "gaussian" std: 0.03 }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2"
  pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "conv3" type: "Convolution" bottom: "pool2" top: "conv3"
  convolution_param { num_output: %(c3)d pad: 1 kernel_size: 3
    weight_filler { type: "gaussian" std: 0.03 }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu3" type: "ReLU" bottom: "conv3" top: "conv3" }
layer { name: "conv4" type: "Convolution" bottom: "conv3" top: "conv4"
  convolution_param { num_output: %(c3)d pad: 1 kernel_size: 3 group: 2
    weight_filler { type: "gaussian" std: 0.03 }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu4" type: "ReLU" bottom: "conv4" top: "conv4" }
layer { name: "conv5" type: "Convolution" bottom: "conv4" top: "conv5"
  convolution_param { num_output: 64 pad: 1 kernel_size: 3
    weight_filler { type: "gaussian" std: 0.03 }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu5" type: "ReLU" bottom: "conv5" top: "conv5" }
layer { name: "pool5" type: "Pooling" bottom: "conv5" top: "pool5"
  pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "fc6" type: "InnerProduct" bottom: "pool5" top: "fc6"
  inner_product_param { num_output: 128
    weight_filler { type: "gaussian" std: 0.01 }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu6" type: "ReLU" bottom: "fc6" top: "fc6" }
layer { name: "fc7" type: "InnerProduct" bottom: "fc6" top: "fc7"
  inner_product_param { num_output: 128
    weight_filler { type: "gaussian" std: 0.01 }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "fc8" type: "InnerProduct" bottom: "fc7" top: "fc8"
  inner_product_param { num_output: 10
    weight_filler { type: "gaussian" std: 0.01 } } }
layer { name: "prob" type: "Softmax" bottom: "fc8" top: "prob" }
"""

BLOBS = ["conv1", "conv2", "conv3", "conv4", "conv5", "fc6", "fc7", "prob"]


@pytest.fixture
def deterministic():
    caffe.set_deterministic(True)
    yield
    config.set("DETERMINISTIC", None)


def _nets(tmp_path, size, c3):
    nets = []
    for n in (1, 10):
        p = tmp_path / f"caffenet_{n}.prototxt"
        p.write_text(NET % dict(n=n, s=size, c3=c3))
        nets.append(caffe.Net(str(p), caffe.TEST))
    for k, v in nets[0].params.items():
        for a, b in zip(v, nets[1].params[k]):
            b.data[...] = a.data
    return nets


@pytest.mark.parametrize("size,c3", [(131, 192), (67, 96)])
def test_batch_1_and_10_give_the_same_bits(tmp_path, deterministic, size, c3):
    caffe.set_random_seed(1)
    n1, n10 = _nets(tmp_path, size, c3)
    x = np.random.RandomState(0).rand(10, 3, size, size).astype(np.float32) * 255
    o1 = {k: v[0].copy() for k, v in n1.forward(data=x[:1], blobs=BLOBS).items()}
    o10 = n10.forward(data=x, blobs=BLOBS)
    for k in BLOBS:
        np.testing.assert_array_equal(o1[k], o10[k][0], err_msg=k)
    # and every image of the batch is its own batch-1 result
    o1b = n1.forward(data=x[7:8], blobs=["prob"])["prob"][0]
    np.testing.assert_array_equal(o1b, o10["prob"][7])


def test_choices_do_not_depend_on_the_batch(deterministic):
    class Dev:
        is_cpu, is_gpu, compute_units, local_mem = True, False, 2, 1 << 19
    dev = Dev()
    g = conv_ops.ConvGeometry(1, 256, 13, 13, 384, 3, 3, 1, 1, 1, 1, 1, 1, 1)
    algos = {conv_ops.algorithm(dev, dataclasses.replace(g, num=n), None, "forward")
             for n in (1, 2, 10, 64, 256)}
    assert len(algos) == 1
    # fully-connected layers: the same K panel and no small-M kernel / K split
    assert gemm_ops.cpu_panels(dev, 1, 4096) == gemm_ops.cpu_panels(dev, 64, 4096)
    gpu = Dev()
    gpu.is_cpu, gpu.is_gpu, gpu.is_nvidia, gpu.compute_units = False, True, True, 132
    gpu.local_mem = 48 << 10
    assert gemm_ops.gpu_tiles(gpu, 1, 9216) == gemm_ops.gpu_tiles(gpu, 256, 9216)


def test_default_is_the_fast_choice():
    assert config.get("DETERMINISTIC") is False
    caffe.set_deterministic(True)
    try:
        assert config.get("DETERMINISTIC") is True
    finally:
        caffe.set_deterministic(False)
        config.set("DETERMINISTIC", None)


def test_environment_variable(monkeypatch):
    monkeypatch.setenv("CAFFE_OCL_DETERMINISTIC", "1")
    assert gemm_ops.deterministic()
    monkeypatch.setenv("CAFFE_OCL_DETERMINISTIC", "0")
    assert not gemm_ops.deterministic()


def test_fully_connected_gemm_choice(deterministic, monkeypatch):
    from caffe_ocl.device import get_device
    dev = get_device()
    used = []
    monkeypatch.setattr(gemm_splitk, "small_m", lambda *a, **k: used.append("small_m"))
    a, b, c = dev.alloc(4 * 64), dev.alloc(4 * 64 * 16), dev.alloc(4 * 16)
    launches = gemm_splitk.gemm_launches(dev, 1, 16, 64, a, b, c, trans_b=True)
    assert not used and len(launches) == 1          # one plain GEMM, no split
    config.set("DETERMINISTIC", False)
    gemm_splitk.gemm_launches(dev, 1, 16, 64, a, b, c, trans_b=True)
    assert used == (["small_m"] if dev.is_cpu else [])
