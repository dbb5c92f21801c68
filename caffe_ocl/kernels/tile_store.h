/* The store of the GPU matrix kernels' results, #included right after
 * tile_mainloop.h (same block).
 * STAGED == 1: a work-item's 8 x 8 results lie on rows and columns strided
 * across the tile (ROW_OF / COL_OF), so storing them directly makes each
 * warp-wide store touch 8-16 partly written 32-byte sectors; write-heavy
 * products (a 1x1 convolution from 64 to 256 channels) then ran at a fifth
 * of memory bandwidth. Staged, the tile goes through local memory, 32 rows
 * at a time (in the B tiles' space, free after the main loop's last
 * barrier), and is stored row by row: work-item lid owns column
 * n0 + lid % TN, so consecutive work-items write consecutive addresses and
 * the per-column address arithmetic is done once.
 * STAGED == 0: direct stores. The host stages only short products (K <=
 * ops/gemm.py STAGED_MAX_K): on the H200 the staged variant made long ones
 * (VGG's 3x3 convolutions by implicit GEMM, a 4096^3 GEMM) 15-25% slower
 * -- the kernel as a whole gets more registers -- and weight gradients
 * (small outputs, long K) up to 1.5x slower.
 *
 * The includer defines, before the #include:
 *   STORE_COL(n)         statements run once for this work-item's column n
 *                        (may declare variables; n may be >= N there, but
 *                        nothing is stored then);
 *   STORE_ROW(m, n, v)   statements storing result v of row m (< M) and
 *                        column n (< N), after alpha / bias / beta / act as
 *                        the kernel needs;
 * and has M, N, m0, n0, lid in scope; the main loop header defines ACC_M,
 * ACC_N (rows and columns of acc) and TILE_FLOATS_ (floats of its B tiles,
 * Bs).
 * An includer whose store adds beta times the old value (gemm.cl, the
 * implicit-GEMM backward-data) may define, instead of reading it in
 * STORE_ROW:
 *   PRIOR_AT(m, n)           the old value at (m, n) (a read);
 *   STORE_ROW_PRIOR(m, n, v, old)  the store given it;
 * then, when beta != 0, a work-item's old values of a row block are read
 * into registers before any of its stores: a read in STORE_ROW after the
 * previous row's store cannot be moved above it (the same buffer), so each
 * row waited a full memory latency (on the H200, ResNet-50's accumulating
 * 1x1 backward-data ran slower than a separate summing pass, and VGG-16's
 * fc6 weight gradient, K = 64 into a 4096 x 25088 dW, at ~9.5 TFLOP/s).
 * An includer that adds a tensor to every result (a shortcut summed by an
 * Eltwise, plan/residual.py) defines, for the same reason:
 *   ADDEND_AT(m, n)          that tensor's value at (m, n) (a read);
 * its values are read ahead of the stores as the old values are, and
 * STORE_ROW / STORE_ROW_PRIOR find the one of their (m, n) in ``addend_v``.
 * Read inside STORE_ROW, ResNet-50's fused 1x1 convolutions at batch 64
 * took 1.75x as long as the same convolution plus a summing pass. */
#ifdef PRIOR_AT
#define ROW_STORE_(m, n, v, i) STORE_ROW_PRIOR(m, n, v, prior_[i])
#else
#define ROW_STORE_(m, n, v, i) STORE_ROW(m, n, v)
#endif
#ifdef ADDEND_AT
#define ADDEND_V_(i) const float addend_v = addend_[i];
#else
#define ADDEND_V_(i)
#endif
#ifndef STAGED
#define STAGED 0
#endif
#if STAGED
#define LDC_ (TN + 8)   /* rows 8 banks apart: float2 (TF32) / float4 stores conflict-free */
#if 32 * LDC_ <= TILE_FLOATS_
#define EPI_ROWS_ 32
#else                   /* tile_mainloop_async.h with 2 stages */
#define EPI_ROWS_ 16
#endif
#if EPI_ROWS_ * LDC_ > TILE_FLOATS_
#error "tile_store.h: the staged rows do not fit the main loop's B tiles"
#endif
#if NT % TN || EPI_ROWS_ % (NT / TN)
#error "tile_store.h: the staged rows are not whole rows of work-items"
#endif
#ifndef VSTORE4
#define VSTORE4 0
#endif
#if VSTORE4
/* VSTORE4 (the host's promise that C's rows, and R's, start on 16 bytes,
 * that an image's columns under NFOLD are a multiple of 4, and that the
 * includer defines STORE_ROW4(m, n, acc4, old4, add4): the results of row m,
 * columns n .. n + 3): work-item lid stores 4 adjacent columns of the rows
 * lid / (TN / 4) + VROWS_ * i with one 16-byte store each. A tile of a
 * short product is nearly all store (a 1x1 convolution from 128 to 256
 * channels: 8 k-steps, then 64 KiB out per work-group), and one store per
 * float kept the H200's load/store units, not its memory, busy. */
#define VROWS_ (NT * 4 / TN)
#define VSTEPS_ (EPI_ROWS_ / VROWS_)
#if EPI_ROWS_ % VROWS_
#error "tile_store.h: the staged rows are not whole rows of 4-column work-items"
#endif
#ifdef PRIOR_AT
#define PRIOR4_(i) prior4_[i]
#else
#define PRIOR4_(i) ((float4)(0.0f))
#endif
#ifdef ADDEND_AT
#define ADDEND4_(i) addend4_[i]
#else
#define ADDEND4_(i) ((float4)(0.0f))
#endif
#endif
    {
        __local float* cs_ = Bs;
#if VSTORE4
        const int ec_ = (lid % (TN / 4)) * 4;     /* this work-item's 4 columns */
        const int en_ = n0 + ec_;
        const int eok_ = en_ < N, efull_ = en_ + 3 < N;
        STORE_COL(en_)
#else
        const int ec_ = lid % TN;
        const int en_ = n0 + ec_;
        const int eok_ = en_ < N;
        STORE_COL(en_)
#endif
#pragma unroll
        for (int h_ = 0; h_ < TM / EPI_ROWS_; ++h_) {
            barrier(CLK_LOCAL_MEM_FENCE);    /* previous readers of the local tiles are done */
#pragma unroll
            for (int i = 0; i < ACC_M; ++i) {
                const int r_ = ROW_OF(i);
                if (r_ / EPI_ROWS_ != h_) continue;
                __local float* crow_ = cs_ + (r_ - h_ * EPI_ROWS_) * LDC_;
#pragma unroll
                for (int j = 0; j < ACC_N; ++j) crow_[COL_OF(j)] = acc[i][j];
            }
            barrier(CLK_LOCAL_MEM_FENCE);
#if VSTORE4
            if (eok_) {
#ifdef PRIOR_AT
                float4 prior4_[VSTEPS_];
#pragma unroll
                for (int pi_ = 0; pi_ < VSTEPS_; ++pi_) {
                    const int em_ = m0 + h_ * EPI_ROWS_ + lid / (TN / 4) + pi_ * VROWS_;
                    prior4_[pi_] = (beta != 0.0f && em_ < M && efull_)
                        ? *(__global const float4*)&PRIOR_AT(em_, en_) : (float4)(0.0f);
                }
#endif
#ifdef ADDEND_AT
                float4 addend4_[VSTEPS_];
#pragma unroll
                for (int pi_ = 0; pi_ < VSTEPS_; ++pi_) {
                    const int em_ = m0 + h_ * EPI_ROWS_ + lid / (TN / 4) + pi_ * VROWS_;
                    addend4_[pi_] = (em_ < M && efull_)
                        ? *(__global const float4*)&ADDEND_AT(em_, en_) : (float4)(0.0f);
                }
#endif
#pragma unroll
                for (int pi_ = 0; pi_ < VSTEPS_; ++pi_) {
                    const int r_ = lid / (TN / 4) + pi_ * VROWS_;
                    const int em_ = m0 + h_ * EPI_ROWS_ + r_;
                    if (em_ >= M) break;
                    const float4 ev4_ = *(__local const float4*)(cs_ + r_ * LDC_ + ec_);
                    if (efull_) {
                        STORE_ROW4(em_, en_, ev4_, PRIOR4_(pi_), ADDEND4_(pi_))
                    } else {        /* the last columns of C, one by one */
                        const float evs_[4] = {ev4_.x, ev4_.y, ev4_.z, ev4_.w};
                        for (int j_ = 0; j_ < 4 && en_ + j_ < N; ++j_) {
                            STORE_COL(en_ + j_)
#ifdef ADDEND_AT
                            const float addend_v = ADDEND_AT(em_, en_ + j_);
#endif
#ifdef PRIOR_AT
                            STORE_ROW_PRIOR(em_, en_ + j_, evs_[j_],
                                            beta != 0.0f ? PRIOR_AT(em_, en_ + j_) : 0.0f)
#else
                            STORE_ROW(em_, en_ + j_, evs_[j_])
#endif
                        }
                    }
                }
            }
#else
            if (eok_) {
#ifdef PRIOR_AT
                float prior_[EPI_ROWS_ / (NT / TN)];
#pragma unroll
                for (int pi_ = 0; pi_ < EPI_ROWS_ / (NT / TN); ++pi_) {
                    const int em_ = m0 + h_ * EPI_ROWS_ + lid / TN + pi_ * (NT / TN);
                    prior_[pi_] = (beta != 0.0f && em_ < M) ? PRIOR_AT(em_, en_) : 0.0f;
                }
#endif
#ifdef ADDEND_AT
                float addend_[EPI_ROWS_ / (NT / TN)];
#pragma unroll
                for (int pi_ = 0; pi_ < EPI_ROWS_ / (NT / TN); ++pi_) {
                    const int em_ = m0 + h_ * EPI_ROWS_ + lid / TN + pi_ * (NT / TN);
                    addend_[pi_] = em_ < M ? ADDEND_AT(em_, en_) : 0.0f;
                }
#endif
#pragma unroll
                for (int pi_ = 0; pi_ < EPI_ROWS_ / (NT / TN); ++pi_) {
                    const int r_ = lid / TN + pi_ * (NT / TN);
                    const int em_ = m0 + h_ * EPI_ROWS_ + r_;
                    if (em_ >= M) break;
                    const float ev_ = cs_[r_ * LDC_ + ec_];
                    ADDEND_V_(pi_)
                    ROW_STORE_(em_, en_, ev_, pi_)
                }
            }
#endif
        }
    }
#undef EPI_ROWS_
#undef VROWS_
#undef VSTEPS_
#undef PRIOR4_
#undef ADDEND4_
#undef LDC_
#else
#pragma unroll
    for (int j = 0; j < ACC_N; ++j) {
        const int en_ = n0 + COL_OF(j);
        if (en_ >= N) continue;
        STORE_COL(en_)
#ifdef PRIOR_AT
        float prior_[ACC_M];
#pragma unroll
        for (int i = 0; i < ACC_M; ++i) {
            const int em_ = m0 + ROW_OF(i);
            prior_[i] = (beta != 0.0f && em_ < M) ? PRIOR_AT(em_, en_) : 0.0f;
        }
#endif
#ifdef ADDEND_AT
        float addend_[ACC_M];
#pragma unroll
        for (int i = 0; i < ACC_M; ++i) {
            const int em_ = m0 + ROW_OF(i);
            addend_[i] = em_ < M ? ADDEND_AT(em_, en_) : 0.0f;
        }
#endif
#pragma unroll
        for (int i = 0; i < ACC_M; ++i) {
            const int em_ = m0 + ROW_OF(i);
            if (em_ >= M) continue;
            ADDEND_V_(i)
            ROW_STORE_(em_, en_, acc[i][j], i)
        }
    }
#endif
#undef ROW_STORE_
#undef ADDEND_V_
