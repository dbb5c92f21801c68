/* The SSD fork's layers (weiliu89/caffe, branch ssd): Normalize, Permute,
 * PriorBox and DetectionOutput (box decoding, per-class NMS, keep_top_k).
 * Semantics follow the fork's normalize_layer.cpp, permute_layer.cpp,
 * prior_box_layer.cpp, detection_output_layer.cu and util/bbox_util.cpp. */
#include "common.h"

/* ---------------------------------------------------------------- Normalize
 * x viewed as [num][channels][spatial]. */

/* ss[n*spatial + s] = sum_c x[n][c][s]^2 (+ eps when add_eps) */
__kernel void norm_sumsq_channels(int num, int channels, int spatial, float eps,
                                  int add_eps, __global const float* x,
                                  __global float* ss) {
    GLOBAL_LOOP(i, num * spatial) {
        const int n = i / spatial, s = i % spatial;
        __global const float* p = x + (size_t)n * channels * spatial + s;
        float acc = add_eps ? eps : 0.0f;
        for (int c = 0; c < channels; ++c) {
            const float v = p[(size_t)c * spatial];
            acc += v * v;
        }
        ss[i] = acc;
    }
}

/* across_spatial: norm[n] = sqrt(sum_s ss[n][s] + eps); otherwise
 * norm[i] = sqrt(ss[i]) (eps already added per position). */
__kernel void norm_finish(int num, int spatial, float eps, int across,
                          __global const float* ss, __global float* norm) {
    if (across) {
        GLOBAL_LOOP(n, num) {
            float acc = 0.0f;
            for (int s = 0; s < spatial; ++s) acc += ss[n * spatial + s];
            norm[n] = sqrt(acc + eps);
        }
    } else {
        GLOBAL_LOOP(i, num * spatial) norm[i] = sqrt(ss[i]);
    }
}

/* y = x / norm * scale (scale[0] when shared, else scale[c]) */
__kernel void norm_fwd(int num, int channels, int spatial, int across, int shared,
                       __global const float* x, __global const float* norm,
                       __global const float* scale, __global float* y) {
    const int dim = channels * spatial;
    GLOBAL_LOOP(i, num * dim) {
        const int n = i / dim, c = (i % dim) / spatial, s = i % spatial;
        const float nv = across ? norm[n] : norm[n * spatial + s];
        y[i] = x[i] / nv * (shared ? scale[0] : scale[c]);
    }
}

/* dot[n*spatial + s] = sum_c scale_c * x[n][c][s] * dy[n][c][s] */
__kernel void norm_dot_channels(int num, int channels, int spatial, int shared,
                                __global const float* x, __global const float* dy,
                                __global const float* scale, __global float* dot) {
    GLOBAL_LOOP(i, num * spatial) {
        const int n = i / spatial, s = i % spatial;
        const size_t base = (size_t)n * channels * spatial + s;
        float acc = 0.0f;
        for (int c = 0; c < channels; ++c)
            acc += (shared ? scale[0] : scale[c])
                   * x[base + (size_t)c * spatial] * dy[base + (size_t)c * spatial];
        dot[i] = acc;
    }
}

/* across: a[n] = sum_s dot[n][s] (written into dot[n*spatial]) */
__kernel void norm_dot_finish(int num, int spatial, __global float* dot) {
    GLOBAL_LOOP(n, num) {
        float acc = 0.0f;
        for (int s = 0; s < spatial; ++s) acc += dot[n * spatial + s];
        dot[n * spatial] = acc;
    }
}

/* dx = (scale_c * dy - x * a / norm^2) / norm, a = sum_c scale_c x_c dy_c:
 * the gradient of y = x / norm * scale. The fork multiplies
 * (dy - x * sum_c x_c dy_c / norm^2) / norm by scale_c, which is the same
 * for a shared (or uniform) scale and not the gradient otherwise. */
__kernel void norm_bwd(int num, int channels, int spatial, int across, int shared,
                       __global const float* x, __global const float* dy,
                       __global const float* norm, __global const float* dot,
                       __global const float* scale, __global float* dx) {
    const int dim = channels * spatial;
    GLOBAL_LOOP(i, num * dim) {
        const int n = i / dim, c = (i % dim) / spatial, s = i % spatial;
        const float nv = across ? norm[n] : norm[n * spatial + s];
        const float a = across ? dot[n * spatial] : dot[n * spatial + s];
        dx[i] = ((shared ? scale[0] : scale[c]) * dy[i] - x[i] * (a / nv / nv))
                * (1.0f / nv);
    }
}

/* scale gradient: shared: dscale[0] += sum(y*dy) / scale[0];
 * per channel: dscale[c] += sum_{n,s} y*dy / scale[c]. One work-item per
 * output value. */
__kernel void norm_scale_grad(int num, int channels, int spatial, int shared,
                              __global const float* y, __global const float* dy,
                              __global const float* scale, __global float* dscale) {
    const int nout = shared ? 1 : channels;
    GLOBAL_LOOP(c, nout) {
        float acc = 0.0f;
        for (int n = 0; n < num; ++n) {
            const int c0 = shared ? 0 : c, c1 = shared ? channels : c + 1;
            for (int cc = c0; cc < c1; ++cc) {
                const size_t base = ((size_t)n * channels + cc) * spatial;
                for (int s = 0; s < spatial; ++s) acc += y[base + s] * dy[base + s];
            }
        }
        dscale[c] += acc / scale[c];
    }
}

/* ------------------------------------------------------------------ Permute
 * geom: new_steps[ndim], old_steps[order[j]] for j < ndim. */
/* the input offset of output index idx (geom: the output's ndim steps,
 * then the old steps of the axes they came from) */
inline int permute_source(int idx, int ndim, __global const int* geom) {
    int old = 0;
    for (int j = 0; j < ndim; ++j) {
        const int step = geom[j];
        old += (idx / step) * geom[ndim + j];
        idx %= step;
    }
    return old;
}

__kernel void permute(int n, int ndim, __global const int* geom,
                      __global const float* src, __global float* dst, int forward) {
    GLOBAL_LOOP(i, n) {
        const int old = permute_source(i, ndim, geom);
        if (forward) dst[i] = src[old];
        else dst[old] = src[i];
    }
}

/* CPU drivers: the output walked as rows of its last axis (``run``
 * values), the index decoded once per row (geom's new steps counted in
 * rows, the old steps in floats) and the row gathered from the input at
 * ``stride`` (scattered back in backward). An order that keeps the last
 * axes in place (attention's (N, L, 3, h, d) -> (3, N, h, L, d)) has them
 * as one row of stride 1: a plain copy. permute decoded every float with
 * a division per axis (0.8 GB/s on PoCL). */
__kernel void permute_rows(int nrows, int ndim, int run, int stride,
                           __global const int* geom, __global const float* src,
                           __global float* dst, int forward) {
    GLOBAL_LOOP(r, nrows) {
        const int old = permute_source(r, ndim, geom);
        if (forward) {
            __global const float* s = src + old;
            __global float* d = dst + (long)r * run;
            if (stride == 1)
                for (int k = 0; k < run; ++k) d[k] = s[k];
            else
                for (int k = 0; k < run; ++k) d[k] = s[(long)k * stride];
        } else {
            __global const float* s = src + (long)r * run;
            __global float* d = dst + old;
            if (stride == 1)
                for (int k = 0; k < run; ++k) d[k] = s[k];
            else
                for (int k = 0; k < run; ++k) d[(long)k * stride] = s[k];
        }
    }
}

/* [outer][R][S] -> [outer][S][R]: the Permute orders that swap two runs
 * of axes (SSD's 0 2 3 1 on every head), on CPU drivers (ops/ssd.py). The
 * kernel above decodes every index with a division per axis: a 64 x 56 x
 * 56 map ran at 0.11x OpenCV's speed on PoCL. Work-items over (outer,
 * block of TR_SB columns s), each writing whole rows of the output (no
 * two cores on one cache line); 8 x 8 blocks (8 rows r, 8 columns s) read
 * as 8 vectors and transposed in registers (transpose8.h; gathering 8
 * rows r into each vector store everywhere, PVT v2's token moves, 32 x
 * 3136 to 160 x 196, took 1.4-1.5x longer on a 2-core EPYC Zen 3), the
 * block's column edge 8 rows r gathered into one vector store, the rows
 * past a multiple of 8 one float at a time. */
#ifndef TR_SB
#define TR_SB 64
#endif
#define T8_NAME store_transposed8_g
#define T8_SPACE __global
#include "transpose8.h"
#undef T8_NAME
#undef T8_SPACE
__kernel void transpose_rs(int outer, int R, int S, __global const float* src,
                           __global float* dst) {
    const int sblocks = (S + TR_SB - 1) / TR_SB;
    GLOBAL_LOOP(item, outer * sblocks) {
        const int o = item / sblocks, s0 = (item - o * sblocks) * TR_SB;
        const int s1 = min(S, s0 + TR_SB);
        __global const float* a = src + (size_t)o * R * S;
        __global float* b = dst + (size_t)o * R * S;
        int r = 0;
        for (; r + 8 <= R; r += 8) {
            __global const float* ar = a + (size_t)r * S;
            int s = s0;
            for (; s + 8 <= s1; s += 8)
                store_transposed8_g(b + (size_t)s * R + r, R,
                                    vload8(0, ar + s), vload8(0, ar + S + s),
                                    vload8(0, ar + 2 * (size_t)S + s), vload8(0, ar + 3 * (size_t)S + s),
                                    vload8(0, ar + 4 * (size_t)S + s), vload8(0, ar + 5 * (size_t)S + s),
                                    vload8(0, ar + 6 * (size_t)S + s), vload8(0, ar + 7 * (size_t)S + s));
            for (; s < s1; ++s) {
                const float8 v = (float8)(ar[s], ar[S + s], ar[2 * (size_t)S + s],
                                          ar[3 * (size_t)S + s], ar[4 * (size_t)S + s],
                                          ar[5 * (size_t)S + s], ar[6 * (size_t)S + s],
                                          ar[7 * (size_t)S + s]);
                vstore8(v, 0, b + (size_t)s * R + r);
            }
        }
        for (; r < R; ++r)
            for (int s = s0; s < s1; ++s) b[(size_t)s * R + r] = a[(size_t)r * S + s];
    }
}

/* GPUs: a batched transpose [outer][R][S] -> [outer][S][R] through a
 * 32 x 33 tile of local memory, both sides read and written along rows
 * (attention's K^T, Swin's head moves); work-groups (32, 8), each item
 * four rows of its tile. permute decoded each float alone, reading one
 * side 4 to 64 floats apart. */
__kernel __attribute__((reqd_work_group_size(32, 8, 1)))
void transpose_tiles(int outer, int R, int S, __global const float* src,
                     __global float* dst) {
    __local float t[32][33];
    const int o = get_group_id(1) / ((R + 31) / 32);
    const int r0 = (get_group_id(1) - o * ((R + 31) / 32)) * 32;
    const int s0 = get_group_id(0) * 32;
    const int lx = get_local_id(0), ly = get_local_id(1);
    __global const float* a = src + (size_t)o * R * S;
    __global float* b = dst + (size_t)o * R * S;
    for (int k = ly; k < 32; k += 8) {
        const int r = r0 + k, sc = s0 + lx;
        if (r < R && sc < S) t[k][lx] = a[(size_t)r * S + sc];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = ly; k < 32; k += 8) {
        const int sc = s0 + k, r = r0 + lx;
        if (sc < S && r < R) b[(size_t)sc * R + r] = t[lx][k];
    }
}

/* GPUs: any other order as rows of the output (row_plan: the kept last
 * axes as one run of stride 1, else the output's last axis read at its
 * input stride), a work-item per float: work-groups (RUN_LX, 256 /
 * RUN_LX) over (the run, rows), each row decoded once per item with the
 * old steps in floats and the new ones in rows. */
__kernel void permute_runs(int nrows, int ndim, int run, int stride,
                           __global const int* geom, __global const float* src,
                           __global float* dst, int forward) {
    const int k = get_global_id(0), r = get_global_id(1);
    if (k >= run || r >= nrows) return;
    const int old = permute_source(r, ndim, geom) + k * stride;
    const size_t at = (size_t)r * run + k;
    if (forward) dst[at] = src[old];
    else dst[old] = src[at];
}

/* ----------------------------------------------------------------- PriorBox
 * boxes: nbox x (box width, box height) in pixels; offsets: noff x
 * (offset x, offset y). Prior k of cell (h, w) is box k / noff at offset
 * k % noff. top: [2][lh*lw*nbox*noff*4]: corners, then variances. */
__kernel void prior_box(int lh, int lw, int nbox, int noff, float img_w, float img_h,
                        float step_w, float step_h, int clip, int nvar,
                        __global const float* boxes, __global const float* offsets,
                        __global const float* var, __global float* top) {
    const int np = nbox * noff;
    const int dim = lh * lw * np * 4;
    GLOBAL_LOOP(i, dim) {
        const int j = i % 4, p = (i / 4) % np, cell = i / 4 / np;
        const int h = cell / lw, w = cell % lw;
        const int b = p / noff, o = p % noff;
        const float cx = ((float)w + offsets[2 * o]) * step_w;
        const float cy = ((float)h + offsets[2 * o + 1]) * step_h;
        const float bw = boxes[2 * b], bh = boxes[2 * b + 1];
        float v;
        if (j == 0) v = (cx - bw / 2.0f) / img_w;
        else if (j == 1) v = (cy - bh / 2.0f) / img_h;
        else if (j == 2) v = (cx + bw / 2.0f) / img_w;
        else v = (cy + bh / 2.0f) / img_h;
        if (clip) v = fmin(fmax(v, 0.0f), 1.0f);
        top[i] = v;
        top[dim + i] = nvar == 1 ? var[0] : var[j];
    }
}

/* ---------------------------------------------------------- DetectionOutput
 * Code types: 1 CORNER, 2 CENTER_SIZE, 3 CORNER_SIZE. loc: [num][np][nlc][4];
 * prior: corners [np][4] then variances [np][4]. bbox: same layout as loc. */
__kernel void detout_decode(int n, int code_type, int var_in_target, int np, int nlc,
                            int share_location, int background, int clip,
                            __global const float* loc, __global const float* prior,
                            __global float* bbox) {
    GLOBAL_LOOP(index, n) {
        const int i = index % 4;
        const int c = (index / 4) % nlc;
        const int d = (index / 4 / nlc) % np;
        if (!share_location && c == background) {
            bbox[index] = 0.0f;
            continue;
        }
        const int pi = d * 4, vi = pi + np * 4;
        const float vr = var_in_target ? 1.0f : prior[vi + i];
        float v;
        if (code_type == 1) {
            v = prior[pi + i] + loc[index] * vr;
        } else if (code_type == 2) {
            const float pw = prior[pi + 2] - prior[pi], ph = prior[pi + 3] - prior[pi + 1];
            const float pcx = (prior[pi] + prior[pi + 2]) / 2.0f;
            const float pcy = (prior[pi + 1] + prior[pi + 3]) / 2.0f;
            const int b0 = index - i;
            const float v0 = var_in_target ? 1.0f : prior[vi];
            const float v1 = var_in_target ? 1.0f : prior[vi + 1];
            const float v2 = var_in_target ? 1.0f : prior[vi + 2];
            const float v3 = var_in_target ? 1.0f : prior[vi + 3];
            const float cx = v0 * loc[b0] * pw + pcx;
            const float cy = v1 * loc[b0 + 1] * ph + pcy;
            const float bw = exp(v2 * loc[b0 + 2]) * pw;
            const float bh = exp(v3 * loc[b0 + 3]) * ph;
            v = i == 0 ? cx - bw / 2.0f : i == 1 ? cy - bh / 2.0f
              : i == 2 ? cx + bw / 2.0f : cy + bh / 2.0f;
        } else {
            const float psize = (i == 0 || i == 2) ? prior[pi + 2] - prior[pi]
                                                   : prior[pi + 3] - prior[pi + 1];
            v = prior[pi + i] + loc[index] * vr * psize;
        }
        if (clip) v = fmax(fmin(v, 1.0f), 0.0f);
        bbox[index] = v;
    }
}

inline float bbox_size(__global const float* b, int normalized) {
    if (b[2] < b[0] || b[3] < b[1]) return 0.0f;
    const float w = b[2] - b[0], h = b[3] - b[1];
    return normalized ? w * h : (w + 1.0f) * (h + 1.0f);
}

/* bbox_util's JaccardOverlap (normalized: the fork's; OpenCV's
 * normalized_bbox false adds 1 to the sizes). */
inline float jaccard(__global const float* a, __global const float* b, int normalized) {
    if (b[0] > a[2] || b[2] < a[0] || b[1] > a[3] || b[3] < a[1]) return 0.0f;
    const float ixmin = fmax(a[0], b[0]), iymin = fmax(a[1], b[1]);
    const float ixmax = fmin(a[2], b[2]), iymax = fmin(a[3], b[3]);
    const float iw = ixmax - ixmin, ih = iymax - iymin;
    const float inter = normalized ? iw * ih : (iw + 1.0f) * (ih + 1.0f);
    const float s1 = bbox_size(a, normalized), s2 = bbox_size(b, normalized);
    return inter / (s1 + s2 - inter);
}

/* "a before b" in the fork's descending score order; equal scores keep the
 * lower index first (std::sort leaves their order unspecified). */
inline int score_before(float sa, int ia, float sb, int ib) {
    return sa > sb || (sa == sb && ia < ib);
}

/* ApplyNMSFast for one (image, class) pair per work-item: candidates with
 * score > threshold, sorted by score (top_k kept when top_k > -1), greedy
 * NMS with the adaptive threshold (eta). conf: [num][np][ncls] (softmaxed,
 * as the net gives it). cand: scratch of np ints per pair. keep: kept
 * prior indices, np per pair, in NMS order; nkeep: their count. */
__kernel void detout_nms(int num, int np, int ncls, int nlc, int share_location,
                         int background, float conf_thresh, float nms_thresh,
                         float eta, int top_k, int normalized,
                         __global const float* conf, __global const float* bbox,
                         __global int* cand, __global int* keep, __global int* nkeep) {
    GLOBAL_LOOP(pair, num * ncls) {
        const int n = pair / ncls, c = pair % ncls;
        __global int* cd = cand + (size_t)pair * np;
        __global int* kp = keep + (size_t)pair * np;
        if (c == background) {
            nkeep[pair] = 0;
            continue;
        }
        __global const float* sc = conf + (size_t)n * np * ncls + c;
        /* the candidates, heap-sorted into (score desc, index asc) order
         * (O(m log m)), then the first top_k of them */
        int m = 0;
        for (int p = 0; p < np; ++p)
            if (sc[(size_t)p * ncls] > conf_thresh) cd[m++] = p;
        for (int start = m / 2 - 1; start >= -m + 1; --start) {
            /* build phase (start >= 0), then extraction (end = m + start) */
            int root = start >= 0 ? start : 0, end = start >= 0 ? m : m + start;
            if (start < 0) {
                const int t = cd[0]; cd[0] = cd[end]; cd[end] = t;
            }
            for (;;) {  /* sift down: a max-heap of "comes later" */
                int child = 2 * root + 1;
                if (child >= end) break;
                if (child + 1 < end && score_before(sc[(size_t)cd[child] * ncls], cd[child],
                                                    sc[(size_t)cd[child + 1] * ncls], cd[child + 1]))
                    ++child;
                if (!score_before(sc[(size_t)cd[root] * ncls], cd[root],
                                  sc[(size_t)cd[child] * ncls], cd[child]))
                    break;
                const int t = cd[root]; cd[root] = cd[child]; cd[child] = t;
                root = child;
            }
        }
        if (top_k > -1 && m > top_k) m = top_k;
        const int lc = share_location ? 0 : c;
        __global const float* bb = bbox + (size_t)n * np * nlc * 4;
        float thr = nms_thresh;
        int k = 0;
        for (int q = 0; q < m; ++q) {
            const int idx = cd[q];
            int ok = 1;
            for (int t = 0; t < k && ok; ++t)
                ok = jaccard(bb + ((size_t)idx * nlc + lc) * 4,
                             bb + ((size_t)kp[t] * nlc + lc) * 4, normalized) <= thr;
            if (ok) {
                kp[k++] = idx;
                if (eta < 1.0f && thr > 0.5f) thr *= eta;
            }
        }
        nkeep[pair] = k;
    }
}

/* keep_top_k per image (one work-item each): the keep_top_k best kept
 * detections in (score desc, label asc, NMS position asc) order, found by
 * insertion into a sorted list of at most keep_top_k slots (best: scratch
 * of keep_top_k ints per image, each slot pair * np + j), so the cost is
 * total x keep_top_k at most. sel marks each kept slot 1/0; count[n] is the
 * image's number of output rows. */
__kernel void detout_keep_top_k(int num, int np, int ncls, int keep_top_k,
                                __global const float* conf, __global const int* keep,
                                __global const int* nkeep, __global int* sel,
                                __global int* count, __global int* best) {
    GLOBAL_LOOP(n, num) {
        __global const float* sc = conf + (size_t)n * np * ncls;
        int total = 0;
        for (int c = 0; c < ncls; ++c) total += nkeep[n * ncls + c];
        const int trim = keep_top_k > -1 && total > keep_top_k;
        for (int c = 0; c < ncls; ++c) {
            const int pair = n * ncls + c;
            for (int j = 0; j < nkeep[pair]; ++j) sel[(size_t)pair * np + j] = !trim;
        }
        if (!trim) {
            count[n] = total;
            continue;
        }
        __global int* bs = best + (size_t)n * keep_top_k;
        int m = 0;
        for (int c = 0; c < ncls; ++c) {
            const int pair = n * ncls + c;
            for (int j = 0; j < nkeep[pair]; ++j) {
                const float v = sc[(size_t)keep[(size_t)pair * np + j] * ncls + c];
                /* entries come in (label, position) order: a new one goes
                 * after every kept one of an equal score */
                if (m == keep_top_k) {
                    const int last = bs[m - 1], lc = last / np - n * ncls;
                    if (!(v > sc[(size_t)keep[last] * ncls + lc])) continue;
                }
                int k = m < keep_top_k ? m++ : m - 1;
                while (k > 0) {
                    const int prev = bs[k - 1], pc = prev / np - n * ncls;
                    if (!(v > sc[(size_t)keep[prev] * ncls + pc])) break;
                    bs[k] = prev;
                    --k;
                }
                bs[k] = pair * np + j;
            }
        }
        for (int k = 0; k < m; ++k) sel[bs[k]] = 1;
        count[n] = m;
    }
}

/* Output rows [image, label, score, xmin, ymin, xmax, ymax], per image in
 * label order, within a label in NMS order. empty: no detection in the
 * batch: one row per image [image, -1 x 6], as the fork. */
__kernel void detout_write(int num, int np, int ncls, int nlc, int share_location,
                           int empty, __global const float* conf,
                           __global const float* bbox, __global const int* keep,
                           __global const int* nkeep, __global const int* sel,
                           __global const int* count, __global float* top) {
    GLOBAL_LOOP(n, num) {
        if (empty) {
            top[n * 7] = (float)n;
            for (int k = 1; k < 7; ++k) top[n * 7 + k] = -1.0f;
            continue;
        }
        int row = 0;
        for (int m = 0; m < n; ++m) row += count[m];
        for (int c = 0; c < ncls; ++c) {
            const int pair = n * ncls + c;
            const int lc = share_location ? 0 : c;
            for (int j = 0; j < nkeep[pair]; ++j) {
                if (!sel[(size_t)pair * np + j]) continue;
                const int idx = keep[(size_t)pair * np + j];
                __global float* o = top + (size_t)row * 7;
                __global const float* b = bbox + (((size_t)n * np + idx) * nlc + lc) * 4;
                o[0] = (float)n;
                o[1] = (float)c;
                o[2] = conf[((size_t)n * np + idx) * ncls + c];
                o[3] = b[0]; o[4] = b[1]; o[5] = b[2]; o[6] = b[3];
                ++row;
            }
        }
    }
}
