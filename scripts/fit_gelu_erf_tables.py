#!/usr/bin/env python3
"""Fits the piecewise erf polynomials of gelu's table form (backends/cpu/elementwise_f32.cc,
GeluErfTableF32) and prints them as C++ arrays.

The kernel scales t = |x| / sqrt(2) to s = t n / T (n: lanes per vector, 8 on AVX2, 16 on
AVX-512), clamps s below n - 1/2, rounds it to the nearest integer i (0 .. n - 1) and takes
f = s - i in [-1/2, 1/2]: interval i is centred on s = i, and each coefficient is one in-register
table lookup by i. T = 3.9 n / (n - 1/2), so that the clamp sits at t = 3.9, where erf(t) =
1 - 3.5e-8 is 1 in float. On interval i, erf(t) / 2 = c_0 + c_1 f + ... + c_d f^d (the 1/2 of
gelu = x / 2 + |x| erf(t) / 2 rides in the table). Each polynomial is the minimax fit in
absolute error (Lawson's iteratively reweighted least squares) on 4001 points of its interval
(the first only on s >= 0), rounded to float. Constraints: c_0 = 0 on the first interval
(erf(0) = 0 exactly: gelu keeps tiny x's sign and relative accuracy), and the last polynomial
reaches 1/2 at the clamp, so that the kernel's min(p, 1/2) gives exactly 1/2 from t = 3.9 on
(gelu(x) = x and gelu(-x) = 0 exactly for large x).

Usage: /usr/bin/python3 scripts/fit_gelu_erf_tables.py  (numpy; prints both tables and the
worst absolute error of each, evaluated in float64 from the float coefficients).
"""
import re
from math import erf

import numpy as np


T_CLAMP = 3.9


def clamp_s(n):
    """The largest float below n - 1/2: s rounds to n - 1 there."""
    return np.nextafter(np.float32(n - 0.5), np.float32(0.0))


def fit_interval(i, n, deg, first):
    width = T_CLAMP / (n - 0.5)  # of t per unit of s
    f = np.linspace(0.0 if first else -0.5, 0.5, 4001)
    y = np.array([0.5 * erf((i + x) * width) for x in f])
    k0 = 1 if first else 0  # the first interval has no constant term
    a = np.stack([f ** k for k in range(k0, deg + 1)], axis=1)
    w = np.ones_like(f)
    for _ in range(200):
        sw = np.sqrt(w)
        c, *_ = np.linalg.lstsq(a * sw[:, None], y * sw, rcond=None)
        e = np.abs(a @ c - y)
        w = w * e
        w /= w.sum()
    c = np.concatenate([[0.0], c]) if first else c
    c32 = c.astype(np.float32)
    if i == n - 1:  # reach 1/2 at the clamp: raise c_0 ulp by ulp (float Horner)
        fc = np.float32(clamp_s(n) - np.float32(n - 1))
        while True:
            p = np.float32(0.0)
            for k in range(deg, -1, -1):
                p = np.float32(p * fc + c32[k])
            if p >= np.float32(0.5):
                break
            c32[0] = np.nextafter(c32[0], np.float32(2.0))
    p = np.zeros_like(f)
    for k in range(deg, -1, -1):
        p = p * f + np.float64(c32[k])
    return c32, float(np.max(np.abs(p - y)))


def table(n, deg, name):
    coefs, worst = [], 0.0
    for i in range(n):
        c, e = fit_interval(i, n, deg, i == 0)
        coefs.append(c)
        worst = max(worst, e)
    print(f"// {n} intervals, degree {deg}: max |error| of erf / 2 {worst:.2e};"
          f" s = |x| * {(n - 0.5) / T_CLAMP / 2 ** 0.5:.9g} clamped to {clamp_s(n)!r}")
    print(f"alignas(64) constexpr float {name}[{deg + 1}][{n}] = {{")
    for k in range(deg + 1):
        vals = [re.sub(r"0+p", "p", float(coefs[i][k]).hex()) + "f" for i in range(n)]
        lines = [", ".join(vals[j:j + 4]) for j in range(0, n, 4)]
        print("    {" + ",\n     ".join(lines) + "},")
    print("};")


if __name__ == "__main__":
    table(8, 6, "kErfTable8")
    table(16, 5, "kErfTable16")
