/* Data-movement and element-wise-combination kernels of the shape layers:
 * Eltwise (PROD/MAX), Tile, Crop, ArgMax, row gather/scatter (Filter,
 * BatchReindex), channel gather (plan/permute.py), Embed; Concat/Slice pieces
 * (multi_copy). */
#include "common.h"

/* y = a * b (y may alias a or b) */
__kernel void eltwise_mul(int n, __global const float* a, __global const float* b,
                          __global float* y) {
    GLOBAL_LOOP(i, n) { y[i] = a[i] * b[i]; }
}

/* dx = top / b * dy (Eltwise PROD backward without stable_prod_grad) */
__kernel void eltwise_div_mul(int n, __global const float* top, __global const float* b,
                              __global const float* dy, __global float* dx) {
    GLOBAL_LOOP(i, n) { dx[i] = top[i] / b[i] * dy[i]; }
}

/* Eltwise MAX, one call per bottom from the second on, as Caffe:
 * bidx == 1: y = a > b ? a : b, mask = a > b ? 0 : 1 (a = bottom 0, b = bottom 1);
 * bidx >= 2: if b > y: y = b, mask = bidx (a unused). */
__kernel void eltwise_max(int n, __global const float* a, __global const float* b,
                          __global float* y, __global int* mask, int bidx) {
    GLOBAL_LOOP(i, n) {
        float vb = b[i];
        if (bidx == 1) {
            float va = a[i];
            if (va > vb) { y[i] = va; mask[i] = 0; }
            else { y[i] = vb; mask[i] = 1; }
        } else if (vb > y[i]) {
            y[i] = vb;
            mask[i] = bidx;
        }
    }
}

__kernel void eltwise_max_bwd(int n, __global const float* dy, __global const int* mask,
                              __global float* dx, int bidx) {
    GLOBAL_LOOP(i, n) { dx[i] = mask[i] == bidx ? dy[i] : 0.0f; }
}

/* Tile: y[o][t][k] = x[o][k], t < tiles, k < inner */
__kernel void tile_fwd(int outer, int tiles, int inner, __global const float* x,
                       __global float* y) {
    int n = outer * tiles * inner;
    GLOBAL_LOOP(i, n) {
        int o = i / (tiles * inner), k = i % inner;
        y[i] = x[o * inner + k];
    }
}

/* CPU drivers (work-groups of one item): each work-item's contiguous chunk
 * of y walked as runs of one tile (a plain copy the compiler vectorises),
 * instead of two divisions per element (PoCL: 6.6 of a 36 ms forward). */
__kernel void tile_fwd_runs(int outer, int tiles, int inner, __global const float* x,
                            __global float* y) {
    const int n = outer * tiles * inner;
    const int chunk = _gl_chunk(n);
    int k = (int)get_global_id(0) * chunk;
    const int end = min(n, k + chunk);
    if (k >= end) return;
    int i = k % inner;
    const int rest = k / inner;         /* o * tiles + t */
    int t = rest % tiles, o = rest / tiles;
    while (k < end) {
        const int len = min(inner - i, end - k);
        __global const float* xs = x + o * inner + i;
        __global float* ys = y + k;
        for (int j = 0; j < len; ++j) ys[j] = xs[j];
        k += len;
        i = 0;
        if (++t == tiles) {
            t = 0;
            ++o;
        }
    }
}

/* dx[o][k] = sum_t dy[o][t][k] (t ascending, as Caffe's copy + axpy) */
__kernel void tile_bwd(int outer, int tiles, int inner, __global const float* dy,
                       __global float* dx) {
    int n = outer * inner;
    GLOBAL_LOOP(i, n) {
        int o = i / inner, k = i - o * inner;
        __global const float* p = dy + o * tiles * inner + k;
        float s = p[0];
        for (int t = 1; t < tiles; ++t) s += p[t * inner];
        dx[i] = s;
    }
}

/* Crop: for each element i of the (top-shaped) region, b = sum_d (idx_d + off_d) * bstride_d.
 * geom = [top_shape[0..nd), bottom_stride[0..nd), offset[0..nd)].
 * forward != 0: dst[i] = src[b] (src = bottom data); else dst[b] = src[i] (src = top diff). */
__kernel void crop_copy(int n, int nd, __global const int* geom, __global const float* src,
                        __global float* dst, int forward) {
    GLOBAL_LOOP(i, n) {
        int rem = i, b = 0;
        for (int d = nd - 1; d >= 0; --d) {
            int s = geom[d];
            int id = rem % s;
            rem /= s;
            b += (id + geom[2 * nd + d]) * geom[nd + d];
        }
        if (forward) dst[i] = src[b];
        else dst[b] = src[i];
    }
}

/* crop_copy by rows of the top's last axis (contiguous in both blobs), for
 * CPU drivers (ops/shape.py): an index decoded per row, not per float
 * (per float a Crop ran at 0.31x OpenCV's speed on PoCL). */
__kernel void crop_rows(int rows, int nd, __global const int* geom, __global const float* src,
                        __global float* dst, int forward) {
    const int w = geom[nd - 1];
    GLOBAL_LOOP(r, rows) {
        int rem = r, b = geom[3 * nd - 1] * geom[2 * nd - 1];
        for (int d = nd - 2; d >= 0; --d) {
            const int s = geom[d];
            const int id = rem % s;
            rem /= s;
            b += (id + geom[2 * nd + d]) * geom[nd + d];
        }
        const size_t t = (size_t)r * w;
        if (forward) for (int j = 0; j < w; ++j) dst[t + j] = src[b + j];
        else for (int j = 0; j < w; ++j) dst[b + j] = src[t + j];
    }
}

/* ArgMax over `dim` values spaced `axis_dist` apart, for each of `num` positions.
 * Order as Caffe's partial_sort with std::greater on (value, index) pairs:
 * larger value first, ties -> larger index first.
 * mode 0: indices at (i/ad*K + j)*ad + i%ad; mode 1: values there (axis given,
 * out_max_val); mode 2: no axis, out_max_val: [i][0][j] = index, [i][1][j] = value. */
__kernel void argmax(int num, int dim, int axis_dist, int top_k, int mode,
                     __global const float* x, __global float* y) {
    GLOBAL_LOOP(i, num) {
        __global const float* p = x + (i / axis_dist * dim) * axis_dist + i % axis_dist;
        float pv = 0.0f;
        int pj = -1;
        for (int k = 0; k < top_k; ++k) {
            float bv = 0.0f;
            int bj = -1;
            for (int j = 0; j < dim; ++j) {
                float v = p[j * axis_dist];
                /* below the previous pick in pair order */
                if (pj >= 0 && !(v < pv || (v == pv && j < pj))) continue;
                if (bj < 0 || v > bv || (v == bv && j > bj)) { bv = v; bj = j; }
            }
            pv = bv;
            pj = bj;
            if (mode == 2) {
                y[2 * i * top_k + k] = (float)bj;
                y[2 * i * top_k + top_k + k] = bv;
            } else {
                y[(i / axis_dist * top_k + k) * axis_dist + i % axis_dist] =
                    mode == 1 ? bv : (float)bj;
            }
        }
    }
}

/* y[r][k] = x[idx[r]][k] for r < rows, k < dim */
__kernel void gather_rows(int rows, int dim, __global const int* idx,
                          __global const float* x, __global float* y) {
    int n = rows * dim;
    GLOBAL_LOOP(i, n) {
        int r = i / dim, k = i - r * dim;
        y[i] = x[idx[r] * dim + k];
    }
}

/* Channel gather (plan/permute.py: a 1x1 convolution whose weight is a
 * permutation matrix): y[o][c][s] = x[o][perm[c]][s] for o < n / (C * S),
 * c < C, s < S; n = outer * C * S. */
__kernel void gather_channels(int n, int C, int S, __global const int* perm,
                              __global const float* x, __global float* y) {
    GLOBAL_LOOP(i, n) {
        const int r = i / S, s = i - r * S;
        const int c = r % C;
        y[i] = x[(size_t)(r - c + perm[c]) * S + s];
    }
}

/* CPU drivers (work-groups of one item, ops.work_size): the same copy, each
 * work-item's contiguous chunk walked as runs within one plane, the source
 * plane found once per run (a plain loop the compiler vectorises). */
__kernel void gather_channels_runs(int n, int C, int S, __global const int* perm,
                                   __global const float* x, __global float* y) {
    const int chunk = _gl_chunk(n);
    int k = (int)get_global_id(0) * chunk;
    const int end = min(n, k + chunk);
    if (k >= end) return;
    int r = k / S;
    int s = k - r * S;
    while (k < end) {
        const int len = min(S - s, end - k);
        const int c = r % C;
        __global const float* src = x + (size_t)(r - c + perm[c]) * S + s;
        __global float* dst = y + k;
        for (int j = 0; j < len; ++j) dst[j] = src[j];
        k += len;
        s = 0;
        ++r;
    }
}

/* A channel gather from up to four sources into up to four destinations (a
 * Concat's inputs read in place of its top, plan/permute.py ConcatGather;
 * written straight into the tops of Slices of the gathered blob,
 * GatherSlices): each image has R rows of S values; row c of image o is
 * channel table[4c + 1] of source table[4c] (x0..x3, whose images hold
 * c0..c3 channels of S values), stored as channel table[4c + 3] of
 * destination table[4c + 2] (y0..y3, d0..d3 channels an image); unused
 * sources and destinations repeat the first. (The host's signature parser
 * reads each kernel's arguments, so they are spelled out.) */
/* the first value of plane (image o, channel ch) of buffer t of four */
#define GATHER_PLANE(t, o, ch, S, b0, n0, b1, n1, b2, n2, b3, n3)                   \
    (((t) == 0 ? (b0) : (t) == 1 ? (b1) : (t) == 2 ? (b2) : (b3))                  \
     + ((size_t)(o) * ((t) == 0 ? (n0) : (t) == 1 ? (n1) : (t) == 2 ? (n2) : (n3))  \
        + (ch)) * (S))

__kernel void gather_channels_multi(int n, int R, int S, __global const int* table,
                                    __global const float* x0, int c0,
                                    __global const float* x1, int c1,
                                    __global const float* x2, int c2,
                                    __global const float* x3, int c3,
                                    __global float* y0, int d0, __global float* y1, int d1,
                                    __global float* y2, int d2, __global float* y3, int d3) {
    GLOBAL_LOOP(i, n) {
        const int r = i / S, s = i - r * S;
        const int o = r / R, c = r - o * R;
        const int4 e = vload4(c, table);
        GATHER_PLANE(e.z, o, e.w, S, y0, d0, y1, d1, y2, d2, y3, d3)[s] =
            GATHER_PLANE(e.x, o, e.y, S, x0, c0, x1, c1, x2, c2, x3, c3)[s];
    }
}

/* CPU drivers: each work-item's contiguous chunk as runs within one row
 * (gather_channels_runs) */
__kernel void gather_channels_multi_runs(int n, int R, int S, __global const int* table,
                                         __global const float* x0, int c0,
                                         __global const float* x1, int c1,
                                         __global const float* x2, int c2,
                                         __global const float* x3, int c3,
                                         __global float* y0, int d0, __global float* y1, int d1,
                                         __global float* y2, int d2, __global float* y3, int d3) {
    const int chunk = _gl_chunk(n);
    int k = (int)get_global_id(0) * chunk;
    const int end = min(n, k + chunk);
    if (k >= end) return;
    int r = k / S;
    int s = k - r * S;
    while (k < end) {
        const int len = min(S - s, end - k);
        const int o = r / R, c = r - o * R;
        const int4 e = vload4(c, table);
        __global const float* src =
            GATHER_PLANE(e.x, o, e.y, S, x0, c0, x1, c1, x2, c2, x3, c3) + s;
        __global float* dst = GATHER_PLANE(e.z, o, e.w, S, y0, d0, y1, d1, y2, d2, y3, d3) + s;
        for (int j = 0; j < len; ++j) dst[j] = src[j];
        k += len;
        s = 0;
        ++r;
    }
}

/* dx[idx[r]][k] = dy[r][k] (idx unique) */
__kernel void scatter_rows(int rows, int dim, __global const int* idx,
                           __global const float* dy, __global float* dx) {
    int n = rows * dim;
    GLOBAL_LOOP(i, n) {
        int r = i / dim, k = i - r * dim;
        dx[idx[r] * dim + k] = dy[i];
    }
}

/* BatchReindex backward without atomics: bottom row n receives the sum of
 * the top rows top_idx[begin[n] .. begin[n] + count[n]) (ascending). */
__kernel void gather_sum_rows(int rows, int dim, __global const int* begin,
                              __global const int* count, __global const int* top_idx,
                              __global const float* dy, __global float* dx) {
    int n = rows * dim;
    GLOBAL_LOOP(i, n) {
        int r = i / dim, k = i - r * dim;
        float s = 0.0f;
        int b = begin[r], c = count[r];
        for (int j = 0; j < c; ++j) s += dy[top_idx[b + j] * dim + k];
        dx[i] = s;
    }
}

/* Embed: y[m][d] = W[(int)x[m]][d] (+ bias[d]); an index outside [0, K) gives
 * 0 (+ bias) instead of reading out of bounds (Caffe only DCHECKs). */
__kernel void embed_fwd(int M, int N, int K, __global const float* x,
                        __global const float* w, __global const float* bias,
                        __global float* y, int has_bias) {
    int n = M * N;
    GLOBAL_LOOP(i, n) {
        int m = i / N, d = i - m * N;
        int idx = (int)x[m];
        float v = (idx >= 0 && idx < K) ? w[idx * N + d] : 0.0f;
        if (has_bias) v += bias[d];
        y[i] = v;
    }
}

/* dW[(int)x[m]][d] += dy[m][d]; one work-item per column d, m ascending
 * (deterministic, no atomics). */
__kernel void embed_wgrad(int M, int N, int K, __global const float* x,
                          __global const float* dy, __global float* dw) {
    GLOBAL_LOOP(d, N) {
        for (int m = 0; m < M; ++m) {
            int idx = (int)x[m];
            if (idx >= 0 && idx < K) dw[idx * N + d] += dy[m * N + d];
        }
    }
}

/* Concat / Slice pieces in one launch (ops.shape.multi_copy): a strided
 * block y (row r at offy + r * ldy) and up to eight pieces k, each a
 * rows x c_k block stored densely at p_k + o_k (row r at r * c_k) whose
 * columns are y's columns d_k .. d_k + c_k. gather != 0: y <- pieces
 * (Concat forward, Slice backward); gather == 0: pieces <- y (Concat
 * backward, Slice forward). The work is the rows x (c_0 + ... + c_7)
 * elements in piece order; an unused piece has c_k = 0 (a zero-width
 * piece is skipped: piece k holds columns s_k <= col < s_k+1 of the walk,
 * k = the number of s_1..s_7 at or below col). */
#define MC_SEL(k) case k: p = p##k; cw = c##k; o = o##k; d = d##k; s = s##k; break
#define MC_PIECE(col) (((col) >= s1) + ((col) >= s2) + ((col) >= s3) + ((col) >= s4) + \
                       ((col) >= s5) + ((col) >= s6) + ((col) >= s7))
#define MC_FIND(col) switch (MC_PIECE(col)) { MC_SEL(0); MC_SEL(1); MC_SEL(2); MC_SEL(3); \
                                               MC_SEL(4); MC_SEL(5); MC_SEL(6); default: MC_SEL(7); }
__kernel void multi_copy(int rows, __global float* y, int offy, int ldy, int gather,
                         __global float* p0, int c0, int o0, int d0,
                         __global float* p1, int c1, int o1, int d1,
                         __global float* p2, int c2, int o2, int d2,
                         __global float* p3, int c3, int o3, int d3,
                         __global float* p4, int c4, int o4, int d4,
                         __global float* p5, int c5, int o5, int d5,
                         __global float* p6, int c6, int o6, int d6,
                         __global float* p7, int c7, int o7, int d7) {
    const int s0 = 0, s1 = c0, s2 = s1 + c1, s3 = s2 + c2, s4 = s3 + c3, s5 = s4 + c4,
              s6 = s5 + c5, s7 = s6 + c6, total = s7 + c7;
    const int n = rows * total;
    __global float* p;
    int cw, o, d, s;
    if (get_local_size(0) == 1) {
        /* CPU drivers (work-groups of one): a contiguous chunk of the walk,
         * copied run by run (a run: the rest of one piece's row) */
        const int chunk = (n + (int)get_global_size(0) - 1) / (int)get_global_size(0);
        const int i0 = min(n, (int)get_global_id(0) * chunk), i1 = min(n, i0 + chunk);
        if (i0 >= i1) return;
        int r = i0 / total, col = i0 - r * total;
        for (int i = i0; i < i1; ) {
            MC_FIND(col);
            int j = col - s, len = min(cw - j, i1 - i);
            __global float* a = p + o + r * cw + j;
            __global float* b = y + offy + r * ldy + d + j;
            if (gather) for (int t = 0; t < len; ++t) b[t] = a[t];
            else for (int t = 0; t < len; ++t) a[t] = b[t];
            i += len;
            col += len;
            if (col == total) { col = 0; ++r; }
        }
        return;
    }
    GLOBAL_LOOP(i, n) {
        int r = i / total, col = i - r * total;
        MC_FIND(col);
        int j = col - s;
        __global float* a = p + o + r * cw + j;
        __global float* b = y + offy + r * ldy + d + j;
        if (gather) *b = *a;
        else *a = *b;
    }
}

/* A Concat of Slices of one blob along the same axis (a roll: Swin's
 * shifted windows), as one gather along that axis: y[o][c][k] =
 * x[o][idx[c]][k], rows of `inner` floats (plan/slice_concat.py). GPUs
 * (GATHER_2D): a float per work-item over (k, row); CPU drivers: a row
 * per work-item. */
#ifdef GATHER_2D
__kernel void gather_axis_rows(int rows, int inner, int cout, int cin,
                               __global const int* idx, __global const float* x,
                               __global float* y) {
    const int k = get_global_id(0), r = get_global_id(1);
    if (k >= inner || r >= rows) return;
    const int o = r / cout, c = r - o * cout;
    y[(size_t)r * inner + k] = x[((size_t)o * cin + idx[c]) * inner + k];
}
#else
__kernel void gather_axis_rows(int rows, int inner, int cout, int cin,
                               __global const int* idx, __global const float* x,
                               __global float* y) {
    GLOBAL_LOOP(r, rows) {
        const int o = r / cout, c = r - o * cout;
        __global const float* s = x + ((size_t)o * cin + idx[c]) * inner;
        __global float* d = y + (size_t)r * inner;
        for (int k = 0; k < inner; ++k) d[k] = s[k];
    }
}
#endif
