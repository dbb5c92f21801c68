"""Data-pipeline throughput: images per second delivered by the Data layer
(LMDB read + decode + transform in the prefetch thread + upload), for
encoded 256x256 JPEG records cropped to 227 (CaffeNet-style, mirror on) and
for raw MNIST records (scale 1/256), beside the training iteration rate of
CaffeNet and LeNet on the same device. If the data rate exceeds the
training rate in images/s, the device never waits for decoding.

    python benchmarks/bench_data.py [--records 256] [--batches 30]
"""
import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import caffe_ocl  # noqa: E402
from caffe_ocl.data.paths import mnist_dir  # noqa: E402
from caffe_ocl.data.tools import convert_imageset, read_idx, write_mnist_lmdb  # noqa: E402
from caffe_ocl.proto import caffe_pb2  # noqa: E402
from caffe_ocl.solvers import SGDSolver  # noqa: E402
from common import fill_inputs, solver_for, timed, with_inputs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_jpeg_db(tmp, n):
    import cv2
    rng = np.random.default_rng(0)
    img_dir = os.path.join(tmp, "img")
    os.makedirs(img_dir)
    with open(os.path.join(tmp, "list.txt"), "w") as f:
        for i in range(n):
            # smooth random images compress like photos, not like noise
            small = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
            img = cv2.resize(small, (256, 256), interpolation=cv2.INTER_CUBIC)
            img = np.clip(img.astype(int) + rng.integers(-20, 20, img.shape), 0, 255).astype(np.uint8)
            name = f"{i:05d}.jpg"
            cv2.imwrite(os.path.join(img_dir, name), img)
            f.write(f"{name} {i % 1000}\n")
    db = os.path.join(tmp, "jpeg_lmdb")
    convert_imageset(img_dir + "/", os.path.join(tmp, "list.txt"), db, encoded=True,
                     encode_type="jpg", progress=False)
    return db


def make_mnist_db(tmp):
    images, labels = read_idx(os.path.join(mnist_dir(), "t10k-images-idx3-ubyte.gz"),
                              os.path.join(mnist_dir(), "t10k-labels-idx1-ubyte.gz"))
    db = os.path.join(tmp, "mnist_lmdb")
    write_mnist_lmdb(images[:4000], labels[:4000], db, progress=False)
    return db


def data_net(source, batch, transform):
    net = caffe_pb2.NetParameter()
    lp = net.layer.add()
    lp.name, lp.type = "data", "Data"
    lp.top.extend(["data", "label"])
    lp.data_param.source = source
    lp.data_param.batch_size = batch
    lp.data_param.backend = caffe_pb2.DataParameter.LMDB
    for k, v in transform.items():
        setattr(lp.transform_param, k, v)
    return caffe_ocl.Net(net, caffe_ocl.TRAIN)


def images_per_second(net, batch, batches):
    dev = net.device
    net.forward()                      # starts the prefetch threads
    dev.finish()
    t0 = time.perf_counter()
    for _ in range(batches):
        net.forward()
    dev.finish()
    return batch * batches / (time.perf_counter() - t0)


def train_rate(proto, batch, shape, iters):
    param = with_inputs(os.path.join(ROOT, proto), batch, shape)
    solver = SGDSolver(solver_for(param))
    fill_inputs(solver.net, 10)
    ms = timed(lambda: solver.step(1), solver.net.device.finish, warmup=2, runs=iters)
    return batch * 1000.0 / ms, ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=256)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--train-iters", type=int, default=3)
    a = ap.parse_args()
    dev = caffe_ocl.get_device()
    print(f"device: {dev.name} ({dev.info['platform_name']}); {os.cpu_count()} CPU cores; "
          f"{time.strftime('%Y-%m-%d')}\n")
    with tempfile.TemporaryDirectory() as tmp:
        jpeg = make_jpeg_db(tmp, a.records)
        mnist = make_mnist_db(tmp)
        rows = []
        net = data_net(jpeg, 32, dict(crop_size=227, mirror=True))
        rows.append(("JPEG 256x256 -> crop 227 + mirror", 32,
                     images_per_second(net, 32, a.batches)))
        del net
        net = data_net(mnist, 64, dict(scale=0.00390625))
        rows.append(("raw MNIST 28x28, scale 1/256", 64, images_per_second(net, 64, a.batches * 4)))
        del net
    caffenet = train_rate("models/alexnet/train.prototxt", 16, (3, 224, 224), a.train_iters)
    lenet = train_rate("models/lenet/lenet_train_test.prototxt", 64, (1, 28, 28),
                       a.train_iters * 5)
    print("| pipeline | batch | images/s delivered by the Data layer |")
    print("|---|---|---|")
    for name, b, ips in rows:
        print(f"| {name} | {b} | {ips:.0f} |")
    print("\n| training (Input-fed, same device) | batch | images/s | ms/iter |")
    print("|---|---|---|---|")
    print(f"| AlexNet/CaffeNet 224 | 16 | {caffenet[0]:.1f} | {caffenet[1]:.0f} |")
    print(f"| LeNet | 64 | {lenet[0]:.0f} | {lenet[1]:.1f} |")


if __name__ == "__main__":
    main()
