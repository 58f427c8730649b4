"""Unit roundoffs and the float32 dot-product error bound (no numba: shared by the
numba kernels, the C kernels and their callers)."""

from __future__ import annotations

#: Unit roundoff of float32.
U32 = 2.0**-24
#: Unit roundoff of float64.
U64 = 2.0**-53


def error_bound_factor(dim: int) -> float:
    """Safety-doubled ``gamma_D`` bound on the float32 dot-product error, relative:
    ``|fl(q . g) - q . g| <= error_bound_factor(D) |q| |g|`` whatever the summation order."""
    return 2.0 * (dim + 2) * U32
