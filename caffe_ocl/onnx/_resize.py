"""ONNX Resize / Upsample as Caffe layers (a mixin of to_caffe.Converter).

Two forms, tried in this order:
- a Deconvolution per axis whose one-hot or bilinear weights reproduce
  the resize exactly (nearest, and linear where the sampling positions
  repeat with the factor) -- cheap;
- otherwise each axis as a product by its interpolation matrix (the
  resize of an identity by onnx's reference evaluator): a 1x1
  Convolution over H through a Reshape and an InnerProduct with axis 3
  over W -- exact for every mode, but dense (out x in multiply-adds per
  value).
The module's functions compute sampling positions and 1-D weights."""
import numpy as np

from ._common import Unsupported, error_line
from ._nodes import NodeError, Var, axis_in, conv_param


class ResizeOps:
    """Converter methods for Resize and Upsample (see the module doc)."""

    def op_Resize(self, node, a):
        self._resize(node, a)

    def op_Upsample(self, node, a):
        self._resize(node, a)

    def _resize_scales(self, node, a, rank):
        """(scales given, sizes given) of a Resize / Upsample, as float64
        arrays of ``rank`` values or None: Upsample's attribute (opset 7)
        or input 1, Resize's input 1 (opset 10) or inputs 2 and 3 (opset
        11 and later, either may be absent or empty; opset 18's ``axes``
        spread over the rank)."""
        if node.op_type == "Upsample" and "scales" in a:
            return np.asarray(a["scales"], np.float64), None
        idx = (1, None) if node.op_type == "Upsample" or self.opset < 11 else (2, 3)
        got = []
        for i in idx:
            v = None if i is None else self.opt_const(i)
            got.append(None if v is None or v.size == 0 else np.asarray(v, np.float64).ravel())
        scales, sizes = got
        axes = a.get("axes")
        if axes is not None:
            axes = [axis_in(ax, rank, node) for ax in axes]
            for k, v in enumerate(got):
                if v is not None:
                    if len(v) != len(axes):
                        raise NodeError(node, f"{len(v)} {('scales', 'sizes')[k]} for "
                                              f"{len(axes)} axes")
                    full = np.ones(rank) if k == 0 else np.asarray(
                        self.shape(node.input[0]), np.float64)
                    full[axes] = v
                    got[k] = full
            scales, sizes = got
        if scales is None and sizes is None:
            raise Unsupported("its scales or sizes must be constants (initializers)")
        for k, v in enumerate((scales, sizes)):
            if v is not None and (len(v) != rank or not np.all(np.isfinite(v)) or np.any(v <= 0)):
                raise NodeError(node, f"{('scales', 'sizes')[k]} {v.tolist()} must be {rank} "
                                      "positive finite values, one per input axis")
        return scales, sizes

    def _resize(self, node, a):
        """Resize / Upsample by whole-number factors on H and W, written as a
        Deconvolution with one group a channel (weights: constants of the
        conversion), exact:
        - nearest: kernel = stride = the factor, weights of ones (each input
          pixel copied to its block), where ONNX's index rule for the node
          (coordinate_transformation_mode, nearest_mode) sends output pixel
          i to input i // factor;
        - linear (bilinear) at whole factors f: the input's edge rows and
          columns repeated once (Slice + Concat), then kernel 2f (odd f:
          2f - 1), stride f, pad 3f/2 (rounded down) with Caffe's bilinear
          filler weights, where that gives
          ONNX's interpolation weights for every output pixel (half_pixel
          and pytorch_half_pixel do: PyTorch's align_corners=False); an
          axis of one entry (a pooled 1 x 1 map) is copied as nearest,
          at any factor and coordinate mode.
        Either is checked against ONNX's formulas for the node's sizes,
        axis by axis; anything else (cubic, fractional
        factors, align_corners linear, resizing N or C) is reported as
        unsupported."""
        mode = a.get("mode", "nearest")
        shape = self.shape(node.input[0])
        if len(shape) != 4:
            raise Unsupported(f"only 4-D (N, C, H, W) resizing maps to Caffe (input shape "
                              f"{list(shape)})")
        scales, sizes = self._resize_scales(node, a, 4)
        if sizes is not None:
            out_hw = [int(v) for v in sizes[2:]]
            if list(sizes[:2]) != list(shape[:2]):
                raise Unsupported("resizing the batch or channel axis has no Caffe equivalent")
            scale_hw = [o / i for o, i in zip(out_hw, shape[2:])]
        else:
            if list(scales[:2]) != [1.0, 1.0]:
                raise Unsupported("resizing the batch or channel axis has no Caffe equivalent")
            scale_hw = list(scales[2:])
            out_hw = [int(np.floor(i * s)) for i, s in zip(shape[2:], scale_hw)]
        inferred = self.p.shapes.get(node.output[0])
        if inferred is not None and list(inferred) != list(shape[:2]) + out_hw:
            raise Unsupported(f"output shape {list(inferred)} is not the scaled input "
                              f"{list(shape[:2]) + out_hw} (keep_aspect_ratio_policy?)")
        if min(out_hw) <= 0:
            raise NodeError(node, f"output size {out_hw} is empty")
        count = shape[0] * shape[1] * out_hw[0] * out_hw[1]
        if count >= 2 ** 31 or max(out_hw) > 2 ** 22 or out_hw[0] * out_hw[1] > 2 ** 30:
            raise NodeError(node, f"output {shape[0]}x{shape[1]}x{out_hw[0]}x{out_hw[1]}: "
                                  "a Caffe blob holds fewer than 2^31 values (and here at "
                                  "most 2^22 a row or column)")
        if node.op_type == "Upsample" or self.opset < 11:
            ctm, rounding = "asymmetric", "floor"     # Upsample and Resize-10 semantics
        else:
            ctm = a.get("coordinate_transformation_mode", "half_pixel")
            rounding = a.get("nearest_mode", "round_prefer_floor")
        try:
            self._resize_deconv(node, a, mode, shape, out_hw, scale_hw, ctm, rounding)
        except Unsupported as why:
            self._resize_matrices(node, a, mode, shape, out_hw, scales, sizes, ctm, rounding,
                                  why)

    def _resize_matrices(self, node, a, mode, shape, out_hw, scales, sizes, ctm, rounding,
                         why):
        """Any other resizing of H and W that ONNX defines axis by axis
        (nearest to any size or with any rounding, linear with any
        coordinate mode -- align_corners included -- or by fractional
        factors, cubic, antialias): each axis is a matrix G (out x in) of
        ONNX's own weights, read off by resizing an identity with onnx's
        reference evaluator, and applied as a 1x1 Convolution over H (the
        input seen as (N*C, H, W, 1)) and an InnerProduct over W (axis 3),
        no bias, the cheaper order first. Where the Deconvolution form
        (``why`` says why not) applies it is used instead: G is dense, so
        these products do out x in multiply-adds a value."""
        if ctm == "tf_crop_and_resize":
            raise Unsupported(f"{why}; coordinate_transformation_mode 'tf_crop_and_resize' "
                              "is not supported")
        if mode not in ("nearest", "linear", "cubic"):
            raise Unsupported(f"mode {mode!r} is not a Resize mode")
        mats = []
        for ax, (i, o) in enumerate(zip(shape[2:], out_hw)):
            sc = None if scales is None else float(scales[2 + ax])
            g = self._resize_matrix(node, a, mode, i, o, sc, ctm, rounding)
            mats.append(None if i == o and np.array_equal(g, np.eye(i)) else g)
        self._axis_products(node, mats, shape)

    def _axis_products(self, node, mats, shape):
        """The node's output = its input (4-D) with H multiplied by
        ``mats[0]`` and W by ``mats[1]`` (out x in each; None: left as it
        is): a 1x1 Convolution over H (the input seen as (N*C, H, W, 1)) and
        an InnerProduct over W (axis 3), no bias, constants of the
        conversion, the cheaper order first."""
        if all(g is None for g in mats):
            self.alias(0, node.input[0])
            return
        n, c, h, w = shape
        oh = h if mats[0] is None else mats[0].shape[0]
        ow = w if mats[1] is None else mats[1].shape[0]
        h_first = n * c * (w * oh * h + oh * ow * w) <= n * c * (h * ow * w + ow * oh * h)
        cur = self.var(node.input[0])
        if cur.index is not None:
            cur = Var(cur.name, self.materialize(cur), cur.shape)
        steps = ["h", "w"] if h_first else ["w", "h"]
        steps = [st for st in steps if mats[0 if st == "h" else 1] is not None]
        base = self.lname()
        for k, st in enumerate(steps):
            last = k == len(steps) - 1
            _, _, hh, ww = cur.shape
            if st == "h":
                g = mats[0]
                rows = self.materialize(Var(self.new_blob(f"{base}_rows"), cur.blob,
                                            cur.blob_shape, (n * c, hh, ww, 1)))
                top = self.new_blob(f"{base}_h")
                lp = self.fixed(self.layer("Convolution", f"{base}_h", [rows], [top],
                                           [g.reshape(oh, hh, 1, 1).astype(np.float32)]))
                conv_param(lp.convolution_param, oh, [1, 1], [0, 0], [1, 1], [1, 1], 1, False)
                name = node.output[0] if last else self.new_blob(f"{base}_hv")
                cur = Var(name, top, (n * c, oh, ww, 1), (n, c, oh, ww))
            else:
                g = mats[1]
                src = self.materialize(cur)
                top = self.out(shape=(n, c, hh, ow)) if last else self.new_blob(f"{base}_w")
                lp = self.fixed(self.layer("InnerProduct", f"{base}_w", [src], [top],
                                           [g.astype(np.float32)]))
                lp.inner_product_param.num_output = ow
                lp.inner_product_param.bias_term = False
                lp.inner_product_param.axis = 3
                cur = Var(top, top, (n, c, hh, ow))
        self.refs[node.output[0]] = cur

    def _resize_matrix(self, node, a, mode, n_in, n_out, scale, ctm, rounding):
        """G (n_out x n_in, float64) with ONNX Resize of one axis = G @ x:
        the node's mode and coordinate attributes applied to an identity
        (n_in images of one column, only axis 2 resized), by onnx's
        reference evaluator."""
        from onnx import TensorProto, helper
        from onnx.reference import ReferenceEvaluator
        attrs = dict(mode=mode, coordinate_transformation_mode=ctm)
        if mode == "nearest":
            attrs["nearest_mode"] = rounding
        for k in ("cubic_coeff_a", "exclude_outside", "antialias"):
            if k in a:
                attrs[k] = a[k]
        # opset 19's axes: only axis 2 resized, the identity along axis 0 untouched
        opset = max(self.opset, 19)
        if scale is not None:
            ins = ["x", "", "s"]
            inits = [helper.make_tensor("s", TensorProto.FLOAT, [1], [scale])]
        else:
            ins = ["x", "", "", "z"]
            inits = [helper.make_tensor("z", TensorProto.INT64, [1], [n_out])]
        rn = helper.make_node("Resize", ins, ["y"], axes=[2], **attrs)
        g = helper.make_graph([rn], "axis", [helper.make_tensor_value_info(
            "x", TensorProto.FLOAT, [n_in, 1, n_in, 1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        try:
            y = ReferenceEvaluator(m).run(None, {"x": np.eye(n_in, dtype=np.float32).reshape(
                n_in, 1, n_in, 1)})[0]
        except Exception as e:      # noqa: BLE001 - the evaluator's own errors, one line
            raise Unsupported(f"onnx's reference Resize failed on one axis ({error_line(e)})")
        if y.shape != (n_in, 1, n_out, 1):
            raise Unsupported(f"one axis resized to {list(y.shape)}, not {n_out} values")
        return y[:, 0, :, 0].T.astype(np.float64)

    def _resize_deconv(self, node, a, mode, shape, out_hw, scale_hw, ctm, rounding):
        """The Deconvolution form of ``_resize``; Unsupported where it does not apply."""
        if mode not in ("nearest", "linear"):
            raise Unsupported(f"mode {mode!r}")
        factors = []
        for ax, (i, o) in enumerate(zip(shape[2:], out_hw)):
            if o % i:
                raise Unsupported(f"output size {o} of axis {ax + 2} is not a whole multiple "
                                  f"of its input size {i}")
            factors.append(o // i)
        if factors[0] * factors[1] > 2 ** 20:
            raise Unsupported(f"factors {factors}")
        if mode == "nearest":
            for i, o, sc, f in zip(shape[2:], out_hw, scale_hw, factors):
                src = _nearest_source(ctm, rounding, i, o, sc)
                if src is None:
                    raise Unsupported(f"coordinate_transformation_mode {ctm!r} with "
                                      f"nearest_mode {rounding!r} is not supported")
                if not np.array_equal(src, np.arange(o) // f):
                    raise Unsupported(f"coordinate_transformation_mode {ctm!r} with "
                                      f"nearest_mode {rounding!r} does not copy each pixel to "
                                      f"a {f}-pixel block; no exact Caffe equivalent")
            kernel, stride, pad = factors, factors, [0, 0]
            taps = [np.ones(f) for f in factors]
        else:
            if int(a.get("antialias", 0)):
                raise Unsupported("antialias is not supported")
            kernel, stride, pad, taps, edges = [], [], [], [], []
            for ax, (i, o, sc, f) in enumerate(zip(shape[2:], out_hw, scale_hw, factors)):
                spec = _bilinear_deconv(ctm, i, o, sc, f)
                if spec is None:
                    raise Unsupported(f"linear resizing with coordinate_transformation_mode "
                                      f"{ctm!r} by {f} on axis {ax + 2} is not a bilinear "
                                      "Deconvolution (whole factors with half_pixel map, or a "
                                      "single row or column)")
                kernel.append(len(spec[0]))
                stride.append(f)
                pad.append(spec[1])
                taps.append(spec[0])
                edges.append(spec[2])
        if factors == [1, 1]:       # checked above: ONNX's result is the input
            self.alias(0, node.input[0])
            return
        x, xs = self.blob(node.input[0]), shape
        if mode == "linear":
            for ax, edge in ((2, edges[0]), (3, edges[1])):
                if edge:
                    x, xs = self.edge_pad(x, xs, ax, self.lname())
        c = shape[1]
        top = self.out(shape=(shape[0], c, out_hw[0], out_hw[1]))
        w = np.outer(taps[0], taps[1]).astype(np.float32)
        lp = self.fixed(self.layer("Deconvolution", self.lname(), [x], [top],
                                   [np.broadcast_to(w, (c, 1) + w.shape)]))
        conv_param(lp.convolution_param, c, kernel, pad, stride, [1, 1], c, False)

    def edge_pad(self, blob, shape, axis, base):
        """``blob`` with its first and last entries along ``axis`` repeated
        once on either side (Slice + Concat): ONNX's linear resize reads
        the edge value past either end."""
        n = shape[axis]
        if n == 1:
            first = last = blob
        else:
            # one Slice for both edges (two crops copied the whole blob twice)
            first = self.new_blob(f"{base}_edge{axis}_first")
            last = self.new_blob(f"{base}_edge{axis}_last")
            middle = [self.new_blob(f"{base}_edge{axis}_unused")] if n > 2 else []
            lp = self.layer("Slice", f"{base}_edge{axis}_slice", [blob], [first] + middle + [last])
            lp.slice_param.axis = axis
            lp.slice_param.slice_point.extend([1, n - 1] if n > 2 else [1])
            if middle:
                self.layer("Silence", f"{base}_edge{axis}_silence", middle, [])
        top = self.new_blob(f"{base}_edge{axis}")
        lp = self.layer("Concat", top, [first, blob, last], [top])
        lp.concat_param.axis = axis
        shape = list(shape)
        shape[axis] = n + 2
        return top, tuple(shape)


def _resize_source(ctm, n_in, n_out, scale, nearest):
    """The input coordinate of each of ``n_out`` output pixels of an ONNX
    Resize along one axis (its coordinate_transformation_mode ``ctm``;
    tf_half_pixel_for_nn only for ``nearest``), or None for a mode not
    known here (tf_crop_and_resize reads an roi)."""
    x = np.arange(n_out, dtype=np.float64)
    if ctm == "half_pixel" or (ctm == "pytorch_half_pixel" and n_out > 1):
        return (x + 0.5) / scale - 0.5
    if ctm == "pytorch_half_pixel":
        return np.zeros_like(x)
    if ctm == "align_corners":
        return x * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros_like(x)
    if ctm == "asymmetric":
        return x / scale
    if ctm == "tf_half_pixel_for_nn" and nearest:
        return (x + 0.5) / scale
    return None


def _nearest_source(ctm, rounding, n_in, n_out, scale):
    """Source index of each of ``n_out`` output pixels of an ONNX nearest
    Resize along one axis (the operator's coordinate transformation and
    rounding rules, clamped to the input), or None for a mode not known
    here."""
    src = _resize_source(ctm, n_in, n_out, scale, nearest=True)
    if src is None:
        return None
    pick = {"round_prefer_floor": lambda v: np.ceil(v - 0.5),
            "round_prefer_ceil": lambda v: np.floor(v + 0.5),
            "floor": np.floor, "ceil": np.ceil}.get(rounding)
    if pick is None:
        return None
    return np.clip(pick(src), 0, n_in - 1).astype(np.int64)


def _linear_resize_1d(ctm, v, n_out, scale):
    """ONNX's linear Resize of the vectors ``v`` (rows of n_in values) along
    their last axis (its coordinate transformation; neighbours past either
    end read the edge value), or None for a mode not known here."""
    n_in = v.shape[-1]
    src = _resize_source(ctm, n_in, n_out, scale, nearest=False)
    if src is None:
        return None
    lo = np.floor(src)
    r = src - lo
    a = v[..., np.clip(lo, 0, n_in - 1).astype(np.int64)]
    b = v[..., np.clip(lo + 1, 0, n_in - 1).astype(np.int64)]
    return (1.0 - r) * a + r * b


def _deconv_1d(v, taps, f, pad, n_out):
    """A Deconvolution (stride ``f``, ``taps``, ``pad``) along the last axis
    of ``v`` with its edge entries repeated once on either side."""
    vp = np.concatenate([v[..., :1], v, v[..., -1:]], axis=-1)
    k, n = len(taps), vp.shape[-1]
    out = np.zeros(v.shape[:-1] + (n_out,))
    o = np.arange(n_out)
    for t in range(k):          # output o takes input i where o = i * f + t - pad
        i, rem = np.divmod(o + pad - t, f)
        ok = (rem == 0) & (i >= 0) & (i < n)
        out[..., ok] += taps[t] * vp[..., i[ok]]
    return out


def _bilinear_deconv(ctm, n_in, n_out, scale, f):
    """(taps, pad, edge) of a Deconvolution (stride ``f``) whose result
    along one axis is ONNX's linear Resize (checked on random vectors):
    kernel 2f (2f - 1 at odd f) with Caffe's bilinear filler taps over the
    input with its edge entries repeated once (edge True); at ``f`` 1 ((1,), 0), the axis
    untouched, where ONNX's is too; from a single entry (an image-pooling
    branch's 1 x 1 map, any coordinate mode, align_corners included) kernel
    f of ones, the entry copied to every output, where ONNX's result is
    that. None where none is (other modes: align_corners, asymmetric)."""
    v = np.random.default_rng(0).standard_normal((3, n_in))
    if f == 1 or n_in == 1:
        got = _linear_resize_1d(ctm, v, n_out, scale)
        ok = got is not None and np.allclose(got, np.repeat(v, f, axis=-1), rtol=0, atol=1e-9)
        return (np.ones(f), 0, False) if ok else None
    # kernel 2f (odd f: 2f - 1, its taps then centred on a whole input
    # pixel) over the edge-repeated input, one input pixel's f outputs past
    # the kernel's centre of padding
    k, pad = 2 * f - f % 2, (3 * f - f % 2) // 2
    c = (2 * f - 1 - f % 2) / (2.0 * f)
    taps = 1.0 - np.abs(np.arange(k) / f - c)
    want = _linear_resize_1d(ctm, v, n_out, scale)
    if want is None:
        return None
    got = _deconv_1d(v, taps, f, pad, n_out)
    return (taps, pad, True) if np.allclose(got, want, rtol=0, atol=1e-9) else None
