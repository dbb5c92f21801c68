/* The TF32 main loop of gemm.cl on NVIDIA GPUs: tensor cores fed by a
 * STAGES-deep pipeline of asynchronous global-to-local copies (PTX cp.async,
 * kernels/mma_tf32.h), #included INSIDE the kernel body, at its outermost
 * block, in place of tile_mainloop.h.
 *
 * Why a second loop: tile_mainloop.h stages the next tile in registers and
 * stores it to local memory itself (one tile ahead, one barrier per 16 k),
 * and spends ~9 instructions per mma on fragment loads and addresses; its
 * TF32 GEMMs ran at 82 TFLOP/s on the H200 (4096^3). Here the copy engine
 * fills local memory STAGES - 1 tiles ahead without registers, a warp owns
 * a 64 x WN block (WN 64: 128 results per work-item, so each float read
 * from local memory feeds more mma's), k-fast operands are read by
 * ldmatrix (one instruction per A fragment) and every fragment address is
 * a lane offset computed once plus a constant: 122 TFLOP/s (1.3-1.9x over
 * the four transpose cases).
 *
 * Operands stay FP32 in local memory (cp.async copies bytes); fragments are
 * rounded to TF32 (cvt.rna, as tile_mainloop.h) when read (feeding the raw
 * FP32 bits, which the tensor cores truncate, measured 8% faster).
 *
 * Local layout, per stage, without padding (3 stages of 128 x 16 for A and
 * B fill the 48 KiB an NVIDIA work-group may have), swizzled so that a
 * warp's fragment reads hit 32 different banks and 16-byte chunks stay
 * whole:
 *   k-fast operand (A not transposed, B transposed), row x of TK = 16 floats:
 *     chunk k / 4 of row x sits at chunk (k / 4) ^ ((x / 2) % 4);
 *   x-fast operand, row k of W floats: chunk x / 4 sits at (x / 4) ^ 2 (k % 4).
 *
 * Copies are 16 bytes, so the host uses this loop only where both
 * operands' rows start on 16-byte boundaries: 4-byte copies (of unaligned
 * rows, or of the implicit-GEMM convolutions' gathers) ran 1.3-1.6x slower
 * on the H200 than tile_mainloop.h's register-staged loads.
 * The includer (gemm.cl) defines, before the #include: A_KFAST / B_KFAST
 * (as for tile_mainloop.h), A_AT(m, k) / B_AT(k, n) (lvalues of the
 * matrices A and B), and has A, B, M, N, kbeg, kend (the product's k
 * range), m0, n0, lid in scope.
 * After it: float acc[8][ACC_N], acc[i][j] = C[m0 + ROW_OF(i)][n0 + COL_OF(j)],
 * for tile_store.h. */
#ifndef STAGES
#define STAGES 3
#endif
#ifndef WN
#define WN 64
#endif
#define NT ((TM / 64) * (TN / WN) * 32)
#define ACC_N (WN / 4)
#define ACC_M 8
#if TK != 16 || (TM != 64 && TM != 128) || TN != 128 || (WN != 32 && WN != 64) || NT % TN
#error "tile_mainloop_async.h: TK 16, TM 64 or 128, TN 128, WN 32 or 64, NT a multiple of TN"
#endif
#if !TF32
#error "tile_mainloop_async.h: the tensor-core (TF32) loop only"
#endif

#define POS_KF_(x, k) ((x) * TK + ((((k) >> 2) ^ (((x) >> 1) & 3)) << 2) + ((k) & 3))
#define POS_XF_(k, x, W) ((k) * (W) + ((((x) >> 2) ^ (((k) & 3) << 1)) << 2) + ((x) & 3))
#if A_KFAST
#define POS_A_(m, k) POS_KF_(m, k)
#else
#define POS_A_(m, k) POS_XF_(k, m, TM)
#endif
#if B_KFAST
#define POS_B_(k, n) POS_KF_(n, k)
#else
#define POS_B_(k, n) POS_XF_(k, n, TN)
#endif
#define TILE_FLOATS_ (STAGES * TN * TK)   /* tile_store.h stages results in Bs */

/* wait until at most STAGES - 2 groups of copies are in flight: the oldest,
 * tile kt's, has landed (cp.async.wait_group takes a literal) */
#if TF32 == 1
#if STAGES == 2
#define cp_async_wait_pending() asm volatile("cp.async.wait_group 0;")
#elif STAGES == 3
#define cp_async_wait_pending() asm volatile("cp.async.wait_group 1;")
#elif STAGES == 4
#define cp_async_wait_pending() asm volatile("cp.async.wait_group 2;")
#else
#error "tile_mainloop_async.h: STAGES 2 to 4"
#endif
#else
#define cp_async_wait_pending()
#endif

    __local float4 As4_[STAGES * TM * TK / 4];
    __local float4 Bs4_[STAGES * TN * TK / 4];
    __local float* As = (__local float*)As4_;
    __local float* Bs = (__local float*)Bs4_;
#if TF32 == 2
    __local float mma_xch_[NT * 6];
#endif

    float acc[8][ACC_N];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < ACC_N; ++j) acc[i][j] = 0.0f;

    const int lane_ = lid & 31, warp_ = lid >> 5;
    const int wm_ = warp_ / (TN / WN), wn_ = warp_ % (TN / WN);
    const int gid_ = lane_ >> 2, tig_ = lane_ & 3;
#define ROW_OF(i) (wm_ * 64 + ((i) >> 1) * 16 + gid_ + ((i) & 1) * 8)
#define COL_OF(j) (wn_ * WN + ((j) >> 1) * 8 + tig_ * 2 + ((j) & 1))

/* Copies of the k-tile starting at k = KT into the stage S of an operand
 * with TX rows or columns x (from X0, XN of them in the matrix), element
 * (x, k) at AT(x, k); every work-item takes chunks lid, lid + NT, ...
 * Bytes past the matrix are zero-filled (P: any valid address then).
 * k-fast: a chunk is 4 k of row x; x-fast: 4 x of row k. */
#define FETCH_KF_(KT, S, TX, X0, XN, AT, P) {                                    \
        for (int i_ = 0; i_ < TX * TK / 4 / NT; ++i_) {                           \
            const int c_ = lid + i_ * NT, x_ = c_ / (TK / 4), k_ = (c_ % (TK / 4)) * 4; \
            const int gx_ = (X0) + x_, gk_ = (KT) + k_;                           \
            const int nb_ = gx_ < (XN) ? clamp(kend - gk_, 0, 4) * 4 : 0;         \
            cp_async16((S) + POS_KF_(x_, k_), nb_ ? &AT(gx_, gk_) : (P), nb_);    \
        } }
#define FETCH_XF_(KT, S, TX, X0, XN, AT, P) {                                    \
        for (int i_ = 0; i_ < TX * TK / 4 / NT; ++i_) {                           \
            const int c_ = lid + i_ * NT, k_ = c_ / (TX / 4), x_ = (c_ % (TX / 4)) * 4; \
            const int gx_ = (X0) + x_, gk_ = (KT) + k_;                           \
            const int nb_ = gk_ < kend ? clamp((XN) - gx_, 0, 4) * 4 : 0;         \
            cp_async16((S) + POS_XF_(k_, x_, TX), nb_ ? &AT(gx_, gk_) : (P), nb_); \
        } }
#define A_XK_(m, k) A_AT(m, k)
#define B_XK_(n, k) B_AT(k, n)
#if A_KFAST
#define FETCH_A_(KT, AS) FETCH_KF_(KT, AS, TM, m0, M, A_XK_, A)
#else
#define FETCH_A_(KT, AS) FETCH_XF_(KT, AS, TM, m0, M, A_XK_, A)
#endif
#if B_KFAST
#define FETCH_B_(KT, BS) FETCH_KF_(KT, BS, TN, n0, N, B_XK_, B)
#else
#define FETCH_B_(KT, BS) FETCH_XF_(KT, BS, TN, n0, N, B_XK_, B)
#endif

    /* Fragment offsets of this lane within a stage, computed once (the loop
     * adds only constants). k-fast operands: ldmatrix.x4 (four 8 x 4 float
     * blocks, each lane giving one row's 16-byte address: lanes 8q..8q+7
     * rows of block q) loads a whole A fragment or two B fragments; rows
     * +16 are +256 floats and the swizzle term does not change. x-fast
     * operands: scalar reads; the swizzle term depends on the 8-column
     * group modulo 4 only, columns +32 are +32 floats. */
    const int lrow_ = lane_ & 7, lq_ = lane_ >> 3;
#if A_KFAST
    const int arow_ = wm_ * 64 + lrow_ + 8 * (lq_ & 1);
    const int aoff0_ = POS_KF_(arow_, 4 * (lq_ >> 1)), aoff1_ = POS_KF_(arow_, 8 + 4 * (lq_ >> 1));
#else
    int aoff_[4];     /* [(mt % 2) * 2 + (row + 8)] */
#pragma unroll
    for (int j = 0; j < 4; ++j)
        aoff_[j] = POS_XF_(tig_, wm_ * 64 + (j >> 1) * 16 + gid_ + (j & 1) * 8, TM);
#endif
#if B_KFAST
    const int brow_ = wn_ * WN + (lq_ >> 1) * 8 + lrow_;
    const int boff0_ = POS_KF_(brow_, 4 * (lq_ & 1)), boff1_ = POS_KF_(brow_, 8 + 4 * (lq_ & 1));
#else
    int boff_[4];     /* [nt % 4] */
#pragma unroll
    for (int j = 0; j < 4; ++j) boff_[j] = POS_XF_(tig_, wn_ * WN + j * 8 + gid_, TN);
#endif

    const int nkt_ = kend > kbeg ? (kend - kbeg + TK - 1) / TK : 0;
#pragma unroll
    for (int s_ = 0; s_ < STAGES - 1; ++s_) {
        if (s_ < nkt_) {
            FETCH_A_(kbeg + s_ * TK, As + s_ * (TM * TK))
            FETCH_B_(kbeg + s_ * TK, Bs + s_ * (TN * TK))
        }
        cp_async_commit();      /* empty groups too: the wait below counts groups */
    }
    int cur_ = 0, nxt_ = STAGES - 1;          /* stages of tiles kt and kt + STAGES - 1 */
    for (int kt_ = 0; kt_ < nkt_; ++kt_) {
        cp_async_wait_pending();              /* this work-item's copies of tile kt landed */
        barrier(CLK_LOCAL_MEM_FENCE);         /* everyone's; and stage nxt_ is no longer read */
        if (kt_ + STAGES - 1 < nkt_) {
            FETCH_A_(kbeg + (kt_ + STAGES - 1) * TK, As + nxt_ * (TM * TK))
            FETCH_B_(kbeg + (kt_ + STAGES - 1) * TK, Bs + nxt_ * (TN * TK))
        }
        cp_async_commit();
        __local const float* as_ = As + cur_ * (TM * TK);
        __local const float* bs_ = Bs + cur_ * (TN * TK);
#pragma unroll
        for (int ks = 0; ks < TK; ks += 8) {
            uint af[4][4], bf[WN / 8][2];
#pragma unroll
            for (int mt = 0; mt < 4; ++mt) {
#if A_KFAST
                LDSM_X4(af[mt], as_, (ks ? aoff1_ : aoff0_) + mt * 256);
#else
                __local const float* p_ = as_ + aoff_[(mt & 1) * 2] + (mt >> 1) * 32 + ks * TM;
                __local const float* q_ = as_ + aoff_[(mt & 1) * 2 + 1] + (mt >> 1) * 32 + ks * TM;
                af[mt][0] = as_uint(p_[0]);
                af[mt][1] = as_uint(q_[0]);
                af[mt][2] = as_uint(p_[4 * TM]);
                af[mt][3] = as_uint(q_[4 * TM]);
#endif
            }
#pragma unroll
            for (int nt = 0; nt < WN / 8; ++nt) {
#if B_KFAST
                if (nt % 2 == 0) {
                    uint r_[4];
                    LDSM_X4(r_, bs_, (ks ? boff1_ : boff0_) + nt * 128);
                    bf[nt][0] = r_[0]; bf[nt][1] = r_[1];
                    bf[nt + 1][0] = r_[2]; bf[nt + 1][1] = r_[3];
                }
#else
                __local const float* p_ = bs_ + boff_[nt & 3] + (nt >> 2) * 32 + ks * TN;
                bf[nt][0] = as_uint(p_[0]);
                bf[nt][1] = as_uint(p_[4 * TN]);
#endif
            }
#pragma unroll
            for (int mt = 0; mt < 4; ++mt)
#pragma unroll
                for (int e = 0; e < 4; ++e) af[mt][e] = as_uint(tf32_round(as_float(af[mt][e])));
#pragma unroll
            for (int nt = 0; nt < WN / 8; ++nt)
#pragma unroll
                for (int e = 0; e < 2; ++e) bf[nt][e] = as_uint(tf32_round(as_float(bf[nt][e])));
#if TF32 == 2
#pragma unroll 1
#else
#pragma unroll
#endif
            for (int mt = 0; mt < 4; ++mt)
#if TF32 == 2
#pragma unroll 1
#else
#pragma unroll
#endif
                for (int nt = 0; nt < WN / 8; ++nt)
                    MMA_TF32(acc[2 * mt][2 * nt], acc[2 * mt][2 * nt + 1],
                             acc[2 * mt + 1][2 * nt], acc[2 * mt + 1][2 * nt + 1],
                             af[mt], bf[nt]);
        }
        cur_ = cur_ + 1 == STAGES ? 0 : cur_ + 1;
        nxt_ = nxt_ + 1 == STAGES ? 0 : nxt_ + 1;
    }
    cp_async_wait_all();
#undef FETCH_KF_
#undef FETCH_XF_
#undef FETCH_A_
#undef FETCH_B_
