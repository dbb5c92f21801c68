"""The on-disk kernel cache's key: a second checkout or install of the same
kernels (another KERNEL_DIR in the -I option) reuses the binaries; what the
binary depends on still changes the key."""
from caffe_ocl import device as D


def test_cache_key_ignores_where_the_kernels_live():
    dev = D.get_device()
    src = "__kernel void k(__global float* x) { x[0] = A; }"

    def opts(kernel_dir, a="1"):
        return [f"-DA={a}", "-I", kernel_dir, "-cl-mad-enable"]

    key = dev._cache_key(src, opts(D.KERNEL_DIR))
    assert dev._cache_key(src, opts("/elsewhere/caffe_ocl/kernels")) == key
    assert dev._cache_key(src, opts(D.KERNEL_DIR, a="2")) != key
    assert dev._cache_key(src + " ", opts(D.KERNEL_DIR)) != key
