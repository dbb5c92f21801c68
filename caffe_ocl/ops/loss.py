"""Loss and metric primitives (kernels/loss.cl).

A loss is computed in two launches: a per-item kernel writing each item's
loss (and a 0/1 counted flag for VALID normalization) into scratch buffers,
then ``reduce`` (one work-group) writing ``top[0] = scale * sum / norm`` and
the normalizer ``norm`` to device buffers. Backward launches read the loss
weight from ``top_diff[0]`` and the normalizer from ``norm[0]`` on the
device, so no value is read back to the host.

The forward kernels of the layers that index by a label (SoftmaxWithLoss,
InfogainLoss, HingeLoss, MultinomialLogisticLoss, Accuracy) take ``chk``,
a 5-int device buffer (``CHECK_INTS``) where they note the first label
outside [0, C); ``reduce`` given ``chk`` counts the layer's forward passes
in it (kernels/loss.cl note_bad_label).
"""
from . import work_size

SRC = "loss.cl"
CHECK_INTS = 5     # chk: [bad?, label float bits, item, passes done, pass of the bad one]


def reduce_wg(dev):
    """Work-group size of the single-group reductions (a power of two)."""
    wg = 256 if dev.is_gpu else 64
    while wg > max(dev.max_work_group, 1):
        wg //= 2
    return wg


def _wg(dev):
    wg = reduce_wg(dev)
    return wg, {"WG": wg}


def reduce(dev, n, vals, top, norm_out, cnt=None, fixed_norm=1.0, scale=1.0, chk=None):
    """top[0] = scale * sum(vals[:n]) / max(norm, 1) and norm_out[0] = max(norm, 1),
    where norm = sum(cnt[:n]) when ``cnt`` is given, else ``fixed_norm``;
    ``chk`` (a label check buffer) gets its pass count advanced."""
    wg, d = _wg(dev)
    return dev.launch(SRC, "loss_reduce", (wg,), (wg,),
                      [n, vals, vals if cnt is None else cnt, int(cnt is not None),
                       float(fixed_norm), float(scale), top, norm_out,
                       norm_out if chk is None else chk, int(chk is not None)], d)


def _grid(dev, name, n, args):
    gs, ls = work_size(dev, n)
    wg, d = _wg(dev)
    return dev.launch(SRC, name, gs, ls, args, d)


def softmax_loss_forward(dev, outer, c, inner, prob, label, ignore, loss, cnt, chk):
    """``ignore``: None or the ignored label value; ``chk``: the label check buffer."""
    return _grid(dev, "softmax_loss_fwd", outer * inner,
                 [outer, c, inner, prob, label, int(ignore is not None), int(ignore or 0),
                  loss, cnt, chk])


def softmax_loss_backward(dev, outer, c, inner, prob, label, ignore, top_diff, norm, dx):
    return _grid(dev, "softmax_loss_bwd", outer * c * inner,
                 [outer, c, inner, prob, label, int(ignore is not None), int(ignore or 0),
                  top_diff, norm, dx])


def infogain_forward(dev, outer, c, inner, prob, label, h, ignore, loss, cnt, chk):
    return _grid(dev, "infogain_loss_fwd", outer * inner,
                 [outer, c, inner, prob, label, h, int(ignore is not None), int(ignore or 0),
                  loss, cnt, chk])


def infogain_rowsum(dev, c, h, rowsum):
    return _grid(dev, "infogain_rowsum", c, [c, h, rowsum])


def infogain_backward(dev, outer, c, inner, prob, label, h, rowsum, ignore, top_diff, norm,
                      dx):
    return _grid(dev, "infogain_loss_bwd", outer * c * inner,
                 [outer, c, inner, prob, label, h, rowsum, int(ignore is not None),
                  int(ignore or 0), top_diff, norm, dx])


def sigmoid_ce_forward(dev, n, x, target, ignore, loss, cnt):
    return _grid(dev, "sigmoid_ce_fwd", n,
                 [n, x, target, int(ignore is not None), int(ignore or 0), loss, cnt])


def sigmoid_ce_backward(dev, n, x, target, ignore, top_diff, norm, dx):
    return _grid(dev, "sigmoid_ce_bwd", n,
                 [n, x, target, int(ignore is not None), int(ignore or 0), top_diff, norm, dx])


def sq_diff(dev, n, a, b, out):
    """out = (a - b)^2 element-wise."""
    return _grid(dev, "sq_diff", n, [n, a, b, out])


def euclidean_backward(dev, n, a, b, sign, top_diff, norm, dx):
    return _grid(dev, "euclidean_bwd", n, [n, a, b, float(sign), top_diff, norm, dx])


def hinge_forward(dev, num, dim, x, label, p, loss, chk):
    return _grid(dev, "hinge_fwd", num, [num, dim, x, label, int(p), loss, chk])


def hinge_backward(dev, num, dim, x, label, p, top_diff, norm, dx):
    return _grid(dev, "hinge_bwd", num * dim, [num, dim, x, label, int(p), top_diff, norm, dx])


def mlogistic_forward(dev, num, dim, x, label, loss, chk):
    return _grid(dev, "mlogistic_fwd", num, [num, dim, x, label, loss, chk])


def mlogistic_backward(dev, num, dim, x, label, top_diff, norm, dx):
    return _grid(dev, "mlogistic_bwd", num * dim, [num, dim, x, label, top_diff, norm, dx])


def contrastive_forward(dev, num, dim, a, b, sim, margin, legacy, dist_sq, loss):
    return _grid(dev, "contrastive_fwd", num,
                 [num, dim, a, b, sim, float(margin), int(bool(legacy)), dist_sq, loss])


def contrastive_backward(dev, num, dim, a, b, sim, dist_sq, margin, legacy, sign, top_diff,
                         norm, dx):
    return _grid(dev, "contrastive_bwd", num * dim,
                 [num, dim, a, b, sim, dist_sq, float(margin), int(bool(legacy)), float(sign),
                  top_diff, norm, dx])


def accuracy_forward(dev, outer, c, inner, x, label, top_k, ignore, correct, valid, chk):
    return _grid(dev, "accuracy_fwd", outer * inner,
                 [outer, c, inner, x, label, int(top_k), int(ignore is not None),
                  int(ignore or 0), correct, valid, chk])


def accuracy_per_class(dev, n, c, label, correct, valid, out):
    wg, d = _wg(dev)
    return dev.launch(SRC, "accuracy_per_class", (c * wg,), (wg,),
                      [n, c, label, correct, valid, out], d)
