/* The main loop of the GPU matrix kernels (gemm.cl, conv_igemm.cl), written
 * once and #included INSIDE a kernel body, at its outermost block (it
 * declares the __local tiles).
 *
 * A work-group of NT = TM*TN/64 work-items computes a TM x TN block of
 * C = op(A) * op(B) over k in [kbeg, kend), TK at a time, with two local
 * buffers (the next tile is fetched from global memory into registers while
 * the current one is multiplied; one barrier per TK step).
 *
 * The includer defines, before the #include:
 *   LOAD_A(m, k), LOAD_B(k, n)  -> float, 0 outside the problem (m, k, n
 *       are absolute indices: m0 + .., kbeg + .., n0 + ..);
 *   A_KFAST / B_KFAST  1 when consecutive k are adjacent in memory for that
 *       operand (the fetch mapping then walks k across work-items);
 *   variables lid (local id), m0, n0 (tile origin), kbeg, kend.
 * After it: float acc[MICRO][MICRO] holds this work-item's results, the
 * element acc[i][j] being C[m0 + ROW_OF(i)][n0 + COL_OF(j)]; tile_store.h
 * writes them out coalesced.
 *
 * Compute: TF32 == 0: strict FP32, each work-item an 8 x 8 register tile
 * (rows ty*4 + 0..3 and TM/2 + ty*4 + 0..3, likewise columns), float4 reads
 * of local memory; or, with MICRO == 4 (ops/conv.py small_tiles: batch-1
 * forwards whose few tiles leave most compute units idle), a 4 x 4 tile
 * (rows ty*4 + 0..3, columns tx*4 + 0..3) on 64 x 64 blocks: four times the
 * work-items per result, so a tile's main loop takes a quarter of the
 * time when the device has compute units to spare. TF32 == 1 (NVIDIA only): tensor cores through inline
 * PTX mma.sync.m16n8k8 tf32 (operands rounded to TF32 when stored to local
 * memory, FP32 accumulation); each warp owns a 64 x 32 block. */
#ifndef TK
#define TK 16
#endif
#ifndef TF32
#define TF32 0
#endif
#ifndef MICRO
#define MICRO 8
#endif
#define NT (TM * TN / (MICRO * MICRO))
/* columns of B each work-item fetches (1 unless TN > NT) */
#if TN > NT
#define B_SETS (TN / NT)
#else
#define B_SETS 1
#endif
/* LOAD_B_AT(i, k, n): the i-th fetch of a work-item; includers whose
 * LOAD_B needs per-column state (conv_igemm.cl's gather) define it to pick
 * set i % B_SETS */
#ifndef LOAD_B_AT
#define LOAD_B_AT(i, k, n) LOAD_B(k, n)
#endif
#define LDA_ (TM + 8)   /* +8: conflict-free TF32 fragment reads, float4-aligned */
#define LDB_ (TN + 8)
#define A_PER (TM * TK / NT)
#define B_PER (TN * TK / NT)
#define ACC_N MICRO                  /* for tile_store.h */
#define ACC_M MICRO
#define TILE_FLOATS_ (2 * TK * LDB_)
#if MICRO == 8 && ((TM != 64 && TM != 128) || TN != 128) \
        && !(TM == 32 && TN == 256 && !TF32) || TK % 8
#error "tile_mainloop.h: TM must be 64 or 128, TN 128 (or 32 x 256 in FP32), TK a multiple of 8"
#endif
#if MICRO == 4 && (TM != 64 || TN != 64 || TF32)
#error "tile_mainloop.h: MICRO 4 is FP32 on 64 x 64 tiles"
#endif
#if MICRO != 8 && MICRO != 4
#error "tile_mainloop.h: MICRO must be 8 or 4"
#endif

/* Fetch mapping. A k-fast operand is read by runs of 4 work-items along k
 * (16 bytes) on 8 rows per warp, not 16 along k on 2 rows: stored to local
 * tile[k][m] (rows LDA_ = 8 banks apart), 16 k of 2 rows hit 8 banks 4
 * times over; 4 k of 8 rows hit 32 different banks. */
#if A_KFAST
#define A_MM(i) (lid / 4 + (NT / 4) * ((i) / (TK / 4)))
#define A_KK(i) (lid % 4 + 4 * ((i) % (TK / 4)))
#else
#define A_MM(i) (lid % TM)
#define A_KK(i) (lid / TM + (i) * (NT / TM))
#endif
#if B_KFAST
#define B_NN(i) (lid / 4 + (NT / 4) * ((i) / (TK / 4)))
#define B_KK(i) (lid % 4 + 4 * ((i) % (TK / 4)))
#elif NT >= TN
#define B_NN(i) (lid % TN)
#define B_KK(i) (lid / TN + (i) * (NT / TN))
#else
/* fewer work-items than columns (32 x 256 tiles): each fetches B_SETS
 * columns, lid + s * NT, s = i % B_SETS (a compile-time constant once the
 * fetch loops unroll, so an includer's per-column state can be an array) */
#define B_NN(i) (lid + NT * ((i) % B_SETS))
#define B_KK(i) ((i) / B_SETS)
#endif

#if TF32
#define TO_LOCAL(v) tf32_round(v)
/* A's rows are stored permuted within each 16-row block (row r at 2r for
 * r < 8, at 2(r-8)+1 otherwise), so the two rows gid and gid + 8 of an mma
 * A fragment are adjacent: one 8-byte local read instead of two 4-byte */
#define A_POS(m) (((m) & ~15) | (((m) & 7) << 1) | (((m) >> 3) & 1))
#else
#define TO_LOCAL(v) (v)
#define A_POS(m) (m)
#endif

    /* two arrays, not one carved in two: with one, the compiler could no
     * longer tell the A and B tiles apart and the big convolutions ran
     * 20-40% slower on the H200. tile_store.h stages results in Bs. */
    __local float4 As4_[2 * TK * LDA_ / 4];
    __local float4 Bs4_[2 * TK * LDB_ / 4];
    __local float* As = (__local float*)As4_;
    __local float* Bs = (__local float*)Bs4_;
#if TF32 == 2
    __local float mma_xch_[NT * 6];       /* mma_tf32.h's emulation */
#endif

    float acc[MICRO][MICRO];
#pragma unroll
    for (int i = 0; i < MICRO; ++i)
#pragma unroll
        for (int j = 0; j < MICRO; ++j) acc[i][j] = 0.0f;

#if TF32
    const int lane_ = lid & 31, warp_ = lid >> 5;
    const int wm_ = warp_ / (TN / 32), wn_ = warp_ % (TN / 32);
    const int gid_ = lane_ >> 2, tig_ = lane_ & 3;
#define ROW_OF(i) (wm_ * 64 + ((i) >> 1) * 16 + gid_ + ((i) & 1) * 8)
#define COL_OF(j) (wn_ * 32 + ((j) >> 1) * 8 + tig_ * 2 + ((j) & 1))
#elif MICRO == 4
    const int tx_ = lid % (TN / 4), ty_ = lid / (TN / 4);
#define ROW_OF(i) (ty_ * 4 + (i))
#define COL_OF(j) (tx_ * 4 + (j))
#else
    const int tx_ = lid % (TN / 8), ty_ = lid / (TN / 8);
#define ROW_OF(i) (((i) >> 2) * (TM / 2) + ty_ * 4 + ((i) & 3))
#define COL_OF(j) (((j) >> 2) * (TN / 2) + tx_ * 4 + ((j) & 3))
#endif

    float ra_[A_PER], rb_[B_PER];
    const int nkt_ = kend > kbeg ? (kend - kbeg + TK - 1) / TK : 0;
    if (nkt_ > 0) {
#pragma unroll
        for (int i = 0; i < A_PER; ++i) ra_[i] = LOAD_A(m0 + A_MM(i), kbeg + A_KK(i));
#pragma unroll
        for (int i = 0; i < B_PER; ++i) rb_[i] = LOAD_B_AT(i, kbeg + B_KK(i), n0 + B_NN(i));
#pragma unroll
        for (int i = 0; i < A_PER; ++i) As[A_KK(i) * LDA_ + A_POS(A_MM(i))] = TO_LOCAL(ra_[i]);
#pragma unroll
        for (int i = 0; i < B_PER; ++i) Bs[B_KK(i) * LDB_ + B_NN(i)] = TO_LOCAL(rb_[i]);
    }
    barrier(CLK_LOCAL_MEM_FENCE);

    for (int kt_ = 0; kt_ < nkt_; ++kt_) {
        const int cur_ = kt_ & 1;
        const int more_ = kt_ + 1 < nkt_;
        if (more_) {
            const int k1_ = kbeg + (kt_ + 1) * TK;
#pragma unroll
            for (int i = 0; i < A_PER; ++i) ra_[i] = LOAD_A(m0 + A_MM(i), k1_ + A_KK(i));
#pragma unroll
            for (int i = 0; i < B_PER; ++i) rb_[i] = LOAD_B_AT(i, k1_ + B_KK(i), n0 + B_NN(i));
        }
        __local const float* as_ = As + cur_ * (TK * LDA_);
        __local const float* bs_ = Bs + cur_ * (TK * LDB_);
#if TF32
#pragma unroll
        for (int ks = 0; ks < TK; ks += 8) {
            uint af[4][4], bf[4][2];
#pragma unroll
            for (int mt = 0; mt < 4; ++mt) {
                __local const float* p = as_ + (ks + tig_) * LDA_ + wm_ * 64 + mt * 16 + 2 * gid_;
                const float2 lo = vload2(0, p), hi = vload2(0, p + 4 * LDA_);
                af[mt][0] = as_uint(lo.x);    /* (gid, tig) */
                af[mt][1] = as_uint(lo.y);    /* (gid + 8, tig) */
                af[mt][2] = as_uint(hi.x);    /* (gid, tig + 4) */
                af[mt][3] = as_uint(hi.y);    /* (gid + 8, tig + 4) */
            }
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                __local const float* p = bs_ + (ks + tig_) * LDB_ + wn_ * 32 + nt * 8 + gid_;
                bf[nt][0] = as_uint(p[0]);
                bf[nt][1] = as_uint(p[4 * LDB_]);
            }
#if TF32 == 2
#pragma unroll 1
#else
#pragma unroll
#endif
            for (int mt = 0; mt < 4; ++mt)
#if TF32 == 2      /* the emulation, 16 copies of barriers: slow to build */
#pragma unroll 1
#else
#pragma unroll
#endif
                for (int nt = 0; nt < 4; ++nt)
                    MMA_TF32(acc[2 * mt][2 * nt], acc[2 * mt][2 * nt + 1],
                             acc[2 * mt + 1][2 * nt], acc[2 * mt + 1][2 * nt + 1],
                             af[mt], bf[nt]);
        }
#elif MICRO == 4
#pragma unroll
        for (int kk = 0; kk < TK; ++kk) {
            const float4 a0 = *(__local const float4*)(as_ + kk * LDA_ + ty_ * 4);
            const float4 b0 = *(__local const float4*)(bs_ + kk * LDB_ + tx_ * 4);
            const float a[4] = {a0.x, a0.y, a0.z, a0.w};
            const float b[4] = {b0.x, b0.y, b0.z, b0.w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = mad(a[i], b[j], acc[i][j]);
        }
#else
#pragma unroll
        for (int kk = 0; kk < TK; ++kk) {
            __local const float* pa = as_ + kk * LDA_ + ty_ * 4;
            __local const float* pb = bs_ + kk * LDB_ + tx_ * 4;
            const float4 a0 = *(__local const float4*)pa;
            const float4 a1 = *(__local const float4*)(pa + TM / 2);
            const float4 b0 = *(__local const float4*)pb;
            const float4 b1 = *(__local const float4*)(pb + TN / 2);
            const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = mad(a[i], b[j], acc[i][j]);
        }
#endif
        if (more_) {
            __local float* an_ = As + (cur_ ^ 1) * (TK * LDA_);
            __local float* bn_ = Bs + (cur_ ^ 1) * (TK * LDB_);
#pragma unroll
            for (int i = 0; i < A_PER; ++i) an_[A_KK(i) * LDA_ + A_POS(A_MM(i))] = TO_LOCAL(ra_[i]);
#pragma unroll
            for (int i = 0; i < B_PER; ++i) bn_[B_KK(i) * LDB_ + B_NN(i)] = TO_LOCAL(rb_[i]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
