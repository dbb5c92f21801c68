"""Seeded mutation fuzzing of the input formats fuzzing.py does not cover:
ONNX models given to onnx2caffe, HDF5 weights (``*.caffemodel.h5``), HDF5
solver states, HDF5Data source lists and their files, images given to
classify/ImageData, and mean files given to classify (``--mean_file``) or a
transform_param. Same contract as fuzzing.py: each case either works or
ends in a CaffeOclError of one line naming the file; anything else is a
finding. ``python fuzzing_more.py FORMAT FIRST COUNT DIR`` runs cases in a
child and prints one JSON line per case.
"""
import os
import random
import shutil
import sys
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fuzzing  # noqa: E402

FORMATS = ("onnx", "h5weights", "h5state", "h5data", "image", "meanfile")

DEPLOY = """name: "fm"
layer { name: "data" type: "Input" top: "data"
  input_param { shape { dim: 1 dim: 3 dim: 8 dim: 8 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1
    weight_filler { type: "xavier" } bias_filler { type: "constant" value: 0.1 } } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv"
  batch_norm_param { use_global_stats: true } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool"
  pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
"""

H5_NET = """name: "fmh"
layer { name: "data" type: "HDF5Data" top: "data" top: "label"
  hdf5_data_param { source: "{src}" batch_size: 3 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "label" top: "loss" }
"""

TRAIN_H5 = """name: "fmt"
layer { name: "data" type: "DummyData" top: "data"
  dummy_data_param { shape { dim: 2 dim: 3 } data_filler { type: "gaussian" } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "Reduction" bottom: "ip" top: "loss" loss_weight: 1 }
"""

SOLVER_H5 = """net: "{net}"
type: "Adam" base_lr: 0.01 momentum: 0.9 momentum2: 0.999 lr_policy: "fixed"
max_iter: 1 snapshot_format: HDF5 snapshot_prefix: "{prefix}" random_seed: 1
"""


def _pj(base, name):
    return os.path.join(base, name)


def make_base(base):
    """Valid files of each format in ``base`` (idempotent)."""
    stamp = _pj(base, "ready")
    if os.path.exists(stamp):
        return
    import cv2
    import h5py
    import caffe_ocl as caffe
    from caffe_ocl.onnx.from_caffe import export
    from caffe_ocl.proto import array_to_blobproto, write_binary
    os.makedirs(base, exist_ok=True)
    open(_pj(base, "deploy.prototxt"), "w").write(DEPLOY)
    caffe.set_random_seed(1)
    net = caffe.Net(_pj(base, "deploy.prototxt"), caffe.TEST)
    net.save(_pj(base, "deploy.caffemodel"))
    net.save_hdf5(_pj(base, "deploy.caffemodel.h5"))
    model = export(_pj(base, "deploy.prototxt"), _pj(base, "deploy.caffemodel"))
    open(_pj(base, "model.onnx"), "wb").write(model.SerializeToString())
    # HDF5 solver state (Adam: two history blobs per param)
    open(_pj(base, "train.prototxt"), "w").write(TRAIN_H5)
    open(_pj(base, "solver.prototxt"), "w").write(
        SOLVER_H5.format(net=_pj(base, "train.prototxt"), prefix=_pj(base, "snap")))
    solver = caffe.get_solver(_pj(base, "solver.prototxt"))
    solver.step(1)
    solver.snapshot()
    # HDF5Data files and list
    rs = np.random.RandomState(0)
    for i in range(2):
        with h5py.File(_pj(base, f"d{i}.h5"), "w") as f:
            f["data"] = rs.randn(5, 3).astype(np.float32)
            f["label"] = rs.randn(5, 2).astype(np.float32)
    open(_pj(base, "h5list.txt"), "w").write(f"{_pj(base, 'd0.h5')}\n{_pj(base, 'd1.h5')}\n")
    # images
    img = rs.randint(0, 255, (8, 8, 3)).astype(np.uint8)
    cv2.imwrite(_pj(base, "img.png"), img)
    cv2.imwrite(_pj(base, "img.jpg"), img)
    cv2.imwrite(_pj(base, "img.bmp"), img)
    write_binary(array_to_blobproto(np.full((1, 3, 8, 8), 100, np.float32)),
                 _pj(base, "mean.binaryproto"))
    np.save(_pj(base, "mean.npy"), np.full((3, 8, 8), 100, np.float32))
    open(stamp, "w").close()


class Finding(Exception):
    pass


# --------------------------------------------------------------------------
# structured mutations


def _mutate_onnx(base, work, r):
    import onnx
    from onnx import helper, numpy_helper
    src = _pj(base, "model.onnx")
    out = _pj(work, "model.onnx")
    if r.random() < 0.4:
        open(out, "wb").write(fuzzing.mutate_bytes(open(src, "rb").read(), r))
        return out
    m = onnx.load(src)
    g = m.graph
    k = r.choice(["dim", "negdim", "zerodim", "unknown_op", "cycle", "drop_init",
                  "external", "opset", "attr", "init_shape", "dup_out", "dangling",
                  "empty", "dtype", "huge_init", "rename_input"])
    if k in ("dim", "negdim", "zerodim"):
        d = r.choice(g.input[0].type.tensor_type.shape.dim)
        d.dim_value = {"dim": r.choice([2**31, 2**40, 2**62, 100000]),
                       "negdim": r.choice([-1, -2**31, -2**62]), "zerodim": 0}[k]
    elif k == "unknown_op":
        n = r.choice(g.node)
        n.op_type = r.choice(["NoSuchOp", "Loop", "If", "Scan", "NonMaxSuppression", ""])
        if r.random() < 0.5:
            n.domain = r.choice(["com.evil", "ai.onnx.ml"])
    elif k == "cycle":
        nodes = list(g.node)
        i = r.randrange(len(nodes))
        j = r.randrange(len(nodes))
        nodes[i].input[0] = nodes[j].output[0]     # a later node's output: a cycle
    elif k == "drop_init" and len(g.initializer):
        del g.initializer[r.randrange(len(g.initializer))]
    elif k == "external" and len(g.initializer):
        t = r.choice(g.initializer)
        loc = r.choice(["/dev/zero", "../../../../etc/passwd", "/etc/shadow", "missing.bin",
                        "/proc/self/mem", work, "/dev/urandom"])
        t.ClearField("raw_data")
        del t.float_data[:]
        t.data_location = onnx.TensorProto.EXTERNAL
        del t.external_data[:]
        for key, val in [("location", loc), ("offset", str(r.choice([0, 2**40, -5]))),
                         ("length", str(r.choice([16, 2**40, -1])))][:r.randint(1, 3)]:
            e = t.external_data.add()
            e.key, e.value = key, val
    elif k == "opset":
        m.opset_import[0].version = r.choice([0, 1, 6, 7, 99, 2**31 - 1, -1])
    elif k == "attr":
        n = r.choice([n for n in g.node if len(n.attribute)] or list(g.node))
        if len(n.attribute):
            a = r.choice(n.attribute)
            if len(a.ints):
                a.ints[r.randrange(len(a.ints))] = r.choice([0, -1, 2**31, 2**62, -2**62])
            elif a.type == onnx.AttributeProto.INT:
                a.i = r.choice([0, -1, 2**31, 2**62, -2**62])
            elif a.type == onnx.AttributeProto.FLOAT:
                a.f = r.choice([float("nan"), float("inf"), -1.0, 0.0, 1e38])
            else:
                a.type = onnx.AttributeProto.STRING
                a.s = b"\xff\x00"
        else:
            n.attribute.append(helper.make_attribute("axis", r.choice([2**40, -99])))
    elif k == "init_shape" and len(g.initializer):
        t = r.choice(g.initializer)
        arr = numpy_helper.to_array(t)
        arr = arr.reshape(-1)[: max(0, arr.size - r.randint(0, 3))] if r.random() < 0.5 \
            else np.concatenate([arr.reshape(-1), arr.reshape(-1)[:1]])
        t.CopyFrom(numpy_helper.from_array(arr.astype(np.float32), t.name))
    elif k == "dup_out":
        n = r.choice(g.node)
        g.node[r.randrange(len(g.node))].output[0] = n.output[0]
    elif k == "dangling":
        n = r.choice(g.node)
        n.input.append("no_such_tensor")
        if r.random() < 0.5:
            n.input[0] = "undefined_" + n.input[0]
    elif k == "empty":
        del g.node[:]
    elif k == "dtype":
        tt = g.input[0].type.tensor_type
        tt.elem_type = r.choice([0, onnx.TensorProto.STRING, onnx.TensorProto.INT8,
                                 onnx.TensorProto.DOUBLE, 99])
    elif k == "huge_init" and len(g.initializer):
        t = r.choice(g.initializer)
        del t.dims[:]
        t.dims.extend([2**20, 2**20] if r.random() < 0.5 else [2**62, 4])
    elif k == "rename_input":
        g.input[0].name = r.choice(["", "x" * 100000, "a\x00b"])
    open(out, "wb").write(m.SerializeToString())
    return out


def _copy_h5(src, dst, edit):
    """Copy an HDF5 file dataset by dataset, applying ``edit(path, array)``
    -> array | None (drop) | ("group",) (replace with an empty group)."""
    import h5py

    def walk(gi, go, prefix):
        for name, obj in gi.items():
            path = f"{prefix}{name}"
            if isinstance(obj, h5py.Group):
                walk(obj, go.require_group(name), path + "/")
            else:
                val = edit(path, obj[()])
                if val is None:
                    continue
                if isinstance(val, tuple) and val and val[0] == "group":
                    go.create_group(name)
                elif isinstance(val, tuple) and val and val[0] == "huge":
                    go.create_dataset(name, shape=val[1], dtype="f4")   # never written
                else:
                    go[name] = val
    with h5py.File(src, "r") as fi, h5py.File(dst, "w") as fo:
        walk(fi, fo, "")


def _h5_edit(r, paths):
    """A structural edit of one dataset of an HDF5 file."""
    target = r.choice(paths)
    k = r.choice(["dtype_str", "dtype_int", "rank", "drop", "group", "huge", "nan", "empty",
                  "scalar", "bytes", "compound", "transpose", "extra"])

    def edit(path, arr):
        if path != target:
            return arr
        a = np.asarray(arr)
        if k == "dtype_str":
            return np.array([b"abc"] * max(1, a.size), dtype="S3")
        if k == "dtype_int":
            if a.dtype.kind not in "fiub":       # a string (learned_net): a number
                return np.int64(7)
            return a.astype(np.int64) if a.dtype.kind == "f" else a.astype(np.float32)
        if k == "rank":
            return a.reshape((1,) * r.randint(1, 6) + a.shape) if r.random() < 0.5 \
                else a.reshape(-1)
        if k == "drop":
            return None
        if k == "group":
            return ("group",)
        if k == "huge":
            return ("huge", r.choice([(2**31, 4), (2**20, 2**20), (10**9,),
                                      (2**40,), (1, 2**35)]))
        if k == "nan":
            return np.full_like(a, np.nan) if a.dtype.kind == "f" else a
        if k == "empty":
            return np.zeros((0,) + a.shape[1:], a.dtype) if a.ndim else np.zeros(0)
        if k == "scalar":
            return np.float32(1.5)
        if k == "bytes":
            return np.array(b"\xff\xfe\x00z", dtype="S4")
        if k == "compound":
            return np.zeros(max(1, a.size), dtype=[("x", "f4"), ("y", "i4")])
        if k == "transpose":
            return a.T.copy() if a.ndim > 1 else np.concatenate([a.reshape(-1), [1]])
        return np.concatenate([a.reshape(-1), a.reshape(-1)]).astype(a.dtype) \
            if a.ndim else a
    return edit


def _h5_paths(path):
    import h5py
    out = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.append(n) if isinstance(o, h5py.Dataset) else None)
    return out


def _mutate_h5(src, dst, r):
    if r.random() < 0.35:
        open(dst, "wb").write(fuzzing.mutate_bytes(open(src, "rb").read(), r))
    else:
        _copy_h5(src, dst, _h5_edit(r, _h5_paths(src)))
    return dst


# --------------------------------------------------------------------------
# one case

_cache = {}


def _net(base):
    import caffe_ocl as caffe
    if "net" not in _cache:
        _cache["net"] = caffe.Net(_pj(base, "deploy.prototxt"), caffe.TEST)
    return _cache["net"]


def _solver(base):
    import caffe_ocl as caffe
    if "solver" not in _cache:
        _cache["solver"] = caffe.get_solver(_pj(base, "solver.prototxt"))
    return _cache["solver"]


def _image(base, work, r):
    """A damaged or unusual image file, or a special file in its place."""
    import cv2
    k = r.choice(["mutate", "mutate", "mutate", "truncate", "empty", "huge_png",
                  "huge_bmp", "16bit", "4ch", "gray", "text", "dir", "fifo", "dev",
                  "tiny", "1x1"])
    ext = r.choice(["png", "jpg", "bmp"])
    out = _pj(work, f"x.{ext}")
    good = open(_pj(base, f"img.{ext}"), "rb").read()
    if k == "mutate":
        open(out, "wb").write(fuzzing.mutate_bytes(good, r))
    elif k == "truncate":
        open(out, "wb").write(good[:r.randrange(len(good))])
    elif k == "empty":
        open(out, "wb").close()
    elif k == "huge_png":
        png = open(_pj(base, "img.png"), "rb").read()
        hdr = bytearray(png)
        w, h = r.choice([(60000, 60000), (2**31 - 1, 1), (1, 2**31 - 1), (0, 5), (100000, 100000)])
        hdr[16:20], hdr[20:24] = w.to_bytes(4, "big"), h.to_bytes(4, "big")
        out = _pj(work, "x.png")
        open(out, "wb").write(bytes(hdr))
    elif k == "huge_bmp":
        bmp = bytearray(open(_pj(base, "img.bmp"), "rb").read())
        w, h = r.choice([(60000, 60000), (2**31 - 1, 1), (1, -(2**31)), (-5, 5)])
        bmp[18:22] = w.to_bytes(4, "little", signed=True)
        bmp[22:26] = h.to_bytes(4, "little", signed=True)
        out = _pj(work, "x.bmp")
        open(out, "wb").write(bytes(bmp))
    elif k == "16bit":
        out = _pj(work, "x.png")
        cv2.imwrite(out, np.full((5, 7, 3), 40000, np.uint16))
    elif k == "4ch":
        out = _pj(work, "x.png")
        cv2.imwrite(out, np.full((5, 7, 4), 200, np.uint8))
    elif k == "gray":
        out = _pj(work, "x.png")
        cv2.imwrite(out, np.full((5, 7), 9, np.uint8))
    elif k == "text":
        open(out, "w").write("this is not an image\n")
    elif k == "dir":
        os.makedirs(out)
    elif k == "fifo":
        os.mkfifo(out)
    elif k == "dev":
        out = r.choice(["/dev/zero", "/dev/null", "/dev/urandom"])
    elif k == "tiny":
        out = _pj(work, "x.png")
        cv2.imwrite(out, np.full((1, 1, 3), 9, np.uint8))
    else:
        out = _pj(work, "x.png")
        cv2.imwrite(out, np.full((1, 300, 3), 9, np.uint8))
    return out


def _meanfile(base, work, r):
    from caffe_ocl.proto import array_to_blobproto, write_binary
    k = r.choice(["mutate", "mutate", "shape", "channels", "nan", "npy", "npy_mutate",
                  "npy_object", "npy_shape"])
    if k == "mutate":
        out = _pj(work, "mean.binaryproto")
        open(out, "wb").write(fuzzing.mutate_bytes(
            open(_pj(base, "mean.binaryproto"), "rb").read(), r))
    elif k in ("shape", "channels", "nan"):
        shape = {"shape": r.choice([(1, 3, 4, 4), (1, 3, 8), (3,), (2, 3, 8, 8), (1, 3, 1, 1),
                                    (1, 3, 9, 8), (1, 1, 1, 1, 1)]),
                 "channels": (1, r.choice([1, 2, 4, 0]), 8, 8),
                 "nan": (1, 3, 8, 8)}[k]
        a = np.full(shape, np.nan if k == "nan" else 3, np.float32)
        out = _pj(work, "mean.binaryproto")
        write_binary(array_to_blobproto(a), out)
    else:
        out = _pj(work, "mean.npy")
        if k == "npy":
            np.save(out, np.full(r.choice([(3, 8, 8), (1, 3, 8, 8), (4, 8, 8), (3,), (8, 8, 3),
                                           (3, 2, 2), ()]), 5,
                                 r.choice([np.float32, np.float64, np.uint8, np.int64])))
        elif k == "npy_mutate":
            open(out, "wb").write(fuzzing.mutate_bytes(open(_pj(base, "mean.npy"), "rb").read(),
                                                       r))
        elif k == "npy_object":
            np.save(out, np.array([{"a": 1}], dtype=object), allow_pickle=True)
        else:    # a header claiming a huge shape
            data = bytearray(open(_pj(base, "mean.npy"), "rb").read())
            txt = data.replace(b"(3, 8, 8)", r.choice([b"(3, 80000, 80000)", b"(-3, 8, 8)",
                                                       b"(3, 8, 8, 2**62)"]))
            open(out, "wb").write(bytes(txt))
    return out


def run_case(fmt, seed, base, work):
    """Run one case; returns ("ok"|"error", message). Raises Finding."""
    import caffe_ocl as caffe
    from caffe_ocl.errors import CaffeOclError
    r = random.Random(f"more:{fmt}:{seed}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    target = None
    names = set()
    try:
        if fmt == "onnx":
            from caffe_ocl.onnx.to_caffe import onnx2caffe
            target = _mutate_onnx(base, work, r)
            onnx2caffe(target, _pj(work, "o.prototxt"), _pj(work, "o.caffemodel"))
            net = caffe.Net(_pj(work, "o.prototxt"), _pj(work, "o.caffemodel"), caffe.TEST)
            net.forward()
            names = {"o.prototxt", "o.caffemodel"}
        elif fmt == "h5weights":
            target = _mutate_h5(_pj(base, "deploy.caffemodel.h5"),
                                _pj(work, "w.caffemodel.h5"), r)
            _net(base).copy_from(target)
        elif fmt == "h5state":
            target = _pj(work, "s.solverstate.h5")
            learned = _pj(work, "snap_iter_1.caffemodel.h5")
            which = r.random()
            if which < 0.6:
                _mutate_h5(_pj(base, "snap_iter_1.solverstate.h5"), target, r)
                shutil.copy(_pj(base, "snap_iter_1.caffemodel.h5"), learned)
            else:
                shutil.copy(_pj(base, "snap_iter_1.solverstate.h5"), target)
                _mutate_h5(_pj(base, "snap_iter_1.caffemodel.h5"), learned, r)
            names = {"snap_iter_1.caffemodel.h5"}
            _solver(base).restore(target)
        elif fmt == "h5data":
            lst = _pj(work, "list.txt")
            files = [_pj(base, "d0.h5"), _pj(work, "d1.h5")]
            k = r.random()
            if k < 0.7:
                _mutate_h5(_pj(base, "d1.h5"), files[1], r)
            elif k < 0.8:
                files[1] = r.choice(["/dev/zero", work, _pj(work, "missing.h5"), "",
                                     _pj(base, "deploy.prototxt")])
                if files[1] == "":
                    files = [files[0], "   "]
            else:
                os.mkfifo(files[1])
            text = "\n".join(files) + "\n"
            if r.random() < 0.2:
                open(lst, "wb").write(fuzzing.mutate_bytes(text.encode(), r, text=True))
            else:
                open(lst, "w").write(text)
            target = lst
            # a mutated list names files that do not exist: the layer is named
            names = {"d1.h5", "d0.h5", os.path.basename(files[1]) or "list.txt", "'data'"}
            net_path = _pj(work, "h5.prototxt")
            open(net_path, "w").write(H5_NET.replace("{src}", lst))
            net = caffe.Net(net_path, caffe.TRAIN)
            for _ in range(5):        # past the end of the first file into the second
                net.forward()
        elif fmt == "image":
            from caffe_ocl.classify import classify
            target = _image(base, work, r)
            classify(_pj(base, "deploy.prototxt"), _pj(base, "deploy.caffemodel"), [target])
        elif fmt == "meanfile":
            from caffe_ocl.classify import classify
            from caffe_ocl.classify import load_mean
            target = _meanfile(base, work, r)
            mean = load_mean(target)
            classify(_pj(base, "deploy.prototxt"), _pj(base, "deploy.caffemodel"),
                     [_pj(base, "img.png")], mean=mean, mean_source=target)
        else:
            raise ValueError(fmt)
        return "ok", ""
    except CaffeOclError as e:
        msg = str(e)
        if "\n" in msg.strip():
            raise Finding(f"multi-line message: {msg!r}")
        names |= {os.path.basename(target), os.path.basename(os.path.dirname(target)), target}
        if not any(n and n in msg for n in names):
            raise Finding(f"message does not name the file: {msg!r}")
        return "error", msg
    except Finding:
        raise
    except Exception as e:  # noqa: BLE001 - that is the finding
        tb = traceback.extract_tb(e.__traceback__)[-1]
        raise Finding(f"{type(e).__name__}: {str(e)[:200]!r} at "
                      f"{os.path.basename(tb.filename)}:{tb.lineno}") from None


def main(argv):
    return fuzzing.main(argv, run_case, make_base, Finding)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
