"""pycaffe's core API (Net, Blob.reshape, Solver.step/add_callback,
set_device, MemoryData) called with wrong arguments, as a fuzz campaign
found them: each call gives pycaffe's result or one error naming what is
wrong, of the Python type pycaffe raised for the misuse."""
import numpy as np
import pytest

import caffe
from caffe_ocl.errors import (ArgumentError, ArgumentValueError, CaffeOclError,
                              FileNotFound, OutOfHostMemory, ShapeError)

LOSS = """
force_backward: true
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "t" type: "Input" top: "t" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "x" bottom: "t" top: "loss" }
"""

MEMDATA = """
layer { name: "data" type: "MemoryData" top: "data" top: "label"
  memory_data_param { batch_size: 2 channels: 1 height: 2 width: 2 } }
"""

SOLVER = """
net: "{net}"
base_lr: 0.01
lr_policy: "fixed"
max_iter: 10
display: 0
snapshot_after_train: false
"""

TRAIN_NET = """
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "x" top: "loss" }
"""


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.fixture
def loss_net(tmp_path):
    return caffe.Net(_write(tmp_path, "loss.prototxt", LOSS), caffe.TRAIN)


@pytest.fixture
def solver(tmp_path):
    net = _write(tmp_path, "train.prototxt", TRAIN_NET)
    return caffe.SGDSolver(_write(tmp_path, "solver.prototxt", SOLVER.format(net=net)))


# ---- 1. backward with the diff of a 0-d (loss) output --------------------------------
def test_backward_takes_the_diff_of_a_scalar_loss_output(loss_net):
    rng = np.random.RandomState(0)
    x, t = rng.randn(2, 3).astype(np.float32), rng.randn(2, 3).astype(np.float32)
    loss_net.forward(x=x, t=t)
    assert loss_net.blobs["loss"].data.shape == ()
    grads = loss_net.backward(loss=np.float32(2.0))         # was an IndexError
    # d(sum((x-t)^2)/(2N))/dx = (x-t)/N, times the top diff 2
    np.testing.assert_allclose(grads["x"], 2.0 * (x - t) / 2, rtol=1e-5, atol=1e-6)
    with pytest.raises(ShapeError, match="'loss'"):
        loss_net.backward(loss=np.ones(3, np.float32))
    with pytest.raises(ValueError, match="'loss'"):
        loss_net.backward(loss=np.ones(3, np.float32))


# ---- 2-4. forward_all ------------------------------------------------------------------
def test_forward_all_of_no_items_gives_empty_arrays(lin):
    out = lin.forward_all(x=np.zeros((0, 4), np.float32))
    assert out["y"].shape == (0, 2)
    out = lin.forward_all(blobs=["x"], x=np.zeros((0, 4), np.float32))
    assert out["x"].shape == (0, 4)


def test_forward_all_names_an_input_that_holds_no_items(lin):
    for bad in (None, 1.0, "abc"):
        with pytest.raises(ArgumentError, match="forward_all: input 'x'"):
            lin.forward_all(x=bad)


def test_forward_all_refuses_an_absurd_number_of_items_without_running(lin):
    # a 2^31-row view of one row: no memory of its own, but the outputs
    # would take 16 GiB a column
    x = np.lib.stride_tricks.as_strided(np.zeros(4, np.float32), (2**40, 4), (0, 4))
    ran = []

    def no_batches(layer):          # the refusal comes before any batch runs
        ran.append(layer)
        raise RuntimeError("forward_all ran a batch")
    lin.before_forward(no_batches)
    with pytest.raises(OutOfHostMemory, match="forward_all.*items"):
        lin.forward_all(x=x)
    assert not ran
    assert issubclass(OutOfHostMemory, MemoryError)


# ---- 5. forward/backward blobs=/diffs= as one string -------------------------------
def test_forward_and_backward_refuse_a_lone_string_of_blob_names(lin):
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(ArgumentError, match=r"blobs must be a list.*blobs=\['x'\]"):
        lin.forward(blobs="x", x=x)
    with pytest.raises(ArgumentError, match=r"diffs must be a list.*diffs=\['y'\]"):
        lin.backward(diffs="y", y=np.zeros((3, 2), np.float32))
    with pytest.raises(ArgumentError, match="blobs must be a list"):
        lin.forward_all(blobs="y", x=x)
    assert set(lin.forward(blobs=["x"], x=x)) == {"x", "y"}


# ---- 6. unknown start/end layers -------------------------------------------------------
def test_unknown_start_or_end_layer_is_a_value_error_naming_it(lin):
    for call in (lambda: lin.forward(start="nope"), lambda: lin.forward(end="nope"),
                 lambda: lin.backward(start="nope"), lambda: lin.backward(end="nope")):
        with pytest.raises(ValueError, match="no layer named 'nope'"):
            call()
    with pytest.raises(CaffeOclError):
        lin.forward(start="nope")


# ---- 7. inputs that are not numbers, or do not fit -------------------------------------
def test_forward_says_when_input_values_are_not_numbers(lin):
    x = np.full((3, 4), "abc", dtype=object)
    with pytest.raises(ValueError, match="input 'x'.*not numbers"):
        lin.forward(x=x)
    with pytest.raises(ValueError, match="input 'x'.*not numbers"):
        lin.forward(x=np.full((3, 4), "abc"))


def test_forward_shape_errors_are_value_errors(lin):
    with pytest.raises(ValueError, match="input 'x': cannot put an array of shape"):
        lin.forward(x=np.zeros((3, 5), np.float32))
    with pytest.raises(ShapeError, match="input 'x' is not batch sized"):
        lin.forward(x=np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match="input 'x' is not batch sized"):
        lin.forward(x=np.zeros((2, 4), np.float32))


# ---- 8-9. the Net constructor, copy_from, save -------------------------------------
def test_net_with_the_phase_as_a_string_says_to_use_the_constant(lin_path):
    for word in ("TEST", "TRAIN"):
        with pytest.raises(ArgumentError, match=f"caffe.{word}"):
            caffe.Net(lin_path, word)
        with pytest.raises(ArgumentError, match="phase must be caffe.TEST or caffe.TRAIN"):
            caffe.Net(lin_path, phase=word)


def test_net_names_a_wrong_phase_level_stages_or_weights(lin_path):
    with pytest.raises(ArgumentError, match="weights must be a file path.*int"):
        caffe.Net(lin_path, caffe.TEST, caffe.TEST)
    with pytest.raises(ArgumentValueError, match="phase must be.*got 5"):
        caffe.Net(lin_path, 5)
    with pytest.raises(ArgumentError, match="phase must be.*float"):
        caffe.Net(lin_path, 1.0)
    with pytest.raises(ArgumentError, match="level must be an int"):
        caffe.Net(lin_path, caffe.TEST, level="x")
    with pytest.raises(ArgumentValueError, match="level must fit a 32-bit int"):
        caffe.Net(lin_path, caffe.TEST, level=2**40)
    with pytest.raises(ArgumentError, match="stages must be a list of stage names"):
        caffe.Net(lin_path, caffe.TEST, stages=[1])
    with pytest.raises(ArgumentError, match=r"stages=\['deploy'\]"):
        caffe.Net(lin_path, caffe.TEST, stages="deploy")
    # pycaffe's spellings still work
    net = caffe.Net(lin_path, caffe.TEST, level=np.int64(1), stages=["a"])
    assert net.phase == caffe.TEST


def test_paths_of_the_wrong_type_name_the_argument(lin_path, lin, tmp_path):
    for bad in (None, 5):
        with pytest.raises(ArgumentError, match="network must be a file path"):
            caffe.Net(bad, caffe.TEST)
        with pytest.raises(ArgumentError, match="copy_from: weights must be a file path"):
            lin.copy_from(bad)
        with pytest.raises(ArgumentError, match="save: path must be a file path"):
            lin.save(bad)
        with pytest.raises(ArgumentError, match="weights must be a file path"):
            caffe.Net(lin_path, caffe.TEST, weights=bad if bad is not None else 5)


# ---- 15. bytes paths, the weights file's role ----------------------------------------
def test_bytes_paths_work_and_weights_errors_say_weights(lin_path, lin, tmp_path):
    net = caffe.Net(lin_path.encode(), caffe.TEST)
    assert net.blobs["y"].shape == (3, 2)
    w = str(tmp_path / "w.caffemodel")
    lin.save(w)
    net.copy_from(w.encode())
    np.testing.assert_array_equal(net.params["ip"][0].data, lin.params["ip"][0].data)
    with pytest.raises(FileNotFound, match="weights file is a directory"):
        lin.copy_from(str(tmp_path))
    with pytest.raises(FileNotFound, match="weights file not found"):
        caffe.Net(lin_path, str(tmp_path / "missing"), caffe.TEST)


# ---- 10. Blob.reshape --------------------------------------------------------------------
def test_blob_reshape_takes_int_dimensions_only(lin):
    b = lin.blobs["x"]
    for args in ((2.5, 3), ("5",), ({1: 2},), ("abc",), (None,), (2, None)):
        with pytest.raises(ArgumentError, match="'x': reshape"):
            b.reshape(*args)
        assert b.shape == (3, 4)
    with pytest.raises(ShapeError, match="negative dimension 0"):
        b.reshape(-1, 4)
    b.reshape(np.int64(5), 4)
    assert b.shape == (5, 4)
    b.reshape((2, 4))
    assert b.shape == (2, 4)


# ---- 11-12. Solver.step, add_callback ---------------------------------------------------
def test_solver_step_takes_an_int32_number_of_iterations(solver):
    for bad in (1.5, "a", None):
        with pytest.raises(ArgumentError, match="step takes an int"):
            solver.step(bad)
    with pytest.raises(OverflowError, match="32-bit"):
        solver.step(2**62)
    with pytest.raises(CaffeOclError):
        solver.step(2**31)
    assert solver.iter == 0
    solver.step(np.int32(1))
    assert solver.iter == 1


def test_solver_add_callback_checks_callables_up_front(solver):
    with pytest.raises(ArgumentError, match="add_callback takes two callables"):
        solver.add_callback(None)
    with pytest.raises(ArgumentError, match="on_start must be callable"):
        solver.add_callback(1, 2)
    with pytest.raises(ArgumentError, match="on_gradients must be callable"):
        solver.add_callback(lambda: None, 2)
    calls = []
    solver.add_callback(lambda: calls.append("s"), lambda: calls.append("g"))
    solver.step(1)
    assert calls == ["s", "g"]


# ---- 13. MemoryData with no rows ----------------------------------------------------------
def test_memory_data_refuses_arrays_of_no_items(tmp_path):
    net = caffe.Net(_write(tmp_path, "mem.prototxt", MEMDATA), caffe.TEST)
    data = np.zeros((0, 1, 2, 2), np.float32)
    labels = np.zeros((0,), np.float32)
    with pytest.raises(ShapeError, match="no items"):
        net.set_input_arrays(data, labels)
    with pytest.raises(ValueError, match="no items"):
        net.set_input_arrays(data, labels)


# ---- 14. set_device -------------------------------------------------------------------------
def test_set_device_takes_an_int():
    for bad in (0.5, "a", None):
        with pytest.raises(ArgumentError, match="set_device takes an int"):
            caffe.set_device(bad)
