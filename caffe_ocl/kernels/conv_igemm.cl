/* Implicit-GEMM 2-D convolution for GPUs: im2col folded into the tile loads
 * of tile_mainloop.h, no column workspace; images folded into the GEMM's
 * N (forward, backward-data) or K (backward-weight) dimension, so one launch
 * covers the whole batch. Grid: (N tiles * NT, M tiles, groups [* splits]).
 *
 * Layouts: image x [n][C][H][W], output y [n][CO][HO][WO], weights
 * [CO][C/G][KH][KW]. The kernel geometry (KH KW SH SW PH PW DH DW) and
 * GROUPS are macros (divisions by them become multiplies); sizes are
 * arguments.
 *   conv_fwd:        y = act(alpha * W (*) x + bias + beta * y)
 *                    M = CO/G, N = n*HO*WO, K = C/G*KH*KW
 *   conv_bwd_data:   dx = W^T (*) dy + beta * dx
 *                    M = C/G, N = n*H*W, K = CO/G*KH*KW
 *   conv_bwd_data_phase: the same for strided convolutions, one stride
 *                    phase per launch (MODE 3, below)
 *   conv_bwd_weight: out[z] = dy (*) x^T + beta * out[z], z = g*nsplit + s,
 *                    M = CO/G, N = C/G*KH*KW, K = n*HO*WO split in nsplit
 *                    chunks of kchunk (out = dW when nsplit == 1, else a
 *                    workspace summed into dW by splitk_reduce)
 *   splitk_reduce:   dw[g][i] = beta * dw[g][i] + sum_s ws[g*nsplit + s][i] */
#include "common.h"
#include "act.h"

#ifndef TM
#define TM 128
#endif
#ifndef TN
#define TN 128
#endif
#ifndef TF32
#define TF32 0
#endif
#ifndef MICRO
#define MICRO 8     /* results per work-item a side (tile_mainloop.h) */
#endif
#define IG_THREADS (TM * TN / (MICRO * MICRO))
#ifndef GROUPS
#define GROUPS 1
#endif
#ifndef BIAS
#define BIAS 0
#endif
#include "conv_geom.h"
#ifndef MODE
#define MODE 0
#endif
#define KHKW (KH * KW)
/* backward-data's store of one result (xb: dx at this work-item's column,
 * from STORE_COL), shared by conv_bwd_data and conv_bwd_data_phase; the
 * old value (accumulate: beta 1) read ahead by tile_store.h */
#define DX_PRIOR_AT(m, n) xb[(m) * HW]
#define STORE_ROW_PRIOR(m, n, acc_v, old) {                               \
        float v = (acc_v);                                                \
        if (beta != 0.0f) v += beta * (old);                              \
        xb[(m) * HW] = v;                                                 \
    }
#include "mma_tf32.h"
#include "tile_raster.h"

#if MODE == 0
/* x value of column (k = c*KH*KW + kh*KW + kw) for the output pixel whose
 * top-left input corner is (hi0, wi0) of image xb */
inline float im2col_at(__global const float* xb, int k, int kend, int ok,
                       int hi0, int wi0, int H, int W) {
    const int c = k / KHKW, r = k - c * KHKW;
    const int kh = r / KW, kw = r - kh * KW;
    const int h = hi0 + kh * DH, w = wi0 + kw * DW;
    return (ok && k < kend && h >= 0 && h < H && w >= 0 && w < W)
        ? xb[(c * H + h) * W + w] : 0.0f;
}

#define A_KFAST 1
#define B_KFAST 0
__kernel __attribute__((reqd_work_group_size(IG_THREADS, 1, 1)))
void conv_fwd(int NIMG, int C, int H, int W, int CO, int HO, int WO, float alpha,
              __global const float* X, int offX, __global const float* Wt, float beta,
              __global float* Y, int offY, __global const float* bias, int offBias,
              float act_a, float act_b, __global const float* R, int offR) {
    const int Cg = C / GROUPS, M = CO / GROUPS;
    const int HW = H * W, HOWO = HO * WO;
    const int N = NIMG * HOWO, K = Cg * KHKW;
#ifdef FWD_KCHUNK
    /* split K (few output tiles, ops/conv.py forward_splitk): group z =
     * g * FWD_NSPLIT + s sums k in [s * FWD_KCHUNK, +FWD_KCHUNK) into slice
     * s of a workspace shaped as y (the host passes alpha 1, beta 0, no
     * bias or act); splitk.cl conv_splitk_reduce adds the slices */
    const int g = get_group_id(2) / FWD_NSPLIT, s_ = get_group_id(2) % FWD_NSPLIT;
    const int kbeg = s_ * FWD_KCHUNK, kend = min(K, kbeg + FWD_KCHUNK);
    offY += s_ * NIMG * CO * HOWO;
#else
    const int g = get_group_id(2);
    const int kbeg = 0, kend = K;
#endif
    X += offX + g * Cg * HW;
    Wt += g * M * K;
    const int lid = get_local_id(0);
    TILE_ORIGIN(m0, n0)
    /* this work-item always fetches the B columns n0 + lid % TN + s *
     * IG_THREADS, s < IG_B_SETS (one but in 32 x 256 tiles, whose 128
     * work-items fetch two: tile_mainloop.h B_SETS): each column's output
     * pixel is found once here, not per k */
#if TN > IG_THREADS
#define IG_B_SETS (TN / IG_THREADS)
#else
#define IG_B_SETS 1
#endif
    int bok[IG_B_SETS], hi0[IG_B_SETS], wi0[IG_B_SETS];
    __global const float* xb[IG_B_SETS];
#pragma unroll
    for (int s = 0; s < IG_B_SETS; ++s) {
        const int bn = n0 + lid % TN + s * IG_THREADS;
        bok[s] = bn < N;
        const int bimg = bok[s] ? bn / HOWO : 0;
        const int bp = bok[s] ? bn - bimg * HOWO : 0;
        const int bho = bp / WO, bwo = bp - bho * WO;
        xb[s] = X + bimg * C * HW;
        hi0[s] = bho * SH - PH;
        wi0[s] = bwo * SW - PW;
    }
#define LOAD_A(m, k) (((m) < M && (k) < kend) ? Wt[(m) * K + (k)] : 0.0f)
#define LOAD_B(k, n) im2col_at(xb[0], (k), kend, bok[0], hi0[0], wi0[0], H, W)
#define LOAD_B_AT(i, k, n) im2col_at(xb[(i) % IG_B_SETS], (k), kend, bok[(i) % IG_B_SETS], \
                                     hi0[(i) % IG_B_SETS], wi0[(i) % IG_B_SETS], H, W)
#include "tile_mainloop.h"

/* Y_CHANNELS: y's images lie Y_CHANNELS planes apart from offY on (a slice
 * of a Concat's top, plan/concat.py); otherwise CO. Not with FWD_KCHUNK,
 * whose workspace is shaped as y (the reduce writes the slice). */
#if defined(Y_CHANNELS) && !defined(FWD_KCHUNK)
#define Y_IMAGE_CO Y_CHANNELS
#else
#define Y_IMAGE_CO CO
#endif
#define STORE_COL(n)                                                      \
    const int img_ = (n) / HOWO, p_ = (n) - img_ * HOWO;                  \
    __global float* yb = Y + offY + (img_ * Y_IMAGE_CO + g * M) * HOWO + p_; \
    __global const float* rb_ = R + offR + (img_ * CO + g * M) * HOWO + p_;
/* RESIDUAL: + R (laid out as y) before the activation (plan/residual.py),
 * read ahead of the stores (tile_store.h ADDEND_AT) */
#if RESIDUAL
#define ADDEND_AT(m, n) rb_[(m) * HOWO]
#define RES_AT(m) addend_v
#else
#define RES_AT(m) 0.0f
#endif
#if BIAS
#define BIAS_AT(m) bias[offBias + g * M + (m)]
#else
#define BIAS_AT(m) 0.0f
#endif
#define STORE_ROW(m, n, acc_v) {                                          \
        float v = alpha * (acc_v) + BIAS_AT(m);                           \
        if (beta != 0.0f) v += beta * yb[(m) * HOWO];                     \
        v += RES_AT(m);                                                   \
        yb[(m) * HOWO] = APPLY_ACT_CH(v, PRELU_SLOPE(bias, offBias + g * M + (m))); \
    }
#include "tile_store.h"
}
#endif

#if MODE == 1
/* dy value feeding input pixel (hp - PH, wp - PW) through kernel tap
 * (kh, kw) of output channel co (k = co*KH*KW + kh*KW + kw) */
inline float col2im_at(__global const float* dyb, int k, int kend, int ok,
                       int hp, int wp, int HO, int WO) {
    const int co = k / KHKW, r = k - co * KHKW;
    const int kh = r / KW, kw = r - kh * KW;
    const int th = hp - kh * DH, tw = wp - kw * DW;
    const int ho = th / SH, wo = tw / SW;
    return (ok && k < kend && th >= 0 && tw >= 0 && ho * SH == th && wo * SW == tw
            && ho < HO && wo < WO) ? dyb[(co * HO + ho) * WO + wo] : 0.0f;
}

#define A_KFAST 1
#define B_KFAST 0
__kernel __attribute__((reqd_work_group_size(IG_THREADS, 1, 1)))
void conv_bwd_data(int NIMG, int C, int H, int W, int CO, int HO, int WO,
                   __global const float* DY, int offDY, __global const float* Wt,
                   float beta, __global float* DX, int offDX) {
    const int g = get_group_id(2);
    const int M = C / GROUPS, Mo = CO / GROUPS;
    const int HW = H * W, HOWO = HO * WO;
    const int N = NIMG * HW, K = Mo * KHKW;
    Wt += g * Mo * M * KHKW;
    const int lid = get_local_id(0);
    TILE_ORIGIN(m0, n0)
    const int kbeg = 0, kend = K;
    const int bn = n0 + lid % TN;
    const int bok = bn < N;
    const int bimg = bok ? bn / HW : 0;
    const int bq = bok ? bn - bimg * HW : 0;
    const int bh = bq / W, bw = bq - bh * W;
    __global const float* dyb = DY + offDY + (bimg * CO + g * Mo) * HOWO;
    const int hp = bh + PH, wp = bw + PW;
    /* A[m = c][k = co*KHKW + r] = Wt[co][c][r] */
#define LOAD_A(m, k) (((m) < M && (k) < kend) \
    ? Wt[((k) / KHKW) * (M * KHKW) + (m) * KHKW + (k) % KHKW] : 0.0f)
#define LOAD_B(k, n) col2im_at(dyb, (k), kend, bok, hp, wp, HO, WO)
#include "tile_mainloop.h"

#define STORE_COL(n)                                                      \
    const int img_ = (n) / HW, q_ = (n) - img_ * HW;                      \
    __global float* xb = DX + offDX + (img_ * C + g * M) * HW + q_;
#define PRIOR_AT DX_PRIOR_AT
#include "tile_store.h"
#undef PRIOR_AT
}
#endif

#if MODE == 3
/* Strided backward-data, one launch per stride phase (rh, rw): the input
 * pixels whose padded coordinates (h + PH, w + PW) are (rh, rw) modulo the
 * stride receive only the taps kh = rh + t*SH, kw = rw + u*SW (dilation 1),
 * so the GEMM runs over K = CO/G * nkh * nkw instead of CO/G * KH * KW and
 * skips the (1 - 1/(SH*SW)) of multiply-adds conv_bwd_data spends on zeros.
 * The phase's pixels are h = h0 + SH*i (i < HP), w = w0 + SW*j (j < WP);
 * qh = (h + PH - rh) / SH is exact and tap t reads dy row qh - t. */
inline float col2im_phase(__global const float* dyb, int k, int kend, int ok,
                          int qh, int qw, int nk, int nkw, int HO, int WO) {
    const int co = k / nk, r = k - co * nk;
    const int t = r / nkw, u = r - t * nkw;
    const int ho = qh - t, wo = qw - u;
    return (ok && k < kend && ho >= 0 && wo >= 0 && ho < HO && wo < WO)
        ? dyb[(co * HO + ho) * WO + wo] : 0.0f;
}

#define A_KFAST 1
#define B_KFAST 0
__kernel __attribute__((reqd_work_group_size(IG_THREADS, 1, 1)))
void conv_bwd_data_phase(int NIMG, int C, int H, int W, int CO, int HO, int WO,
                         int rh, int rw, int h0, int w0, int HP, int WP,
                         __global const float* DY, int offDY, __global const float* Wt,
                         float beta, __global float* DX, int offDX) {
    const int g = get_group_id(2);
    const int M = C / GROUPS, Mo = CO / GROUPS;
    const int HW = H * W, HOWO = HO * WO, HPWP = HP * WP;
    const int nkh = rh < KH ? (KH - rh + SH - 1) / SH : 0;
    const int nkw = rw < KW ? (KW - rw + SW - 1) / SW : 0;
    const int nk = nkh * nkw;
    const int N = NIMG * HPWP, K = Mo * nk;
    Wt += g * Mo * M * KHKW;
    const int lid = get_local_id(0);
    TILE_ORIGIN(m0, n0)
    const int kbeg = 0, kend = K;
    const int bn = n0 + lid % TN;
    const int bok = bn < N;
    const int bimg = bok ? bn / HPWP : 0;
    const int bq = bok ? bn - bimg * HPWP : 0;
    const int bi = bq / WP, bj = bq - bi * WP;
    const int qh = (h0 + SH * bi + PH - rh) / SH, qw = (w0 + SW * bj + PW - rw) / SW;
    __global const float* dyb = DY + offDY + (bimg * CO + g * Mo) * HOWO;
    /* A[m = c][k = co*nk + t*nkw + u] = Wt[co][c][rh + t*SH][rw + u*SW] */
#define LOAD_A(m, k) (((m) < M && (k) < kend) \
    ? Wt[((k) / nk) * (M * KHKW) + (m) * KHKW + \
         (rh + (((k) % nk) / nkw) * SH) * KW + rw + (((k) % nk) % nkw) * SW] : 0.0f)
#define LOAD_B(k, n) col2im_phase(dyb, (k), kend, bok, qh, qw, nk, nkw, HO, WO)
#include "tile_mainloop.h"

#define STORE_COL(n)                                                      \
    const int img_ = (n) / HPWP, q_ = (n) - img_ * HPWP;                  \
    const int i_ = q_ / WP, j_ = q_ - i_ * WP;                            \
    __global float* xb = DX + offDX + (img_ * C + g * M) * HW +           \
                         (h0 + SH * i_) * W + w0 + SW * j_;
#define PRIOR_AT DX_PRIOR_AT
#include "tile_store.h"
#undef PRIOR_AT
}
#endif

#if MODE == 2
/* im2col'd x, transposed: element (k = img*HO*WO + p, n = c*KH*KW + r) */
inline float im2col_t(__global const float* X, int k, int n, int kend, int N,
                      int C, int H, int W, int HOWO, int WO) {
    const int img = k / HOWO, p = k - img * HOWO;
    const int ho = p / WO, wo = p - ho * WO;
    const int c = n / KHKW, r = n - c * KHKW;
    const int kh = r / KW, kw = r - kh * KW;
    const int h = ho * SH - PH + kh * DH, w = wo * SW - PW + kw * DW;
    return (n < N && k < kend && h >= 0 && h < H && w >= 0 && w < W)
        ? X[((img * C + c) * H + h) * W + w] : 0.0f;
}

#define A_KFAST 1
#define B_KFAST 1
__kernel __attribute__((reqd_work_group_size(IG_THREADS, 1, 1)))
void conv_bwd_weight(int NIMG, int C, int H, int W, int CO, int HO, int WO,
                     int nsplit, int kchunk,
                     __global const float* X, int offX, __global const float* DY, int offDY,
                     float beta, __global float* OUT) {
    const int z = get_group_id(2);
    const int g = z / nsplit, s = z - g * nsplit;
    const int Cg = C / GROUPS, M = CO / GROUPS;
    const int HW = H * W, HOWO = HO * WO;
    const int N = Cg * KHKW, K = NIMG * HOWO;
    X += offX + g * Cg * HW;
    DY += offDY + g * M * HOWO;
    const int lid = get_local_id(0);
    TILE_ORIGIN(m0, n0)
    const int kbeg = s * kchunk, kend = min(K, kbeg + kchunk);
    /* k = img*HOWO + p; both operands are k-fast, so a work-item's loads of
     * a tile share its 4 values of k (tile_mainloop.h's fetch mapping): the
     * decode is shared (CSE), and divides by constants when the host passes
     * the output size as macros (HO_C, WO_C) */
#ifdef WO_C
#define HOWO_ (HO_C * WO_C)
#define WO_ WO_C
#else
#define HOWO_ HOWO
#define WO_ WO
#endif
#define K_IMG(k) ((k) / HOWO_)
#define K_P(k) ((k) - K_IMG(k) * HOWO_)
#define LOAD_A(m, k) (((m) < M && (k) < kend) \
    ? DY[(K_IMG(k) * CO + (m)) * HOWO_ + K_P(k)] : 0.0f)
#define LOAD_B(k, n) im2col_t(X, (k), (n), kend, N, C, H, W, HOWO_, WO_)
#include "tile_mainloop.h"

    __global float* out = OUT + z * M * N;
#define STORE_COL(n)
#define STORE_ROW(m, n, acc_v) {                                          \
        float v = (acc_v);                                                \
        if (beta != 0.0f) v += beta * out[(m) * N + (n)];                 \
        out[(m) * N + (n)] = v;                                           \
    }
#include "tile_store.h"
}
#endif

__kernel void splitk_reduce(int total, int MN, int nsplit, __global const float* WS,
                            float beta, __global float* dW) {
    GLOBAL_LOOP(idx, total) {
        const int g = idx / MN, i = idx - g * MN;
        __global const float* src = WS + g * nsplit * MN + i;
        float v = 0.0f;
        for (int s = 0; s < nsplit; ++s) v += src[s * MN];
        dW[idx] = (beta != 0.0f ? beta * dW[idx] : 0.0f) + v;
    }
}


/* Backward-data of a strided 1x1 convolution without padding, second step:
 * the dense dx_sub[n][c][HO][WO] = W^T dy (a stride-1 conv_bwd_data) is
 * spread onto the stride grid of dx[n][c][H][W]; the other positions get no
 * gradient (0, or unchanged when accumulating). The gather form of
 * conv_bwd_data would spend (1 - 1/(SH*SW)) of its multiply-adds on them. */
#ifdef SS_W
/* dx = sub scattered onto the stride grid (SS_SH, SS_SW) of SS_H x SS_W
 * planes, zeros between; sub holds SS_HO x SS_WO planes. The sizes are
 * compiled in: four divisions by runtime values per element ran this at
 * ~1 TB/s on an H200 (1 ms of ResNet-50's training step). */
__kernel void stride_scatter(int total, __global const float* sub, __global float* dx) {
    GLOBAL_LOOP(i, total) {
        const int w = i % SS_W, t = i / SS_W;
        const int h = t % SS_H, nc = t / SS_H;
        float v = 0.0f;
        if (h % SS_SH == 0 && w % SS_SW == 0 && h / SS_SH < SS_HO && w / SS_SW < SS_WO)
            v = sub[(nc * SS_HO + h / SS_SH) * SS_WO + w / SS_SW];
        dx[i] = v;
    }
}

/* Accumulating (dx += the scattered sub): only the stride grid's positions
 * change, so one work-item per element of sub reads and writes those alone
 * (the full-plane pass read and rewrote all of dx, (1 - 1/(SH*SW)) of it
 * unchanged). */
__kernel void stride_scatter_add(int total_sub, __global const float* sub, __global float* dx) {
    GLOBAL_LOOP(i, total_sub) {
        const int wo = i % SS_WO, t = i / SS_WO;
        const int ho = t % SS_HO, nc = t / SS_HO;
        dx[(nc * SS_H + ho * SS_SH) * SS_W + wo * SS_SW] += sub[i];
    }
}
#endif
