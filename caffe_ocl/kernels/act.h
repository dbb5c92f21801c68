/* The activation epilogue shared by the kernels that fuse one (gemm.cl,
 * gemm_cpu.cl, conv_igemm.cl, depthwise.cl, splitk.cl, the TRAIN fusion in
 * normalization.cl / channel.cl), selected at build time by -DACT
 * (ops.gemm.act_defines):
 *   ACT 0: none;  1: ReLU, v > 0 ? v : act_a * v (act_a = negative_slope);
 *   2: clip, fmax(act_a, fmin(act_b, v));
 *   3: swish, v / (1 + exp(-act_a * v)) (act_a = beta; SiLU: 1);
 *   4: sigmoid, 1 / (1 + exp(-v));
 *   5: hard swish, v * fmax(0, fmin(1, act_a * v + act_b));
 *   6: hard sigmoid, fmax(0, fmin(1, act_a * v + act_b))
 *   (3-6: the TEST plan's rewrites, caffe_ocl/plan/swish.py).
 * APPLY_ACT(v) is the activation, ACT_GRAD(v) its derivative at the
 * pre-activation v (Caffe's rule for a ReLU or Clip that is not in place).
 * Kernels name their scalar arguments act_a and act_b. */
#ifndef CAFFE_OCL_ACT_H
#define CAFFE_OCL_ACT_H

#ifndef ACT
#define ACT 0
#endif
#if ACT < 0 || ACT > 6
#error "ACT must be 0 (none), 1 (relu), 2 (clip), 3 (swish), 4 (sigmoid), 5 (hard swish) or 6 (hard sigmoid)"
#endif

#if ACT == 1
#define APPLY_ACT(v) ((v) > 0.0f ? (v) : act_a * (v))
#define ACT_GRAD(v) ((v) > 0.0f ? 1.0f : act_a)
#elif ACT == 2
#define APPLY_ACT(v) fmax(act_a, fmin(act_b, (v)))
#define ACT_GRAD(v) (((v) >= act_a && (v) <= act_b) ? 1.0f : 0.0f)
#elif ACT == 3
#define APPLY_ACT(v) ((v) / (1.0f + exp(-act_a * (v))))
#define ACT_GRAD(v) act_swish_grad((v), act_a)
inline float act_swish_grad(float v, float beta) {
    const float s = 1.0f / (1.0f + exp(-beta * v));
    return s + beta * v * s * (1.0f - s);
}
#elif ACT == 4
#define APPLY_ACT(v) (1.0f / (1.0f + exp(-(v))))
#define ACT_GRAD(v) act_sigmoid_grad(v)
inline float act_sigmoid_grad(float v) {
    const float s = 1.0f / (1.0f + exp(-v));
    return s * (1.0f - s);
}
#elif ACT == 5
#define APPLY_ACT(v) ((v) * fmax(0.0f, fmin(1.0f, act_a * (v) + act_b)))
#define ACT_GRAD(v) act_hardswish_grad((v), act_a, act_b)
inline float act_hardswish_grad(float v, float a, float b) {
    const float t = a * v + b;
    return t <= 0.0f ? 0.0f : (t >= 1.0f ? 1.0f : t + a * v);
}
#elif ACT == 6
#define APPLY_ACT(v) fmax(0.0f, fmin(1.0f, act_a * (v) + act_b))
#define ACT_GRAD(v) ((act_a * (v) + act_b > 0.0f && act_a * (v) + act_b < 1.0f) ? act_a : 0.0f)
#else
#define APPLY_ACT(v) (v)
#define ACT_GRAD(v) 1.0f
#endif

/* APPLY_ACT on a vector of type T (the CPU kernels' vector epilogues:
 * float8, or float16 in gemm_cpu.cl with VW 16) */
#if ACT == 1
#define APPLY_ACT_VEC(v, T) select(act_a * (v), (v), (v) > (T)0.0f)
#elif ACT == 2
#define APPLY_ACT_VEC(v, T) fmax((T)act_a, fmin((T)act_b, (v)))
#elif ACT == 3
#define APPLY_ACT_VEC(v, T) ((v) / ((T)1.0f + exp(-act_a * (v))))
#elif ACT == 4
#define APPLY_ACT_VEC(v, T) ((T)1.0f / ((T)1.0f + exp(-(v))))
#elif ACT == 5
#define APPLY_ACT_VEC(v, T) ((v) * fmax((T)0.0f, fmin((T)1.0f, act_a * (v) + act_b)))
#elif ACT == 6
#define APPLY_ACT_VEC(v, T) fmax((T)0.0f, fmin((T)1.0f, act_a * (v) + act_b))
#else
#define APPLY_ACT_VEC(v, T) (v)
#endif
#define APPLY_ACT8(v) APPLY_ACT_VEC(v, float8)

/* The same activations with the kind given at run time (kernels applying
 * two different ones, se_squeeze.cl): kind as ACT, a and b as act_a, act_b. */
inline float act_eval(int kind, float v, float a, float b) {
    switch (kind) {
    case 1: return v > 0.0f ? v : a * v;
    case 2: return fmax(a, fmin(b, v));
    case 3: return v / (1.0f + exp(-a * v));
    case 4: return 1.0f / (1.0f + exp(-v));
    case 5: return v * fmax(0.0f, fmin(1.0f, a * v + b));
    case 6: return fmax(0.0f, fmin(1.0f, a * v + b));
    default: return v;
    }
}

#endif
