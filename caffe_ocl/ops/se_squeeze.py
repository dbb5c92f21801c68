"""An SE block's squeeze (global average pooling -> product + activation
-> product + activation) as one launch (kernels/se_squeeze.cl; the plan's
rewrite is plan/se_squeeze.py)."""
from .. import config
from .gemm import act_defines

SRC = "se_squeeze.cl"
THREADS = 256
# Most floats of one image's input: one work-group reads them all (the
# separate pooling launch spreads the planes over the device). EfficientNet-
# B0's SE inputs run from 32 x 112 x 112 (401 K) down to 1152 x 7 x 7 (56 K).
MAX_IMAGE_FLOATS = 1 << 17
# Most images: every work-group reads both weight matrices again.
MAX_IMAGES = 4
# Most channels and squeeze units: the pooled vector and the hidden units
# live in local memory.
MAX_CHANNELS = 4096
MAX_SQUEEZE = 1024


def applies(dev, n, c, hw, s, co):
    """Whether the one-launch squeeze runs here: GPUs (CPU drivers run
    the layers: one work-group per image would use one core), setting
    FUSE_SE_SQUEEZE, at most MAX_IMAGES images of at most
    MAX_IMAGE_FLOATS floats, MAX_CHANNELS channels in and out and
    MAX_SQUEEZE hidden units."""
    return (not dev.is_cpu and bool(config.get("FUSE_SE_SQUEEZE")) and 0 < n <= MAX_IMAGES
            and c * hw <= MAX_IMAGE_FLOATS and 0 < c <= MAX_CHANNELS
            and 0 < co <= MAX_CHANNELS and 0 < s <= MAX_SQUEEZE)


def _pow2(v):
    """Local array length for ``v`` values: a power of two from 64 (few
    program variants over a net's SE blocks)."""
    return max(64, 1 << (int(v) - 1).bit_length())


def forward(dev, n, c, hw, s, co, x, w1, b1, act1, w2, b2, act2, y):
    """y[n][co] = act2(w2 act1(w1 mean(x[n]) + b1) + b2): one launch.
    ``w1`` [s][c], ``w2`` [co][s]; ``b1``/``b2`` None or buffers."""
    k1, a1, c1 = act_defines(act1)
    k2, a2, c2 = act_defines(act2)
    return dev.launch(SRC, "se_squeeze", (n * THREADS,), (THREADS,),
                      [c, hw, s, co, x, w1, b1 if b1 is not None else w1, w2,
                       b2 if b2 is not None else w2, y, k1, a1, c1, k2, a2, c2],
                      dict(SQ_THREADS=THREADS, SQ_MAX_C=_pow2(c), SQ_MAX_S=_pow2(s),
                           HAS_B1=int(b1 is not None),
                           HAS_B2=int(b2 is not None)))
