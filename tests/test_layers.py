"""jaxzoo.layers: a convolution written as patches @ kernel is the convolution
(`patches`: the MinAtar 3x3 of ppo, rainbow, unizero and unizero_ppo), and the
stride-2 convolution and its transpose of planet and world_models are XLA's,
values and gradients (the transpose's gradient is written by hand)."""

import jax
import numpy as np
import pytest

from jaxzoo import layers


@pytest.mark.parametrize("kernel_size, stride, size", [(3, 1, 10), (4, 2, 64), (5, 2, 13), (3, 2, 7)])
def test_patches_times_kernel_is_the_valid_convolution(kernel_size, stride, size):
    x_key, k_key = jax.random.split(jax.random.key(kernel_size * 10 + stride))
    x = jax.random.normal(x_key, (2, size, size, 3))  # [B, H, W, C]
    kernel = jax.random.normal(k_key, (kernel_size, kernel_size, 3, 5))  # HWIO
    expected = jax.lax.conv_general_dilated(
        x,
        kernel,
        (stride, stride),
        "VALID",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
        precision=jax.lax.Precision.HIGHEST,
    )
    patches = layers.patches(x, kernel_size, stride)
    out = (size - kernel_size) // stride + 1
    assert patches.shape == (2, out, out, kernel_size * kernel_size * 3)
    np.testing.assert_allclose(patches @ kernel.reshape(-1, 5), expected, rtol=1e-5, atol=1e-5)


def test_patches_keep_leading_axes():
    x = np.arange(2 * 3 * 10 * 10 * 4, dtype=np.float32).reshape(2, 3, 10, 10, 4)  # [T, N, H, W, C]
    patches = layers.patches(x, 3)
    assert patches.shape == (2, 3, 8, 8, 36)
    # Tap (i, j) sits in channels [(3i + j) C, (3i + j + 1) C).
    np.testing.assert_array_equal(patches[..., 5, 2, (3 * 1 + 2) * 4 : (3 * 1 + 2 + 1) * 4], x[..., 6, 4, :])


def _reference_conv_transpose(x, kernel):
    """out[2i + a, 2j + b] += x[i, j] @ kernel[a, b], as XLA's dilated convolution
    of the padded input with the flipped kernel (lax.conv_transpose's definition)."""
    k = kernel.shape[0]
    return jax.lax.conv_general_dilated(
        x,
        kernel[::-1, ::-1],
        (1, 1),
        [(k - 1, k - 1)] * 2,
        lhs_dilation=(2, 2),
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
        precision=jax.lax.Precision.HIGHEST,
    )


@pytest.mark.parametrize("kernel_size, size", [(4, 32), (4, 15), (5, 13), (3, 7)])
def test_stride2_conv_and_its_gradients_match_lax_conv(kernel_size, size):
    x = jax.random.normal(jax.random.key(size), (2, size, size + 1, 3))
    kernel = jax.random.normal(jax.random.key(kernel_size), (kernel_size, kernel_size, 3, 5))

    def ours(x, kernel):
        return layers.stride2_patches(x, kernel_size) @ layers.stride2_kernel(kernel)

    def reference(x, kernel):
        return jax.lax.conv_general_dilated(
            x, kernel, (2, 2), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"), precision=jax.lax.Precision.HIGHEST
        )

    np.testing.assert_allclose(ours(x, kernel), reference(x, kernel), rtol=1e-5, atol=1e-4)
    loss = lambda f: lambda x, kernel: (jax.numpy.sin(f(x, kernel)) ** 2).sum()  # noqa: E731
    for got, want in zip(jax.grad(loss(ours), (0, 1))(x, kernel), jax.grad(loss(reference), (0, 1))(x, kernel)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("kernel_size, size", [(5, 1), (6, 5), (6, 14), (5, 4), (3, 6)])
def test_conv_transpose_and_its_hand_written_gradients_match_lax(kernel_size, size):
    """The forward (output-side form) and the custom backward (the adjoint stride-2
    convolution) against XLA's own transposed convolution and its autodiff, also
    under vmap with extra leading axes, as the vmapped seeds of planet.py run it."""
    x = jax.random.normal(jax.random.key(size), (3, 2, size, size + 2, 4))  # [seeds, B, h, w, C_in]
    kernel = jax.random.normal(jax.random.key(kernel_size), (3, kernel_size, kernel_size, 4, 2))  # per seed
    reference = jax.vmap(_reference_conv_transpose)
    got = jax.vmap(layers.conv_transpose_stride2)(x, kernel)
    assert got.shape == (3, 2, 2 * (size - 1) + kernel_size, 2 * (size + 1) + kernel_size, 2)
    np.testing.assert_allclose(got, reference(x, kernel), rtol=1e-5, atol=1e-4)
    loss = lambda f: lambda x, kernel: (jax.numpy.sin(f(x, kernel)) ** 2).sum()  # noqa: E731
    grads = jax.grad(loss(jax.vmap(layers.conv_transpose_stride2)), (0, 1))(x, kernel)
    for got, want in zip(grads, jax.grad(loss(reference), (0, 1))(x, kernel)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
