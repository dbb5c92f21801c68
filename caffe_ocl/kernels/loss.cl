/* Loss and metric layers (Caffe's loss_layers), forward and backward.
 *
 * Forward is two stages: a per-item kernel writes each item's loss (and,
 * for VALID normalization, a 0/1 "counted" flag) into scratch buffers, then
 * loss_reduce, one work-group, sums them, computes the normalizer on the
 * device and writes top[0] and the normalizer (kept for backward).
 * Backward kernels read the loss weight from the top's diff (Caffe's
 * top[0]->cpu_diff()[0]) and the normalizer from device memory, so nothing
 * is read back to the host.
 *
 * Labels are float blobs converted with (int) (C truncation, as Caffe's
 * static_cast<int>). A label outside [0, C) (not ignored) makes that
 * item's loss and gradient NaN instead of reading out of bounds (Caffe only
 * DCHECKs it), and the forward kernel notes the first one in the layer's
 * check buffer ``chk`` (note_bad_label), which the host reads where it
 * synchronises anyway (layers/loss.py LabelCheck): only a bad label takes
 * that branch, so good batches pay nothing.
 * Remainders are written as idx - q * n rather than idx % n: LLVM turns a
 * div/rem pair into a `freeze` instruction that Oclgrind's uninitialized-
 * value checker (OCLGRIND_UNINITIALIZED=1) cannot run.
 */
#include "common.h"

#ifndef WG
#define WG 64          /* work-group size of the reductions (power of two) */
#endif
#if (WG & (WG - 1)) != 0
#error "WG must be a power of two"
#endif

#define LOG_THRESHOLD 1e-20f   /* Caffe's kLOG_THRESHOLD */

inline int is_ignored(int l, int has_ignore, int ignore_label) {
    return has_ignore && l == ignore_label;
}

/* The layer's label check buffer (5 ints): chk[0] 0 -> 1 for the first bad
 * label (atomic), then chk[1] its float bits, chk[2] the item (flat index
 * into the label blob) and chk[4] the forward pass it came in: chk[3]
 * counts finished passes (loss_reduce adds one; the queue is in order, so
 * nothing writes it while a forward kernel reads it). */
inline void note_bad_label(__global int* chk, float label, int item) {
    if (atomic_cmpxchg((volatile __global int*)chk, 0, 1) == 0) {
        chk[1] = as_int(label);
        chk[2] = item;
        chk[4] = chk[3];
    }
}

/* ---- stage 2: one work-group sums n values (and counts) ----------------
 * norm = use_count ? sum(cnt) : fixed_norm, then max(norm, 1) as Caffe's
 * get_normalizer; top[0] = scale * sum(vals) / norm; norm_out[0] = norm. */
__kernel void loss_reduce(int n, __global const float* vals, __global const float* cnt,
                          int use_count, float fixed_norm, float scale,
                          __global float* top, __global float* norm_out,
                          __global int* chk, int count_pass) {
    __local float sv[WG];
    __local float sc[WG];
    int lid = get_local_id(0);
    float v = 0.0f, c = 0.0f;
    for (int i = lid; i < n; i += WG) {
        v += vals[i];
        if (use_count) c += cnt[i];
    }
    sv[lid] = v;
    sc[lid] = c;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (lid < s) {
            sv[lid] += sv[lid + s];
            sc[lid] += sc[lid + s];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) {
        float norm = fmax(use_count ? sc[0] : fixed_norm, 1.0f);
        top[0] = scale * sv[0] / norm;
        norm_out[0] = norm;
        if (count_pass) chk[3] += 1;     /* one more forward pass of a checked layer */
    }
}

/* ---- SoftmaxWithLoss: prob is [outer][C][inner] ------------------------- */
__kernel void softmax_loss_fwd(int outer, int C, int inner, __global const float* prob,
                               __global const float* label, int has_ignore, int ignore_label,
                               __global float* loss, __global float* cnt, __global int* chk) {
    int total = outer * inner;
    GLOBAL_LOOP(idx, total) {
        int o = idx / inner, s = idx - o * inner;
        int l = (int)label[idx];
        if (is_ignored(l, has_ignore, ignore_label)) {
            loss[idx] = 0.0f;
            cnt[idx] = 0.0f;
        } else if (l >= 0 && l < C) {
            loss[idx] = -log(fmax(prob[(o * C + l) * inner + s], FLT_MIN));
            cnt[idx] = 1.0f;
        } else {
            note_bad_label(chk, label[idx], idx);
            loss[idx] = NAN;
            cnt[idx] = 1.0f;
        }
    }
}

/* dx = (prob - [c == label]) * loss_weight / norm; 0 where ignored */
__kernel void softmax_loss_bwd(int outer, int C, int inner, __global const float* prob,
                               __global const float* label, int has_ignore, int ignore_label,
                               __global const float* top_diff, __global const float* norm,
                               __global float* dx) {
    int total = outer * C * inner;
    float w = top_diff[0] / norm[0];
    GLOBAL_LOOP(idx, total) {
        int q = idx / inner, s = idx - q * inner, o = q / C, c = q - o * C;
        int l = (int)label[o * inner + s];
        float g;
        if (is_ignored(l, has_ignore, ignore_label)) g = 0.0f;
        else if (l < 0 || l >= C) g = NAN;
        else g = (prob[idx] - (c == l ? 1.0f : 0.0f)) * w;
        dx[idx] = g;
    }
}

/* ---- InfogainLoss (softmax inside, as final BVLC) ----------------------- */
__kernel void infogain_loss_fwd(int outer, int C, int inner, __global const float* prob,
                                __global const float* label, __global const float* H,
                                int has_ignore, int ignore_label,
                                __global float* loss, __global float* cnt,
                                __global int* chk) {
    int total = outer * inner;
    GLOBAL_LOOP(idx, total) {
        int o = idx / inner, s = idx - o * inner;
        int l = (int)label[idx];
        if (is_ignored(l, has_ignore, ignore_label)) {
            loss[idx] = 0.0f;
            cnt[idx] = 0.0f;
            continue;
        }
        float acc = NAN;
        if (l >= 0 && l < C) {
            acc = 0.0f;
            for (int k = 0; k < C; ++k)
                acc -= H[l * C + k] * log(fmax(prob[(o * C + k) * inner + s], LOG_THRESHOLD));
        } else {
            note_bad_label(chk, label[idx], idx);
        }
        loss[idx] = acc;
        cnt[idx] = 1.0f;
    }
}

/* rowsum[r] = sum_c H[r][c] */
__kernel void infogain_rowsum(int C, __global const float* H, __global float* rowsum) {
    GLOBAL_LOOP(r, C) {
        float s = 0.0f;
        for (int c = 0; c < C; ++c) s += H[r * C + c];
        rowsum[r] = s;
    }
}

/* dx = (prob * rowsum[label] - H[label][c]) * loss_weight / norm */
__kernel void infogain_loss_bwd(int outer, int C, int inner, __global const float* prob,
                                __global const float* label, __global const float* H,
                                __global const float* rowsum, int has_ignore, int ignore_label,
                                __global const float* top_diff, __global const float* norm,
                                __global float* dx) {
    int total = outer * C * inner;
    float w = top_diff[0] / norm[0];
    GLOBAL_LOOP(idx, total) {
        int q = idx / inner, s = idx - q * inner, o = q / C, c = q - o * C;
        int l = (int)label[o * inner + s];
        float g;
        if (is_ignored(l, has_ignore, ignore_label)) g = 0.0f;
        else if (l < 0 || l >= C) g = NAN;
        else g = (prob[idx] * rowsum[l] - H[l * C + c]) * w;
        dx[idx] = g;
    }
}

/* ---- SigmoidCrossEntropyLoss ------------------------------------------- */
__kernel void sigmoid_ce_fwd(int n, __global const float* x, __global const float* target,
                             int has_ignore, int ignore_label,
                             __global float* loss, __global float* cnt) {
    GLOBAL_LOOP(i, n) {
        float t = target[i];
        if (is_ignored((int)t, has_ignore, ignore_label)) {
            loss[i] = 0.0f;
            cnt[i] = 0.0f;
        } else {
            float v = x[i];
            float pos = v >= 0.0f ? 1.0f : 0.0f;
            /* Caffe's stable form: -(x (t - [x>=0]) - log(1 + exp(x - 2x[x>=0]))) */
            loss[i] = -(v * (t - pos) - log1p(exp(v - 2.0f * v * pos)));
            cnt[i] = 1.0f;
        }
    }
}

__kernel void sigmoid_ce_bwd(int n, __global const float* x, __global const float* target,
                             int has_ignore, int ignore_label,
                             __global const float* top_diff, __global const float* norm,
                             __global float* dx) {
    float w = top_diff[0] / norm[0];
    GLOBAL_LOOP(i, n) {
        float t = target[i];
        dx[i] = is_ignored((int)t, has_ignore, ignore_label)
            ? 0.0f : (1.0f / (1.0f + exp(-x[i])) - t) * w;
    }
}

/* ---- EuclideanLoss: sum (a-b)^2 / num / 2 ------------------------------ */
__kernel void sq_diff(int n, __global const float* a, __global const float* b,
                      __global float* out) {
    GLOBAL_LOOP(i, n) {
        float d = a[i] - b[i];
        out[i] = d * d;
    }
}

/* dx = sign * loss_weight / norm * (a - b) */
__kernel void euclidean_bwd(int n, __global const float* a, __global const float* b,
                            float sign, __global const float* top_diff,
                            __global const float* norm, __global float* dx) {
    float w = sign * top_diff[0] / norm[0];
    GLOBAL_LOOP(i, n) dx[i] = w * (a[i] - b[i]);
}

/* ---- HingeLoss: x is [num][dim], label[num]; NORM 1 (L1) or 2 (L2) ----- */
__kernel void hinge_fwd(int num, int dim, __global const float* x, __global const float* label,
                        int norm_p, __global float* loss, __global int* chk) {
    GLOBAL_LOOP(i, num) {
        int l = (int)label[i];
        if (l < 0 || l >= dim) {
            note_bad_label(chk, label[i], i);
            loss[i] = NAN;
            continue;
        }
        float acc = 0.0f;
        for (int j = 0; j < dim; ++j) {
            float t = fmax(0.0f, 1.0f + (j == l ? -1.0f : 1.0f) * x[i * dim + j]);
            acc += norm_p == 2 ? t * t : t;
        }
        loss[i] = acc;
    }
}

__kernel void hinge_bwd(int num, int dim, __global const float* x, __global const float* label,
                        int norm_p, __global const float* top_diff, __global const float* norm,
                        __global float* dx) {
    int total = num * dim;
    float w = top_diff[0] / norm[0];
    GLOBAL_LOOP(idx, total) {
        int i = idx / dim, j = idx - i * dim;
        int l = (int)label[i];
        float s = j == l ? -1.0f : 1.0f;
        float t = fmax(0.0f, 1.0f + s * x[idx]);
        float g = norm_p == 2 ? 2.0f * s * t : (t > 0.0f ? s : 0.0f);
        dx[idx] = (l >= 0 && l < dim) ? g * w : NAN;
    }
}

/* ---- MultinomialLogisticLoss: x holds probabilities [num][dim] --------- */
__kernel void mlogistic_fwd(int num, int dim, __global const float* x,
                            __global const float* label, __global float* loss,
                            __global int* chk) {
    GLOBAL_LOOP(i, num) {
        int l = (int)label[i];
        if (l >= 0 && l < dim) {
            loss[i] = -log(fmax(x[i * dim + l], LOG_THRESHOLD));
        } else {
            note_bad_label(chk, label[i], i);
            loss[i] = NAN;
        }
    }
}

__kernel void mlogistic_bwd(int num, int dim, __global const float* x,
                            __global const float* label, __global const float* top_diff,
                            __global const float* norm, __global float* dx) {
    int total = num * dim;
    float w = -top_diff[0] / norm[0];
    GLOBAL_LOOP(idx, total) {
        int i = idx / dim, j = idx - i * dim;
        int l = (int)label[i];
        float g = j == l ? w / fmax(x[idx], LOG_THRESHOLD) : 0.0f;
        dx[idx] = (l >= 0 && l < dim) ? g : NAN;
    }
}

/* ---- ContrastiveLoss: a, b [num][dim], sim[num] ------------------------ */
__kernel void contrastive_fwd(int num, int dim, __global const float* a,
                              __global const float* b, __global const float* sim,
                              float margin, int legacy, __global float* dist_sq,
                              __global float* loss) {
    GLOBAL_LOOP(i, num) {
        float d2 = 0.0f;
        for (int j = 0; j < dim; ++j) {
            float d = a[i * dim + j] - b[i * dim + j];
            d2 += d * d;
        }
        dist_sq[i] = d2;
        float l;
        if ((int)sim[i]) l = d2;
        else if (legacy) l = fmax(margin - d2, 0.0f);
        else {
            float m = fmax(margin - sqrt(d2), 0.0f);
            l = m * m;
        }
        loss[i] = l;
    }
}

/* gradient of bottom a (sign = 1) or b (sign = -1) */
__kernel void contrastive_bwd(int num, int dim, __global const float* a,
                              __global const float* b, __global const float* sim,
                              __global const float* dist_sq, float margin, int legacy,
                              float sign, __global const float* top_diff,
                              __global const float* norm, __global float* dx) {
    int total = num * dim;
    float alpha = sign * top_diff[0] / norm[0];
    GLOBAL_LOOP(idx, total) {
        int i = idx / dim;
        float d = a[idx] - b[idx];
        float g;
        if ((int)sim[i]) {
            g = alpha * d;
        } else {
            float mdist, beta;
            if (legacy) {
                mdist = margin - dist_sq[i];
                beta = -alpha;
            } else {
                float dist = sqrt(dist_sq[i]);
                mdist = margin - dist;
                beta = -alpha * mdist / (dist + 1e-4f);
            }
            g = mdist > 0.0f ? beta * d : 0.0f;
        }
        dx[idx] = g;
    }
}

/* ---- Accuracy ----------------------------------------------------------
 * correct[p] = 1 when fewer than top_k classes score >= the true class's
 * score (the true class counts itself, ties count against it, as Caffe). */
__kernel void accuracy_fwd(int outer, int C, int inner, __global const float* x,
                           __global const float* label, int top_k, int has_ignore,
                           int ignore_label, __global float* correct, __global float* valid,
                           __global int* chk) {
    int total = outer * inner;
    GLOBAL_LOOP(idx, total) {
        int o = idx / inner, s = idx - o * inner;
        int l = (int)label[idx];
        if (is_ignored(l, has_ignore, ignore_label)) {
            correct[idx] = 0.0f;
            valid[idx] = 0.0f;
            continue;
        }
        valid[idx] = 1.0f;
        if (l < 0 || l >= C) {
            note_bad_label(chk, label[idx], idx);
            correct[idx] = NAN;
            continue;
        }
        __global const float* px = x + o * C * inner + s;
        float truth = px[l * inner];
        int better = -1;
        for (int k = 0; k < C && better < top_k; ++k) better += px[k * inner] >= truth;
        correct[idx] = better < top_k ? 1.0f : 0.0f;
    }
}

/* Per-class accuracy: one work-group per class c,
 * out[c] = (#correct with label c) / (#counted with label c), 0 if none. */
__kernel void accuracy_per_class(int n, int C, __global const float* label,
                                 __global const float* correct, __global const float* valid,
                                 __global float* out) {
    __local float sh[WG];
    __local float sn[WG];
    int c = get_group_id(0), lid = get_local_id(0);
    float h = 0.0f, m = 0.0f;
    if (c < C) {
        for (int i = lid; i < n; i += WG) {
            if (valid[i] > 0.0f && (int)label[i] == c) {
                h += correct[i];
                m += 1.0f;
            }
        }
    }
    sh[lid] = h;
    sn[lid] = m;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (lid < s) {
            sh[lid] += sh[lid + s];
            sn[lid] += sn[lid + s];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0 && c < C) out[c] = sn[0] == 0.0f ? 0.0f : sh[0] / sn[0];
}
