"""Convolutions written as patches @ kernel matmuls, shared by the files that
see images: `patches` (the MinAtar 3x3 convolution of algos/ppo.py,
rainbow.py, unizero.py and unizero_ppo.py), and the stride-2 convolutions and
their transposes of algos/planet.py and algos/world_models.py. XLA:CPU computes
the kernel gradient of a real convolution several times slower inside a
`lax.scan` (docs/ppo.md, detail 13; docs/planet.md, detail 12); a matmul over
patches is the same function without that cost. Each file keeps its own kernel
(its own initialisation); only the patch extraction is shared."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


def patches(x: jax.Array, kernel_size: int, stride: int = 1) -> jax.Array:
    """[..., H, W, C] -> [..., out_h, out_w, k*k*C] with out = (H - k) // stride + 1:
    the k x k windows of an unpadded convolution, tap (i, j) of the window in
    channels [(i*k + j)*C, (i*k + j + 1)*C). A convolution with a kernel
    [k, k, C, C_out] is then `patches(x, k, stride) @ kernel.reshape(k*k*C, C_out)`."""
    out_h, out_w = (x.shape[-3] - kernel_size) // stride + 1, (x.shape[-2] - kernel_size) // stride + 1
    return jnp.concatenate(
        [
            x[..., i : i + stride * (out_h - 1) + 1 : stride, j : j + stride * (out_w - 1) + 1 : stride, :]
            for i in range(kernel_size)
            for j in range(kernel_size)
        ],
        axis=-1,
    )


class StridedConv(nnx.Module):
    """[..., H, W, C_in] -> [..., (H - k) // 2 + 1, (W - k) // 2 + 1, C_out]: a
    k x k convolution with stride 2 and no padding, written as patches @ kernel
    (the k^2 strided views concatenated, then one matmul). Same function as
    `lax.conv`, but XLA:CPU runs the kernel gradient of a real convolution
    about 4x slower inside a `lax.scan` (docs/planet.md, detail 12; docs/ppo.md
    measured the same for the MinAtar CNN)."""

    def __init__(self, c_in: int, c_out: int, kernel_size: int, rngs: nnx.Rngs):
        self.kernel = nnx.Param(nnx.initializers.lecun_normal()(rngs.params(), (kernel_size, kernel_size, c_in, c_out)))
        self.bias = nnx.Param(jnp.zeros((c_out,)))

    def __call__(self, x: jax.Array) -> jax.Array:
        k, _, c_in, c_out = self.kernel.shape
        return patches(x, k, stride=2) @ self.kernel[...].reshape(k * k * c_in, c_out) + self.bias[...]


class StridedConvTranspose(nnx.Module):
    """[..., h, w, C_in] -> [..., 2(h - 1) + k, 2(w - 1) + k, C_out]: the
    transposed k x k convolution with stride 2 and no padding,
    out[2i + a, 2j + b] += x[i, j] @ kernel[a, b]. Written as its sub-pixel
    form: each output parity (2m + q, 2n + r) is a stride-1 convolution of the
    zero-padded input with the kernel taps (2p + q, 2s + r), so all four are one
    patches @ kernel matmul followed by an interleave. Avoids
    `lax.conv_transpose` for the reason given in StridedConv."""

    def __init__(self, c_in: int, c_out: int, kernel_size: int, rngs: nnx.Rngs):
        self.kernel = nnx.Param(nnx.initializers.lecun_normal()(rngs.params(), (kernel_size, kernel_size, c_in, c_out)))
        self.bias = nnx.Param(jnp.zeros((c_out,)))

    def __call__(self, x: jax.Array) -> jax.Array:
        k, _, c_in, c_out = self.kernel.shape
        *lead, h, w, _ = x.shape
        half = (k + 1) // 2  # taps per output parity along an axis
        m, n = h + half - 1, w + half - 1
        padded = jnp.pad(x, [(0, 0)] * len(lead) + [(half - 1, half - 1), (half - 1, half - 1), (0, 0)])
        patches = jnp.concatenate(
            [padded[..., u : u + m, v : v + n, :] for u in range(half) for v in range(half)], axis=-1
        )  # [..., m, n, half*half*C_in]
        # Tap (2p + q, 2s + r) of the kernel (zero past k) serves view (u, v) = (half-1-p, half-1-s), parity (q, r).
        kernel = jnp.pad(self.kernel[...], [(0, 2 * half - k), (0, 2 * half - k), (0, 0), (0, 0)])
        kernel = kernel.reshape(half, 2, half, 2, c_in, c_out)[::-1, :, ::-1]  # [u, q, v, r, C_in, C_out]
        kernel = kernel.transpose(0, 2, 4, 1, 3, 5).reshape(half * half * c_in, 4 * c_out)
        out = (patches @ kernel).reshape(*lead, m, n, 2, 2, c_out)
        out = jnp.moveaxis(out, -3, -4).reshape(*lead, 2 * m, 2 * n, c_out)  # row 2i + q, column 2j + r
        return out[..., : 2 * (h - 1) + k, : 2 * (w - 1) + k, :] + self.bias[...]
