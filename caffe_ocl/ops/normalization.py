"""BatchNorm / MVN primitives (kernels/normalization.cl).

Blobs are viewed as ``O x C x I``; statistics of channel c run over (o, i)
by one work-group per channel (BatchNorm: O=num, I=spatial; MVN: O=1,
C=rows, I=row length)."""
from . import cpu_chunks, cpu_units_work_size, vec_work_size, work_size
from .gemm import act_defines
from .channel import channel_partials, partial_finish, reduce_groups, reduce_wg, vec_of

SRC = "normalization.cl"


def _per_channel(dev, name, C, args):
    wg = reduce_wg(dev)
    return dev.launch(SRC, name, (reduce_groups(dev, C) * wg,), (wg,), args, {"WG": wg})


def bn_train_stats(dev, O, C, I, x, mean, stdv, eps, run_mean, run_var, run_scale, maf):
    """[launches]: batch mean/stdv per channel (one shifted-sums pass split
    over many work-groups, then a per-channel finish) and Caffe's
    moving-average update."""
    m = O * I
    corr = m / (m - 1.0) if m > 1 else 1.0
    first, part, chunks = channel_partials(dev, O, C, I, x, shifted=True)
    g, l = work_size(dev, C)
    return [first, dev.launch(SRC, "bn_stats_finalize", g, l,
                              [C, I, chunks, 1.0 / max(m, 1), x, part, mean, stdv,
                               float(eps), run_mean, run_var, run_scale, float(maf),
                               float(corr)])]


def bn_global_stats(dev, C, run_mean, run_var, run_scale, mean, stdv, eps):
    g, l = work_size(dev, C)
    return dev.launch(SRC, "bn_global_stats", g, l,
                      [C, run_mean, run_var, run_scale, mean, stdv, float(eps)])


def mvn_stats(dev, rows, dim, x, mean, stdv, eps):
    """mean and sqrt(biased variance) + eps of each of ``rows`` rows of
    ``dim`` floats (CPU drivers: a work-item a row, mvn_stats_rows)."""
    if dev.is_cpu and rows:
        g, l = cpu_units_work_size(dev, rows, rows * dim)
        return dev.launch(SRC, "mvn_stats_rows", g, l, [rows, dim, x, mean, stdv, float(eps)])
    return _per_channel(dev, "mvn_stats", rows, [1, rows, dim, x, mean, stdv, float(eps)])


def normalize(dev, O, C, I, x, mean, stdv, y, xnorm=None, use_std=True):
    """y = (x - mean[c]) / stdv[c] (copy to xnorm too when given)."""
    n = O * C * I
    g, l = work_size(dev, n)
    return dev.launch(SRC, "chan_normalize_runs" if dev.is_cpu else "chan_normalize", g, l,
                      [n, C, I, x, mean, stdv, y, xnorm if xnorm is not None else y,
                       int(bool(use_std)), int(xnorm is not None)])


def channel_div(dev, O, C, I, x, d, y):
    n = O * C * I
    g, l = work_size(dev, n)
    return dev.launch(SRC, "chan_div_runs" if dev.is_cpu else "chan_div", g, l, [n, C, I, x, d, y])


def normalize_backward(dev, O, C, I, dy, y, stdv, dx, use_std=True):
    """dx = (dy - mean(dy) - mean(dy*y)*y) / stdv per channel (or dy - mean(dy))."""
    return _per_channel(dev, "chan_normalize_bwd", C,
                        [O, C, I, dy, y, stdv, dx, int(bool(use_std))])


def bn_backward(dev, O, C, I, dy, y, stdv, dx):
    """[launches]: BatchNorm TRAIN backward dx = (dy - mean(dy) - mean(dy*y)*y)
    / stdv: the two per-channel sums in one split pass, then one
    element-wise pass."""
    sums = dev.alloc(8 * max(int(C), 1))
    n = O * C * I
    g, l = work_size(dev, n)
    first, part, chunks = channel_partials(dev, O, C, I, dy, y)
    finish = partial_finish(dev, C, chunks, part, pairs=sums)
    return [first, finish,
            dev.launch(SRC, "bn_backward_apply", g, l,
                       [n, C, I, 1.0 / max(O * I, 1), dy, y, sums, stdv, dx])]


def _act_args(act):
    kind, a, b = act_defines(act)
    return {"ACT": kind}, [a, b]


def bn_scale_act_forward(dev, O, C, I, x, mean, stdv, gamma, beta, xnorm, y, act=None,
                         snap=None):
    """TRAIN BatchNorm -> Scale -> act after the statistics (bn_train_stats):
    xnorm = (x - mean) / stdv, y = act(gamma * xnorm + beta), one pass.
    ``snap``: (gamma copy, beta copy) buffers the pass also fills.
    ``xnorm`` None: no normalized copy (an inference chain, plan/affine.py;
    on CPU drivers the kernel built without it, XNORM 0, stores each element
    once and runs 16 lanes at a time; GPUs write y twice)."""
    n = O * C * I
    defs, aa = _act_args(act)
    if xnorm is None:
        xnorm = y
        if dev.is_cpu:
            defs["XNORM"] = 0
    extra = [gamma, beta]           # not written without SNAP (normalization.cl)
    if snap is not None:
        defs["SNAP"] = 1
        extra = list(snap)
    args = [n, C, I, x, mean, stdv, gamma, beta, xnorm, y] + aa + extra
    if dev.is_cpu:
        # contiguous chunks walked by channel runs (bn_scale_act_fwd_runs)
        return dev.launch(SRC, "bn_scale_act_fwd_runs", (cpu_chunks(dev, n),), (1,), args,
                          defs)
    vec = vec_of(I)
    g, l = vec_work_size(dev, n // vec, vec)
    defs["VEC"] = vec
    return dev.launch(SRC, "bn_scale_act_fwd", g, l, args, defs)


def bn_scale_act_backward(dev, O, C, I, dy, xnorm, gamma, beta, stdv, dx, dgamma, dbeta,
                          act=None):
    """[launches]: the gradients of y = act(gamma * (x - mean)/stdv + beta)
    with batch statistics: dgamma += sum g*xn, dbeta += sum g (g = dy *
    act'), dx = gamma/stdv * (g - mean(g) - mean(g*xn)*xn). One split
    reduction pass, one per-channel finish, one element-wise pass."""
    first, part, chunks = channel_partials(dev, O, C, I, dy, xnorm,
                                           gated=(gamma, beta, act))
    return [first] + _bn_scale_finish(dev, O, C, I, part, chunks, dy, 1.0, xnorm, gamma, beta,
                                      stdv, dx, dgamma, dbeta, act)


def _bn_scale_finish(dev, O, C, I, part, chunks, dy, gscale, xnorm, gamma, beta, stdv, dx,
                     dgamma, dbeta, act):
    """[launches] after the split reduction of the gradient g of the Scale's
    output (part): dgamma (+)= sum g*xn, dbeta (+)= sum g, and dx from g =
    gscale * dy (gated by act)."""
    defs, aa = _act_args(act)
    sums = dev.alloc(8 * max(int(C), 1))
    grads_and_pairs = partial_finish(dev, C, chunks, part, out1=dbeta, out2=dgamma,
                                     acc1=True, acc2=True, pairs=sums)
    n = O * C * I
    vec = vec_of(I)
    g, l = vec_work_size(dev, n // vec, vec)
    defs["VEC"] = vec
    apply = dev.launch(SRC, "bn_scale_act_bwd", g, l,
                       [n, C, I, 1.0 / max(O * I, 1), dy, float(gscale), xnorm, gamma, beta,
                        stdv, sums, dx] + aa, defs)
    return [grads_and_pairs, apply]


def residual_tail_forward(dev, O, C, I, x, mean, stdv, gamma, beta, xnorm, c_t, s, c_s, y,
                          slope, write_t=True, snap=None):
    """TRAIN BatchNorm -> Scale -> Eltwise SUM -> ReLU after the statistics
    (bn_train_stats of x): xnorm = (x - mean) / stdv, t = gamma * xnorm +
    beta (written back into x when ``write_t``: the in-place layers' x), y =
    relu(c_t * t + c_s * s), one pass. ``snap``: (gamma copy, beta copy)
    buffers the pass also fills (as bn_scale_act_forward's)."""
    n = O * C * I
    vec = vec_of(I)
    g, l = vec_work_size(dev, n // vec, vec)
    defs = {"VEC": vec, "WRITE_T": int(bool(write_t)), "SNAP": int(snap is not None)}
    extra = list(snap) if snap is not None else [gamma, beta]     # untouched without SNAP
    return dev.launch(SRC, "bn_scale_add_relu_fwd", g, l,
                      [n, C, I, x, mean, stdv, gamma, beta, xnorm, float(c_t), s, float(c_s),
                       y, float(slope)] + extra, defs)


def residual_tail_backward(dev, O, C, I, dy, y, xnorm, gamma, beta, stdv, dx, dgamma, dbeta,
                           c_t, ds, c_s, slope, keep_g=True, g_out=None):
    """[launches]: backward of ``residual_tail_forward``: g = dy * relu'(y)
    (Caffe's in-place ReLU gates by its output; a ReLU writing a new top
    has the same gate), ds = c_s * g (the shortcut's gradient; None: not
    wanted), g written into ``g_out`` (default dy: the in-place ReLU's
    diff) when ``keep_g``, and BatchNorm/Scale's gradients of c_t * g as
    bn_scale_act_backward (dgamma, dbeta accumulate; dx = the BatchNorm's
    input gradient). The last pass reads g back from ds (scaled by c_t /
    c_s) or, without one, from g_out (then g is always written there)."""
    g_out = dy if g_out is None else g_out
    from_ds = ds is not None and c_s != 0.0
    keep_g = keep_g or not from_ds
    first, part, chunks = channel_partials(
        dev, O, C, I, dy, xnorm, tail=(y, c_t, ds, c_s, g_out if keep_g else None, slope))
    src, gscale = (ds, c_t / c_s) if from_ds else (g_out, c_t)
    return [first] + _bn_scale_finish(dev, O, C, I, part, chunks, src, gscale, xnorm, gamma,
                                      beta, stdv, dx, dgamma, dbeta, None)
