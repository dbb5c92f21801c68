"""float64 NumPy references of Caffe's layers, shared by the tests."""
import math

import numpy as np


def conv2d(x, w, b=None, pad=(0, 0), stride=(1, 1), dil=(1, 1), group=1):
    x = x.astype(np.float64)
    w = w.astype(np.float64)
    n, c, h, wd = x.shape
    co, cg, kh, kw = w.shape
    ph, pw = pad
    sh, sw = stride
    dh, dw = dil
    ho = (h + 2 * ph - ((kh - 1) * dh + 1)) // sh + 1
    wo = (wd + 2 * pw - ((kw - 1) * dw + 1)) // sw + 1
    xp = np.zeros((n, c, h + 2 * ph, wd + 2 * pw))
    xp[:, :, ph:ph + h, pw:pw + wd] = x
    out = np.zeros((n, co, ho, wo))
    og = co // group
    for g in range(group):
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cg:(g + 1) * cg,
                           i * dh: i * dh + sh * (ho - 1) + 1: sh,
                           j * dw: j * dw + sw * (wo - 1) + 1: sw]
                out[:, g * og:(g + 1) * og] += np.einsum(
                    "nchw,oc->nohw", patch, w[g * og:(g + 1) * og, :, i, j])
    if b is not None:
        out += b.reshape(1, -1, 1, 1)
    return out


def deconv2d(x, w, b=None, pad=(0, 0), stride=(1, 1), dil=(1, 1), group=1):
    """Caffe Deconvolution: the adjoint of conv2d; w is [Cin, Cout/g, kh, kw]."""
    x = x.astype(np.float64)
    w = w.astype(np.float64)
    n, ci, h, wd = x.shape
    _, cog, kh, kw = w.shape
    co = cog * group
    ph, pw = pad
    sh, sw = stride
    dh, dw = dil
    oh = sh * (h - 1) + (dh * (kh - 1) + 1) - 2 * ph
    ow = sw * (wd - 1) + (dw * (kw - 1) + 1) - 2 * pw
    full = np.zeros((n, co, oh + 2 * ph, ow + 2 * pw))
    cig = ci // group
    for g in range(group):
        for i in range(kh):
            for j in range(kw):
                contrib = np.einsum("nchw,co->nohw", x[:, g * cig:(g + 1) * cig],
                                    w[g * cig:(g + 1) * cig, :, i, j])
                full[:, g * cog:(g + 1) * cog,
                     i * dh: i * dh + sh * (h - 1) + 1: sh,
                     j * dw: j * dw + sw * (wd - 1) + 1: sw] += contrib
    out = full[:, :, ph:ph + oh, pw:pw + ow]
    if b is not None:
        out = out + b.reshape(1, -1, 1, 1)
    return out


def pool_out_size(h, k, s, p, ceil=True):
    rnd = math.ceil if ceil else math.floor
    o = int(rnd((h + 2 * p - k) / s)) + 1
    if p and (o - 1) * s >= h + p:
        o -= 1
    return o


def pool2d(x, k, s, p, method="max", ceil=True):
    x = x.astype(np.float64)
    n, c, h, w = x.shape
    ho = pool_out_size(h, k[0], s[0], p[0], ceil)
    wo = pool_out_size(w, k[1], s[1], p[1], ceil)
    out = np.zeros((n, c, ho, wo))
    for i in range(ho):
        for j in range(wo):
            hs, ws = i * s[0] - p[0], j * s[1] - p[1]
            he, we = min(hs + k[0], h + p[0]), min(ws + k[1], w + p[1])
            size = (he - hs) * (we - ws)
            hs2, ws2, he2, we2 = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
            win = x[:, :, hs2:he2, ws2:we2]
            if method == "max":
                out[:, :, i, j] = win.max(axis=(2, 3))
            else:
                out[:, :, i, j] = win.sum(axis=(2, 3)) / size
    return out


def lrn_across(x, size, alpha, beta, k):
    x = x.astype(np.float64)
    n, c, h, w = x.shape
    pre = (size - 1) // 2
    post = size - 1 - pre
    sq = x ** 2
    scale = np.empty_like(x)
    for ch in range(c):
        lo, hi = max(ch - pre, 0), min(ch + post, c - 1)
        scale[:, ch] = k + alpha / size * sq[:, lo:hi + 1].sum(axis=1)
    return x * scale ** (-beta)


def lrn_within(x, size, alpha, beta):
    pad = (size - 1) // 2
    avg = pool2d(x.astype(np.float64) ** 2, (size, size), (1, 1), (pad, pad), "ave")
    return x * (1 + alpha * avg) ** (-beta)


def softmax(x, axis=1):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def rel_err(out, ref):
    """Relative L2 error of ``out`` against ``ref``."""
    return np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)
