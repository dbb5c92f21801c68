/* The element-wise forward op y = fwd_op(x; a, b, c) for -DOP=<n> (op
 * numbers: caffe_ocl/ops/pointwise.py UNARY_OPS). Not guarded: a source
 * may include it several times with OP and the name fwd_op redefined
 * (plan/pointwise.py's fused chains: #define OP 7, #define fwd_op step_3,
 * #include, #undef both). Needs act.h (CPU exp and tanh: EXP_FULL, act_exp). */
#ifndef UNARY_OP_NUMBERS
#define UNARY_OP_NUMBERS
#define OP_IDENTITY 0
#define OP_RELU 1       /* a = negative_slope */
#define OP_SIGMOID 2
#define OP_TANH 3
#define OP_SCALE 4      /* y = a*x + b */
#define OP_ABSVAL 5
#define OP_ELU 6        /* a = alpha */
#define OP_POWER 7      /* y = (b*x + c)^a  (a=power, b=scale, c=shift) */
#define OP_EXP 8        /* y = exp(a*(b*x + c))  (a = ln(base)) */
#define OP_LOG 9        /* y = log(b*x + c) * a  (a = 1/ln(base)) */
#define OP_BNLL 10
#define OP_THRESHOLD 11 /* a = threshold */
#define OP_CLIP 12      /* a = min, b = max */
#define OP_SWISH 13     /* a = beta */
#define OP_SQUARE 14
#define OP_SQRT 15
#endif

inline float fwd_op(float x, float a, float b, float c) {
#if OP == OP_IDENTITY
    return x;
#elif OP == OP_RELU
    return x > 0.0f ? x : a * x;
#elif OP == OP_SIGMOID
    return 1.0f / (1.0f + EXP_FULL(-x));
#elif OP == OP_TANH
#ifdef CAFFE_OCL_CPU
    /* Cephes' tanhf with act.h's inline exp (PoCL's tanh is a library call
     * per float: a TanH layer ran at 0.27x OpenCV's speed): the odd
     * polynomial below |x| 0.625, 1 - 2 / (exp(2|x|) + 1) above */
    const float z = fabs(x);
    if (z > 0.625f)
        return copysign(1.0f - 2.0f / (act_exp(2.0f * z) + 1.0f), x);
    const float q = x * x;
    return fma((((((-5.70498872745e-3f * q + 2.06390887954e-2f) * q - 5.37397155531e-2f) * q
                 + 1.33314422036e-1f) * q - 3.33332819422e-1f) * q), x, x);
#else
    return tanh(x);
#endif
#elif OP == OP_SCALE
    return a * x + b;
#elif OP == OP_ABSVAL
    return fabs(x);
#elif OP == OP_ELU
    return x > 0.0f ? x : a * (EXP_FULL(x) - 1.0f);
#elif OP == OP_POWER
    /* Caffe: power * scale == 0 -> constant (1 if power == 0 else shift^power) */
    if (a == 0.0f) return 1.0f;
    if (b == 0.0f) return pow(c, a);
    /* the exponents with an exact shortcut (pow is a library call per
     * float: power 2 ran 20x slower than OpenCV's on PoCL); sqrt(-0) + 0
     * and the -inf case keep pow's +0 and +inf */
    const float v = b * x + c;
    if (a == 1.0f) return v;
    if (a == 2.0f) return v * v;
    if (a == -1.0f) return 1.0f / v;
    if (a == 0.5f) return v == -INFINITY ? INFINITY : sqrt(v) + 0.0f;
    return pow(v, a);
#elif OP == OP_EXP
    return EXP_FULL(a * (b * x + c));
#elif OP == OP_LOG
    return log(b * x + c) * a;
#elif OP == OP_BNLL
    return x > 0.0f ? x + log(1.0f + EXP_FULL(-x)) : log(1.0f + EXP_FULL(x));
#elif OP == OP_THRESHOLD
    return x > a ? 1.0f : 0.0f;
#elif OP == OP_CLIP
    return fmax(a, fmin(b, x));
#elif OP == OP_SWISH
    return x / (1.0f + EXP_FULL(-a * x));
#elif OP == OP_SQUARE
    return x * x;
#elif OP == OP_SQRT
    return sqrt(x);
#else
#error "unknown OP"
#endif
}

