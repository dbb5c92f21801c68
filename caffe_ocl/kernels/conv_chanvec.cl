/* Convolutions (one group) of small planes on CPU drivers, vectorized over
 * output channels instead of pixels: 1x1 layers, and KH x KW layers read
 * from their zero-padded images (the CPU GEMM's pad_planes copy).
 *
 * The CPU GEMM (gemm_cpu.cl) puts pixels along its vectors: a 7 x 7 plane
 * (49 pixels) fills 49 of the 64 lanes of its two 32-column tiles, and its
 * blocks re-read the whole weight matrix for each block of columns. Here
 * the micro-tile is 6 pixels x NR output channels (NR = 2 * VW): per
 * column row k = (c, kh, kw), two vectors of NR channels' weights (packed
 * once: [ceil(M/NR)][K][NR], pack_w_chanvec) times 6 broadcast input
 * values, 12 accumulators. 49 pixels fill 49 of 54 rows, and channels
 * come in multiples of 8/16/32 in most nets. The tile is stored channel by
 * channel (6 pixels of each row of y; transposed on the way out, element
 * by element).
 *
 * Grouped convolutions: see PANEL_CHANNELS; K is one group's column rows.
 *
 * Layouts: x images (image i at X + offX + i * ldxI), y images [M][N]
 * (Y + offY + i * ldyI: a Concat's slice when ldyI > M * N), the residual
 * R laid out as y (from offR). Epilogue as the GEMM's: y = act(sum + bias
 * (+ R)), the sum over k in order (one fma chain per output, as
 * gemm_cpu.cl within a K panel).
 *
 * Work-items (work-groups of one): (panel of NR channels, chunk of pix
 * pixels, image). Host: caffe_ocl/ops/conv.py chanvec_forward. */
#include "common.h"
#include "act.h"

#ifndef VW
#define VW 16
#endif
#ifndef BIAS
#define BIAS 0
#endif
#ifndef RESIDUAL
#define RESIDUAL 0
#endif
/* GATE: x's channels scaled by gate[img * gate_stride + c] as the weights
 * of channel c are loaded (an SE block's channel scale applied by the
 * projection that reads it: plan/se.py, plan/residual.py) */
#ifndef GATE
#define GATE 0
#endif
#if VW == 16
#define floatV float16
#define vloadV vload16
#define vstoreV vstore16
#elif VW == 8
#define floatV float8
#define vloadV vload8
#define vstoreV vstore8
#else
#error "VW is 8 or 16"
#endif
#define NR (2 * VW)
#define MR 6
/* the kernel's geometry (compile-time, conv_geom.h: 1 x 1 stride 1 by
 * default; its PH, PW unused: X is then the zero-padded images
 * ([K / (KH * KW)][Hp][Wp], row Wp = wp, plane hwp; output rows of wo
 * pixels), column row k = (c, kh, kw) of pixel (ho, wo) read at
 * c * hwp + (ho * SH + kh * DH) * wp + wo * SW + kw * DW */
#include "conv_geom.h"

/* Groups: GROUPS groups of MG = M / GROUPS output channels, each reading
 * its K / (KH * KW) input channels; a group's channels fill PPG =
 * ceil(MG / NR) panels of their own (a panel never straddles two groups,
 * so its last one may be partial: RegNet's 16-channel groups fill one
 * panel of 16 at VW 8, ResNeXt's 4-channel ones a quarter of one). With
 * one group: panel p holds channels p * NR .. */
#ifndef GROUPS
#define GROUPS 1
#endif
/* GPAIR (groups of at most VW output channels, conv_chanvec only): a panel
 * holds two groups, group 2p in its first vector and group 2p + 1 in its
 * second (m1, mc1 of them; none past the last group), each vector's fmas
 * taking its own group's input value. A 16-lane panel of RegNet's
 * 8-channel groups is then full instead of half idle: twice the broadcasts
 * a step (12 for 12 fmas), half the steps. */
#ifndef GPAIR
#define GPAIR 0
#endif
#if GPAIR
#if defined(PIXMAX) || GATE
#error "GPAIR is conv_chanvec's, without a gate"
#endif
#define PANELS ((GROUPS + 1) / 2)
#define PANEL_CHANNELS(p, m0, mc)                                              \
    const int mg_ = M / GROUPS, grp = 2 * (p);                                 \
    const int m0 = grp * mg_, mc = mg_;                                        \
    const int m1 = m0 + mg_, mc1 = grp + 1 < GROUPS ? mg_ : 0;
/* lane j of panel p: output channel, and whether it has one */
#define PAIR_LANE(p, j) ((2 * (p) + (j) / VW) * (M / GROUPS) + (j) % VW)
#define PAIR_LANE_REAL(p, j) ((j) % VW < M / GROUPS && 2 * (p) + (j) / VW < GROUPS)
#else
#define PANELS (GROUPS * ((M / GROUPS + NR - 1) / NR))    /* over all groups */
#define PANEL_CHANNELS(p, m0, mc)                                              \
    const int mg_ = M / GROUPS, ppg_ = (mg_ + NR - 1) / NR;                    \
    const int grp = (p) / ppg_, pj_ = (p) - grp * ppg_;                        \
    const int m0 = grp * mg_ + pj_ * NR, mc = min(NR, mg_ - pj_ * NR);        \
    const int m1 = m0, mc1 = 0;     /* no second group: lanes j < mc hold m0 + j */
#endif

/* Wp[p][k][j] = W[channel j of panel p][k] (zero past the panel's channels;
 * W rows of K values, one group's column rows): one work-item per panel */
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void pack_w_chanvec(int M, int K, __global const float* W, __global float* Wp) {
    const int p = get_global_id(0);
    if (p >= PANELS) return;
    PANEL_CHANNELS(p, m0, mc)
    __global float* d = Wp + (size_t)p * K * NR;
    for (int j = 0; j < NR; ++j) {
#if GPAIR
        const bool real = PAIR_LANE_REAL(p, j);
        __global const float* s = W + (size_t)(real ? PAIR_LANE(p, j) : m0) * K;
#else
        const bool real = j < mc;
        __global const float* s = W + (size_t)(m0 + min(j, mc - 1)) * K;
#endif
        for (int k = 0; k < K; ++k) d[k * NR + j] = real ? s[k] : 0.0f;
    }
}

/* the 6 x NR tile of rows (pixels) n .. n + rows - 1, channels m0 ..: bias
 * (and without a residual the activation) on the vectors, then stored
 * channel by channel (with a residual: added, then activated, element by
 * element -- act(sum + bias + R) as the GEMM's epilogue) */
#if RESIDUAL
#define TILE_ACT(v, sv) (v)
#define ELEM_OUT(v, idx, ch) APPLY_ACT_CH((v) + Ri[idx], PRELU_SLOPE(bias, ch))
#else
#define TILE_ACT(v, sv) APPLY_ACT_VEC_LANES(v, floatV, sv)
#define ELEM_OUT(v, idx, ch) (v)
#endif
/* lanes j < mc of the tile to channels m0 + j (with one group a panel mc
 * runs up to NR, into the second vector), and with GPAIR the second
 * vector's lanes j < mc1 to the second group's channels m1 + j */
#define STORE_ROW(i, va, vb)                                                   \
    if ((i) < rows) {                                                          \
        float t_[NR];                                                          \
        vstoreV(TILE_ACT((va) + bv0, sv0), 0, t_);                             \
        vstoreV(TILE_ACT((vb) + bv1, sv1), 1, t_);                             \
        for (int j = 0; j < mc; ++j) {                                         \
            const size_t idx_ = (size_t)(m0 + j) * N + n + (i);                \
            Yi[idx_] = ELEM_OUT(t_[j], idx_, m0 + j);                          \
        }                                                                      \
        for (int j = 0; j < mc1; ++j) {                                        \
            const size_t idx_ = (size_t)(m1 + j) * N + n + (i);                \
            Yi[idx_] = ELEM_OUT(t_[VW + j], idx_, m1 + j);                     \
        }                                                                      \
    }

/* CHANVEC_ROW_STORES: a whole 6-pixel tile stored channel by channel, each
 * channel's 6 pixels (consecutive in y's plane) as a 4- and a 2-float
 * store from the tile spilled to private memory, instead of 6 scattered
 * scalar stores per channel */
#ifndef CHANVEC_ROW_STORES
#define CHANVEC_ROW_STORES 1
#endif
#define SPILL_ROW(i)                                                           \
    vstoreV(TILE_ACT(c##i##0 + bv0, sv0), 0, tt_[i]);                          \
    vstoreV(TILE_ACT(c##i##1 + bv1, sv1), 1, tt_[i]);
#if RESIDUAL
#define STORE_CH6(lane, ch)                                                    \
    {                                                                          \
        const size_t o_ = (size_t)(ch) * N + n;                                \
        float4 v4_ = (float4)(tt_[0][lane], tt_[1][lane], tt_[2][lane], tt_[3][lane]) \
                     + vload4(0, Ri + o_);                                     \
        float2 v2_ = (float2)(tt_[4][lane], tt_[5][lane]) + vload2(0, Ri + o_ + 4); \
        vstore4(APPLY_ACT_VEC_CH(v4_, float4, PRELU_SLOPE(bias, ch)), 0, Yi + o_); \
        vstore2(APPLY_ACT_VEC_CH(v2_, float2, PRELU_SLOPE(bias, ch)), 0, Yi + o_ + 4); \
    }
#else
#define STORE_CH6(lane, ch)                                                    \
    {                                                                          \
        const size_t o_ = (size_t)(ch) * N + n;                                \
        vstore4((float4)(tt_[0][lane], tt_[1][lane], tt_[2][lane], tt_[3][lane]), 0, Yi + o_); \
        vstore2((float2)(tt_[4][lane], tt_[5][lane]), 0, Yi + o_ + 4);         \
    }
#endif
/* a whole tile of NROWS rows (ROWS: their row macro list) spilled, then
 * stored channel by channel with STORE_CH (lane, channel) */
#define STORE_TILE_BY_CHANNEL(ROWS, NROWS, STORE_CH)                           \
    {                                                                          \
        float tt_[NROWS][NR];                                                  \
        ROWS(SPILL_ROW)                                                        \
        for (int j = 0; j < mc; ++j) STORE_CH(j, m0 + j)                       \
        for (int j = 0; j < mc1; ++j) STORE_CH(VW + j, m1 + j)                 \
    }

/* What both tile kernels start with: the work-item's panel of NR output
 * channels (m0, mc of them real) and pixel range [nbeg, nend) of image img,
 * its image's input, output and residual, its weight panel, and bv0 / bv1,
 * the panel's bias (the last channel repeated past M; zeros without BIAS).
 * Returns when the work-item has no panel or pixels. */
#if GPAIR
#define BIAS_LANE(j) (PAIR_LANE_REAL(p, j) ? PAIR_LANE(p, j) : m0)
#else
#define BIAS_LANE(j) (m0 + (j))
#endif
#if BIAS
#define CHANVEC_BIAS_VECTORS \
    floatV bv0, bv1; \
    { \
        float t[NR]; \
        for (int j = 0; j < NR; ++j) t[j] = bias[min(BIAS_LANE(j), M - 1)]; \
        bv0 = vloadV(0, t); \
        bv1 = vloadV(1, t); \
    }
#else
#define CHANVEC_BIAS_VECTORS const floatV bv0 = 0.0f, bv1 = 0.0f;
#endif
/* ... and sv0 / sv1, the panel's PReLU slopes (ACT 7: the op passes a bias) */
#if ACT == 7
#define CHANVEC_SLOPE_VECTORS \
    floatV sv0, sv1; \
    { \
        float t[NR]; \
        for (int j = 0; j < NR; ++j) t[j] = PRELU_SLOPE(bias, min(BIAS_LANE(j), M - 1)); \
        sv0 = vloadV(0, t); \
        sv1 = vloadV(1, t); \
    }
#else
#define CHANVEC_SLOPE_VECTORS
#endif
#define CHANVEC_PROLOGUE \
    const int p = get_global_id(0), img = get_global_id(2); \
    const int nbeg = get_global_id(1) * pix; \
    if (p >= PANELS || nbeg >= N) return; \
    PANEL_CHANNELS(p, m0, mc) \
    const int nend = min(N, nbeg + pix); \
    __global const float* Xi = X + offX + (size_t)img * ldxI \
                               + (size_t)grp * (K / (KH * KW)) * hwp; \
    __global float* Yi = Y + offY + (size_t)img * ldyI; \
    __global const float* Ri = R + offR + (size_t)img * ldyI; \
    __global const float* wpan = Wp + (size_t)p * K * NR; \
    __global const float* gi = gate + (size_t)img * gate_stride \
                               + (size_t)grp * (K / (KH * KW)); \
    CHANVEC_BIAS_VECTORS \
    CHANVEC_SLOPE_VECTORS

/* Offsets o<i> of a tile's pixels n + i (past the chunk's end the last
 * again, not stored) at their tap (0, 0) in the (padded) image: TILE_POS
 * finds the first pixel's output row and column (one division), DECL_OFF
 * steps along the row (not a division and a remainder per pixel) */
#define TILE_POS int ho_ = n / wo, wo_ = n - ho_ * wo; ho_ -= ho_base;
#define DECL_OFF(i)                                                            \
    const int o##i = ho_ * SH * wp + wo_ * SW;                                 \
    if (n + (i) + 1 < nend && ++wo_ == wo) {                                   \
        wo_ = 0;                                                               \
        ++ho_;                                                                 \
    }
#define TILE6(X) X(0) X(1) X(2) X(3) X(4) X(5)
/* a tile row's two accumulators (pixel i x NR channels): declared, zeroed,
 * one column row's fmas (its input value broadcast), stored */
#define DECL_ACC(i) floatV c##i##0, c##i##1;
#define ZERO_ACC(i) c##i##0 = c##i##1 = 0.0f;
#if GPAIR
/* the second vector's group: its input channels xoff1 floats further on
 * (0 where the panel has no second group: its weights are zeros) */
#define FMA_ROW(i)                                                             \
    {                                                                          \
        c##i##0 = fma((floatV)xk[o##i], w0, c##i##0);                          \
        c##i##1 = fma((floatV)xk[xoff1 + o##i], w1, c##i##1);                  \
    }
#else
#define FMA_ROW(i)                                                             \
    {                                                                          \
        const floatV a_ = (floatV)xk[o##i];                                    \
        c##i##0 = fma(a_, w0, c##i##0);                                        \
        c##i##1 = fma(a_, w1, c##i##1);                                        \
    }
#endif
#define STORE_TILE_ROW(i) STORE_ROW(i, c##i##0, c##i##1)
/* GATE: the work-item's weight panel, each channel's rows times its gate,
 * copied once into __local memory (GATE_FLOATS >= K * NR) and read from
 * there: scaling the two weight vectors at every tile's every channel
 * (two more multiplies a 12-fma step) made RegNet's 208- and 440-channel
 * projections slower than the Scale's pass it saved */
#if GATE
#define WSPACE __local
#define GATE_PANEL                                                             \
    for (int k = 0; k < K; ++k) {                                              \
        const float gk = gi[k / (KH * KW)];                                    \
        vstoreV(vloadV(0, wpan + k * NR) * gk, 0, wsc + k * NR);               \
        vstoreV(vloadV(1, wpan + k * NR) * gk, 1, wsc + k * NR);               \
    }
#define WPANEL wsc
#else
#define WSPACE __global
#define GATE_PANEL
#define WPANEL wpan
#endif

/* TAP_MASK (host: ops/conv.py chanvec_tap_mask; needs PH, PW): the
 * tile's rows and columns of taps that read the image, not its padding,
 * for at least one of its pixels (rmask bit kh, cmask bit kw: unions over
 * the tile's pixels, so a tile across two output rows keeps both rows'
 * taps); the others are skipped. They only added zeros: the sums are the
 * same. Dilated layers on small planes (DeepLab's ASPP: 3 x 3, dilation 12
 * on 14 x 14 or 28 x 28) spent most of their multiply-adds on padding:
 * for the edge taps only the outputs within the dilation of the far side
 * read the image. */
#ifndef TAP_MASK
#define TAP_MASK 0
#endif
#if TAP_MASK
#define TAP_MASKS                                                              \
    int rmask = 0, cmask = 0;                                                  \
    {                                                                          \
        int h_ = n / wo, w_ = n - h_ * wo;                                     \
        for (int i = 0; i < rows; ++i) {                                       \
            for (int t = 0; t < KH; ++t) {                                     \
                const int r_ = h_ * SH + t * DH - PH;                          \
                if (r_ >= 0 && r_ < ih) rmask |= 1 << t;                       \
            }                                                                  \
            for (int t = 0; t < KW; ++t) {                                     \
                const int q_ = w_ * SW + t * DW - PW;                          \
                if (q_ >= 0 && q_ < iw) cmask |= 1 << t;                       \
            }                                                                  \
            if (++w_ == wo) {                                                  \
                w_ = 0;                                                        \
                ++h_;                                                          \
            }                                                                  \
        }                                                                      \
    }
#else
#define TAP_MASKS
#endif

/* LPAD_FLOATS (host: ops/conv.py _chanvec_local_pad): X is the images
 * unpadded (planes of hwp = ih * iw floats), and each work-item first
 * copies the input rows its chunk of pixels reads, zero-padded (PH, PW;
 * rows of wp = iw + 2 * PW), of its group's channels into __local memory,
 * then reads them there as it would the padded copy. That copy was a
 * launch of its own (pad_planes) before every padded KH x KW layer, made
 * by other work-items than the ones reading it. Panels of one group and
 * chunks sharing rows each copy them again: a copy of about
 * 1 / (2 * KH * KW) of the work-item's fmas. */
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void conv_chanvec(int M, int N, int K, int pix,
                     __global const float* Wp, __global const float* X, int offX, int ldxI,
                     __global const float* bias, __global float* Y, int offY, int ldyI,
                     __global const float* R, int offR, float act_a, float act_b,
                     int wp, int hwp, int wo, int ih, int iw,
                     __global const float* gate, int gate_stride) {
#ifdef LPAD_FLOATS
    __local float xl[LPAD_FLOATS];
#endif
#if GATE
    __local float wsc[GATE_FLOATS];
#endif
    CHANVEC_PROLOGUE
    GATE_PANEL
    const int C = K / (KH * KW);
#ifdef LPAD_FLOATS
    /* output rows ho_base .. of the chunk read padded rows ho_base * SH ..
     * (lrows of them, a plane of lplane floats per channel) */
    const int ho_base = nbeg / wo;
    const int lrows = ((nend - 1) / wo - ho_base) * SH + (KH - 1) * DH + 1;
    const int lplane = lrows * wp;
#if GPAIR
    const int ccopy = mc1 ? 2 * C : C;      /* the second group's channels follow */
#else
    const int ccopy = C;
#endif
    for (int c = 0; c < ccopy; ++c)
        for (int r = 0; r < lrows; ++r) {
            __local float* d = xl + c * lplane + r * wp;
            const int y = ho_base * SH + r - PH;
            if (y < 0 || y >= ih) {
                for (int j = 0; j < wp; ++j) d[j] = 0.0f;
                continue;
            }
            __global const float* s = Xi + (size_t)c * hwp + (size_t)y * iw;
            for (int j = 0; j < PW; ++j) d[j] = 0.0f;
            int j = 0;
            for (; j + 8 <= iw; j += 8) vstore8(vload8(0, s + j), 0, d + PW + j);
            for (; j < iw; ++j) d[PW + j] = s[j];
            for (j = PW + iw; j < wp; ++j) d[j] = 0.0f;
        }
    __local const float* xbase = xl;
    const int xplane = lplane;
#else
    const int ho_base = 0;
    __global const float* xbase = Xi;
    const int xplane = hwp;
#endif
#if GPAIR
    const int xoff1 = mc1 ? C * xplane : 0;
#endif
    for (int n = nbeg; n < nend; n += MR) {
        const int rows = min(MR, nend - n);
        TAP_MASKS
        TILE_POS
        TILE6(DECL_OFF)
        TILE6(DECL_ACC)
        TILE6(ZERO_ACC)
        WSPACE const float* wk = WPANEL;
        for (int c = 0; c < C; ++c) {
#pragma unroll
            for (int kh = 0; kh < KH; ++kh) {
#if TAP_MASK
                if (!((rmask >> kh) & 1)) {
                    wk += KW * NR;
                    continue;
                }
#endif
#pragma unroll
                for (int kw = 0; kw < KW; ++kw) {
#if TAP_MASK
                    if (!((cmask >> kw) & 1)) {
                        wk += NR;
                        continue;
                    }
#endif
                    const floatV w0 = vloadV(0, wk), w1 = vloadV(1, wk);
                    wk += NR;
#ifdef LPAD_FLOATS
                    __local const float* xk = xbase + c * xplane + kh * DH * wp + kw * DW;
#else
                    __global const float* xk = xbase + (size_t)c * xplane + kh * DH * wp + kw * DW;
#endif
                    TILE6(FMA_ROW)
                }
            }
        }
#if CHANVEC_ROW_STORES
        if (rows == MR) {
            STORE_TILE_BY_CHANNEL(TILE6, MR, STORE_CH6)
        } else {
            TILE6(STORE_TILE_ROW)
        }
#else
        TILE6(STORE_TILE_ROW)
#endif
    }
}

/* conv_chanvec_kb: the same product with the walk over input channels
 * split into blocks of kbc channels (kbc = C: one block): for each block
 * every tile of the chunk in turn, so the block's weight panel (kbc * KH *
 * KW * NR floats; 8 KiB for a 1x1 at VW 8 and kbc 128) stays in L1 while
 * the chunk's tiles read it, instead of the whole panel streaming through
 * from L2 for each tile (with the tile's input rows: a cache line per
 * input channel on 1x1 layers). Between blocks the tiles' sums wait as
 * vectors in local scratch (PIXMAX pixels: the host chunks no more); each
 * output's sum is the same fma chain over k in order (the partial sum is
 * stored and reloaded as the float it is), so the results equal
 * conv_chanvec's up to the tile's clamped rows.
 *
 * Tiles of MRK pixels x NR channels: MRK 6 (12 accumulators, AVX2's 16
 * registers at VW 8), or MRK 8 at VW 16 (AVX-512's 32 registers: 16
 * accumulators and 2 weight vectors, 16 fmas per 2 vector loads and 8
 * broadcasts instead of 12 per 2 and 6).
 *
 * Built only when the host asks for it (PIXMAX defined): a kernel's
 * __local array is a module-level variable to the compiler, which a driver
 * may count against every kernel of the program (Oclgrind refused
 * conv_chanvec's launches: 128 KiB of local memory for PIXMAX 1024). */
#ifdef PIXMAX
#ifndef MRK
#define MRK 8
#endif
#if MRK == 8
#define TILE_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#elif MRK == 6
#define TILE_ROWS(X) TILE6(X)
#else
#error "MRK is 6 or 8"
#endif
/* a whole tile's channel ``lane``: its MRK consecutive pixels of y in one
 * or two vector stores (CHANVEC_ROW_STORES) */
#if MRK == 6
#define STORE_CH_MRK(lane, ch) STORE_CH6(lane, ch)
#elif RESIDUAL
#define STORE_CH_MRK(lane, ch)                                                 \
    {                                                                          \
        const size_t o_ = (size_t)(ch) * N + n;                                \
        const float8 v8_ = (float8)(tt_[0][lane], tt_[1][lane], tt_[2][lane], tt_[3][lane], \
                                    tt_[4][lane], tt_[5][lane], tt_[6][lane], tt_[7][lane]) \
                           + vload8(0, Ri + o_);                               \
        vstore8(APPLY_ACT_VEC_CH(v8_, float8, PRELU_SLOPE(bias, ch)), 0, Yi + o_); \
    }
#else
#define STORE_CH_MRK(lane, ch)                                                 \
    vstore8((float8)(tt_[0][lane], tt_[1][lane], tt_[2][lane], tt_[3][lane],    \
                     tt_[4][lane], tt_[5][lane], tt_[6][lane], tt_[7][lane]),   \
            0, Yi + (size_t)(ch) * N + n);
#endif
#define LOAD_PART(i)                                                           \
    c##i##0 = part[t + 2 * (i)];                                               \
    c##i##1 = part[t + 2 * (i) + 1];
#define SAVE_PART(i)                                                           \
    part[t + 2 * (i)] = c##i##0;                                               \
    part[t + 2 * (i) + 1] = c##i##1;

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void conv_chanvec_kb(int M, int N, int K, int pix, int kbc,
                     __global const float* Wp, __global const float* X, int offX, int ldxI,
                     __global const float* bias, __global float* Y, int offY, int ldyI,
                     __global const float* R, int offR, float act_a, float act_b,
                     int wp, int hwp, int wo, int ih, int iw,
                     __global const float* gate, int gate_stride) {
    /* the chunk's partial sums between channel blocks: tile t's pixel i at
     * vectors 2 * (MRK * t + i) and + 1 */
    __local floatV part[2 * PIXMAX];
#if GATE
    __local float wsc[GATE_FLOATS];
#endif
    CHANVEC_PROLOGUE
    GATE_PANEL
    const int ho_base = 0;
    const int C = K / (KH * KW);
    for (int cb = 0; cb < C; cb += kbc) {
        const int ce = min(C, cb + kbc);
        for (int n = nbeg, t = 0; n < nend; n += MRK, t += 2 * MRK) {
            const int rows = min(MRK, nend - n);
            TILE_POS
            TILE_ROWS(DECL_OFF)
            TILE_ROWS(DECL_ACC)
            if (cb == 0) {
                TILE_ROWS(ZERO_ACC)
            } else {
                TILE_ROWS(LOAD_PART)
            }
            WSPACE const float* wk = WPANEL + (size_t)cb * (KH * KW * NR);
            for (int c = cb; c < ce; ++c) {
#pragma unroll
                for (int kh = 0; kh < KH; ++kh)
#pragma unroll
                    for (int kw = 0; kw < KW; ++kw) {
                        const floatV w0 = vloadV(0, wk), w1 = vloadV(1, wk);
                        wk += NR;
                        __global const float* xk = Xi + (size_t)c * hwp + kh * DH * wp + kw * DW;
                        TILE_ROWS(FMA_ROW)
                    }
            }
            if (ce < C) {
                TILE_ROWS(SAVE_PART)
            } else if (CHANVEC_ROW_STORES && rows == MRK) {
                STORE_TILE_BY_CHANNEL(TILE_ROWS, MRK, STORE_CH_MRK)
            } else {
                TILE_ROWS(STORE_TILE_ROW)
            }
        }
    }
}
#endif  /* PIXMAX */
