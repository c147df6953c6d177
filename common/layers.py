"""Convolutions written as matmuls, shared by the files that see images:
`patches` (the MinAtar 3x3 convolution of algos/ppo.py, rainbow.py,
unizero.py and unizero_ppo.py, which keep their own kernels), and the
stride-2 convolution and its transpose (`StridedConv`, `StridedConvTranspose`)
of algos/planet.py and algos/world_models.py. XLA:CPU computes the kernel
gradient of a real convolution several times slower inside a `lax.scan`
(docs/ppo.md, detail 13; docs/planet.md, detail 12); a matmul over patches
is the same function without that cost."""

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


def stride2_patches(x: jax.Array, kernel_size: int) -> jax.Array:
    """[..., H, W, C] -> [..., out_h, out_w, 4 * half^2 * C] with out = (H - k) // 2
    + 1 and half = ceil(k / 2): the windows of an unpadded stride-2 k x k
    convolution, read through space-to-depth. The input, cropped or zero-padded
    to 2 (out + half - 1) rows and columns, is folded into 2 x 2 blocks
    ([..., H/2, W/2, 4C], block channel (q, r, c) holding pixel (2i + q, 2j + r));
    then the stride-2 window at (i, j) is the half x half window of blocks at
    (i, j), so the patches are half^2 contiguous views instead of k^2 strided
    ones. Tap (2u + q, 2v + r) of the window sits in channels ordered
    (u, v, q, r, c); taps past k (odd k) read padding and meet zero kernel rows
    (`stride2_kernel`). XLA:CPU differentiates contiguous slices as plain pads,
    strided ones as interior pads: the encoders' backward pass 1.4x faster
    (docs/performance.md, PlaNet)."""
    *lead, height, width, channels = x.shape
    half = (kernel_size + 1) // 2
    out_h, out_w = (height - kernel_size) // 2 + 1, (width - kernel_size) // 2 + 1
    rows, cols = 2 * (out_h + half - 1), 2 * (out_w + half - 1)
    x = x[..., : min(height, rows), : min(width, cols), :]
    x = jnp.pad(x, [(0, 0)] * len(lead) + [(0, rows - x.shape[-3]), (0, cols - x.shape[-2]), (0, 0)])
    blocks = x.reshape(*lead, rows // 2, 2, cols // 2, 2, channels)
    blocks = jnp.moveaxis(blocks, -4, -3).reshape(*lead, rows // 2, cols // 2, 4 * channels)  # channels (q, r, c)
    return jnp.concatenate(
        [blocks[..., u : u + out_h, v : v + out_w, :] for u in range(half) for v in range(half)], axis=-1
    )


def stride2_kernel(kernel: jax.Array) -> jax.Array:
    """[k, k, C_in, C_out] -> [4 * half^2 * C_in, C_out], rows in the tap order of
    `stride2_patches` ((u, v, q, r, c) for tap (2u + q, 2v + r)); an odd k is
    zero-padded to 2 * half taps."""
    k, _, c_in, c_out = kernel.shape
    half = (k + 1) // 2
    kernel = jnp.pad(kernel, [(0, 2 * half - k), (0, 2 * half - k), (0, 0), (0, 0)])
    kernel = kernel.reshape(half, 2, half, 2, c_in, c_out).transpose(0, 2, 1, 3, 4, 5)  # [u, v, q, r, C_in, C_out]
    return kernel.reshape(half * half * 4 * c_in, c_out)


class StridedConv(nnx.Module):
    """[..., H, W, C_in] -> [..., (H - k) // 2 + 1, (W - k) // 2 + 1, C_out]: a
    k x k convolution with stride 2 and no padding, written as patches @ kernel
    (`stride2_patches`, then one matmul). Same function as `lax.conv`, but
    XLA:CPU runs the kernel gradient of a real convolution about 4x slower
    inside a `lax.scan` (docs/planet.md, detail 12; docs/ppo.md measured the
    same for the MinAtar CNN)."""

    def __init__(self, c_in: int, c_out: int, kernel_size: int, rngs: nnx.Rngs):
        self.kernel = nnx.Param(nnx.initializers.lecun_normal()(rngs.params(), (kernel_size, kernel_size, c_in, c_out)))
        self.bias = nnx.Param(jnp.zeros((c_out,)))

    def __call__(self, x: jax.Array) -> jax.Array:
        return stride2_patches(x, self.kernel.shape[0]) @ stride2_kernel(self.kernel[...]) + self.bias[...]


@jax.custom_vjp
def conv_transpose_stride2(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """[..., h, w, C_in], [k, k, C_in, C_out] -> [..., 2(h - 1) + k, 2(w - 1) + k, C_out]:
    the transposed stride-2 convolution, out[2i + a, 2j + b] += x[i, j] @ kernel[a, b].

    Forward, the output-side form: one matmul gives every tap's contribution,
    taps[a, b][i, j] = x[i, j] @ kernel[a, b]; with a = 2p + q and b = 2s + r,
    output pixel (2m + q, 2n + r) sums taps[2p + q, 2s + r][m - p, n - s] over
    (p, s), so each parity (q, r) is the sum of half^2 shifted tap maps, added
    in place into one buffer (`dynamic_update_slice`: XLA:CPU runs `.at[].add`
    as a scatter, 14x slower, and a sum of zero-padded maps gets fused into
    every consumer of the output and recomputed there). Backward, by hand
    (`jax.custom_vjp`): this map is the adjoint of the stride-2 convolution, so
    the gradient of x is the stride-2 convolution of the output gradient g with
    the same kernel, `stride2_patches(g) @ kernel^T`, and the kernel gradient
    is x^T @ those patches; differentiating the forward pass would build and
    sum half^2 full-size pads instead. PlaNet's model update (cpu preset)
    went from 77 to 44 ms with this and `stride2_patches`, from the input-side
    (sub-pixel) form used before (docs/performance.md, PlaNet)."""
    k, _, c_in, c_out = kernel.shape
    *lead, h, w, _ = x.shape
    half = (k + 1) // 2
    kernel = jnp.pad(kernel, [(0, 2 * half - k), (0, 2 * half - k), (0, 0), (0, 0)])
    kernel = kernel.reshape(half, 2, half, 2, c_in, c_out).transpose(0, 2, 4, 1, 3, 5)  # [p, s, C_in, q, r, C_out]
    taps = jnp.einsum("...hwc,pscd->ps...hwd", x, kernel.reshape(half, half, c_in, 4 * c_out))
    m, n = h + half - 1, w + half - 1  # rows and columns per parity
    out = jnp.zeros((*lead, m, n, 4 * c_out), taps.dtype)  # [..., m, n, (q, r, C_out)]
    for p in range(half):
        for s in range(half):
            start = (0,) * len(lead) + (p, s, 0)
            region = jax.lax.dynamic_slice(out, start, taps[p, s].shape)
            out = jax.lax.dynamic_update_slice(out, region + taps[p, s], start)
    out = jnp.moveaxis(out.reshape(*lead, m, n, 2, 2, c_out), -3, -4).reshape(*lead, 2 * m, 2 * n, c_out)
    return out[..., : 2 * (h - 1) + k, : 2 * (w - 1) + k, :]


def _conv_transpose_stride2_forward(x: jax.Array, kernel: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return conv_transpose_stride2(x, kernel), (x, kernel)


def _conv_transpose_stride2_backward(
    residuals: tuple[jax.Array, jax.Array], out_grad: jax.Array
) -> tuple[jax.Array, jax.Array]:
    x, kernel = residuals
    c_in = x.shape[-1]
    windows = stride2_patches(out_grad, kernel.shape[0])  # [..., h, w, 4 half^2 C_out]
    flipped = kernel.transpose(0, 1, 3, 2)  # [k, k, C_out, C_in]
    x_grad = windows @ stride2_kernel(flipped)
    kernel_grad_rows = x.reshape(-1, c_in).T @ windows.reshape(-1, windows.shape[-1])  # [C_in, taps]
    _, to_kernel = jax.vjp(stride2_kernel, flipped)  # stride2_kernel is a linear rearrangement: its vjp undoes it
    (kernel_grad,) = to_kernel(kernel_grad_rows.T)
    return x_grad, kernel_grad.transpose(0, 1, 3, 2)


conv_transpose_stride2.defvjp(_conv_transpose_stride2_forward, _conv_transpose_stride2_backward)


class StridedConvTranspose(nnx.Module):
    """[..., h, w, C_in] -> [..., 2(h - 1) + k, 2(w - 1) + k, C_out]: the
    transposed k x k convolution with stride 2 and no padding
    (`conv_transpose_stride2`). Avoids `lax.conv_transpose` for the reason given
    in StridedConv."""

    def __init__(self, c_in: int, c_out: int, kernel_size: int, rngs: nnx.Rngs):
        self.kernel = nnx.Param(nnx.initializers.lecun_normal()(rngs.params(), (kernel_size, kernel_size, c_in, c_out)))
        self.bias = nnx.Param(jnp.zeros((c_out,)))

    def __call__(self, x: jax.Array) -> jax.Array:
        return conv_transpose_stride2(x, self.kernel[...]) + self.bias[...]
