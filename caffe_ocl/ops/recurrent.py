"""Element-wise steps of the recurrent layers (kernels/recurrent.cl).

Each returns one Launch over one time step of ``N`` streams x ``D`` units;
``off_*`` are float offsets (a step's slice of a [T, N, ...] buffer)."""
from . import work_size

SRC = "recurrent.cl"


def _launch(dev, name, n, args):
    g, l = work_size(dev, n)
    return dev.launch(SRC, name, g, l, args)


def cont_scale(dev, N, D, cont, off_cont, src, off_src, dst, off_dst):
    """dst = cont[n] * src[n, :] (Caffe's h_conted = cont_t * h_{t-1})."""
    return _launch(dev, "cont_scale", N * D,
                   [N, D, cont, off_cont, src, off_src, dst, off_dst])


def lstm_unit_forward(dev, N, D, X, off_x, c_prev, off_cp, cont, off_cont, A, off_a,
                      c, off_c, h, off_h):
    """Caffe's LSTMUnit: gate inputs X [N, 4D] -> activated gates A, c_t, h_t."""
    return _launch(dev, "lstm_unit_fwd", N * D,
                   [N, D, X, off_x, c_prev, off_cp, cont, off_cont, A, off_a,
                    c, off_c, h, off_h])


def lstm_unit_backward(dev, N, D, A, off_a, c_prev, off_cp, c, off_c, dh, off_dh,
                       dc_in, off_dci, dc_prev, off_dcp, dX, off_dx, rec=None):
    """Gradients of LSTMUnit's gate inputs (dX) and c_{t-1} (dc_prev) from
    those of h_t (dh, plus cont_{t+1} * dhc where ``rec`` = (dhc, off,
    cont, off_cont)) and c_t (dc_in)."""
    dhc, off_dhc, cont_next, off_cn = rec if rec is not None else (dh, 0, dh, 0)
    return _launch(dev, "lstm_unit_bwd", N * D,
                   [N, D, A, off_a, c_prev, off_cp, c, off_c, dh, off_dh, dhc, off_dhc,
                    cont_next, off_cn, int(rec is not None), dc_in, off_dci,
                    dc_prev, off_dcp, dX, off_dx])


def rnn_tanh_backward(dev, N, D, h, off_h, dh, off_dh, dpre, off_dp, rec=None):
    """dpre = (dh + cont_{t+1} * dhc) * (1 - h^2), ``rec`` as in
    lstm_unit_backward."""
    dhc, off_dhc, cont_next, off_cn = rec if rec is not None else (dh, 0, dh, 0)
    return _launch(dev, "rnn_tanh_bwd", N * D,
                   [N, D, h, off_h, dh, off_dh, dhc, off_dhc, cont_next, off_cn,
                    int(rec is not None), dpre, off_dp])


def sum_steps(dev, T, count, src, dst, accumulate=False):
    """dst (+)= sum over the T steps of src [T, count]."""
    return _launch(dev, "sum_steps", count, [T, count, src, dst, int(accumulate)])


def add_steps(dev, T, count, src, dst):
    """dst[t] += src for each of the T steps of dst [T, count]."""
    return _launch(dev, "add_steps", T * count, [T, count, src, dst])
