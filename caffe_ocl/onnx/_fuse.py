"""Graph rewrites before conversion: constant affine steps folded into the
linear layer next to them, so that they cost no layer of their own.

- ``MatMul(x, W) + b`` (a constant ``b`` along the last axis; PyTorch's
  ``nn.Linear`` on a 3-D or 4-D input exports so): one MatMul with a bias
  (a third input, read by the converter's MatMul), one InnerProduct or
  1x1 Convolution with ``bias_term`` instead of a layer and a Bias layer.
- ``(x * g + b) @ W`` (a per-channel affine -- the gamma and beta of a
  LayerNorm -- right before a MatMul, contracting the axis they vary
  along): the MatMul's weights become ``g[:, None] * W`` and its bias
  ``b @ W`` (+ its own); likewise before a Conv with no padding, groups 1
  (``W[o, c] * g[c]``, bias ``sum W[o, c] * b[c]``), where the affine is
  exact at every input pixel; also with a Transpose between them (timm's
  LayerNorm2d: the affine on a channels-last view, the Transpose back,
  the convolution), the affine's axis followed through it.
- ``BatchNormalization(MatMul(x, W) [+ b])``, the BatchNorm over the
  product's output features (also through a Reshape / Flatten to (rows,
  features): LeViT's Linear + BatchNorm1d): the weights and bias scaled
  and shifted by the BatchNorm's constants.

Each step folded must be read by the next one only and be no graph output:
the tensors in between disappear from the converted net. The results
differ from the unfused ones by float rounding only."""
import numpy as np
from onnx import NodeProto


def fuse_affine_into_linear(nodes, consts, shapes, outputs):
    """``nodes`` with the rewrites above applied (new constants added to
    ``consts``); the lists and dicts given are not changed otherwise."""
    nodes = [_copy(n) for n in nodes]
    # tensor names of the graph: new constants avoid them
    taken = set(shapes) | {o for n in nodes for o in n.output}
    for rule in (_matmul_bias, _affine_before_linear, _batchnorm_after_matmul):
        while True:
            readers = _readers(nodes)
            done = rule(nodes, consts, shapes, outputs, readers, taken)
            if not done:
                break
            nodes = [n for n in nodes if n is not None]
    return nodes


def _copy(n):
    c = NodeProto()
    c.CopyFrom(n)
    return c


def _readers(nodes):
    out = {}
    for i, n in enumerate(nodes):
        for name in n.input:
            if name:
                out.setdefault(name, []).append(i)
    return out


def _only_reader(name, readers, outputs):
    r = readers.get(name, [])
    return r[0] if len(r) == 1 and name not in outputs else None


def _const_operand(node, consts):
    """(the computed input, the constant) of a binary node, else None."""
    if len(node.input) != 2:
        return None
    a, b = node.input
    if b in consts and a not in consts:
        return a, consts[b]
    if a in consts and b not in consts and node.op_type in ("Add", "Mul"):
        return b, consts[a]
    return None


def _along(c, size, rank, axis):
    """``c`` as a (size,) vector when, broadcast against a rank-``rank``
    tensor, it varies along ``axis`` only (or is one value), else None."""
    c = np.asarray(c)
    if c.size == 1:
        return np.full(size, float(c.ravel()[0]), np.float64)
    if c.ndim > rank or c.size != size:
        return None
    full = (1,) * (rank - c.ndim) + c.shape
    if full[axis] != size:
        return None
    return c.reshape(size).astype(np.float64)


def _new_const(consts, taken, base, value):
    name, k = base, 1
    while name in consts or name in taken:
        name, k = f"{base}_{k}", k + 1
    consts[name] = np.ascontiguousarray(value, np.float32)
    return name


def _matmul_bias(nodes, consts, shapes, outputs, readers, taken):
    for i, n in enumerate(nodes):
        if n is None or n.op_type != "MatMul" or len(n.input) != 2:
            continue
        W = consts.get(n.input[1])
        if W is None or W.ndim != 2 or n.input[0] in consts:
            continue
        j = _only_reader(n.output[0], readers, outputs)
        if j is None or nodes[j].op_type != "Add":
            continue
        pair = _const_operand(nodes[j], consts)
        if pair is None or pair[0] != n.output[0]:
            continue
        out_shape = shapes.get(nodes[j].output[0])
        if out_shape is None or tuple(out_shape) != tuple(shapes.get(n.output[0], ())):
            continue
        b = _along(pair[1], W.shape[1], len(out_shape), len(out_shape) - 1)
        if b is None:
            continue
        n.input.append(_new_const(consts, taken, n.output[0] + "_bias", b))
        n.output[0] = nodes[j].output[0]
        nodes[j] = None
        return True
    return False


def _affine_before_linear(nodes, consts, shapes, outputs, readers, taken):
    for i, n in enumerate(nodes):
        if n is None or n.op_type not in ("Mul", "Add"):
            continue
        pair = _const_operand(n, consts)
        if pair is None:
            continue
        x, c = pair
        shape = shapes.get(n.output[0])
        if shape is None or tuple(shapes.get(x, ())) != tuple(shape):
            continue
        # an Add right after a Mul is folded with it (the Mul's pass finds it)
        j = _only_reader(n.output[0], readers, outputs)
        if j is None:
            continue
        steps = [(n, c)]
        if n.op_type == "Mul" and nodes[j].op_type == "Add":
            p2 = _const_operand(nodes[j], consts)
            if p2 is not None and p2[0] == n.output[0]:
                k = _only_reader(nodes[j].output[0], readers, outputs)
                if k is not None:
                    steps.append((nodes[j], p2[1]))
                    j = k
        lin, through = nodes[j], None
        if lin.input[0] != steps[-1][0].output[0]:
            continue
        rank = len(shape)
        perm = list(range(rank))
        if lin.op_type == "Transpose":
            # timm's LayerNorm2d: the affine on a channels-last view, the
            # Transpose back, then the convolution
            k = _only_reader(lin.output[0], readers, outputs)
            got = [a.ints for a in lin.attribute if a.name == "perm"]
            perm = list(got[0]) if got else list(reversed(range(rank)))
            if k is None or nodes[k].input[0] != lin.output[0] or len(perm) != rank:
                continue
            lin, through = nodes[k], lin
        if lin.op_type == "MatMul":
            ok = _fold_into_matmul(lin, steps, consts, taken, rank, perm[rank - 1])
        elif lin.op_type == "Conv":
            ok = rank == 4 and _fold_into_conv(lin, steps, consts, taken, rank, perm[1])
        else:
            ok = False
        if not ok:
            continue
        (through or lin).input[0] = x
        for s, _ in steps:
            nodes[nodes.index(s)] = None
        return True
    return False


def _batchnorm_after_matmul(nodes, consts, shapes, outputs, readers, taken):
    """An inference BatchNormalization over the output features of a
    MatMul with constant weights, directly or through a Reshape / Flatten
    to (rows, features) (LeViT's Linear + BatchNorm1d on ``flatten(0, 1)``):
    the weights become ``W * s`` and the bias ``(b - mean) * s + beta``,
    ``s = gamma / sqrt(var + eps)``."""
    for i, bn in enumerate(nodes):
        if bn is None or bn.op_type != "BatchNormalization" or len(bn.input) != 5 \
                or len(bn.output) != 1 or any(a.name == "training_mode" and a.i
                                              for a in bn.attribute):
            continue
        if any(name not in consts for name in bn.input[1:]):
            continue
        x_shape = shapes.get(bn.input[0])
        if x_shape is None or len(x_shape) != 2:
            continue
        src = [j for j, n in enumerate(nodes) if n is not None and bn.input[0] in n.output]
        if len(src) != 1 or _only_reader(bn.input[0], readers, outputs) is None:
            continue
        view = None
        mm = nodes[src[0]]
        if mm.op_type in ("Reshape", "Flatten"):
            view = mm
            src = [j for j, n in enumerate(nodes) if n is not None and view.input[0] in n.output]
            if len(src) != 1 or _only_reader(view.input[0], readers, outputs) is None:
                continue
            mm = nodes[src[0]]
        if mm.op_type != "MatMul" or mm.input[1] not in consts:
            continue
        W = consts[mm.input[1]]
        mm_shape = shapes.get(mm.output[0])
        if W.ndim != 2 or mm_shape is None or mm_shape[-1] != W.shape[1] \
                or x_shape[1] != W.shape[1]:
            continue
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        gamma, beta, mean, var = (consts[n].astype(np.float64).reshape(-1) for n in bn.input[1:])
        if any(v.size != W.shape[1] for v in (gamma, beta, mean, var)):
            continue
        s_ = gamma / np.sqrt(var + np.float64(np.float32(eps)))
        old = (consts[mm.input[2]].astype(np.float64).reshape(-1)
               if len(mm.input) > 2 and mm.input[2] else np.zeros(W.shape[1]))
        weight = W.astype(np.float64) * s_[None, :]
        bias = (old - mean) * s_ + beta
        mm.input[1] = _new_const(consts, taken, mm.input[1] + "_bn", weight)
        while len(mm.input) < 3:
            mm.input.append("")
        mm.input[2] = _new_const(consts, taken, mm.output[0] + "_bn_bias", bias)
        (view or mm).output[0] = bn.output[0]
        nodes[i] = None
        return True
    return False


def _scale_shift(steps, vec):
    """The steps as one ``x * g + b``: (g, b) as vectors via ``vec``."""
    g = b = None
    for node, c in steps:
        v = vec(c)
        if v is None:
            return None
        if node.op_type == "Mul":
            g = v if g is None else g * v
            b = None if b is None else b * v
        else:
            b = v if b is None else b + v
    size = len(v)
    return (np.ones(size) if g is None else g), (np.zeros(size) if b is None else b)


def _fold_into_matmul(lin, steps, consts, taken, rank, axis):
    W = consts.get(lin.input[1])
    if W is None or W.ndim != 2:
        return False
    gb = _scale_shift(steps, lambda c: _along(c, W.shape[0], rank, axis))
    if gb is None:
        return False
    g, b = gb
    W64 = W.astype(np.float64)
    _set_weights(lin, consts, taken, g[:, None] * W64, b @ W64)
    return True


def _set_weights(lin, consts, taken, weight, bias):
    """``lin``'s weight replaced by ``weight``, its bias by ``bias`` plus
    the one it had (new constants: the old ones may have other readers)."""
    if len(lin.input) > 2 and lin.input[2]:
        bias = bias + consts[lin.input[2]].astype(np.float64).reshape(-1)
    lin.input[1] = _new_const(consts, taken, lin.input[1] + "_affine", weight)
    while len(lin.input) < 3:
        lin.input.append("")
    lin.input[2] = _new_const(consts, taken, lin.output[0] + "_bias", bias)


def _fold_into_conv(lin, steps, consts, taken, rank, axis):
    if len(lin.input) < 2 or lin.input[1] not in consts:
        return False
    attrs = {a.name: a for a in lin.attribute}
    if "group" in attrs and attrs["group"].i != 1:
        return False
    if any(v for v in (attrs["pads"].ints if "pads" in attrs else [])):
        return False
    if "auto_pad" in attrs and attrs["auto_pad"].s not in (b"", b"NOTSET", b"VALID"):
        return False
    W = consts[lin.input[1]]
    if W.ndim != 4:
        return False
    gb = _scale_shift(steps, lambda c: _along(c, W.shape[1], rank, axis))
    if gb is None:
        return False
    g, b = gb
    W64 = W.astype(np.float64)
    _set_weights(lin, consts, taken, W64 * g[None, :, None, None],
                 np.einsum("ocij,c->o", W64, b))
    return True
