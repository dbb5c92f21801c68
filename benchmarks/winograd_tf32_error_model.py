"""Float64 model of Winograd's error when the GEMM operands are rounded to
TF32 (issue #27; what set WINOGRAD_TILE_TF32_TRAIN to 2).

One output tile of a 3x3 convolution over C input channels is computed
three ways from the same random data: direct, with both operands rounded
to TF32 (what an implicit-GEMM TF32 convolution does), and by Winograd
F(m x m, 3x3) with the transforms in float32 and the transformed filter U
and input V rounded to TF32 before their product (what our TF32 Winograd
GEMMs do). Prints the RMS error of each against the exact float64 result,
for F(2x2) and F(4x4) with the usual points (0, +-1, +-2, inf) and
F(4x4) with other point sets (Barabasz et al. 2020 on point choice).
Transform matrices come from the points by Toom-Cook, checked against a
direct convolution first.

    python3 benchmarks/winograd_tf32_error_model.py [--channels 32] [--trials 60]
"""
import argparse
from fractions import Fraction as F

import numpy as np


def tf32(x):
    """float32 -> TF32 (10 mantissa bits), round to nearest, ties away
    (cvt.rna.tf32.f32), returned as float64."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x1000) & 0xFFFFE000
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def _poly(roots):
    """Coefficients, lowest first, of prod (x - r)."""
    c = [F(1)]
    for q in roots:
        c = [(c[i - 1] if i > 0 else 0) - q * (c[i] if i < len(c) else 0)
             for i in range(len(c) + 1)]
    return c


def transforms(points, m, r):
    """(A^T, G, B^T) of F(m, r) on the finite ``points`` and infinity."""
    n = m + r - 1
    pts = [F(p) for p in points]
    assert len(pts) == n - 1
    at, g, bt = np.zeros((m, n)), np.zeros((n, r)), np.zeros((n, n))
    for j, p in enumerate(pts):
        others = pts[:j] + pts[j + 1:]
        c = F(1)
        for q in others:
            c *= p - q
        at[:, j] = [float(p ** i) for i in range(m)]
        g[j] = [float(p ** i / c) for i in range(r)]
        bt[j, :n - 1] = [float(v) for v in _poly(others)]
    at[m - 1, n - 1] = g[n - 1, r - 1] = 1.0
    bt[n - 1] = [float(v) for v in _poly(pts)]
    return at, g, bt


def tile_errors(at, g_t, bt, m, r, channels, trials, rng):
    """Mean RMS error over ``trials`` tiles: (Winograd TF32, direct TF32)."""
    n = m + r - 1
    wino, direct = [], []
    for _ in range(trials):
        d = rng.standard_normal((channels, n, n))
        w = rng.standard_normal((channels, r, r)) / np.sqrt(channels * r * r)
        win = np.lib.stride_tricks.sliding_window_view(d, (r, r), axis=(1, 2))  # C m m r r
        exact = np.einsum("cijab,cab->ij", win, w)
        u = np.einsum("ab,cbd,ed->cae", g_t, w, g_t).astype(np.float32)
        v = np.einsum("ab,cbd,ed->cae", bt, d, bt).astype(np.float32)
        y = at @ np.sum(tf32(u) * tf32(v), axis=0) @ at.T
        yd = np.einsum("cijab,cab->ij", tf32(win), tf32(w))
        wino.append(np.sqrt(np.mean((y - exact) ** 2)))
        direct.append(np.sqrt(np.mean((yd - exact) ** 2)))
    return float(np.mean(wino)), float(np.mean(direct))


CASES = [("F(2x2,3x3) 0 +-1", (0, 1, -1), 2),
         ("F(4x4,3x3) 0 +-1 +-2 (ours)", (0, 1, -1, 2, -2), 4),
         ("F(4x4,3x3) 0 +-1 1/2 -2", (0, 1, -1, F(1, 2), -2), 4),
         ("F(4x4,3x3) 0 +-1 +-1/2", (0, 1, -1, F(1, 2), F(-1, 2)), 4)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--channels", type=int, default=32)
    ap.add_argument("--trials", type=int, default=60)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"| transform | Winograd TF32 RMS | direct TF32 RMS | ratio |  ({args.channels} channels, "
          f"{args.trials} tiles)")
    print("|---|---|---|---|")
    for name, pts, m in CASES:
        at, g_t, bt = transforms(pts, m, 3)
        d, w = rng.standard_normal(m + 2), rng.standard_normal(3)
        assert np.allclose(at @ ((g_t @ w) * (bt @ d)), np.convolve(d, w[::-1], "valid")), name
        e, ed = tile_errors(at, g_t, bt, m, 3, args.channels, args.trials, rng)
        print(f"| {name} | {e:.2e} | {ed:.2e} | {e / ed:.1f} |")


if __name__ == "__main__":
    main()
