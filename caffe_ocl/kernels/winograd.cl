/* Winograd F(m x m, r x r) convolution transforms (ops/winograd.py),
 * (m, r) = (WM, WR) = (2, 3), (4, 3) or (2, 5) (compile-time), tile side
 * WA = m + r - 1 (4 or 6):
 *
 *   U[k][.][.] = G g G^T        (filter transform, k = WA*a + b)
 *   V[k][c][t] = B^T d B        (input transform of the WA x WA patch of tile t)
 *   M[k]       = U[k] x V[k]    (WA*WA batched GEMMs, ops.gemm)
 *   y (m x m)  = A^T m A        (output transform, + bias, + beta*y, act)
 *
 * F(2x2, 3x3): B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1],
 *              G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1], A^T = [1 1 1 0; 0 1 -1 -1].
 * WA = 6 (Lavin & Gray, points 0, +-1, +-2, inf), the same B^T for
 * F(4x4, 3x3) and F(2x2, 5x5):
 *   B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0;
 *          0 2 -1 -2 1 0; 0 4 0 -5 0 1],
 *   G row of point p = c_p [1 p .. p^(r-1)], c = 1/4, -1/6, -1/6, 1/24, 1/24
 *   for p = 0, 1, -1, 2, -2; row of inf = [0 .. 0 1]:
 *   F(4x4, 3x3): G = [1/4 0 0; -1/6 -1/6 -1/6; -1/6 1/6 -1/6; 1/24 1/12 1/6;
 *                     1/24 -1/12 1/6; 0 0 1],
 *                A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1];
 *   F(2x2, 5x5): A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 1].
 * Tiles t = (img * TH + ty) * TW + tx cover the output in m x m blocks
 * (TH = ceil(HO/m), TW = ceil(WO/m)); V and M are [WA*WA][channels][Tp]
 * row-major (Tp >= T: rows padded with zero tiles for the split-K GEMMs of
 * backward-weight; Tp = T otherwise), so each GEMM reads/writes plain
 * matrices; the WA*WA matrices lie KS floats apart (KS >= channels * Tp,
 * an odd number of 64-byte lines: ops/winograd.py _kstride).
 *
 * Backward-weight (the adjoint of the forward pipeline):
 *   dM[k][co][t] = A dy_tile A^T                    (wino_output_grad)
 *   dUp[k][s][co][c] = sum over the tiles of split s of dM[k] V[k]^T (ops.gemm)
 *   dW[co][c] += G^T (sum_s dUp[k][s][co][c]) G     (wino_filter_grad)
 * with A = (A^T)^T.
 * Every geometry value is a run-time argument: one program per (m, r).
 * Work-item i walks (channel, tile) with the tile fastest (coalesced
 * V/M accesses on GPUs, contiguous chunks on CPU drivers). */
#include "common.h"

#ifndef WM
#define WM 2
#endif
#ifndef WR
#define WR 3
#endif
#define WA (WM + WR - 1)
#define WRR (WR * WR)
#if !((WM == 2 || WM == 4) && WR == 3) && !(WM == 2 && WR == 5)
#error "winograd.cl: (WM, WR) must be (2, 3), (4, 3) or (2, 5)"
#endif

/* 1-D transforms; s is the stride between the vector's elements. */
/* v = B^T d, for one column (float) or eight tiles' (float8, wino_input_rows) */
#if WA == 4
#define DEFINE_BT1(NAME, T)                                               \
    inline void NAME(const T* d, int s, T* v, int t) {                    \
        v[0] = d[0] - d[2 * s];                                           \
        v[t] = d[s] + d[2 * s];                                           \
        v[2 * t] = d[2 * s] - d[s];                                       \
        v[3 * t] = d[s] - d[3 * s];                                       \
    }
#else
#define DEFINE_BT1(NAME, T)                                               \
    inline void NAME(const T* d, int s, T* v, int t) {                    \
        const T d0 = d[0], d1 = d[s], d2 = d[2 * s], d3 = d[3 * s], d4 = d[4 * s], \
                d5 = d[5 * s];                                            \
        v[0] = 4.0f * d0 - 5.0f * d2 + d4;                                \
        v[t] = d3 + d4 - 4.0f * (d1 + d2);                                \
        v[2 * t] = d4 - d3 + 4.0f * (d1 - d2);                            \
        v[3 * t] = d4 - d2 + 2.0f * (d3 - d1);                            \
        v[4 * t] = d4 - d2 - 2.0f * (d3 - d1);                            \
        v[5 * t] = 4.0f * d1 - 5.0f * d3 + d5;                            \
    }
#endif
DEFINE_BT1(bt1, float)
DEFINE_BT1(bt1_8, float8)

/* u = G g, for one filter (float) or eight (float8, wino_filter_lines) */
#if WA == 4
#define DEFINE_G1(NAME, T)                                                \
    inline void NAME(const T* g, int s, T* u, int t) {                    \
        const T g0 = g[0], g1_ = g[s], g2 = g[2 * s];                     \
        u[0] = g0;                                                        \
        u[t] = 0.5f * (g0 + g1_ + g2);                                    \
        u[2 * t] = 0.5f * (g0 - g1_ + g2);                                \
        u[3 * t] = g2;                                                    \
    }
#elif WR == 3
#define DEFINE_G1(NAME, T)                                                \
    inline void NAME(const T* g, int s, T* u, int t) {                    \
        const T g0 = g[0], g1_ = g[s], g2 = g[2 * s];                     \
        u[0] = 0.25f * g0;                                                \
        u[t] = (-1.0f / 6.0f) * (g0 + g1_ + g2);                          \
        u[2 * t] = (-1.0f / 6.0f) * (g0 - g1_ + g2);                      \
        u[3 * t] = (1.0f / 24.0f) * g0 + (1.0f / 12.0f) * g1_ + (1.0f / 6.0f) * g2; \
        u[4 * t] = (1.0f / 24.0f) * g0 - (1.0f / 12.0f) * g1_ + (1.0f / 6.0f) * g2; \
        u[5 * t] = g2;                                                    \
    }
#else   /* F(2x2, 5x5): G rows c_p [1 p p^2 p^3 p^4], even and odd parts */
#define DEFINE_G1(NAME, T)                                                \
    inline void NAME(const T* g, int s, T* u, int t) {                    \
        const T g0 = g[0], g1_ = g[s], g2 = g[2 * s], g3 = g[3 * s], g4 = g[4 * s]; \
        const T e1 = g0 + g2 + g4, o1 = g1_ + g3;                         \
        const T e2 = g0 + 4.0f * g2 + 16.0f * g4, o2 = 2.0f * g1_ + 8.0f * g3; \
        u[0] = 0.25f * g0;                                                \
        u[t] = (-1.0f / 6.0f) * (e1 + o1);                                \
        u[2 * t] = (-1.0f / 6.0f) * (e1 - o1);                            \
        u[3 * t] = (1.0f / 24.0f) * (e2 + o2);                            \
        u[4 * t] = (1.0f / 24.0f) * (e2 - o2);                            \
        u[5 * t] = g4;                                                    \
    }
#endif
DEFINE_G1(g1, float)
DEFINE_G1(g1_8, float8)

/* y = A^T m, for one tile (float) or eight (float8, wino_output_rows) */
#if WA == 4
#define DEFINE_AT1(NAME, T)                                               \
    inline void NAME(const T* m, int s, T* y, int t) {                    \
        y[0] = m[0] + m[s] + m[2 * s];                                    \
        y[t] = m[s] - m[2 * s] - m[3 * s];                                \
    }
#elif WM == 2                                          /* F(2x2, 5x5) */
#define DEFINE_AT1(NAME, T)                                               \
    inline void NAME(const T* m, int s, T* y, int t) {                    \
        const T m1 = m[s], m2 = m[2 * s], m3 = m[3 * s], m4 = m[4 * s];   \
        y[0] = m[0] + (m1 + m2) + (m3 + m4);                              \
        y[t] = (m1 - m2) + 2.0f * (m3 - m4) + m[5 * s];                   \
    }
#else
#define DEFINE_AT1(NAME, T)                                               \
    inline void NAME(const T* m, int s, T* y, int t) {                    \
        const T m0 = m[0], m1 = m[s], m2 = m[2 * s], m3 = m[3 * s], m4 = m[4 * s], \
                m5 = m[5 * s];                                            \
        const T p12 = m1 + m2, n12 = m1 - m2, p34 = m3 + m4, n34 = m3 - m4; \
        y[0] = m0 + p12 + p34;                                            \
        y[t] = n12 + 2.0f * n34;                                          \
        y[2 * t] = p12 + 4.0f * p34;                                      \
        y[3 * t] = n12 + 8.0f * n34 + m5;                                 \
    }
#endif
DEFINE_AT1(at1, float)
DEFINE_AT1(at1_8, float8)

inline void a1(const float* y, int s, float* m, int t) {      /* m = A y */
#if WA == 4
    const float y0 = y[0], y1 = y[s];
    m[0] = y0;
    m[t] = y0 + y1;
    m[2 * t] = y0 - y1;
    m[3 * t] = -y1;
#elif WM == 4
    const float y0 = y[0], y1 = y[s], y2 = y[2 * s], y3 = y[3 * s];
    const float p02 = y0 + y2, p13 = y1 + y3, q02 = y0 + 4.0f * y2, q13 = y1 + 4.0f * y3;
    m[0] = y0;
    m[t] = p02 + p13;
    m[2 * t] = p02 - p13;
    m[3 * t] = q02 + 2.0f * q13;
    m[4 * t] = q02 - 2.0f * q13;
    m[5 * t] = y3;
#else                                                  /* F(2x2, 5x5) */
    const float y0 = y[0], y1 = y[s];
    m[0] = y0;
    m[t] = y0 + y1;
    m[2 * t] = y0 - y1;
    m[3 * t] = y0 + 2.0f * y1;
    m[4 * t] = y0 - 2.0f * y1;
    m[5 * t] = y1;
#endif
}

inline void gt1(const float* u, int s, float* g, int t) {     /* g = G^T u */
#if WA == 4
    const float u0 = u[0], u1 = u[s], u2 = u[2 * s], u3 = u[3 * s];
    g[0] = u0 + 0.5f * (u1 + u2);
    g[t] = 0.5f * (u1 - u2);
    g[2 * t] = 0.5f * (u1 + u2) + u3;
#else
    const float u0 = u[0], u1 = u[s], u2 = u[2 * s], u3 = u[3 * s], u4 = u[4 * s],
                u5 = u[5 * s];
    const float p12 = u1 + u2, n12 = u2 - u1, p34 = u3 + u4, n34 = u3 - u4;
    g[0] = 0.25f * u0 - (1.0f / 6.0f) * p12 + (1.0f / 24.0f) * p34;
    g[t] = (1.0f / 6.0f) * n12 + (1.0f / 12.0f) * n34;
#if WR == 3
    g[2 * t] = (1.0f / 6.0f) * (p34 - p12) + u5;
#else                                                  /* F(2x2, 5x5) */
    g[2 * t] = (1.0f / 6.0f) * (p34 - p12);
    g[3 * t] = (1.0f / 6.0f) * n12 + (1.0f / 3.0f) * n34;
    g[4 * t] = (2.0f / 3.0f) * p34 - (1.0f / 6.0f) * p12 + u5;
#endif
#endif
}

/* V[k][c][t] (+offV) from X[img][c][H][W] (+offX); the patch of tile
 * (ty, tx) starts at (WM*ty - ph, WM*tx - pw); outside the image reads 0
 * (ph, pw may be negative: a crop). */
__kernel void wino_input(int nimg, int C, int H, int W, int TH, int TW, int ph, int pw,
                         int Tp, int KS,
                         __global const float* X, int offX,
                         __global float* V, int offV) {
    const int tiles = TH * TW;
    const int T = nimg * tiles;
    const int total = C * Tp;
    GLOBAL_LOOP(i, total) {
        const int c = i / Tp, t = i - c * Tp;
        const bool live = t < T;          /* t >= T: a zero padding tile */
        const int img = t / tiles, r = t - img * tiles;
        const int ty = r / TW, tx = r - ty * TW;
        const int y0 = WM * ty - ph, x0 = WM * tx - pw;
        __global const float* xp = X + offX + (img * C + c) * H * W;
        float d[WA * WA], s[WA * WA], v[WA * WA];
#pragma unroll
        for (int a = 0; a < WA; ++a) {
            const int yy = y0 + a;
            const bool rowok = live && yy >= 0 && yy < H;
#pragma unroll
            for (int b = 0; b < WA; ++b) {
                const int xx = x0 + b;
                d[a * WA + b] = (rowok && xx >= 0 && xx < W) ? xp[yy * W + xx] : 0.0f;
            }
        }
#pragma unroll
        for (int b = 0; b < WA; ++b) bt1(d + b, WA, s + b, WA);        /* B^T d */
#pragma unroll
        for (int a = 0; a < WA; ++a) bt1(s + a * WA, 1, v + a * WA, 1); /* (B^T d) B */
        __global float* vp = V + offV + i;     /* i == c * Tp + t */
#pragma unroll
        for (int k = 0; k < WA * WA; ++k) vp[k * KS] = v[k];
    }
}

/* CPU drivers: the same V, one work-item per strip of tiles (channel c,
 * image, tile row ty), so that each input element is read once per strip
 * instead of once per overlapping tile, the column transform B^T runs once
 * per strip column, and no index is divided per tile. The strip's WA input
 * rows, transformed down the columns (8 columns of one phase at a time),
 * are kept by column phase, s[k][x % WM][x / WM] (x: padded column,
 * WM*TW + WR - 1 <= ROWMAX, else the host uses wino_input), so that input
 * column j of tiles t .. t+7 is one
 * run of 8 (phase j % WM from t + j / WM); then B
 * across each tile's WA columns, 8 tiles at a time, and the WA*WA values
 * of those 8 tiles stored as runs of 8 (a strip's last 8 overlap the ones
 * before; strips under 8 tiles one tile at a time). Tile by tile, the 36
 * scalar stores per tile into 36 streams held DenseNet-121's 56 x 56
 * transforms at ~20 GB/s, longer than their GEMMs. Padding tiles
 * T <= t < Tp are written by the strip that ends channel c. */
#define ROWMAX 1030
/* phase columns kept (8 past the last used: the column pass stores runs of 8) */
#define QMAX (ROWMAX / WM + 10)
/* 8 elements at stride WM from s, reading s[0 .. 8 * WM - 1] */
#if WM == 2
#define WSTRIDE8(s) (vload16(0, (s)).even)
#else
#define WSTRIDE8(s) ((float8)(vload16(0, (s)).s048c, vload16(0, (s) + 16).s048c))
#endif
__kernel void wino_input_rows(int nimg, int C, int H, int W, int TH, int TW, int ph, int pw,
                              int Tp, int KS,
                              __global const float* X, int offX,
                              __global float* V, int offV) {
    const int strips = nimg * TH, T = nimg * TH * TW;
    const int ncol = WM * TW + WR - 1;
    float s[WA * WM * QMAX];        /* s[k][x % WM][x / WM], or s[k][x] (ROWMAX apart) */
    GLOBAL_LOOP(i, C * strips) {
        const int c = i / strips, r = i - c * strips;
        const int img = r / TH, ty = r - img * TH;
        const int y0 = WM * ty - ph, x0 = -pw;
        __global const float* xp = X + offX + (img * C + c) * H * W;
        __global const float* rows[WA];
        bool rowok[WA];
#pragma unroll
        for (int a = 0; a < WA; ++a) {
            const int yy = y0 + a;
            rowok[a] = yy >= 0 && yy < H;
            rows[a] = xp + clamp(yy, 0, H - 1) * W;
        }
        __global float* vp = V + offV + c * Tp + (img * TH + ty) * TW;
        if (TW >= 8) {
            /* column phase p, 8 phase columns q0 .. q0+7 (padded columns
             * WM*q + p) at a time: 8 loads at stride WM per row inside the
             * image, column by column at its edges */
            const int nq = (ncol + WM - 1) / WM;
            for (int p = 0; p < WM; ++p)
                for (int q0 = 0; q0 < nq; q0 += 8) {
                    const int xa = x0 + WM * q0 + p;      /* image column of lane 0 */
                    if (xa >= 0 && xa + 8 * WM - 1 < W) {
                        float8 d[WA], e[WA];
#pragma unroll
                        for (int a = 0; a < WA; ++a)
                            d[a] = rowok[a] ? WSTRIDE8(rows[a] + xa) : (float8)0.0f;
                        bt1_8(d, 1, e, 1);                                 /* B^T d */
#pragma unroll
                        for (int k = 0; k < WA; ++k)
                            vstore8(e[k], 0, s + (k * WM + p) * QMAX + q0);
                        continue;
                    }
                    for (int q = q0; q < min(q0 + 8, nq); ++q) {
                        const int x = WM * q + p, xx = x0 + x;
                        if (x >= ncol) break;
                        const bool colok = xx >= 0 && xx < W;
                        const int xc = clamp(xx, 0, W - 1);
                        float d[WA];
#pragma unroll
                        for (int a = 0; a < WA; ++a)
                            d[a] = (colok && rowok[a]) ? rows[a][xc] : 0.0f;
                        bt1(d, 1, s + p * QMAX + q, WM * QMAX);            /* B^T d */
                    }
                }
            /* B across 8 tiles at a time, the last 8 overlapping */
            for (int t0 = 0; t0 < TW; t0 += 8) {
                const int t = min(t0, TW - 8);
                float8 v[WA * WA];
#pragma unroll
                for (int k = 0; k < WA; ++k) {
                    const float* sk = s + k * WM * QMAX;
                    float8 e[WA];
#pragma unroll
                    for (int j = 0; j < WA; ++j)
                        e[j] = vload8(0, sk + (j % WM) * QMAX + t + j / WM);
                    bt1_8(e, 1, v + k * WA, 1);                           /* (B^T d) B */
                }
#pragma unroll
                for (int k = 0; k < WA * WA; ++k) vstore8(v[k], 0, vp + k * KS + t);
            }
        } else {
            /* strips under 8 tiles: column by column into s[k][x], then
             * tile by tile */
            for (int x = 0; x < ncol; ++x) {
                const int xx = x0 + x;
                const bool colok = xx >= 0 && xx < W;
                const int xc = clamp(xx, 0, W - 1);
                float d[WA];
#pragma unroll
                for (int a = 0; a < WA; ++a) d[a] = (colok && rowok[a]) ? rows[a][xc] : 0.0f;
                bt1(d, 1, s + x, ROWMAX);                                 /* B^T d */
            }
            for (int tx = 0; tx < TW; ++tx) {
                float v[WA * WA];
#pragma unroll
                for (int k = 0; k < WA; ++k)
                    bt1(s + k * ROWMAX + WM * tx, 1, v + k * WA, 1);      /* (B^T d) B */
#pragma unroll
                for (int k = 0; k < WA * WA; ++k) vp[k * KS + tx] = v[k];
            }
        }
        if (r == strips - 1)                                             /* zero tiles */
            for (int t = T; t < Tp; ++t)
#pragma unroll
                for (int k = 0; k < WA * WA; ++k) V[offV + k * KS + c * Tp + t] = 0.0f;
    }
}

/* u[k * us] = (G w G^T)[k] of filter i as wino_filter indexes it. */
inline void wino_filter_one(int i, int CO, int C, int flip, __global const float* Wt,
                            float* u, int us) {
    int co, c;
    if (flip) { c = i / CO; co = i - c * CO; }
    else      { co = i / C; c = i - co * C; }
    __global const float* wp = Wt + (co * C + c) * WRR;
    float g[WRR], s[WA * WR], v[WA * WA];
#pragma unroll
    for (int j = 0; j < WRR; ++j) g[j] = flip ? wp[WRR - 1 - j] : wp[j];
#pragma unroll
    for (int q = 0; q < WR; ++q) g1(g + q, WR, s + q, WR);           /* G g */
#pragma unroll
    for (int a = 0; a < WA; ++a) g1(s + a * WR, 1, v + a * WA, 1);   /* (G g) G^T */
#pragma unroll
    for (int k = 0; k < WA * WA; ++k) u[k * us] = v[k];
}

/* U[k] (+offU) from Wt[CO][C][WR][WR] (+offW).
 * flip == 0: U[k][co][c] = (G w[co][c] G^T)[k]          (forward)
 * flip != 0: U[k][c][co] = (G rot180(w[co][c]) G^T)[k]  (backward-data:
 *            the full correlation of dy with the rotated, transposed filter). */
__kernel void wino_filter(int CO, int C, int flip,
                          __global const float* Wt, int offW,
                          __global float* U, int offU) {
    const int total = CO * C;
    GLOBAL_LOOP(i, total) {
        float u[WA * WA];
        wino_filter_one(i, CO, C, flip, Wt + offW, u, 1);
        __global float* up = U + offU + i;
#pragma unroll
        for (int k = 0; k < WA * WA; ++k) up[k * total] = u[k];
    }
}

/* u[k * us + l] = (G w G^T)[k] of filters i0 + l, l < 8, as float8 lanes
 * (lanes from nv on repeat filter i0 + nv - 1). */
inline void wino_filter_8(int i0, int nv, int CO, int C, int flip, __global const float* Wt,
                          float* u, int us) {
    float gl[WRR * 8];                                            /* gl[tap * 8 + lane] */
    for (int l = 0; l < 8; ++l) {
        const int i = i0 + min(l, nv - 1);
        int co, c;
        if (flip) { c = i / CO; co = i - c * CO; }
        else      { co = i / C; c = i - co * C; }
        __global const float* wp = Wt + (co * C + c) * WRR;
#pragma unroll
        for (int j = 0; j < WRR; ++j) gl[j * 8 + l] = flip ? wp[WRR - 1 - j] : wp[j];
    }
    float8 g[WRR], s[WA * WR], v[WA * WA];
#pragma unroll
    for (int j = 0; j < WRR; ++j) g[j] = vload8(j, gl);
#pragma unroll
    for (int q = 0; q < WR; ++q) g1_8(g + q, WR, s + q, WR);           /* G g */
#pragma unroll
    for (int a = 0; a < WA; ++a) g1_8(s + a * WR, 1, v + a * WA, 1);   /* (G g) G^T */
#pragma unroll
    for (int k = 0; k < WA * WA; ++k) vstore8(v[k], 0, u + k * us);
}

/* CPU drivers: the same U, FILTER_BLOCK filters per step, transformed
 * eight at a time as float8 lanes, each of the WA*WA matrices then
 * receiving whole 64-byte lines of them. U[k] lie Co*C floats apart,
 * often a multiple of 4 KiB: wino_filter's one-float stores to the WA*WA
 * streams all fell in one cache set and re-fetched each line once per
 * float (ResNet-50 batch 16, 2 cores: 262 ms per pass; blocks of 16
 * filters 109 ms, of 64 ~20% less again, of 256 no better); the scalar
 * transform then took ~120 cycles per filter (52 ms per pass). */
#define FILTER_BLOCK 64
__kernel void wino_filter_lines(int CO, int C, int flip,
                                __global const float* Wt, int offW,
                                __global float* U, int offU) {
    const int total = CO * C;
    GLOBAL_LOOP(b, (total + FILTER_BLOCK - 1) / FILTER_BLOCK) {
        const int i0 = FILTER_BLOCK * b, n = min(FILTER_BLOCK, total - i0);
        float u[WA * WA * FILTER_BLOCK];                  /* u[k * FILTER_BLOCK + j] */
        for (int j = 0; j < n; j += 8)
            wino_filter_8(i0 + j, min(8, n - j), CO, C, flip, Wt + offW, u + j, FILTER_BLOCK);
        __global float* up = U + offU + i0;
        if (n == FILTER_BLOCK) {
            for (int k = 0; k < WA * WA; ++k)
                for (int q = 0; q < FILTER_BLOCK; q += 16)
                    vstore16(vload16(0, u + k * FILTER_BLOCK + q), 0, up + k * total + q);
        } else {
            for (int k = 0; k < WA * WA; ++k)
                for (int j = 0; j < n; ++j) up[k * total + j] = u[k * FILTER_BLOCK + j];
        }
    }
}

/* Y[img][co][HO][WO] (+offY) = act(A^T m A + bias[co] + beta * Y) from
 * M[k][co][t] (+offM); Y's images lie YC channels apart (CO, or more when
 * Y is a slice of a Concat's top: ops/conv.py writes_slices; the CPU
 * kernels below likewise). act: 0 none, 1 leaky ReLU (slope act_a),
 * 2 clip to [act_a, act_b] (ops.gemm.act_defines); Y is read only when
 * beta != 0. */
__kernel void wino_output(int nimg, int CO, int HO, int WO, int TH, int TW, int KS,
                          __global const float* Mm, int offM,
                          __global const float* bias, int has_bias, float beta,
                          int act, float act_a, float act_b,
                          __global float* Y, int offY, int YC,
                          __global const float* G, int offG) {
    /* act == 3 (backward-data of a convolution whose input is an in-place
     * ReLU's output, fusion_train.py ReLUConvBackward): that ReLU's
     * gradient gate, v if G > 0 else act_a * v, G (shaped as Y) being the
     * ReLU's output */
    const int tiles = TH * TW;
    const int T = nimg * tiles;
    const int total = CO * T;
    /* F(4x4): with WO and the offset multiples of 4, each tile row is an
     * aligned float4 (one 16-byte store; four 4-byte stores 16 bytes apart
     * per warp instruction ran the output transforms at ~1.9 TB/s on an
     * H200) */
    const bool rows4 = WM == 4 && WO % 4 == 0 && offY % 4 == 0;
    GLOBAL_LOOP(i, total) {
        const int co = i / T, t = i - co * T;
        const int img = t / tiles, r = t - img * tiles;
        const int ty = r / TW, tx = r - ty * TW;
        __global const float* mp = Mm + offM + i;
        float m[WA * WA], s[WM * WA], o[WM * WM];
#pragma unroll
        for (int k = 0; k < WA * WA; ++k) m[k] = mp[k * KS];
#pragma unroll
        for (int b = 0; b < WA; ++b) at1(m + b, WA, s + b, WA);        /* A^T m */
#pragma unroll
        for (int a = 0; a < WM; ++a) at1(s + a * WA, 1, o + a * WM, 1); /* (A^T m) A */
        const float bv = has_bias ? bias[co] : 0.0f;
        __global float* yp = Y + offY + (img * YC + co) * HO * WO;
        __global const float* gp = G + offG + (img * CO + co) * HO * WO;
#if WM == 4
        if (rows4) {       /* a tile row is one aligned float4 of the output */
#pragma unroll
            for (int a = 0; a < WM; ++a) {
                const int oy = WM * ty + a;
                if (oy >= HO) continue;
                __global float4* p4 = (__global float4*)(yp + oy * WO + WM * tx);
                float4 v = (float4)(o[a * WM], o[a * WM + 1], o[a * WM + 2], o[a * WM + 3]) + bv;
                if (beta != 0.0f) v += beta * *p4;
                if (act == 1) v = select(act_a * v, v, v > (float4)0.0f);
                else if (act == 2) v = fmax((float4)act_a, fmin((float4)act_b, v));
                else if (act == 3)
                    v = select(act_a * v, v,
                               *(__global const float4*)(gp + oy * WO + WM * tx) > (float4)0.0f);
                *p4 = v;
            }
            continue;
        }
#endif
#pragma unroll
        for (int a = 0; a < WM; ++a) {
            const int oy = WM * ty + a;
            if (oy >= HO) continue;
#pragma unroll
            for (int b = 0; b < WM; ++b) {
                const int ox = WM * tx + b;
                if (ox >= WO) continue;
                float v = o[a * WM + b] + bv;
                if (beta != 0.0f) v += beta * yp[oy * WO + ox];
                if (act == 1) v = v > 0.0f ? v : act_a * v;
                else if (act == 2) v = fmax(act_a, fmin(act_b, v));
                else if (act == 3) v = gp[oy * WO + ox] > 0.0f ? v : act_a * v;
                yp[oy * WO + ox] = v;
            }
        }
    }
}

#if WM == 4
/* o = A^T m A of 8 tiles at once (F(4x4), the CPU output kernels below):
 * their M values read as runs of 8 from each of the 36 matrices, KS floats
 * apart from mp */
inline void wino_out8(__global const float* mp, int KS, float8* o) {
    float8 m[WA * WA], sv[WM * WA];
#pragma unroll
    for (int k = 0; k < WA * WA; ++k) m[k] = vload8(0, mp + k * KS);
#pragma unroll
    for (int b = 0; b < WA; ++b) at1_8(m + b, WA, sv + b, WA);        /* A^T m */
#pragma unroll
    for (int a = 0; a < WM; ++a) at1_8(sv + a * WA, 1, o + a * WM, 1); /* (A^T m) A */
}

/* the forward's activation (act 1: ReLU with slope a, 2: clip to [a, b])
 * of 8 outputs */
inline float8 wino_act8(float8 v, int act, float a, float b) {
    if (act == 1) return select(a * v, v, v > (float8)0.0f);
    if (act == 2) return fmax((float8)a, fmin((float8)b, v));
    return v;
}
#endif

/* CPU drivers, forward (no beta, act 0-2), F(4x4), tile rows of at least 8
 * tiles: one work-item per strip (channel co, image, tile row ty), 8
 * tiles at a time (the strip's last 8 overlapping the ones before: the
 * same values again), their M read as runs of 8 from each of the 36
 * matrices and each output row's 32 values stored as runs of 8 (tile by
 * tile, wino_output read 36 streams 4 bytes at a time). Host:
 * ops/winograd.py output_rows. */
#if WM == 4
__kernel void wino_output_rows(int nimg, int CO, int HO, int WO, int TH, int TW, int KS,
                               __global const float* Mm, int offM,
                               __global const float* bias, int has_bias,
                               int act, float act_a, float act_b,
                               __global float* Y, int offY, int YC) {
    const int strips = nimg * TH, T = nimg * TH * TW;
    GLOBAL_LOOP(i, CO * strips) {
        const int co = i / strips, r = i - co * strips;
        const int img = r / TH, ty = r - img * TH;
        __global const float* mp = Mm + offM + co * T + r * TW;
        __global float* yp = Y + offY + (img * YC + co) * HO * WO;
        const float bv = has_bias ? bias[co] : 0.0f;
        for (int t0 = 0; t0 < TW; t0 += 8) {
            const int tx = min(t0, TW - 8);
            float8 o[WM * WM];
            wino_out8(mp + tx, KS, o);
#pragma unroll
            for (int a = 0; a < WM; ++a) {
                const int oy = WM * ty + a;
                if (oy >= HO) break;
                const float8 o0 = o[a * WM] + bv, o1 = o[a * WM + 1] + bv,
                             o2 = o[a * WM + 2] + bv, o3 = o[a * WM + 3] + bv;
                /* columns 4 (tx + l) + b: lane l of o_b */
                float8 q[4];
                q[0] = (float8)(o0.s0, o1.s0, o2.s0, o3.s0, o0.s1, o1.s1, o2.s1, o3.s1);
                q[1] = (float8)(o0.s2, o1.s2, o2.s2, o3.s2, o0.s3, o1.s3, o2.s3, o3.s3);
                q[2] = (float8)(o0.s4, o1.s4, o2.s4, o3.s4, o0.s5, o1.s5, o2.s5, o3.s5);
                q[3] = (float8)(o0.s6, o1.s6, o2.s6, o3.s6, o0.s7, o1.s7, o2.s7, o3.s7);
                __global float* yr = yp + oy * WO + WM * tx;
#pragma unroll
                for (int h = 0; h < 4; ++h) {
                    const float8 v = wino_act8(q[h], act, act_a, act_b);
                    if (WM * tx + 8 * h + 8 <= WO) {
                        vstore8(v, 0, yr + 8 * h);
                    } else {
                        float e[8];
                        vstore8(v, 0, e);
                        for (int j = 0; j < 8 && WM * tx + 8 * h + j < WO; ++j) yr[8 * h + j] = e[j];
                    }
                }
            }
        }
    }
}
#endif

/* CPU drivers, forward (no beta, act 0-2), F(4x4), any tile rows (those
 * under 8 tiles, which wino_output_rows cannot take: 13 x 13 to 28 x 28
 * outputs): runs of 8 consecutive tiles of one channel, whatever rows and
 * images they lie in, transformed as vectors (M read as runs of 8 from
 * each of the 36 matrices), each lane's 4 x 4 tile stored row by row.
 * Work-item i owns runs i*runs_per .. of the CO * ceil(T / 8) runs (T =
 * nimg * TH * TW >= 8); a channel's last run starts at T - 8, its lanes
 * before 8 * (its index) belonging to the run before, which another
 * work-item may own: they are not stored (no two work-items write one
 * output). wino_output's tile by tile, scalar transform ran SqueezeNet
 * 1.0's 27 x 27 layers at 1.2-1.25x the channel-vector kernel's time. */
#if WM == 4
__kernel void wino_output_runs(int nimg, int CO, int HO, int WO, int TH, int TW, int KS,
                               int runs_per,
                               __global const float* Mm, int offM,
                               __global const float* bias, int has_bias,
                               int act, float act_a, float act_b,
                               __global float* Y, int offY, int YC) {
    const int tiles = TH * TW, T = nimg * tiles, runs = (T + 7) / 8;
    const int j0 = get_global_id(0) * runs_per, j1 = min(CO * runs, j0 + runs_per);
    for (int j = j0; j < j1; ++j) {
        const int co = j / runs, run = j - co * runs;
        const int t0 = min(8 * run, T - 8), first = 8 * run - t0;   /* lanes < first: not ours */
        __global const float* mp = Mm + offM + co * T + t0;
        const float bv = has_bias ? bias[co] : 0.0f;
        float8 o[WM * WM];
        wino_out8(mp, KS, o);
        float e[WM * WM][8];      /* e[a * 4 + b][lane] */
#pragma unroll
        for (int q = 0; q < WM * WM; ++q) vstore8(wino_act8(o[q] + bv, act, act_a, act_b), 0, e[q]);
        for (int l = first; l < 8; ++l) {
            const int t = t0 + l, img = t / tiles, r = t - img * tiles;
            const int ty = r / TW, tx = r - ty * TW;
            __global float* yp = Y + offY + (img * YC + co) * HO * WO + WM * ty * WO + WM * tx;
            const int rows = min(WM, HO - WM * ty), cols = min(WM, WO - WM * tx);
            for (int a = 0; a < rows; ++a, yp += WO) {
                if (cols == WM) {
                    vstore4((float4)(e[a * WM][l], e[a * WM + 1][l], e[a * WM + 2][l],
                                     e[a * WM + 3][l]), 0, yp);
                } else {
                    for (int b = 0; b < cols; ++b) yp[b] = e[a * WM + b][l];
                }
            }
        }
    }
}
#endif

/* dM[k][co][t] (+offM) = (A dy A^T)[k] of the m x m tile t of
 * DY[img][co][HO][WO] (+offDY), zero outside the output and for the
 * padding tiles T <= t < Tp: the adjoint of wino_output. */
__kernel void wino_output_grad(int nimg, int CO, int HO, int WO, int TH, int TW, int Tp, int KS,
                               __global const float* DY, int offDY,
                               __global float* Mm, int offM) {
    const int tiles = TH * TW;
    const int T = nimg * tiles;
    const int total = CO * Tp;
    const bool rows4 = WM == 4 && WO % 4 == 0 && offDY % 4 == 0;
    GLOBAL_LOOP(i, total) {
        const int co = i / Tp, t = i - co * Tp;
        const bool live = t < T;
        const int img = t / tiles, r = t - img * tiles;
        const int ty = r / TW, tx = r - ty * TW;
        __global const float* yp = DY + offDY + (img * CO + co) * HO * WO;
        float d[WM * WM], s[WA * WM], m[WA * WA];
#pragma unroll
        for (int a = 0; a < WM; ++a) {
            const int oy = WM * ty + a;
            const bool rowok = live && oy < HO;
#if WM == 4
            if (rows4) {     /* as wino_output: one aligned float4 per tile row */
                const float4 v = rowok ? *(__global const float4*)(yp + oy * WO + WM * tx)
                                       : (float4)0.0f;
                d[a * WM] = v.x; d[a * WM + 1] = v.y; d[a * WM + 2] = v.z; d[a * WM + 3] = v.w;
                continue;
            }
#endif
#pragma unroll
            for (int b = 0; b < WM; ++b) {
                const int ox = WM * tx + b;
                d[a * WM + b] = (rowok && ox < WO) ? yp[oy * WO + ox] : 0.0f;
            }
        }
#pragma unroll
        for (int b = 0; b < WM; ++b) a1(d + b, WM, s + b, WM);         /* A dy */
#pragma unroll
        for (int a = 0; a < WA; ++a) a1(s + a * WM, 1, m + a * WA, 1);  /* (A dy) A^T */
        __global float* mp = Mm + offM + i;    /* i == co * Tp + t */
#pragma unroll
        for (int k = 0; k < WA * WA; ++k) mp[k * KS] = m[k];
    }
}

/* DW[co][c][WR][WR] (+offW) += G^T S G, S[k] = sum over s < nsplit of
 * P[k][s][co][c] (+offP): the adjoint of wino_filter (flip == 0), which
 * also reduces the split-K partial sums of the backward-weight GEMMs. */
__kernel void wino_filter_grad(int CO, int C, int nsplit,
                               __global const float* P, int offP,
                               __global float* DW, int offW) {
    const int total = CO * C;
    GLOBAL_LOOP(i, total) {
        __global const float* pp = P + offP + i;
        float u[WA * WA], s[WR * WA], g[WRR];
#pragma unroll
        for (int k = 0; k < WA * WA; ++k) {
            float acc = 0.0f;
            for (int q = 0; q < nsplit; ++q) acc += pp[(k * nsplit + q) * total];
            u[k] = acc;
        }
#pragma unroll
        for (int b = 0; b < WA; ++b) gt1(u + b, WA, s + b, WA);         /* G^T u */
#pragma unroll
        for (int q = 0; q < WR; ++q) gt1(s + q * WA, 1, g + q * WR, 1);  /* (G^T u) G */
        __global float* wp = DW + offW + i * WRR;
#pragma unroll
        for (int j = 0; j < WRR; ++j) wp[j] += g[j];
    }
}
