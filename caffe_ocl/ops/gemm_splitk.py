"""GEMM with K split over work-groups, for GPUs (kernels/splitk.cl).

A fully-connected layer at batch 64 is a GEMM with few rows (M = 64), a
few thousand columns and a long K (AlexNet fc6: 64 x 4096 x 9216): its
128 x 128 tiles number ~32, a quarter of an H200's 132 compute units. Split
K into ``nsplit`` equal chunks, run them as one batched GEMM into a
workspace, then sum the chunks with the usual epilogue (bias, beta, act).
Products with few rows of C = A B^T (a fully-connected layer's forward at
a small batch) take kernels of their own: gemm_small_m.cl on CPU drivers,
gemv.cl (a matrix-vector kernel, 1-8 rows) on GPUs.
``gemm_launches`` decides and falls back to one plain ``gemm``.
"""
import logging

from .. import config
from . import cpu_chunks, tuned, work_size
from .gemm import act_defines, act_program, deterministic, gemm, gpu_tiles, use_tf32

log = logging.getLogger("caffe_ocl")
_warned_stale = set()

SRC = "splitk.cl"
# The split aims for SPLIT_WGS_PER_CU work-groups per compute unit, in
# chunks of at least MIN_CHUNK of K, for TF32 tensor-core products; FP32
# ones (tile_mainloop.h's register-staged loop) by the _FP32 pair. H200,
# fully-connected forwards at batch 16-64 (bench_fc_splitk.py):
# - TF32: 4 per CU took AlexNet's fc6 (K 9216) and VGG-16's (K 25088) from
#   9 / 8 chunks to 16, 1.3-1.4x; fc7 (K 4096) split in 16 chunks of 256
#   was 1.05-1.2x slower than in 8 of 512, and 8 per CU or chunks down to
#   128 changed nothing else by more than 0.005 ms (twenty-seventh session).
# - FP32 (twenty-seventh session, `--min-chunks 512,256,128 --targets 4,8`,
#   the same at batch 16, 32 and 64): 8 per CU in chunks of >= 128 splits
#   fc6 in 32 (0.213 -> 0.182 ms at b64), VGG-16's fc6 in 32 (0.539 ->
#   0.458), fc8 (N 1000: 8 tiles) in 32 instead of 8 (0.057 -> 0.027);
#   fc7 in 32 instead of 8: 0.092 -> 0.097 at b64, 0.090 -> 0.085 at b16.
# - Short products (forty-sixth session, H100, `--batches 197 --shapes ...`):
#   a ViT's token-major MLP (197 x 192, K 768) ran 4 tiles of 128 x 128 for
#   0.111 ms in FP32; split in 6 chunks of 128, 0.025 (cuBLAS 0.027); the
#   old floor of K >= 2 * MIN_CHUNK in both precisions kept it whole. TF32
#   in 3 chunks of 256: 0.047 -> 0.020. K under 2 * MIN_CHUNK now splits
#   in chunks of >= MIN_CHUNK_SHORT in TF32, MIN_CHUNK_FP32 in FP32.
# - Products whose tiles fill half the compute units or more are not split
#   (forty-seventh session, H200, `bench_gemm_tiles.py`): Swin-T's last-stage
#   qkv (784 x 2304 x 768, 126 tiles) 0.114 ms whole against 0.140 in 6
#   chunks, MLP-Mixer's 8192 x 196 x 256 (128 tiles) 0.039 against 0.049
#   in 2; with fewer tiles the split still pays (BERT's 128 x 2304 x 768,
#   18 tiles: 0.110 -> 0.027). FP32 only: TF32 products still split below
#   one wave (not measured there).
# - Long reductions (forty-ninth session, H100, `bench_gemm_tiles.py
#   --splits`): with K >= LONG_K_MIN, FP32 products of 128-row tiles ran
#   fastest in chunks near LONG_K_CHUNK from 42 to 297 tiles (0.3 to 2.25
#   waves): a ViT's fc2 3152 x 384 x 1536 (75 tiles) whole 0.227 ms, in 2
#   chunks 0.168; ViT-B's 3152 x 768 x 3072 (150) 0.592 -> 0.468 in 4;
#   12608 x 384 x 1536 (297) 0.551 -> 0.481 in 2; below half a wave
#   784 x 768 x 3072 (42 tiles) 0.146 in 4 against 0.193 in the 24 chunks
#   of 128 the rule above gives. Such products split so whenever their
#   chunks make at least a wave of work-groups, up to LONG_K_MAX_WAVES of
#   tiles (not measured beyond). Fiftieth session (H100, held-out shapes,
#   `benchmarks/results/gpu_gemm_splits_longk_h100_s50.txt`): the rule's
#   factor was the fastest on 7 of 11, within 0.90 on 3; a ViT-S/8 at
#   batch 8 (1576 x 384 x 1536, 39 tiles: 2 chunks make 78 work-groups)
#   took 12 chunks of 128 from the per-unit rule, 0.099 ms, against 0.083
#   in 4 of 384 and 0.077 in 3: where chunks near 768 make under a wave,
#   the fewest chunks of at least LONG_K_WAVE_CHUNK that make one.
MIN_CHUNK = 512
MIN_CHUNK_SHORT = 256
SPLIT_WGS_PER_CU = 4
MIN_CHUNK_FP32 = 128
SPLIT_WGS_PER_CU_FP32 = 8
LONG_K_MIN = 1536
LONG_K_CHUNK = 768
LONG_K_MAX_WAVES = 2.5
LONG_K_WAVE_CHUNK = 384


def chunk_divisors(K, min_chunk=16):
    """Factors d > 1 that split K into equal chunks that are multiples of
    16 and at least ``min_chunk`` long."""
    return [d for d in range(2, K // 16 + 1)
            if K % d == 0 and (K // d) % 16 == 0 and K // d >= min_chunk]


def long_k_factor(dev, M, N, K):
    """nsplit for a long FP32 reduction by LONG_K_CHUNK (see above), or
    None where that rule does not apply: TF32, 64-row tiles (a
    fully-connected layer at a small batch streams its weights; the
    work-groups-per-unit rule was measured there), K < LONG_K_MIN, more than
    LONG_K_MAX_WAVES of tiles, or no chunks of LONG_K_WAVE_CHUNK or more
    that make a wave of work-groups."""
    t = gpu_tiles(dev, M)
    if t["TF32"] or t["TM"] != 128 or K < LONG_K_MIN:
        return None
    tiles = -(-M // t["TM"]) * -(-N // t["TN"])
    cus = max(dev.compute_units, 1)
    divisors = chunk_divisors(K)
    if tiles > LONG_K_MAX_WAVES * cus or not divisors:
        return None
    # the chunk nearest LONG_K_CHUNK by ratio (ties to the longer chunk)
    d = min(divisors, key=lambda d: (max(K / d, LONG_K_CHUNK) / min(K / d, LONG_K_CHUNK), d))
    if tiles * d >= cus:
        return d
    # under a wave: the fewest chunks, not shorter than LONG_K_WAVE_CHUNK, that make one
    return next((d for d in divisors if tiles * d >= cus and K // d >= LONG_K_WAVE_CHUNK), None)


def split_factor_of(name):
    """The factor n of a split's name "x<n>" (as `caffe_ocl tune` stores
    and prints it), or None for anything else."""
    if isinstance(name, str) and name[:1] == "x" and name[1:].isdigit() and int(name[1:]) >= 1:
        return int(name[1:])
    return None


def stored_split(dev, M, N, K):
    """The factor `caffe_ocl tune` stored for this product on ``dev``
    (tuning.py ``tune_products``; stored as "x<n>"), or None: none stored,
    switched off (CAFFE_OCL_TUNED=0), or one that does not divide K
    (reported once)."""
    choice = tuned.lookup(dev, tuned.gemm_split_key(M, N, K, use_tf32(dev)))
    if choice is None:
        return None
    factor = split_factor_of(choice)
    if factor is not None and K % factor == 0:
        return factor
    key = (M, N, K, repr(choice))
    if key not in _warned_stale:
        _warned_stale.add(key)
        log.warning("ignoring tuned K split %r for the %d x %d x %d product: it does not "
                    "divide K; `caffe_ocl tune` stores a new one", choice, M, N, K)
    return None


def splitk_factor(dev, M, N, K, stored=True):
    """nsplit for an M x N x K GEMM on ``dev``: on a GPU the factor
    `caffe_ocl tune` stored for it (``stored``: False gives the rules'
    own), else ``long_k_factor`` where it applies; else 1 (no split) on CPU drivers,
    when the tiles fill the compute units (FP32: half of them) or more, for
    K under two chunks, or when
    K has no divisor giving chunks of at least MIN_CHUNK (MIN_CHUNK_SHORT
    for K under 2 * MIN_CHUNK; MIN_CHUNK_FP32 without TF32) that are
    multiples of 16."""
    if not dev.is_gpu:
        return 1
    if stored:
        choice = stored_split(dev, M, N, K)
        if choice is not None:
            return choice
    long_k = long_k_factor(dev, M, N, K)
    if long_k is not None:
        return long_k
    t = gpu_tiles(dev, M)
    tiles = -(-M // t["TM"]) * -(-N // t["TN"])
    cus = max(dev.compute_units, 1)
    if tiles >= (cus if t["TF32"] else cus // 2):     # TF32: not measured at half a wave
        return 1
    per_cu, min_chunk = ((SPLIT_WGS_PER_CU, MIN_CHUNK) if t["TF32"] else
                         (SPLIT_WGS_PER_CU_FP32, MIN_CHUNK_FP32))
    if t["TF32"] and K < 2 * MIN_CHUNK:
        min_chunk = MIN_CHUNK_SHORT
    if K < 2 * min_chunk:
        return 1
    want = -(-per_cu * cus // tiles)
    return max((d for d in chunk_divisors(K, min_chunk) if d <= want), default=1)


SMALL_M_SRC = "gemm_small_m.cl"
SMALL_M_MAX = 32         # rows of C the CPU small-M kernel holds (SM_MAXM)
# Batch 1 (M = 1): rows of B taken SMALL_M_ONE_ROW at a time against the
# one row of A (SM_ONE_ROW in the kernel; 0: the general kernel, which
# pairs rows of A and so computed a copy of the one row and dropped it).
# 2-core EPYC Zen 3, PoCL 3.1, a fully-connected layer's launch alone,
# interleaved (11 rounds): 1280 / 2048 / 4096 / 512 -> 1000 and AlexNet's
# 9216 -> 4096 (151 MB of weights, read from memory) 0.77-1.02 of the
# general kernel's time (median 0.90; BENCHMARKS.md, thirty-third
# session); 4 rows at a time were level with 8.
SMALL_M_ONE_ROW = 8


def use_small_m(dev, M, N, K, trans_a, trans_b):
    """CPU drivers, C = A B^T with few rows (a fully-connected layer at a
    small batch): stream B once (kernels/gemm_small_m.cl)."""
    return bool(getattr(dev, "is_cpu", False)) and trans_b and not trans_a and \
        M <= SMALL_M_MAX and K >= 64 and N >= 16


def small_m(dev, M, N, K, A, B, C, *, alpha=1.0, beta=0.0, lda=None, ldb=None, ldc=None,
            bias=None, bias_axis=0, act=None, off_a=0, off_b=0, off_c=0):
    """One launch of gemm_small_m: C = act(alpha A B^T + bias + beta C),
    A [M][K], B [N][K], M <= SMALL_M_MAX (offsets in floats)."""
    if M > SMALL_M_MAX:
        raise ValueError(f"small_m: M = {M} > {SMALL_M_MAX}")
    act_kind, act_a, act_b = act_defines(act)
    items = cpu_chunks(dev, -(-N // 4), min_chunk=4)
    per = -(-(-(-N // items)) // 4) * 4                 # columns per work-item, x4
    items = -(-N // per)
    return dev.launch(act_program(dev, SMALL_M_SRC, act), "gemm_small_m", (items,), (1,),
                      [M, N, K, float(alpha), A, off_a, K if lda is None else lda,
                       B, off_b, K if ldb is None else ldb, float(beta),
                       C, off_c, N if ldc is None else ldc,
                       bias if bias is not None else A, act_a, act_b, per],
                      dict(SM_MAXM=SMALL_M_MAX, ACT=act_kind,
                           SM_ONE_ROW=SMALL_M_ONE_ROW if M == 1 else 0,
                           BIAS=0 if bias is None else (1 if bias_axis == 0 else 2)))


# CPU drivers, C = X op(W) with W constant (a TEST net's fully-connected
# layer): op(W) packed once into the micro-kernel's panels (rewritten after
# W changes; ops.gemm.pack_b_panels), so no block of rows packs it again
# -- and a transposed W is not gathered column by column from N rows.
# 2-core EPYC Zen 4, PoCL 3.1, one launch alone against the unpacked
# C = X W^T (BENCHMARKS.md, forty-seventh session): 197 x 768 x 192 1.16x,
# 49 x 256 x 512 2.1x, 16 x 768 x 384 2.2x (1.48x the small-M kernel's),
# 64 x 4096 x 9216 1.26x; the small-M kernel stays ahead at 1 row (70-77
# against 139-145 us; at 8 rows 0.86x and 1.17x in two runs). Weights over
# the byte limit are read as they are: the copy doubles their memory.
CPU_PACKED_FC_MIN_M = 9
CPU_PACKED_FC_MAX_BYTES = 64 << 20


def keeps_weights_packed(dev, M, N, K):
    """Whether a fully-connected product C[M, N] = X[M, K] op(W) on ``dev``
    reads op(W) from panels packed once (CPU drivers, setting
    CPU_PACKED_WEIGHTS, at least CPU_PACKED_FC_MIN_M rows -- any in
    deterministic mode, where the small-M kernel is not used --, weights of
    at most CPU_PACKED_FC_MAX_BYTES)."""
    return (bool(getattr(dev, "is_cpu", False)) and bool(config.get("CPU_PACKED_WEIGHTS"))
            and 0 < 4 * N * K <= CPU_PACKED_FC_MAX_BYTES
            and (M >= CPU_PACKED_FC_MIN_M or (M > 0 and deterministic())))


GEMV_SRC = "gemv.cl"
GEMV_MAX_M = 8           # rows of C (batch of a fully-connected layer) for gemv.cl
GEMV_WG = 256            # work-items per group
GEMV_ITEMS_PER_CU = 2048  # work-items per compute unit the column split aims for


def use_gemv(dev, M, N, K, trans_a, trans_b):
    """GPUs, C = A B^T with at most GEMV_MAX_M rows (a fully-connected layer
    at batch 1-8): a matrix-vector product whose time is reading B once
    (kernels/gemv.cl), where the tiled GEMM ran a 64-row tile for each."""
    return bool(getattr(dev, "is_gpu", False)) and trans_b and not trans_a and \
        1 <= M <= GEMV_MAX_M and K >= 32 and config.get("GEMV")


def gemv_threads(dev, N, K):
    """Work-items per column of gemv.cl: a power of two from 32 to GEMV_WG,
    enough that N columns give every compute unit about GEMV_ITEMS_PER_CU
    work-items (memory parallelism), but no more than K/4 (each reads at
    least one float4 of its row)."""
    want = -(-GEMV_ITEMS_PER_CU * max(int(dev.compute_units), 1) // max(N, 1))
    t = 32
    while t < GEMV_WG and t < want and 2 * t * 4 <= K:
        t *= 2
    return t


def gemv(dev, M, N, K, A, B, C, *, alpha=1.0, beta=0.0, lda=None, ldb=None, ldc=None,
         bias=None, bias_axis=0, act=None, off_a=0, off_b=0, off_c=0):
    """One launch of gemv_t: C = act(alpha A B^T + bias + beta C), A [M][K],
    B [N][K], M <= GEMV_MAX_M (offsets in floats)."""
    if not 1 <= M <= GEMV_MAX_M:
        raise ValueError(f"gemv: M = {M} outside 1..{GEMV_MAX_M}")
    lda = K if lda is None else lda
    ldb = K if ldb is None else ldb
    ldc = N if ldc is None else ldc
    act_kind, act_a, act_b = act_defines(act)
    t = gemv_threads(dev, N, K)
    vec = int(all(int(v) % 4 == 0 for v in (lda, ldb, off_a, off_b)))
    groups = -(-N // (GEMV_WG // t))
    return dev.launch(act_program(dev, GEMV_SRC, act), "gemv_t", (groups * GEMV_WG,), (GEMV_WG,),
                      [N, K, float(alpha), A, off_a, lda, B, off_b, ldb, float(beta),
                       C, off_c, ldc, bias if bias is not None else A, act_a, act_b],
                      dict(GV_M=int(M), GV_T=t, GV_WG=GEMV_WG, GV_VEC=vec, ACT=act_kind,
                           BIAS=0 if bias is None else (1 if bias_axis == 0 else 2)))


def adds_residual(dev, M, N, K, trans_a=False, trans_b=False):
    """Whether ``gemm_launches`` can add a residual to the product: its
    ``gemm`` launch or its split's reducing launch can, the small-M kernel
    and the matrix-vector kernel cannot."""
    if deterministic():
        return True
    return not (use_small_m(dev, M, N, K, trans_a, trans_b)
                or use_gemv(dev, M, N, K, trans_a, trans_b))


def gemm_launches(dev, M, N, K, A, B, C, *, trans_a=False, trans_b=False, alpha=1.0,
                  beta=0.0, lda=None, ldb=None, ldc=None, bias=None, bias_axis=0,
                  act=None, nsplit=None, off_a=0, off_b=0, off_c=0, residual=None):
    """[launches] computing C = act(alpha*op(A)op(B) + bias + beta*C), as
    ops.gemm.gemm (one problem; offsets in floats), split along K when it
    pays (``nsplit`` forces a factor that divides K). In deterministic mode
    (gemm.deterministic) neither the small-M kernels (CPU: gemm_small_m.cl,
    GPU: gemv.cl) nor a split of K, which all depend on M (the batch of a
    fully-connected layer). residual: a buffer laid out as C added before
    the activation (as ``gemm``'s, in C's layout from off_c); only where
    ``adds_residual`` or with ``nsplit`` given."""
    if residual is not None and nsplit is None \
            and not adds_residual(dev, M, N, K, trans_a, trans_b):
        raise ValueError("gemm_launches: a residual needs a gemm launch or a split of K "
                         "(not the small-M or matrix-vector kernel)")
    if nsplit is None and deterministic():
        nsplit = 1
    if nsplit is None and use_small_m(dev, M, N, K, trans_a, trans_b):
        return [small_m(dev, M, N, K, A, B, C, alpha=alpha, beta=beta, lda=lda, ldb=ldb,
                        ldc=ldc, bias=bias, bias_axis=bias_axis, act=act, off_a=off_a,
                        off_b=off_b, off_c=off_c)]
    if nsplit is None and use_gemv(dev, M, N, K, trans_a, trans_b):
        return [gemv(dev, M, N, K, A, B, C, alpha=alpha, beta=beta, lda=lda, ldb=ldb,
                     ldc=ldc, bias=bias, bias_axis=bias_axis, act=act, off_a=off_a,
                     off_b=off_b, off_c=off_c)]
    if nsplit is None:
        nsplit = splitk_factor(dev, M, N, K)
    if nsplit <= 1:
        return [gemm(dev, M, N, K, A, B, C, trans_a=trans_a, trans_b=trans_b, alpha=alpha,
                     beta=beta, lda=lda, ldb=ldb, ldc=ldc, bias=bias, bias_axis=bias_axis,
                     act=act, off_a=off_a, off_b=off_b, off_c=off_c, residual=residual,
                     off_residual=off_c, tiles="auto")]
    if K % nsplit:
        raise ValueError(f"gemm_launches: nsplit {nsplit} does not divide K = {K}")
    lda = lda if lda is not None else (M if trans_a else K)
    ldb = ldb if ldb is not None else (K if trans_b else N)
    ldc = ldc if ldc is not None else N
    kc = K // nsplit
    ws = dev.shared_scratch(nsplit * M * N)
    # chunk s starts at column s*kc of op(A) and row s*kc of op(B)
    sa = kc * lda if trans_a else kc
    sb = kc if trans_b else kc * ldb
    partial = gemm(dev, M, N, kc, A, B, ws, trans_a=trans_a, trans_b=trans_b, alpha=alpha,
                   lda=lda, ldb=ldb, ldc=N, batch=nsplit, stride_a=(sa, 0),
                   stride_b=(sb, 0), stride_c=(M * N, 0), impl="tiled",
                   off_a=off_a, off_b=off_b, tiles="auto")
    act_kind, act_a, act_b = act_defines(act)
    g, l = work_size(dev, M * N)
    reduce = dev.launch(act_program(dev, SRC, act), "gemm_splitk_reduce", g, l,
                        [M, N, nsplit, ws, float(beta), C, off_c, ldc,
                         bias if bias is not None else ws, 0, act_a, act_b,
                         residual if residual is not None else ws, off_c],
                        dict(BIAS=0 if bias is None else (1 if bias_axis == 0 else 2),
                             ACT=act_kind, RESIDUAL=int(residual is not None)))
    return [partial, reduce]
