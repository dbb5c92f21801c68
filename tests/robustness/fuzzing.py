"""Seeded mutation fuzzing of every input format caffe_ocl reads.

A *case* is (format, seed): the seed picks the mutation(s) applied to a
valid file of that format (bit flips, truncation, byte insertions, NUL
bytes, duplicated fields/lines, numbers replaced by huge, negative or
boundary values). ``run_case`` writes the mutated file into a folder and
feeds it through the same entry point the commands use (net building,
weights loading, mean loading, solver construction and restore, LMDB
reading, image lists). The verdict is "ok" (it worked) or "error" (a
CaffeOclError whose message is one line naming the file); anything else
(another exception, a multi-line message, a message without the file) is
a finding. ``python fuzzing.py FORMAT FIRST COUNT DIR`` runs cases in a
child process (used for LMDB and the command-level sample) and prints one
JSON line per case.
"""
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
import traceback

import numpy as np

BOUNDARY = [0, -1, 1, 2147483647, 2147483648, -2147483648, 4294967295, 4294967296,
            2 ** 62, 2 ** 62 + 1, -(2 ** 62), 2 ** 63 - 1, 9999999999999999999999,
            "1e40", "-1e40", "nan", "inf", "-inf", "1e-45", "0.5"]

NET = """name: "fz"
layer { name: "data" type: "Input" top: "data"
  input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 stride: 1 pad: 1 group: 1
    weight_filler { type: "xavier" } bias_filler { type: "constant" value: 0.1 } } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv"
  batch_norm_param { use_global_stats: true eps: 0.001 } }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 pad: 0 } }
layer { name: "relu" type: "ReLU" bottom: "pool" top: "pool" relu_param { negative_slope: 0 } }
layer { name: "lrn" type: "LRN" bottom: "pool" top: "lrn" lrn_param { local_size: 3 alpha: 0.0001 beta: 0.75 } }
layer { name: "slice" type: "Slice" bottom: "lrn" top: "s1" top: "s2" slice_param { axis: 1 slice_point: 2 } }
layer { name: "cat" type: "Concat" bottom: "s2" bottom: "s1" top: "cat" concat_param { axis: 1 } }
layer { name: "elt" type: "Eltwise" bottom: "cat" bottom: "lrn" top: "elt" eltwise_param { operation: SUM } }
layer { name: "tile" type: "Tile" bottom: "elt" top: "tile" tile_param { axis: 1 tiles: 2 } }
layer { name: "resh" type: "Reshape" bottom: "tile" top: "resh" reshape_param { shape { dim: 0 dim: -1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "resh" top: "ip"
  inner_product_param { num_output: 5 weight_filler { type: "msra" variance_norm: AVERAGE }
    bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" softmax_param { axis: 1 } }
"""

TRAIN_NET = """name: "fzt"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 4 dim: 3 dim: 6 dim: 6 } shape { dim: 4 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 2 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""

SOLVER = """net: "{net}"
type: "SGD"
base_lr: 0.01
momentum: 0.9
weight_decay: 0.0005
lr_policy: "step"
gamma: 0.5
stepsize: 2
display: 1
average_loss: 2
max_iter: 2
iter_size: 1
snapshot: 0
snapshot_prefix: "{prefix}"
random_seed: 3
test_iter: 1
test_interval: 100
test_initialization: false
"""

DATA_NET = """name: "fzd"
layer { name: "data" type: "Data" top: "data" top: "label"
  data_param { source: "{db}" backend: LMDB batch_size: 3 prefetch: 2 }
  transform_param { scale: 0.00390625 } }
"""

IMAGE_NET = """name: "fzi"
layer { name: "data" type: "ImageData" top: "data" top: "label"
  image_data_param { source: "{src}" batch_size: 2 new_height: 6 new_width: 6 } }
"""

FORMATS = ("prototxt", "solver", "caffemodel", "caffemodel_v1", "binaryproto",
           "solverstate", "lmdb", "imagelist")


# --------------------------------------------------------------------------
# mutations

_NUM = re.compile(rb"(?<![\w.])-?\d+(\.\d+)?(e-?\d+)?(?![\w.])")


def mutate_bytes(data, r, text=False):
    """One to three random edits of ``data``; which ones depends on ``r``."""
    data = bytearray(data)
    for _ in range(r.choice((1, 1, 1, 2, 3))):
        kinds = ["flip", "truncate", "insert", "nul", "delete", "dup", "zero"]
        if text:
            kinds += ["number", "number", "number", "dupline", "dupline", "negate"]
        k = r.choice(kinds)
        n = len(data)
        if k == "flip" and n:
            for _ in range(r.randint(1, 8)):
                i = r.randrange(n)
                data[i] ^= 1 << r.randrange(8)
        elif k == "truncate" and n:
            del data[r.randrange(n):]
        elif k == "insert":
            i = r.randint(0, n)
            data[i:i] = bytes(r.randrange(256) for _ in range(r.randint(1, 16)))
        elif k == "nul":
            i = r.randint(0, n)
            data[i:i] = b"\0"
        elif k == "delete" and n:
            i = r.randrange(n)
            del data[i:i + r.randint(1, 32)]
        elif k == "dup" and n:
            i = r.randrange(n)
            j = min(n, i + r.randint(1, 64))
            data[j:j] = data[i:j]
        elif k == "zero" and n:
            i = r.randrange(n)
            j = min(n, i + r.randint(1, 4096))
            data[i:j] = bytes(j - i)
        elif k == "number":
            nums = list(_NUM.finditer(bytes(data)))
            if nums:
                m = r.choice(nums)
                v = str(r.choice(BOUNDARY)).encode()
                data[m.start():m.end()] = v
        elif k == "negate":
            nums = list(_NUM.finditer(bytes(data)))
            if nums:
                m = r.choice(nums)
                data[m.start():m.start()] = b"-"
        elif k == "dupline":
            lines = bytes(data).split(b"\n")
            i = r.randrange(len(lines))
            lines.insert(i, lines[i])
            data = bytearray(b"\n".join(lines))
    return bytes(data)


# --------------------------------------------------------------------------
# valid inputs (built once per folder)

def _pb():
    from caffe_ocl.proto import caffe_pb2
    return caffe_pb2


def make_base(base):
    """Write a valid file of each format into ``base`` (idempotent)."""
    stamp = os.path.join(base, "ready")
    if os.path.exists(stamp):
        return
    import caffe_ocl as caffe
    from caffe_ocl.data.datum import array_to_datum
    from caffe_ocl.data.db import LMDBWriter
    from caffe_ocl.proto import array_to_blobproto, write_binary
    os.makedirs(base, exist_ok=True)
    pj = lambda n: os.path.join(base, n)   # noqa: E731
    with open(pj("net.prototxt"), "w") as f:
        f.write(NET)
    with open(pj("train.prototxt"), "w") as f:
        f.write(TRAIN_NET)
    with open(pj("solver.prototxt"), "w") as f:
        f.write(SOLVER.format(net=pj("train.prototxt"), prefix=pj("snap")))
    caffe.set_random_seed(1)
    net = caffe.Net(pj("net.prototxt"), caffe.TEST)
    net.save(pj("net.caffemodel"))
    # the same weights as a V1 (``layers``) caffemodel with legacy 4-D blobs
    new = _pb().NetParameter()
    new.ParseFromString(open(pj("net.caffemodel"), "rb").read())
    v1 = _pb().NetParameter()
    v1.name = "fz"
    types = {"Convolution": "CONVOLUTION", "InnerProduct": "INNER_PRODUCT"}
    for lp in new.layer:
        if lp.type not in types:
            continue
        l1 = v1.layers.add()
        l1.name = lp.name
        l1.type = _pb().V1LayerParameter.LayerType.Value(types[lp.type])
        for b in lp.blobs:
            dims = [1] * (4 - len(b.shape.dim)) + list(b.shape.dim)
            bp = l1.blobs.add()
            bp.num, bp.channels, bp.height, bp.width = dims
            bp.data.extend(b.data)
    write_binary(v1, pj("net_v1.caffemodel"))
    write_binary(array_to_blobproto(np.arange(1 * 3 * 8 * 8, dtype=np.float32)
                                    .reshape(1, 3, 8, 8) / 7), pj("mean.binaryproto"))
    solver = caffe.get_solver(pj("solver.prototxt"))
    solver.step(1)
    state = solver.snapshot()
    os.replace(state, pj("snap.solverstate"))
    rs = np.random.RandomState(0)
    with LMDBWriter(pj("db")) as w:
        import cv2
        for i in range(120):   # a branch page, leaves and (every 8th) overflow records
            img = rs.randint(0, 255, (3, 40, 40)).astype(np.uint8)
            if i % 8 == 0:
                d = array_to_datum(img, i % 3)            # 4800 raw bytes: overflow pages
            else:                                         # a small PNG of one colour
                d = _pb().Datum(channels=3, height=40, width=40, label=i % 3, encoded=True)
                d.data = cv2.imencode(".png", np.full((40, 40, 3), i, np.uint8))[1].tobytes()
            w.put(f"{i:08d}", d.SerializeToString())
    for i in range(3):
        cv2.imwrite(pj(f"img{i}.png"), rs.randint(0, 255, (7, 9, 3)).astype(np.uint8))
    with open(pj("list.txt"), "w") as f:
        for i in range(3):
            f.write(f"{pj(f'img{i}.png')} {i}\n")
    open(stamp, "w").close()


# --------------------------------------------------------------------------
# one case

class Finding(Exception):
    pass


def _mutated(base, work, name, r, text):
    with open(os.path.join(base, name), "rb") as f:
        data = f.read()
    out = os.path.join(work, name)
    with open(out, "wb") as f:
        f.write(mutate_bytes(data, r, text))
    return out


def _structured_caffemodel(base, work, name, r):
    """A caffemodel with a structural change: dims set to boundary values,
    a blob's data cut, a layer renamed, blobs duplicated."""
    pb = _pb()
    m = pb.NetParameter()
    m.ParseFromString(open(os.path.join(base, name), "rb").read())
    layers = m.layers if len(m.layers) else m.layer
    cands = [lp for lp in layers if len(lp.blobs)]
    lp = r.choice(cands)
    b = r.choice(lp.blobs)
    k = r.choice(["dim", "dim", "cut", "rename", "dupblob", "legacy", "double"])
    big = [v for v in BOUNDARY if isinstance(v, int)]
    if k == "dim":
        if len(b.shape.dim):
            b.shape.dim[r.randrange(len(b.shape.dim))] = max(min(r.choice(big), 2**63 - 1), -2**63)
        else:
            setattr(b, r.choice(["num", "channels", "height", "width"]),
                    max(min(r.choice(big), 2**31 - 1), -2**31))
    elif k == "cut":
        del b.data[r.randrange(len(b.data) + 1):]
    elif k == "rename":
        lp.name = lp.name + "_x"
    elif k == "dupblob":
        lp.blobs.add().CopyFrom(b)
    elif k == "legacy":
        b.num = 1
    elif k == "double":
        b.double_data.extend(b.data)
        del b.data[:]
        b.double_data.append(1.0)
    out = os.path.join(work, name)
    open(out, "wb").write(m.SerializeToString())
    return out


def _structured_solverstate(base, work, r):
    pb = _pb()
    st = pb.SolverState()
    st.ParseFromString(open(os.path.join(base, "snap.solverstate"), "rb").read())
    k = r.choice(["iter", "step", "learned", "hist_dim", "hist_cut", "hist_drop"])
    if k == "iter":
        st.iter = r.choice([-2**31, -1, 2**31 - 1])
    elif k == "step":
        st.current_step = r.choice([-2**31, -1, 2**31 - 1])
    elif k == "learned":
        st.learned_net = r.choice([os.path.join(base, "net_v1.caffemodel"),
                                   os.path.join(base, "net.caffemodel"),
                                   "/dev/zero", "/dev/null", base, "",
                                   os.path.join(base, "solver.prototxt"),
                                   os.path.join(base, "mean.binaryproto")])
    elif k == "hist_dim":
        h = r.choice(st.history)
        h.shape.dim[0] = r.choice([2**31, 2**32, 2**62, -1, 0])
    elif k == "hist_cut":
        h = r.choice(st.history)
        del h.data[r.randrange(len(h.data) + 1):]
    else:
        del st.history[r.randrange(len(st.history))]
    out = os.path.join(work, "snap.solverstate")
    open(out, "wb").write(st.SerializeToString())
    return out


def _mutate_lmdb(base, work, r):
    src = os.path.join(base, "db")
    dst = os.path.join(work, "db")
    shutil.copytree(src, dst)
    path = os.path.join(dst, "data.mdb")
    data = bytearray(open(path, "rb").read())
    k = r.choice(["flip", "truncate", "zeropage", "bytes", "lock"])
    page = 4096
    if k == "flip":
        for _ in range(r.randint(1, 16)):
            i = r.randrange(len(data))
            data[i] ^= 1 << r.randrange(8)
    elif k == "truncate":
        del data[r.randrange(len(data)):]
    elif k == "zeropage":
        p = r.randrange(len(data) // page)
        data[p * page:(p + 1) * page] = bytes(page)
    elif k == "bytes":
        data = bytearray(mutate_bytes(bytes(data), r))
    else:
        open(os.path.join(dst, "lock.mdb"), "wb").write(b"\xff" * 100)
    open(path, "wb").write(bytes(data))
    return dst


def run_case(fmt, seed, base, work):
    """Run one case; returns ("ok"|"error", message). Raises Finding."""
    import caffe_ocl as caffe
    from caffe_ocl.errors import CaffeOclError
    r = random.Random(f"{fmt}:{seed}")
    os.makedirs(work, exist_ok=True)
    target = None
    try:
        if fmt == "prototxt":
            target = _mutated(base, work, "net.prototxt", r, True)
            net = caffe.Net(target, caffe.TEST)
            net.forward()
        elif fmt == "solver":
            target = _mutated(base, work, "solver.prototxt", r, True)
            cwd = os.getcwd()
            os.chdir(work)        # a mutated relative snapshot_prefix writes here
            try:
                s = caffe.get_solver(target)
                if 0 < s.param.iter_size <= 4:
                    s.step(1)
                prefix = s.param.snapshot_prefix
                if prefix.startswith(base + os.sep) or os.sep not in prefix:
                    s.snapshot()      # never into a folder the mutation made up
            finally:
                os.chdir(cwd)
        elif fmt in ("caffemodel", "caffemodel_v1"):
            name = "net.caffemodel" if fmt == "caffemodel" else "net_v1.caffemodel"
            if r.random() < 0.5:
                target = _mutated(base, work, name, r, False)
            else:
                target = _structured_caffemodel(base, work, name, r)
            net = _cached_net(base)
            net.copy_from(target)
        elif fmt == "binaryproto":
            from caffe_ocl.data.transformer import load_mean_file
            target = _mutated(base, work, "mean.binaryproto", r, False)
            load_mean_file(target)
        elif fmt == "solverstate":
            if r.random() < 0.5:
                target = _mutated(base, work, "snap.solverstate", r, False)
            else:
                target = _structured_solverstate(base, work, r)
            s = _cached_solver(base)
            s.restore(target)
        elif fmt == "lmdb":
            target = _mutate_lmdb(base, work, r)
            from caffe_ocl.data.datum import decode_datum, parse_datum
            from caffe_ocl.data.db import LMDBReader
            with LMDBReader(target) as rd:
                gen = rd.records()
                for i in range(len(rd) + 2):
                    k, v = next(gen)
                    decode_datum(parse_datum(v, f"{target} record {k!r}"), target)
            net_path = os.path.join(work, "data.prototxt")
            open(net_path, "w").write(DATA_NET.replace("{db}", target))
            net = caffe.Net(net_path, caffe.TRAIN)
            for _ in range(3):
                net.forward()
        elif fmt == "imagelist":
            target = _mutated(base, work, "list.txt", r, True)
            net_path = os.path.join(work, "img.prototxt")
            open(net_path, "w").write(IMAGE_NET.replace("{src}", target))
            net = caffe.Net(net_path, caffe.TRAIN)
            for _ in range(3):
                net.forward()
        else:
            raise ValueError(fmt)
        return "ok", ""
    except CaffeOclError as e:
        msg = str(e)
        if "\n" in msg.strip():
            raise Finding(f"multi-line message: {msg!r}")
        names = {os.path.basename(target), os.path.basename(os.path.dirname(target))}
        if fmt in ("solver", "lmdb", "imagelist") or "learned" in msg:
            names |= {"train.prototxt", "net.prototxt", "data.prototxt", "img.prototxt",
                      "snap", "img0.png", "img1.png", "img2.png", "db"}
        if not any(n and n in msg for n in names):
            raise Finding(f"message does not name the file: {msg!r}")
        return "error", msg
    except Finding:
        raise
    except Exception as e:  # noqa: BLE001 - that is the finding
        tb = traceback.extract_tb(e.__traceback__)[-1]
        raise Finding(f"{type(e).__name__}: {str(e)[:200]!r} at "
                      f"{os.path.basename(tb.filename)}:{tb.lineno}") from None


_cache = {}


def _cached_net(base):
    import caffe_ocl as caffe
    if ("net", base) not in _cache:
        _cache[("net", base)] = caffe.Net(os.path.join(base, "net.prototxt"), caffe.TEST)
    return _cache[("net", base)]


def _cached_solver(base):
    import caffe_ocl as caffe
    if ("solver", base) not in _cache:
        _cache[("solver", base)] = caffe.get_solver(os.path.join(base, "solver.prototxt"))
    return _cache[("solver", base)]


def run_cases(fmt, seeds, base, root, budget_s=None):
    """Run cases; returns (counts, findings list of (seed, text))."""
    make_base(base)
    counts = {"ok": 0, "error": 0}
    findings = []
    t0 = time.monotonic()
    for seed in seeds:
        if budget_s is not None and time.monotonic() - t0 > budget_s:
            break
        work = os.path.join(root, f"{fmt}-{seed}")
        try:
            verdict, _ = run_case(fmt, seed, base, work)
            counts[verdict] += 1
        except Finding as f:
            findings.append((seed, str(f)))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return counts, findings


def main(argv, run_case=run_case, make_base=make_base, finding=Finding):
    """The child's side of ``run_child_cases``: ``argv`` = format, first
    seed, count, work folder; one JSON line as each case starts and one
    with its verdict. fuzzing_more.py passes its own cases."""
    fmt, first, count, root = argv[0], int(argv[1]), int(argv[2]), argv[3]
    import logging
    logging.getLogger("caffe_ocl").setLevel(logging.ERROR)
    from caffe_ocl import config
    config.set("MEMORY_LIMIT_MB", 512)
    config.set("HOST_MEMORY_LIMIT_MB", 512)
    base = os.path.join(root, "base")
    make_base(base)
    for seed in range(first, first + count):
        work = os.path.join(root, f"{fmt}-{seed}")
        print(json.dumps({"seed": seed, "start": True}), flush=True)
        try:
            verdict, msg = run_case(fmt, seed, base, work)
            out = {"seed": seed, "verdict": verdict, "msg": msg}
        except finding as f:
            out = {"seed": seed, "verdict": "finding", "msg": str(f)}
        shutil.rmtree(work, ignore_errors=True)
        print(json.dumps(out), flush=True)
    return 0


CHILD_MEMORY = 6 << 30     # RLIMIT_AS of the children (OpenCL drivers map a lot)


def limit_child():
    """preexec_fn of a fuzz child: its address space capped at CHILD_MEMORY."""
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))


def run_child_cases(script, fmt, first, count, root, timeout):
    """Run seeds ``first`` .. ``first + count`` of ``fmt`` through
    ``script``'s ``main`` in a memory-limited child; a finding, or a case the
    child did not finish (a signal, a hang past ``timeout``), fails. The
    set of the cases' verdicts."""
    from conftest import child_env     # here: this file also runs as the child
    env = child_env()
    p = subprocess.run([sys.executable, script, fmt, str(first), str(count), str(root)],
                       capture_output=True, text=True, timeout=timeout, env=env,
                       preexec_fn=limit_child)
    started, done, findings = None, {}, []
    for line in p.stdout.splitlines():
        d = json.loads(line)
        if d.get("start"):
            started = d["seed"]
        else:
            done[d["seed"]] = d
            if d["verdict"] == "finding":
                findings.append(f"seed {d['seed']}: {d['msg']}")
    if p.returncode != 0:
        findings.append(f"child died (exit {p.returncode}) in seed {started}: "
                        f"{p.stderr[-500:]}")
    assert not findings, "; ".join(findings[:5])
    assert len(done) == count
    return {d["verdict"] for d in done.values()}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
