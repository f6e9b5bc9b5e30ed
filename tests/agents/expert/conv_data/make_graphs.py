"""Writes the analyze summaries (DataflowGraph JSON) that
tests/agents/expert/conv_templates_test.cpp reads: small convolution chains in several
spellings, analysed by the worker's own analyze(). Re-run after a change to analyze.py:
  .venv/bin/python tests/agents/expert/conv_data/make_graphs.py [name ...]"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "..", "tpu_nodes", "worker"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from maxkernel_worker.analyze import analyze  # noqa: E402

bf16, f32 = jnp.bfloat16, jnp.float32
S = jax.ShapeDtypeStruct


def nhwc_bias_relu_pool(x, w, b):
    y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                     preferred_element_type=f32)
    y = jax.nn.relu(y + b.astype(f32))
    y = jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    return y.astype(x.dtype)


def nchw_groupnorm(x, w, b, gamma, beta, groups):
    y = jax.lax.conv(x, w, (1, 1), "VALID") + b[None, :, None, None]
    n, c, h, wd = y.shape
    g = y.reshape(n, groups, c // groups, h, wd)
    g = (g - g.mean(axis=(2, 3, 4), keepdims=True)) / jnp.sqrt(g.var(axis=(2, 3, 4), keepdims=True) + 1e-5)
    y = g.reshape(n, c, h, wd) * gamma[None, :, None, None] + beta[None, :, None, None]
    return jnp.clip(y, 0.0, 1.0)


def depthwise_layernorm(x, dw, g, b):
    y = jax.lax.conv_general_dilated(x, dw, (1, 1), ((3, 3), (3, 3)),
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                     feature_group_count=x.shape[-1],
                                     preferred_element_type=f32)
    mu = y.mean(-1, keepdims=True)
    var = ((y - mu) ** 2).mean(-1, keepdims=True)
    return ((y - mu) / jnp.sqrt(var + 1e-6) * g + b).astype(x.dtype)


def conv_transpose_relu(x, w):
    return jax.nn.relu(jax.lax.conv_transpose(x, w, (2, 2), "SAME",
                                              dimension_numbers=("NHWC", "HWIO", "NHWC")))


def groupnorm_silu_conv(x, w, groups):
    n, h, wd, c = x.shape
    g = x.astype(f32).reshape(n, h, wd, groups, c // groups)
    g = (g - g.mean(axis=(1, 2, 4), keepdims=True)) * jax.lax.rsqrt(g.var(axis=(1, 2, 4), keepdims=True) + 1e-5)
    a = jax.nn.silu(g.reshape(n, h, wd, c)).astype(x.dtype)
    return jax.lax.conv_general_dilated(a, w, (1, 1), ((1, 1), (1, 1)),
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                        preferred_element_type=f32)


def grouped16(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", feature_group_count=16,
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def patch4_valid(x, w):
    # VALID, 4x4 stride 4 at 32 x 32: the pads (0, 0) are also what SAME gives at these sizes
    return jax.lax.conv_general_dilated(x, w, (4, 4), "VALID",
                                        dimension_numbers=("NCHW", "OIHW", "NHWC"))


def k4s2_pad1(x, w):
    # PyTorch's Conv2d(k=4, stride=2, padding=1): also SAME's split at even sizes
    return jax.lax.conv_general_dilated(x, w, (2, 2), ((1, 1), (1, 1)),
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def k3s2_same(x, w):
    # SAME, stride 2 at even sizes: pads (0, 1), which depend on the input size
    return jax.lax.conv_general_dilated(x, w, (2, 2), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def same_pool(x, w):
    # a "SAME" 3x3 stride-2 max pool after a stride-1 conv: pads (0, 1) at 16 x 16
    y = jax.nn.relu(jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                                 dimension_numbers=("NHWC", "HWIO", "NHWC")))
    return jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")


def depthwise_s2(x, w):
    # a 5x5 stride-2 depthwise conv (an MBConv's downsampling): SAME pads (1, 2) at 16 x 16
    return jax.lax.conv_general_dilated(x, w, (2, 2), "SAME", feature_group_count=x.shape[-1],
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def matmul_relu(x, w):
    return jax.nn.relu(x @ w)


CASES = {
    "nhwc_bias_relu_pool": (nhwc_bias_relu_pool, [S((2, 16, 16, 64), bf16),
                                                  S((3, 3, 64, 128), bf16), S((128,), bf16)], ()),
    "nchw_groupnorm": (nchw_groupnorm, [S((4, 32, 18, 18), f32), S((64, 32, 3, 3), f32),
                                        S((64,), f32), S((64,), f32), S((64,), f32), 8], (5,)),
    "depthwise_layernorm": (depthwise_layernorm, [S((2, 14, 14, 128), bf16), S((7, 7, 1, 128), bf16),
                                                  S((128,), f32), S((128,), f32)], ()),
    "conv_transpose_relu": (conv_transpose_relu, [S((2, 8, 8, 256), bf16),
                                                  S((4, 4, 256, 128), bf16)], ()),
    "groupnorm_silu_conv": (groupnorm_silu_conv, [S((2, 16, 16, 320), bf16),
                                                  S((3, 3, 320, 320), bf16), 32], (2,)),
    "grouped16": (grouped16, [S((2, 8, 8, 64), f32), S((3, 3, 4, 64), f32)], ()),
    "patch4_valid": (patch4_valid, [S((2, 3, 32, 32), bf16), S((128, 3, 4, 4), bf16)], ()),
    "k4s2_pad1": (k4s2_pad1, [S((2, 16, 16, 64), bf16), S((4, 4, 64, 128), bf16)], ()),
    "k3s2_same": (k3s2_same, [S((2, 16, 16, 64), bf16), S((3, 3, 64, 128), bf16)], ()),
    "same_pool": (same_pool, [S((2, 16, 16, 64), f32), S((3, 3, 64, 128), f32)], ()),
    "depthwise_s2": (depthwise_s2, [S((2, 16, 16, 128), bf16), S((5, 5, 1, 128), bf16)], ()),
    "matmul_relu": (matmul_relu, [S((64, 128), bf16), S((128, 256), bf16)], ()),
}

if __name__ == "__main__":
    for name, (fn, args, statics) in CASES.items():
        if sys.argv[1:] and name not in sys.argv[1:]:
            continue
        graph = analyze(fn, args, statics)
        with open(os.path.join(HERE, name + ".json"), "w") as f:
            json.dump(graph, f, indent=1, sort_keys=True)
        print(name, len(graph["nodes"]), "nodes")
