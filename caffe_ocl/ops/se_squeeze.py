"""An SE block's squeeze (global average pooling -> product + activation
-> product + activation) as one launch (kernels/se_squeeze.cl; the plan's
rewrite is plan/se_squeeze.py)."""
from .. import config
from .gemm import act_defines

SRC = "se_squeeze.cl"
THREADS = 1024
LANES = 8       # work-items summing one plane
# Most floats of one image's input: one work-group reads them all (the
# separate pooling launch spreads the planes over the device). EfficientNet-
# B0's SE inputs run from 32 x 112 x 112 (401 K) down to 1152 x 7 x 7 (56 K).
MAX_IMAGE_FLOATS = 1 << 17
# Most images: every work-group reads both weight matrices again.
MAX_IMAGES = 4
# Most floats of local memory the kernel's arrays take (the lanes' partial
# sums, the pooled vector, the hidden units): 48 KiB on NVIDIA's GPUs, a
# little left over. EfficientNet-B0's widest SE block (1152 channels, 48
# units) takes 11 K.
MAX_LOCAL_FLOATS = 11_500


def _local_floats(c, s):
    return max(LANES * c, 32 * s) + c + s


def applies(dev, n, c, hw, s, co):
    """Whether the one-launch squeeze runs here: setting FUSE_SE_SQUEEZE, at
    most MAX_IMAGES images of at most MAX_IMAGE_FLOATS floats (on CPU
    drivers each of an image's work-items pools all of it: see
    se_squeeze_cpu), channels and hidden units whose arrays fit
    MAX_LOCAL_FLOATS of local memory."""
    local = c + s if cpu_kernel(dev) else _local_floats(c, s)
    return (bool(config.get("FUSE_SE_SQUEEZE")) and 0 < n <= MAX_IMAGES
            and 0 < c and c * hw <= MAX_IMAGE_FLOATS and 0 < s and 0 < co
            and local <= MAX_LOCAL_FLOATS)


def cpu_kernel(dev):
    """Whether ``dev`` runs se_squeeze_cpu (work-items of one, each core
    pooling its image's planes alone) rather than the GPU's work-groups of
    THREADS."""
    return bool(dev.is_cpu)


def cpu_parts(dev, co):
    """Work-items an image on a CPU driver: one a core, at most one per
    output of the second product."""
    return max(1, min(int(dev.compute_units or 1), co))


def forward(dev, n, c, hw, s, co, x, w1, b1, act1, w2, b2, act2, y):
    """y[n][co] = act2(w2 act1(w1 mean(x[n]) + b1) + b2): one launch.
    ``w1`` [s][c], ``w2`` [co][s]; ``b1``/``b2`` None or buffers."""
    k1, a1, c1 = act_defines(act1)
    k2, a2, c2 = act_defines(act2)
    args = [c, hw, s, co, x, w1, b1 if b1 is not None else w1, w2,
            b2 if b2 is not None else w2, y, k1, a1, c1, k2, a2, c2]
    defs = dict(SQ_MAX_C=c, SQ_MAX_S=s, HAS_B1=int(b1 is not None), HAS_B2=int(b2 is not None))
    if cpu_kernel(dev):
        parts = cpu_parts(dev, co)
        return dev.launch(SRC, "se_squeeze_cpu", (n * parts,), (1,), args,
                          dict(defs, SQ_CPU=1, SQ_PARTS=parts))
    return dev.launch(SRC, "se_squeeze", (n * THREADS,), (THREADS,), args,
                      dict(defs, SQ_THREADS=THREADS, SQ_LANES=LANES,
                           SQ_PART=max(LANES * c, 32 * s)))
