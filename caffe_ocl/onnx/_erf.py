"""ONNX Erf and Gelu as standard Caffe layers (a mixin of to_caffe.Converter).

Caffe has no erf. It is written out with Abramowitz & Stegun's formula
7.1.26, whose error is at most 1.5e-7 (about one float32 step of erf's
values):

    erf(a) = 1 - (a1 t + a2 t^2 + a3 t^3 + a4 t^4 + a5 t^5) exp(-a^2),
    t = 1 / (1 + p a),  a >= 0,

as AbsVal, Power (t, and each Horner step's shift), Eltwise PROD, Exp
(scale -1) and a last Power (1 - r): about fifteen layers, all BVLC's.
The error is absolute: with float32's rounding of 1 - r it comes to at
most 4e-7 (tests/onnx/test_onnx_erf.py), which near 0, where erf(x) is
about 1.13 x, is a larger relative error (3.4e-7 at erf(0.04) = 0.045).
erf is odd: erf(x) = sign(x) erf(|x|), with sign(x) = x / (|x| + 1e-30)
(exact for |x| > 1e-22; smaller x give erf values below 1e-22 anyway).

GELU (PyTorch's exports: x * 0.5 * (1 + erf(x / sqrt 2)), which the
generic Erf covers, or ONNX's Gelu from opset 20) needs no sign, since
x erf(x / sqrt 2) = |x| erf(|x| / sqrt 2):

    gelu(x) = 0.5 x + 0.5 |x| erf(|x| / sqrt 2);

Gelu's approximate="tanh" form is exact in Caffe's layers:
0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))."""
import math

from ._common import Unsupported

# Abramowitz & Stegun 7.1.26
_P = 0.3275911
_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
_SIGN_EPS = 1e-30


class ErfOps:
    """Converter methods for Erf and Gelu (see the module doc)."""

    def _erf_of_abs(self, x, base, scale=1.0):
        """(blob |x|, blob erf(scale |x|)) by 7.1.26 (module doc)."""
        def blob(suffix):
            return self.new_blob(f"{base}_{suffix}")
        a = blob("abs")
        self.layer("AbsVal", f"{base}_abs", [x], [a])
        t = self._power(a, blob("t"), f"{base}_t", power=-1.0, scale=_P * scale, shift=1.0)
        h = self._power(t, blob("h5"), f"{base}_h5", scale=_A[4], shift=_A[3])
        for k, coeff in ((4, _A[2]), (3, _A[1]), (2, _A[0])):
            ht = self._eltwise(f"{base}_h{k}t", [h, t], blob(f"h{k}t"))
            h = self._power(ht, blob(f"h{k}"), f"{base}_h{k}", shift=coeff)
        poly = self._eltwise(f"{base}_poly", [h, t], blob("poly"))
        sq = self._power(a, blob("sq"), f"{base}_sq", power=2.0, scale=scale)
        e = blob("exp")
        lp = self.layer("Exp", f"{base}_exp", [sq], [e])
        lp.exp_param.scale = -1.0
        r = self._eltwise(f"{base}_r", [poly, e], blob("r"))
        return a, self._power(r, blob("erf"), f"{base}_erf", scale=-1.0, shift=1.0)

    def op_Erf(self, node, a):
        x = self.blob(node.input[0])
        base = self.lname()
        ax, m = self._erf_of_abs(x, base)
        inv = self._power(ax, self.new_blob(f"{base}_inv"), f"{base}_inv", power=-1.0,
                          shift=_SIGN_EPS)
        sign = self._eltwise(f"{base}_sign", [x, inv], self.new_blob(f"{base}_sign"))
        self._eltwise(base, [sign, m], self.out())

    def op_Gelu(self, node, a):
        x = self.blob(node.input[0])
        base = self.lname()
        approximate = a.get("approximate", "none")
        if approximate == "tanh":
            sq = self._power(x, self.new_blob(f"{base}_sq"), f"{base}_sq", power=2.0)
            cube = self._eltwise(f"{base}_cube", [sq, x], self.new_blob(f"{base}_cube"))
            inner = self._eltwise(f"{base}_inner", [x, cube], self.new_blob(f"{base}_inner"),
                                  "SUM", [1.0, 0.044715])
            arg = self._power(inner, self.new_blob(f"{base}_arg"), f"{base}_arg",
                              scale=math.sqrt(2.0 / math.pi))
            th = self.new_blob(f"{base}_tanh")
            self.layer("TanH", f"{base}_tanh", [arg], [th])
            gate = self._power(th, self.new_blob(f"{base}_gate"), f"{base}_gate",
                               scale=0.5, shift=0.5)
            self._eltwise(base, [x, gate], self.out())
            return
        if approximate != "none":
            raise Unsupported(f"approximate={approximate!r} (ONNX defines 'none' and 'tanh')")
        ax, m = self._erf_of_abs(x, base, scale=1.0 / math.sqrt(2.0))
        half = self._eltwise(f"{base}_abserf", [ax, m], self.new_blob(f"{base}_abserf"))
        self._eltwise(base, [x, half], self.out(), "SUM", [0.5, 0.5])
