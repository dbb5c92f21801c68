"""Batched SGEMM primitive (kernels/gemm.cl).

``gemm(dev, M, N, K, A, B, C, ...)`` returns one Launch computing
C = alpha*op(A)*op(B) + beta*C, row-major, optionally over a batch of
``batch`` x ``groups`` matrices with per-level strides, and optionally
adding a bias per row (``bias_axis=0``) or per column (``bias_axis=1``),
and optionally applying an activation to the result in the epilogue
(``act=("relu", negative_slope)`` or ``act=("clip", lo, hi)``; applied after
alpha, bias and beta, so C = act(alpha*op(A)*op(B) + bias + beta*C)).
"""
import os

SRC = "gemm.cl"

# PyTorch's allow_tf32: let matrix products on NVIDIA GPUs use TF32 tensor
# cores (10-bit mantissa operands, FP32 accumulation). Off by default
# (strict FP32). Read when launches are built (reshape time).
_allow_tf32 = os.environ.get("CAFFE_OCL_TF32", "").strip().lower() in ("1", "true", "yes", "on")


def set_allow_tf32(flag=True):
    """Allow TF32 tensor cores for GEMMs and convolutions built from now on
    (NVIDIA GPUs only; other devices always compute in FP32)."""
    global _allow_tf32
    _allow_tf32 = bool(flag)


def allow_tf32():
    return _allow_tf32


def use_tf32(dev):
    """TF32 == 1 for this device? Only NVIDIA GPUs ever see PTX."""
    return int(bool(_allow_tf32 and dev.is_gpu and getattr(dev, "is_nvidia", False)))


def gpu_tiles(dev, M):
    """Tile of the GPU kernels (tile_mainloop.h): 128 x 128 (256 work-items),
    or 64 x 128 (128 work-items) when op(A) has at most 64 rows."""
    tm = 64 if M <= 64 else 128
    if 2 * 16 * (tm + 8 + 128 + 8) * 4 > getattr(dev, "local_mem", 1 << 16):
        tm = 64          # 128-row tiles need 34 KiB of local memory
    return dict(TM=tm, TN=128, TK=16, TF32=use_tf32(dev))


def _cpu_blocks(dev, M, N):
    """Blocks of kernels/gemm_cpu.cl: one work-item per BM x BN block of C.

    M <= 64: one block row (rows past M cost nothing) with the 4 x 16
    register tile; larger M: 6 x 16 tile (12 float8 accumulators) in
    48-row blocks. KC = 256 (the B panel stays in L2 and C is re-read
    K/KC times). When the problem has few blocks, N is split finer (down
    to 16 columns) so that every core gets work."""
    cu = max(int(dev.compute_units), 1)
    if M <= 64:
        bm, mr = 64, 4
    else:
        bm, mr = 48, 6
    bn = 64
    while bn > 16 and -(-N // bn) * -(-M // bm) < 2 * cu:
        bn //= 2
    kc = 256
    while kc > 16 and kc * bn * 4 > int(dev.local_mem):   # packed B panel in __local
        kc //= 2
    return dict(BM=bm, BN=bn, KC=kc, MR=mr)


def act_defines(act):
    """(ACT macro value, act_a, act_b) for an ``act`` spec (see ``gemm``)."""
    if act is None:
        return 0, 0.0, 0.0
    kind = act[0]
    if kind == "relu" and len(act) in (1, 2):
        return 1, float(act[1]) if len(act) > 1 else 0.0, 0.0
    if kind == "clip" and len(act) == 3:
        return 2, float(act[1]), float(act[2])
    raise ValueError(f"gemm: unknown activation {act!r}; expected None, "
                     "('relu', negative_slope) or ('clip', lo, hi)")


def gemm(dev, M, N, K, A, B, C, *, trans_a=False, trans_b=False,
         alpha=1.0, beta=0.0, off_a=0, off_b=0, off_c=0,
         lda=None, ldb=None, ldc=None, batch=1, groups=1,
         stride_a=(0, 0), stride_b=(0, 0), stride_c=(0, 0),
         bias=None, bias_axis=0, off_bias=0, act=None, impl=None):
    """One launch over batch*groups problems.

    stride_x = (per batch index, per group index), in elements.
    act: None, ("relu", negative_slope) or ("clip", lo, hi), fused into the
    epilogue after bias and beta.
    impl: None (by device: "cpu" on CPU drivers, "tiled" on GPUs) or one of
    them explicitly (tests run the GPU kernel on PoCL this way)."""
    act_kind, act_a, act_b = act_defines(act)
    if lda is None:
        lda = M if trans_a else K
    if ldb is None:
        ldb = K if trans_b else N
    if ldc is None:
        ldc = N
    common = dict(TRANS_A=int(trans_a), TRANS_B=int(trans_b),
                  BIAS=0 if bias is None else (1 if bias_axis == 0 else 2),
                  GROUPS=int(groups))
    if act_kind:
        common["ACT"] = act_kind
    gz = batch * groups
    if impl is None:
        impl = "cpu" if dev.is_cpu else "tiled"
    if impl == "cpu":
        # CPU drivers: one work-item per BM x BN block (kernels/gemm_cpu.cl)
        t = _cpu_blocks(dev, M, N)
        src, lx, ly = "gemm_cpu.cl", 1, 1
        gx, gy = -(-N // t["BN"]), -(-M // t["BM"])
    else:
        t = gpu_tiles(dev, M)
        src = SRC
        lx, ly = t["TM"] * t["TN"] // 64, 1
        gx = -(-N // t["TN"]) * lx
        gy = -(-M // t["TM"])
    defines = dict(t, **common)
    args = [M, N, K, alpha,
            A, off_a, lda, stride_a[0], stride_a[1],
            B, off_b, ldb, stride_b[0], stride_b[1],
            beta,
            C, off_c, ldc, stride_c[0], stride_c[1],
            bias if bias is not None else A, off_bias, act_a, act_b]
    return dev.launch(src, "gemm", (gx, gy, gz), (lx, ly, 1), args, defines)
