"""Kernel launches straight through clEnqueueNDRangeKernel (cl_enqueue.py):
same results as pyopencl's call, pyopencl's errors on a failing launch,
events still recorded for timing, and the setting that turns it off."""
import numpy as np
import pyopencl as cl
import pytest

from caffe_ocl import cl_enqueue, config, device as devmod

SRC = """
__kernel void axpb(__global float *x, float a, float b, int n) {
    int i = get_global_id(0);
    if (i < n) x[i] = a * x[i] + b;
}
"""


@pytest.fixture(scope="module")
def kernel():
    dev = devmod.get_device()
    return dev, cl.Program(dev.context, SRC).build().axpb


def _run(dev, k, n, gsize, lsize):
    x = (np.arange(n, dtype=np.float32) - 3.0)
    buf = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=x)
    k.set_args(buf, np.float32(2.0), np.float32(0.5), np.int32(n))
    launch = devmod.Launch(k, gsize, lsize, name="axpb", buffers={0: buf})
    for _ in range(3):
        launch.run(dev.queue)
    out = np.empty_like(x)
    cl.enqueue_copy(dev.queue, out, buf)
    ref = x.astype(np.float64)
    for _ in range(3):
        ref = 2.0 * ref + 0.5
    return launch, out, ref


def test_direct_launch_matches_reference(kernel):
    dev, k = kernel
    if cl_enqueue.direct_enqueue_fn() is None:
        pytest.skip("no OpenCL library reachable through ctypes here")
    launch, out, ref = _run(dev, k, 1000, (1024,), (64,))
    assert isinstance(launch.direct, cl_enqueue.DirectEnqueue)
    np.testing.assert_allclose(out, ref, rtol=1e-6)
    # a launch without a local size (the driver chooses) goes the same way
    launch, out, ref = _run(dev, k, 77, (77,), None)
    assert isinstance(launch.direct, cl_enqueue.DirectEnqueue)
    np.testing.assert_allclose(out, ref, rtol=1e-6)


def test_setting_off_uses_pyopencl(kernel):
    dev, k = kernel
    with config.override(DIRECT_ENQUEUE=False):
        launch, out, ref = _run(dev, k, 100, (128,), (64,))
    assert launch.direct is False
    np.testing.assert_allclose(out, ref, rtol=1e-6)


def test_failing_launch_raises_pyopencls_error(kernel):
    dev, k = kernel
    x = np.zeros(64, np.float32)
    buf = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=x)
    k.set_args(buf, np.float32(1), np.float32(1), np.int32(64))
    too_big = dev.max_work_group * 2
    launch = devmod.Launch(k, (too_big,), (too_big,), name="axpb", buffers={0: buf})
    for _ in range(2):      # the first run sets the direct path up, the second takes it
        with pytest.raises(cl.Error):
            launch.run(dev.queue)


def test_recorded_runs_keep_their_events(kernel):
    dev, k = kernel
    x = np.zeros(64, np.float32)
    buf = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=x)
    k.set_args(buf, np.float32(1), np.float32(1), np.int32(64))
    launch = devmod.Launch(k, (64,), (64,), name="axpb", buffers={0: buf})
    launch.run(dev.queue)
    sink = []
    with devmod.record_events(sink):
        launch.run(dev.queue)
        launch.run(dev.queue)
    assert len(sink) == 2 and all(isinstance(e, cl.Event) for e in sink)
    dev.queue.finish()
    out = np.empty_like(x)
    cl.enqueue_copy(dev.queue, out, buf)
    np.testing.assert_array_equal(out, np.full(64, 3.0, np.float32))


def test_direct_launch_follows_the_queue_it_is_given(kernel):
    """A launch binds the queue of its last run: run on another queue (a
    second one on the same context) it enqueues there, and back again."""
    dev, k = kernel
    if cl_enqueue.direct_enqueue_fn() is None:
        pytest.skip("no OpenCL library reachable through ctypes here")
    x = np.zeros(64, np.float32)
    buf = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=x)
    k.set_args(buf, np.float32(1), np.float32(1), np.int32(64))
    launch = devmod.Launch(k, (64,), (64,), name="axpb", buffers={0: buf})
    other = cl.CommandQueue(dev.context)
    launch.run(dev.queue)       # the first run sets the direct path up (pyopencl's call)
    for q in (dev.queue, other, dev.queue):     # x -> x + 1 each run
        launch.run(q)
        q.finish()
        assert launch.direct.queue is q
    out = np.empty_like(x)
    cl.enqueue_copy(dev.queue, out, buf)
    np.testing.assert_array_equal(out, np.full(64, 4.0, np.float32))
