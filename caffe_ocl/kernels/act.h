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
 *   (3-6: the TEST plan's rewrites, caffe_ocl/plan/swish.py);
 *   7: PReLU (below);
 *   8: a generated element-wise chain, gen_act(v) (the TEST plan's
 *   product -> chain groups, plan/pointwise.py): the program is a
 *   generated source that defines gen_act and gen_act_float2 .. 16 (lane
 *   by lane) before the kernel file's text (ops.gemm.act_program);
 *   forward only.
 * APPLY_ACT(v) is the activation, ACT_GRAD(v) its derivative at the
 * pre-activation v (Caffe's rule for a ReLU or Clip that is not in place).
 * Kernels name their scalar arguments act_a and act_b. */
#ifndef CAFFE_OCL_ACT_H
#define CAFFE_OCL_ACT_H

#ifndef ACT
#define ACT 0
#endif

/* ACT_EXP, the exp of swish and sigmoid. CPU drivers (CAFFE_OCL_CPU, set
 * by device.py for every program built for a CPU): Cephes' expf inline --
 * clamped to [-87.3, 88] (normal floats; swish and sigmoid are 0, v or 1
 * to float precision beyond), exp_poly below times 2^n built in the
 * exponent bits; within 1 ulp of exp on that range (tests/ops/
 * test_act_exp.py), ~15 vector operations. PoCL's exp made swish layers
 * 4-15% slower than this (BENCHMARKS.md, twenty-ninth session). GPUs keep
 * the driver's exp (a hardware approximation). */
#ifdef CAFFE_OCL_CPU
/* exp_poly(x, t): exp(x) / 2^n for t = x / ln 2 + 1.5 * 2^23 -- n =
 * rint(x / ln 2) by that sum (PoCL built rint as a dozen selects), its
 * integer in t's low bits, the remainder r = x - n ln 2 in two parts and
 * a degree-7 polynomial of r. act_exp and exp_full apply 2^n. */
#define EXP_POLY_OF(T)                                                         \
    inline T __attribute__((overloadable)) exp_poly(T x, T t) {               \
        const T n = t - (T)12582912.0f;                                        \
        T r = fma(n, (T)-0.693359375f, x);                                     \
        r = fma(n, (T)2.12194440e-4f, r);                                      \
        T p = fma((T)1.9875691500e-4f, r, (T)1.3981999507e-3f);               \
        p = fma(p, r, (T)8.3334519073e-3f);                                    \
        p = fma(p, r, (T)4.1665795894e-2f);                                    \
        p = fma(p, r, (T)1.6666665459e-1f);                                    \
        p = fma(p, r, (T)5.0000001201e-1f);                                    \
        return fma(p, r * r, r) + (T)1.0f;                                     \
    }
#define EXP_T_(T, x) fma((x), (T)1.44269504088896341f, (T)12582912.0f)
#define ACT_EXP_OF(T, IT)                                                      \
    EXP_POLY_OF(T)                                                             \
    inline T __attribute__((overloadable)) act_exp(T x) {                     \
        x = clamp(x, (T)-87.3f, (T)88.0f);                                     \
        const T t = EXP_T_(T, x);                                              \
        return exp_poly(x, t) * as_##T((as_##IT(t) - (IT)(0x4B400000 - 127)) << 23); \
    }
/* (float16 arguments without AVX-512: clang's -Wpsabi notes, at every
 * call, that passing them by value differs from AVX-512's ABI; these
 * functions are inlined, and the note filled the build log) */
#pragma clang diagnostic ignored "-Wpsabi"
ACT_EXP_OF(float, int)
ACT_EXP_OF(float2, int2)
ACT_EXP_OF(float4, int4)
ACT_EXP_OF(float8, int8)
ACT_EXP_OF(float16, int16)
#define ACT_EXP(x) act_exp(x)
/* EXP_FULL: exp over the whole float range by the same polynomial, for
 * layers whose output is the exp itself (Exp, ELU; ONNX's Erf and Softmax
 * forms convert to them): x clamped to [-104, 89], where exp is 0 and inf
 * in float, and 2^n applied in two halves so that n from -150 to 128
 * gives the denormals and the overflow to inf; NaN stays NaN. PoCL's exp
 * is a library call per float, which kept a converted GELU's 15-step
 * chain from vectorizing (BENCHMARKS.md, forty-seventh session). */
#define EXP_FULL_OF(T, IT)                                                     \
    inline T __attribute__((overloadable)) exp_full(T x) {                    \
        const T xc = clamp(x, (T)-104.0f, (T)89.0f);                           \
        const T t = EXP_T_(T, xc);                                             \
        const IT ni = as_##IT(t) - (IT)0x4B400000;                             \
        const IT h = ni >> 1;                                                  \
        const T p = exp_poly(xc, t) * as_##T((h + (IT)127) << 23)               \
            * as_##T((ni - h + (IT)127) << 23);                                \
        return x != x ? x : p;                                                 \
    }
EXP_FULL_OF(float, int)
EXP_FULL_OF(float4, int4)
EXP_FULL_OF(float8, int8)
EXP_FULL_OF(float16, int16)
#define EXP_FULL(x) exp_full(x)
#else
#define ACT_EXP(x) exp(x)
#define EXP_FULL(x) exp(x)
#endif
#if ACT < 0 || ACT > 8
#error "ACT must be 0 (none), 1 (relu), 2 (clip), 3 (swish), 4 (sigmoid), 5 (hard swish), 6 (hard sigmoid), 7 (prelu) or 8 (generated)"
#endif

#if ACT == 1
#define APPLY_ACT(v) ((v) > 0.0f ? (v) : act_a * (v))
#define ACT_GRAD(v) ((v) > 0.0f ? 1.0f : act_a)
#elif ACT == 2
#define APPLY_ACT(v) fmax(act_a, fmin(act_b, (v)))
#define ACT_GRAD(v) (((v) >= act_a && (v) <= act_b) ? 1.0f : 0.0f)
#elif ACT == 3
#define APPLY_ACT(v) ((v) / (1.0f + ACT_EXP(-act_a * (v))))
#define ACT_GRAD(v) act_swish_grad((v), act_a)
inline float act_swish_grad(float v, float beta) {
    const float s = 1.0f / (1.0f + ACT_EXP(-beta * v));
    return s + beta * v * s * (1.0f - s);
}
#elif ACT == 4
#define APPLY_ACT(v) (1.0f / (1.0f + ACT_EXP(-(v))))
#define ACT_GRAD(v) act_sigmoid_grad(v)
inline float act_sigmoid_grad(float v) {
    const float s = 1.0f / (1.0f + ACT_EXP(-v));
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
#elif ACT == 7
/* PReLU, one slope per output channel (the TEST plan's chains, plan/
 * chain.py): the op hands the bias and the slopes over as one buffer, the
 * slope of the channel whose bias is bias[i] at bias[i + act_a] (act_a =
 * the number of biases, exact in a float). Only APPLY_ACT_CH and
 * APPLY_ACT_VEC_CH know it: a kernel site still calling APPLY_ACT does not
 * build with ACT 7 (ops.conv.fuses_act keeps PReLU from such paths). */
#define PRELU_SLOPE(bias, i) ((bias)[(int)act_a + (i)])
#elif ACT == 8
#define APPLY_ACT(v) gen_act(v)
/* (no ACT_GRAD: a backward kernel does not build with a generated chain) */
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
#define APPLY_ACT_VEC(v, T) ((v) / ((T)1.0f + ACT_EXP(-act_a * (v))))
#elif ACT == 4
#define APPLY_ACT_VEC(v, T) ((T)1.0f / ((T)1.0f + ACT_EXP(-(v))))
#elif ACT == 5
#define APPLY_ACT_VEC(v, T) ((v) * fmax((T)0.0f, fmin((T)1.0f, act_a * (v) + act_b)))
#elif ACT == 6
#define APPLY_ACT_VEC(v, T) fmax((T)0.0f, fmin((T)1.0f, act_a * (v) + act_b))
#elif ACT == 7
/* (none: APPLY_ACT_VEC_CH / _LANES below) */
#elif ACT == 8
#define GEN_ACT_VEC(T, v) gen_act_##T(v)
#define APPLY_ACT_VEC(v, T) GEN_ACT_VEC(T, v)
#else
#define APPLY_ACT_VEC(v, T) (v)
#endif
#if ACT != 7
#define APPLY_ACT8(v) APPLY_ACT_VEC(v, float8)
#endif

/* The activation of a value of one channel whose slope (ACT 7) is
 * ``slope`` -- an expression read only under ACT 7, e.g.
 * PRELU_SLOPE(bias, m) -- and the same on a vector of one channel's
 * values (APPLY_ACT_VEC_CH) or of a vector of slopes, lane by lane
 * (APPLY_ACT_VEC_LANES). Every other kind ignores ``slope``. */
#if ACT == 7
#define APPLY_ACT_CH(v, slope) ((v) > 0.0f ? (v) : (slope) * (v))
#define APPLY_ACT_VEC_CH(v, T, slope) select((T)(slope) * (v), (v), (v) > (T)0.0f)
#define APPLY_ACT_VEC_LANES(v, T, slopes) select((slopes) * (v), (v), (v) > (T)0.0f)
#else
#define APPLY_ACT_CH(v, slope) APPLY_ACT(v)
#define APPLY_ACT_VEC_CH(v, T, slope) APPLY_ACT_VEC(v, T)
#define APPLY_ACT_VEC_LANES(v, T, slopes) APPLY_ACT_VEC(v, T)
#endif
#define APPLY_ACT8_CH(v, slope) APPLY_ACT_VEC_CH(v, float8, slope)

/* The same activations with the kind given at run time (kernels applying
 * two different ones, se_squeeze.cl): kind as ACT, a and b as act_a, act_b. */
inline float act_eval(int kind, float v, float a, float b) {
    switch (kind) {
    case 1: return v > 0.0f ? v : a * v;
    case 2: return fmax(a, fmin(b, v));
    case 3: return v / (1.0f + ACT_EXP(-a * v));
    case 4: return 1.0f / (1.0f + ACT_EXP(-v));
    case 5: return v * fmax(0.0f, fmin(1.0f, a * v + b));
    case 6: return fmax(0.0f, fmin(1.0f, a * v + b));
    default: return v;
    }
}

#endif
