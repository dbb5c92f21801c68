"""Does PyTorch's CUDA work in the same process slow caffe_ocl's OpenCL
forwards? (why bench_zoo.py runs PyTorch in a child process by default)

Times caffe_ocl's batch-1 forward and host enqueue of converted zoo nets
(1) before torch touches CUDA, (2) after torch only made a CUDA context,
(3) after torch ran the same nets eagerly and captured/replayed CUDA
graphs, (4) two seconds later. GPU only.

    python3 benchmarks/probe_cuda_context.py shufflenet_v2_x1_0,mobilenet_v2
"""
import os, sys, time
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..")); sys.path.insert(0, HERE)
import numpy as np
import bench_zoo
from caffe_ocl.onnx import to_caffe
import caffe_ocl
caffe_ocl.set_mode_gpu()
nets = sys.argv[1].split(",")
made = {}
for name in nets:
    model = bench_zoo.build_model(name)
    path = bench_zoo.export_onnx(model, name, 1, 224, "/tmp/zx")
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    net = bench_zoo.make_net(to_caffe.convert(path, batch=1), x, False)
    made[name] = (model, x, net)
def t(label):
    for name, (model, x, net) in made.items():
        f = bench_zoo.ours_timer(net)
        v = sorted(bench_zoo.mean_ms(f, 5, 50) for _ in range(5))[2]
        h, n = bench_zoo.host_cost(net, 20)
        print(f"{label:28s} {name:20s} forward {v:.3f} ms  enqueue {h:.3f} ms / {n}", flush=True)
t("no torch cuda")
import torch
torch.backends.cudnn.benchmark = True
torch.zeros(1).cuda(); torch.cuda.synchronize()
t("torch cuda initialised")
timers = {}
for name, (model, x, net) in made.items():
    m = model.cuda().eval(); xt = torch.from_numpy(x).cuda()
    timers[name] = (bench_zoo.torch_eager_timer(m, xt), bench_zoo.torch_graph_timer(m, xt))
    print(name, "eager", bench_zoo.mean_ms(timers[name][0], 5, 50), "graph", bench_zoo.mean_ms(timers[name][1], 5, 50))
t("after torch ran")
time.sleep(2)
t("after torch ran + 2s")
