"""Batched SGEMM primitive (kernels/gemm.cl).

``gemm(dev, M, N, K, A, B, C, ...)`` returns one Launch computing
C = alpha*op(A)*op(B) + beta*C, row-major, optionally over a batch of
``batch`` x ``groups`` matrices with per-level strides, and optionally
adding a bias per row (``bias_axis=0``) or per column (``bias_axis=1``),
and optionally applying an activation to the result in the epilogue
(``act=("relu", negative_slope)`` or ``act=("clip", lo, hi)``; applied after
alpha, bias and beta, so C = act(alpha*op(A)*op(B) + bias + beta*C)).
"""
from .. import config

SRC = "gemm.cl"

# PyTorch's allow_tf32: let matrix products on NVIDIA GPUs use TF32 tensor
# cores (10-bit mantissa operands, FP32 accumulation). Off by default
# (strict FP32): setting TF32. Read when launches are built (reshape time).


def set_allow_tf32(flag=True):
    """Allow TF32 tensor cores for GEMMs and convolutions built from now on
    (NVIDIA GPUs only; other devices always compute in FP32)."""
    config.set("TF32", bool(flag))


def allow_tf32():
    return config.get("TF32")


# Tests only: build the tensor-core tiling with an emulated mma (TF32 == 2,
# kernels/mma_tf32.h) on any device, so PoCL checks its fragment layouts
# (setting TF32_EMULATE).


def set_emulate_tf32(flag=True):
    """Tests: kernels built from now on use the TF32 tiling with an emulated
    warp mma on any device (slow; exact TF32 rounding)."""
    config.set("TF32_EMULATE", bool(flag))


def use_tf32(dev):
    """The TF32 macro for this device: 1 (tensor cores) only on NVIDIA GPUs
    with TF32 allowed, so only they ever see PTX; 2 under the tests'
    emulation; else 0."""
    if config.get("TF32_EMULATE"):
        return 2
    return int(bool(config.get("TF32") and dev.is_gpu and getattr(dev, "is_nvidia", False)))


# kernels/tile_store.h: products with K up to this store their results
# through local memory (coalesced rows); longer ones store directly (H200:
# staging sped up 1x1 convolutions and Winograd's channel GEMMs, K 64-512,
# by 1.1-1.5x and slowed VGG's implicit-GEMM convolutions, K 576-4608, and
# a 4096^3 GEMM by 15-25%).
STAGED_MAX_K = 512


# gemm.cl reads the old values of C (beta != 0) ahead of its stores
# (kernels/tile_store.h PRIOR_AT); setting GEMM_READ_AHEAD off: read each
# right before its store.


def gpu_tiles(dev, M, K=None):
    """Tile of the GPU kernels (tile_mainloop.h): 128 x 128 (256 work-items),
    or 64 x 128 (128 work-items) when op(A) has at most 64 rows; STAGED (the
    store of tile_store.h) for a product of depth K <= STAGED_MAX_K. In
    deterministic mode always 128 rows where local memory allows (M is the
    batch of a fully-connected layer). RASTER: the order the work-groups
    start in (kernels/tile_raster.h, setting GPU_TILE_RASTER)."""
    tm = 64 if M <= 64 and not deterministic() else 128
    if 2 * 16 * (tm + 8 + 128 + 8) * 4 > getattr(dev, "local_mem", 1 << 16):
        tm = 64          # 128-row tiles need 34 KiB of local memory
    return dict(TM=tm, TN=128, TK=16, TF32=use_tf32(dev),
                STAGED=int(K is not None and K <= STAGED_MAX_K),
                READ_AHEAD=int(config.get("GEMM_READ_AHEAD")),
                RASTER=max(1, int(config.get("GPU_TILE_RASTER"))))


# TF32 GEMMs (not the implicit-GEMM convolutions) run
# kernels/tile_mainloop_async.h: local tiles filled by asynchronous copies
# (cp.async), ASYNC_MAX_STAGES deep where local memory allows, warps of
# 64 x ASYNC_WN results. CAFFE_OCL_TF32_ASYNC=0 keeps tile_mainloop.h.
ASYNC_WN = 64           # H200, 4096^3: 32-column warps 1.38 ms, 64: 1.12
ASYNC_MAX_STAGES = 3    # as many 128 x 16 stages as 48 KiB holds (64-row tiles: not tried deeper)


def async_tiles(dev, t, aligned_a, aligned_b):
    """Defines that switch a TF32 tile ``t`` (gpu_tiles) to
    tile_mainloop_async.h, or {} where it does not apply: FP32, the switch
    off, under 2 stages of local memory, or an operand whose rows do not
    start on 16-byte boundaries (aligned_x False). Its copies are 16 bytes:
    4-byte ones ran 1.3x slower than tile_mainloop.h (VGG-16's Winograd
    GEMMs with 1519 tiles per row; the implicit-GEMM gathers 1.3-1.6x)."""
    if not t["TF32"] or not config.get("TF32_ASYNC") or not (aligned_a and aligned_b):
        return {}
    tm, tk = t["TM"], t["TK"]
    wn = ASYNC_WN if tm == 128 else 32       # at least 128 work-items (tile_store.h)
    threads = (tm // 64) * (t["TN"] // wn) * 32
    stage = 4 * tk * (tm + t["TN"])
    have = getattr(dev, "local_mem", 1 << 16) - (24 * threads if t["TF32"] == 2 else 0)
    stages = min(ASYNC_MAX_STAGES, have // stage)
    if stages < 2:
        return {}
    return dict(ASYNC=1, STAGES=stages, WN=wn)


def tile_threads(t):
    """Work-group size of the GPU matrix kernels for tile ``t``
    (kernels/tile_config.h)."""
    if t.get("ASYNC"):
        return (t["TM"] // 64) * (t["TN"] // t["WN"]) * 32
    return t["TM"] * t["TN"] // t.get("MICRO", 8) ** 2


# The FP32 tile shapes gemm.cl can run besides gpu_tiles' own
# (tile_mainloop.h): "rows64" 64 x 128 (128 work-items), "small" 64 x 64 of
# 4 x 4 results a work-item (256 work-items: a quarter of a 128 x 128
# tile's main loop per work-group). Each result is one work-item's sum over
# K in order whichever runs, so the values are the same bits.
GEMM_TILE_NAMES = ("usual", "rows64", "small")


def fill_tiles(dev, M, N, gz, t):
    """The rule's tile name for gz M x N products (``gemm(tiles="auto")``).
    H200, FP32, `bench_gemm_tiles.py` (BENCHMARKS.md, forty-seventh
    session): "small" (64 x 64) for at most 64 columns (a 128-column tile
    computes at least as many columns past N: Swin's 49 x 49 window
    products 0.070 -> 0.048 ms) and for fewer usual tiles than half the
    compute units (DeiT's 197 x 576 x 192 at batch 1, 10 tiles: 0.030 ->
    0.016); "rows64" (64 x 128) where the usual tiles make more than one
    wave but less than two (DeiT b16's 3152 x 768 x 192, 150 tiles: 0.058
    -> 0.042; its scores 197 x 197 x 64 x 48 0.025 -> 0.018); else the
    usual (one wave mostly full, 125-128 tiles: small tiles were 1.15-1.26x
    slower there; or two waves and more)."""
    cus = max(int(dev.compute_units), 1)
    if N <= 64:
        return "small"
    tiles = -(-M // t["TM"]) * -(-N // 128) * gz
    if tiles >= 2 * cus:
        return "usual"
    if tiles > cus:
        return "rows64" if t["TM"] == 128 else "usual"
    return "usual" if tiles >= cus // 2 else "small"


def gemm_tiles(dev, M, N, K, gz=1, name=None):
    """Tile of a GPU ``gemm`` of gz M x N x K problems: gpu_tiles' (name
    "usual"), another of GEMM_TILE_NAMES by name, or by ``fill_tiles``
    ("auto": the fully-connected and MatMul products ask for it). Setting
    GEMM_TILES: "rule" (the default) lets "auto" follow fill_tiles,
    another name forces that tile on every product that asks "auto". TF32
    and deterministic mode always take the usual."""
    t = gpu_tiles(dev, M, K)
    name = name or "usual"
    if name == "auto":
        name = config.get("GEMM_TILES")
        if name == "rule":
            name = fill_tiles(dev, M, N, gz, t)
    if name not in GEMM_TILE_NAMES:
        raise ValueError(f"gemm: tiles {name!r}; expected one of {GEMM_TILE_NAMES} or 'auto'")
    if name == "usual" or t["TF32"] or deterministic():
        return t
    if name == "rows64":
        return dict(t, TM=64)
    return dict(t, TM=64, TN=64, MICRO=4)


def _rows_aligned(ld, off, strides):
    """Rows of ld floats from offset off, moved by strides, all on 16 bytes."""
    return all(int(v) % 4 == 0 for v in (ld, off) + tuple(strides))


# kernels/gemm_cpu.cl: fixed panel sizes (one compiled variant per
# transpose/bias/activation/groups combination); the block of C a
# work-item owns is a run-time argument up to these maxima. KC x BM_MAX of A
# and KC x BN_MAX of B packed in __local: 400 KiB, inside a 512 KiB L2.
# BM_MAX 144 rather than 96: each work-item packs its own B panel, so taller
# blocks pack B fewer times; 2-core EPYC, PoCL 3.1, interleaved runs:
# 512x784x4608 92 -> 101-106 GFLOP/s, 256x3136x2304 89 -> 103-107,
# 256x2916x1200 79 -> 96-101, M <= 96 unchanged.
CPU_KC, CPU_BM_MAX, CPU_BN_MAX = 256, 144, 256
CPU_MR = 6
# Thin, short products (M <= 36 rows, K <= 32: MobileNet v2's 32 -> 16 1x1
# layer and its conv1, LeNet's conv1) get a variant of their own with
# blocks of up to 2048 columns: each work-item then streams 8 KiB runs of
# B's few rows instead of 1 KiB ones, and their time is that of moving B
# and C, not of arithmetic. 2-core EPYC, PoCL 3.1, interleaved A/B:
# M 16 x K 32 x N 200704 1.16x with 1024 columns, 1.37x with 2048;
# M 32 x K 27 (conv1's columns) 1.13x; M 24 x K 96 1.08x but M 96 x K 16
# 0.94x and M 32 x K 144-192 0.91x (those keep the usual panels).
CPU_THIN_MAX_M, CPU_THIN_MAX_K = 36, 32
CPU_THIN_PANELS = (32, 36, 2048)     # KC, BM_MAX, BN_MAX


def cpu_vw(dev):
    """Vector width VW of gemm_cpu.cl's micro-kernel on ``dev`` (its tiles
    are 6 x 2*VW): setting CPU_GEMM_VW, or by default 16 where the driver
    prefers 16-float vectors (PoCL on AVX-512 CPUs), 8 elsewhere (on AVX2,
    float16 is emulated by pairs of registers and 12 accumulators would
    spill)."""
    v = config.get("CPU_GEMM_VW")
    if v != "auto":
        return int(v)
    return 16 if int(getattr(dev, "vector_width_float", 8) or 8) >= 16 else 8


def cpu_nr(dev):
    """Columns of gemm_cpu.cl's micro-tile (and of its B micro-panels) on
    ``dev``: bn is a multiple of it."""
    return 2 * cpu_vw(dev)


def cpu_kc(dev):
    """K panel of the CPU kernel: CPU_KC, halved until both packed panels fit
    the device's local memory (PoCL gives 512 KiB; simulators such as
    Oclgrind only 32 KiB)."""
    kc = CPU_KC
    while kc > 8 and not _panels_fit(dev, kc, CPU_BM_MAX, CPU_BN_MAX):
        kc //= 2
    return kc


def _panels_fit(dev, kc, bm_max, bn_max):
    """Whether gemm_cpu.cl's packed panels (KC x BM_MAX of A, KC x BN_MAX
    of B) fit the device's local memory."""
    return 4 * kc * (bm_max + bn_max) <= getattr(dev, "local_mem", 1 << 19)


def deterministic():
    """Batch-invariant results asked for (CAFFE_OCL_DETERMINISTIC,
    caffe.set_deterministic): no choice of kernel, K panel or K split may
    depend on a size that grows with the batch."""
    return bool(config.get("DETERMINISTIC"))


def cpu_panels(dev, M, K):
    """(KC, BM_MAX, BN_MAX): the gemm_cpu.cl variant for an M x K operand
    A -- CPU_THIN_PANELS for thin, short ones where the device's local
    memory holds them, the usual panels otherwise (always the usual ones in
    deterministic mode: M is the batch in a fully-connected layer, and the
    K panel sets where partial sums are rounded)."""
    kc, bm, bn = CPU_THIN_PANELS
    if not deterministic() and M <= CPU_THIN_MAX_M and K <= CPU_THIN_MAX_K and _panels_fit(dev, kc, bm, bn):
        return kc, bm, bn
    return cpu_kc(dev), CPU_BM_MAX, CPU_BN_MAX


def _split(n, most, unit):
    """Block of at most ``most`` (a multiple of ``unit``) covering ``n`` in
    as few, evenly sized blocks as possible."""
    most = max(unit, most // unit * unit)
    nblk = -(-n // most)
    return min(most, -(-(-(-n // nblk)) // unit) * unit)


def cpu_full_blocks(M, N, nr, bm_max=None, bn_max=None):
    """(bm, bn): the largest evenly sized blocks of an M x N product for
    kernels/gemm_cpu.cl (panels of at most bm_max x bn_max, by default
    CPU_BM_MAX x CPU_BN_MAX; bn a multiple of the micro-tile's ``nr``
    columns, cpu_nr), before cpu_blocks halves them to fill the cores."""
    return (_split(max(M, 1), bm_max or CPU_BM_MAX, CPU_MR),
            _split(max(N, 1), bn_max or CPU_BN_MAX, nr))


def cpu_blocks(dev, M, N, nz=1, bm_max=None, bn_max=None, packed_a=False):
    """(bm, bn): block of C per work-item of kernels/gemm_cpu.cl.

    Blocks as large as the packed panels allow (packing costs 16/bn of the
    arithmetic for A and about 2/bm for B), evenly sized so that M = 64 or
    N = 784 waste little; then halved (bn first, down to 64; then bm, down
    to 24; then bn down to one micro-tile, cpu_nr) until there are 4 blocks
    per core, so PoCL's dynamic scheduling keeps both cores busy. With op(A)
    packed once (``packed_a``) narrow blocks cost no packing of A: bn is
    halved down to one micro-tile before bm (2-core EPYC, PoCL 3.1, min of 31 interleaved rounds:
    MobileNet v2's batch-1 1x1 products 1.06x over packed A with the usual
    blocks, 1.16x over the unpacked kernel)."""
    nr = cpu_nr(dev)
    bm, bn = cpu_full_blocks(M, N, nr, bm_max, bn_max)
    want = 4 * max(int(dev.compute_units), 1)

    def blocks():
        return -(-M // bm) * -(-N // bn) * nz
    while blocks() < want:
        if packed_a and bn > nr:
            bn = _split(N, bn // 2, nr)
        elif bn > max(64, nr):
            bn = _split(N, bn // 2, nr)
        elif bm > 24:
            bm = _split(M, bm // 2, CPU_MR)
        elif bn > nr:
            bn = _split(N, bn // 2, nr)
        else:
            break
    # packed A: N split further until the cores get as many blocks each
    # (9 or 13 blocks of a 7 x 7 or 56 x 56 batch-1 layer left one core a
    # block longer: 1.10-1.17x on those, min of 31 interleaved rounds)
    cores = max(int(dev.compute_units), 1)
    while packed_a and blocks() % cores and blocks() < 8 * cores and bn > nr:
        bn = _split(N, bn // 2, nr)
    return bm, bn


# gemm_cpu.cl's epilogue applies the activation to floatV rows: gen_act on
# each lane, written out lane by lane so that the compiler vectorizes the
# lanes' identical chains (PoCL: a loop over a private array of the lanes
# stayed scalar, 0.74-0.91x the separate chain kernel; this form 1.02-1.14x)
_LANE = "0123456789abcdef"
_GEN_ACT_LANES = "\n".join(
    f"inline float{n} gen_act_float{n}(float{n} v) {{\n"
    f"    return (float{n})(" + ", ".join(f"gen_act(v.s{_LANE[i]})" for i in range(n)) + ");\n}"
    for n in (2, 4, 8, 16))


def act_program(dev, src, act):
    """The program a launch of kernel file ``src`` with activation ``act``
    builds: ``src``, or for a generated chain (``("chain", code)``: code
    defining ``float gen_act(float)``, plan/pointwise.py) a generated
    source holding the code, gen_act's lane helpers and ``src``'s text
    (whose changes then change the program's cache key)."""
    if act is None or act[0] != "chain":
        return src
    return dev.generated_source("\n".join([act[1], _GEN_ACT_LANES, dev.kernel_text(src)]))


def act_defines(act):
    """(ACT macro value, act_a, act_b) for an ``act`` spec (see ``gemm``)."""
    if act is None:
        return 0, 0.0, 0.0
    kind = act[0]
    if kind == "relu" and len(act) in (1, 2):
        return 1, float(act[1]) if len(act) > 1 else 0.0, 0.0
    if kind == "clip" and len(act) == 3:
        return 2, float(act[1]), float(act[2])
    if kind == "swish" and len(act) in (1, 2):
        return 3, float(act[1]) if len(act) > 1 else 1.0, 0.0
    if kind == "sigmoid" and len(act) == 1:
        return 4, 0.0, 0.0
    if kind in ("hardswish", "hardsigmoid") and len(act) == 3:
        return 5 if kind == "hardswish" else 6, float(act[1]), float(act[2])
    if kind == "prelu" and len(act) == 2 and 0 < int(act[1]) < (1 << 24):
        # the slopes follow the act[1] biases in the bias buffer (act.h ACT 7)
        return 7, float(int(act[1])), 0.0
    if kind == "chain" and len(act) == 2 and isinstance(act[1], str):
        return 8, 0.0, 0.0      # the code is in the program (act_program)
    raise ValueError(f"gemm: unknown activation {act!r}; expected None, "
                     "('relu', negative_slope), ('clip', lo, hi), ('swish', beta), "
                     "('sigmoid',), ('hardswish', a, b), ('hardsigmoid', a, b), "
                     "('prelu', channels) or ('chain', code)")


def gemm(dev, M, N, K, A, B, C, *, trans_a=False, trans_b=False,
         alpha=1.0, beta=0.0, off_a=0, off_b=0, off_c=0,
         lda=None, ldb=None, ldc=None, batch=1, groups=1,
         stride_a=(0, 0), stride_b=(0, 0), stride_c=(0, 0),
         bias=None, bias_axis=0, off_bias=0, act=None, impl=None,
         nsplit=0, nstride=(0, 0), nsplit_b=True, ksplit=0, kstride=(0, 0), kchunk=0,
         conv=None, packed_a=False, packed_b=False, residual=None, off_residual=0,
         tiles=None):
    """One launch over batch*groups problems.

    stride_x = (per batch index, per group index), in elements.
    act: None, ("relu", negative_slope) or ("clip", lo, hi), fused into the
    epilogue after bias and beta.
    impl: None (by device: "cpu" on CPU drivers, "tiled" on GPUs) or one of
    them explicitly (tests run the GPU kernel on PoCL this way).
    CPU kernel only (images folded into a GEMM dimension, see gemm_cpu.cl):
    nsplit > 0: columns n of op(B) and C lie in image n // nsplit at
    n % nsplit, images nstride = (B, C) floats apart (op(B) not transposed);
    ksplit > 0: index k of op(A), op(B) lies in image k // ksplit at
    k % ksplit, images kstride = (A, B) floats apart (A not transposed, B
    transposed);
    The GPU kernel takes nsplit too (gemm.cl NFOLD; batch then moves the
    operands as usual), with nsplit_b=False folding only C's columns (op(B)
    a plain matrix, nstride[0] unused), and ksplit (gemm.cl KFOLD) with a
    split of K:
    batch index i computes the slice [i * kchunk, + kchunk) of K (batch =
    ceil(K / kchunk); C moves by stride_c[0] per slice; A and B do not move,
    so stride_a[0] and stride_b[0] must be 0).
    conv = (kh, kw, sh, sw, dh, dw, wp, hwp, wo): B is zero-padded images
    ([image][C][Hp][Wp]; Wp, Hp*Wp, output row WO) whose columns the kernel
    packs itself (gemm_cpu.cl CONV_B): op(B) = col with nsplit = HO*WO
    (forward), or op(B) = col^T with ksplit = HO*WO (weight gradient).
    packed_b: B is op(B) packed by ``pack_b_panels`` or, for a conv
    operand, ``pack_b_conv`` (from off_b; CPU kernel, one group and batch
    index).
    packed_a: A is op(A) packed by ``pack_a`` (CPU kernel only, op(A) = A,
    no ksplit; a group's A then starts stride_a[1] = packed_a_floats(M, K)
    floats after the previous one's).
    residual: a buffer laid out as C (from ``off_residual``, moving with C's
    strides) added before the activation: C = act(alpha*op(A)*op(B) + bias
    + beta*C + residual), the sum an Eltwise after the product would make
    (plan/residual.py). Not with ksplit (C then holds partial sums).
    tiles: GPU kernel only: None (the usual tile), "auto" (gemm_tiles'
    choice for a product that may take other tiles) or a name of
    GEMM_TILE_NAMES."""
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
    if ksplit and impl != "cpu":
        kchunk = int(kchunk or K)
        if batch != -(-K // kchunk) or stride_a[0] or stride_b[0] or kchunk % 16:
            raise ValueError("gemm: a GPU ksplit GEMM has one batch index per kchunk "
                             "(a multiple of 16) of K and operands that do not move with it")
    if nsplit and not nsplit_b and impl == "cpu":
        raise ValueError("gemm: nsplit_b=False exists only in the GPU kernel")
    if nsplit and nsplit_b and trans_b:
        raise ValueError("gemm: nsplit needs op(B) = B (not transposed)")
    if nsplit and ksplit:
        raise ValueError("gemm: nsplit and ksplit together")
    if ksplit and (trans_a or not trans_b):
        raise ValueError("gemm: ksplit needs op(A) = A and op(B) = B^T")
    if conv is not None:
        if not (nsplit if not trans_b else ksplit) or impl not in (None, "cpu"):
            raise ValueError("gemm: conv needs the CPU kernel and nsplit (op(B) = B) "
                             "or ksplit (op(B) = B^T)")
        common["CONV_B"] = 2 if trans_b else 1
    if residual is not None:
        if ksplit:
            raise ValueError("gemm: residual with ksplit (partial sums)")
        common["RESIDUAL"] = 1
    if packed_b:
        if impl != "cpu" or groups != 1 or batch != 1 or (conv is not None and trans_b):
            raise ValueError("gemm: packed_b needs the CPU kernel, one group and one batch "
                             "index (and op(B) = B for a conv operand)")
        common["PACKED_B"] = 1
        common["TRANS_B"] = 0     # the packed panels are op(B), however B was stored
    if packed_a:
        if impl != "cpu" or trans_a or ksplit:
            raise ValueError("gemm: packed_a needs the CPU kernel, op(A) = A and no ksplit")
        common["PACKED_A"] = 1
    extra = []
    if impl == "cpu":
        # CPU drivers: one work-item per bm x bn block (kernels/gemm_cpu.cl)
        kc, bm_max, bn_max = cpu_panels(dev, M, K)
        bm, bn = cpu_blocks(dev, M, N, gz, bm_max, bn_max, packed_a)
        t = dict(KC=kc, BM_MAX=bm_max, BN_MAX=bn_max, VW=cpu_vw(dev))
        src, lx, ly = "gemm_cpu.cl", 1, 1
        gx, gy = -(-N // bn), -(-M // bm)
        extra = [bm, bn, int(nsplit), int(nstride[0]), int(nstride[1]),
                 int(ksplit), int(kstride[0]), int(kstride[1])]
        extra += [int(v) for v in (conv if conv is not None else (0,) * 9)]
    else:
        t = gemm_tiles(dev, M, N, K, gz, tiles)
        fold_a = fold_b = ()
        extra = [int(kstride[0]), int(kstride[1]), int(kchunk), int(nstride[0]), int(nstride[1])]
        if ksplit:       # images folded into K (gemm.cl KFOLD), K split in kchunks
            common["KFOLD"] = int(ksplit)
            fold_a, fold_b = (kstride[0], ksplit), (kstride[1], ksplit)
        if nsplit:       # images folded into N (gemm.cl NFOLD)
            common["NFOLD"] = int(nsplit)
            if nsplit_b:
                fold_b = (nstride[0], nsplit)
            else:
                common["NFOLD_B"] = 0
        t.update(async_tiles(dev, t, _rows_aligned(lda, off_a, tuple(stride_a) + fold_a),
                             _rows_aligned(ldb, off_b, tuple(stride_b) + fold_b)))
        if t["STAGED"] and config.get("GEMM_VSTORE4") and _rows_aligned(
                ldc, off_c, tuple(stride_c) + ((nstride[1], nsplit) if nsplit else ())) \
                and (residual is None or int(off_residual) % 4 == 0):
            t["VSTORE4"] = 1     # 16-byte stores of the staged tile (tile_store.h)
        src = SRC
        lx, ly = tile_threads(t), 1
        gx = -(-N // t["TN"]) * lx
        gy = -(-M // t["TM"])
    defines = dict(t, **common)
    args = [M, N, K, alpha,
            A, off_a, lda, stride_a[0], stride_a[1],
            B, off_b, ldb, stride_b[0], stride_b[1],
            beta,
            C, off_c, ldc, stride_c[0], stride_c[1],
            bias if bias is not None else A, off_bias, act_a, act_b] + extra
    args += [C, off_c] if residual is None else [residual, off_residual]
    return dev.launch(act_program(dev, src, act), "gemm", (gx, gy, gz), (lx, ly, 1), args,
                      defines)


def packed_a_floats(M, K):
    """Floats of one M x K operand packed by ``pack_a`` (rows rounded up to
    the micro-kernel's 6)."""
    return -(-int(M) // CPU_MR) * CPU_MR * int(K)


def pack_a(dev, M, K, src, dst, groups=1, off_src=0):
    """Launch writing ``groups`` row-major M x K matrices (src + off_src,
    one after another) into ``dst`` as kernels/gemm_cpu.cl reads a packed
    op(A) (``gemm(..., packed_a=True)``; kernels/gemm_cpu_pack.cl)."""
    mp = -(-int(M) // CPU_MR) * CPU_MR
    panels = int(groups) * mp // CPU_MR
    return dev.launch("gemm_cpu_pack.cl", "pack_a_panels", (max(panels, 1),), (1,),
                      [panels, int(M), int(K), mp, src, int(off_src), dst])


def packed_b_floats(dev, N, K):
    """Floats of an op(B) of N columns and K rows packed by ``pack_b_conv``
    (columns rounded up to the micro-tile's cpu_nr)."""
    nr = cpu_nr(dev)
    return -(-int(N) // nr) * nr * int(K)


# pack_b_conv, pack_b_panels: rows of K per work-item (a chunk of one panel)
PACK_B_KCHUNK = 64


def pack_b_panels(dev, N, K, src, dst, trans=True):
    """Launch packing op(B) (N columns, K rows: ``src`` stored N x K with
    ``trans``, as Caffe's InnerProduct weights, else K x N) into ``dst``
    as ``gemm(..., packed_b=True)`` reads it (kernels/gemm_cpu_pack.cl);
    ``dst`` holds packed_b_floats(dev, N, K) floats."""
    nr = cpu_nr(dev)
    items = -(-int(N) // nr) * -(-int(K) // PACK_B_KCHUNK)
    return dev.launch("gemm_cpu_pack.cl", "pack_b_panels", (max(items, 1),), (1,),
                      [int(N), int(K), nr, PACK_B_KCHUNK, int(bool(trans)), src, dst])


def pack_b_conv(dev, N, K, src, off_src, nsplit, nsb, conv, dst, off_dst=0):
    """Launch packing a CONV_B forward operand (the zero-padded images from
    ``src`` + ``off_src``, ``conv`` as ``gemm``'s; columns folded over
    images by ``nsplit`` / ``nsb``) into ``dst`` + ``off_dst`` as
    ``gemm(..., packed_b=True)`` reads it (kernels/gemm_cpu.cl pack_b_conv;
    one program for every geometry, which the kernel takes as arguments)."""
    panels = -(-int(N) // cpu_nr(dev))
    items = panels * -(-int(K) // PACK_B_KCHUNK)
    return dev.launch("gemm_cpu.cl", "pack_b_conv", (max(items, 1),), (1,),
                      [int(N), int(K), PACK_B_KCHUNK, src, int(off_src), int(nsplit), int(nsb)]
                      + [int(v) for v in conv] + [dst, int(off_dst)],
                      dict(CONV_B=1, VW=cpu_vw(dev), KC=cpu_kc(dev), BM_MAX=CPU_BM_MAX,
                           BN_MAX=CPU_BN_MAX))
