"""Writes the analyze summaries (DataflowGraph JSON) that tests/agents/expert/*_test.cpp read:
small references in several spellings, analysed by the worker's own analyze(). Re-run after a
change to analyze.py:  .venv/bin/python tests/agents/expert/data/make_graphs.py"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "..", "tpu_nodes", "worker"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from maxkernel_worker.analyze import analyze  # noqa: E402

bf16, f32, i32 = jnp.bfloat16, jnp.float32, jnp.int32
S = jax.ShapeDtypeStruct


def matmul_bias_gelu_softmax(x, w, b):
    y = jnp.einsum("mk,kn->mn", x, w, preferred_element_type=f32) + b.astype(f32)
    return jax.nn.softmax(jax.nn.gelu(y), axis=-1).astype(x.dtype)


def rmsnorm_3d(x, weight, eps):
    x32 = x.astype(f32)
    ms = jnp.mean(x32 * x32, axis=-1, keepdims=True)
    return (x32 * jax.lax.rsqrt(ms + eps) * weight.astype(f32)).astype(x.dtype)


def cross_entropy(h, w, labels):
    logits = jnp.dot(h, w, preferred_element_type=f32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    return lse - jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]


def groupnorm_after_matmul(x, w):
    y = x @ w
    g = y.reshape(y.shape[0], 4, y.shape[1] // 4)
    return ((g - g.mean(-1, keepdims=True))).reshape(y.shape)


def groupnorm_var_after_matmul(x, w):
    y = x @ w
    g = y.reshape(y.shape[0], 4, y.shape[1] // 4)
    return ((g - g.mean(-1, keepdims=True)) / jnp.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(y.shape)


def maxout_after_matmul(x, w):
    y = x @ w
    return y.reshape(y.shape[0], y.shape[1] // 4, 4).max(-1)


def cumsum_after_matmul(x, w):
    return jnp.cumsum(x @ w, axis=-1)


def residual_per_row_scalar(x, w, res, row_scale, s):
    y = jax.lax.dot_general(x, w, (((1,), (1,)), ((), ())), preferred_element_type=f32)
    return (y * row_scale[:, None] + res.astype(f32)) * s, jnp.max(y, axis=1)


def gates_after_matmul(x, w, c):
    g = jnp.einsum("mk,kgn->mgn", x, w)
    return jax.nn.sigmoid(g[:, 1]) * c + jnp.tanh(g[:, 0]) * g[:, 2]


def headnorm_after_einsum(x, w, b):
    q = jnp.einsum("mk,khd->mhd", x, w, preferred_element_type=f32) + b.astype(f32)
    mu = q.mean(-1, keepdims=True)
    var = jnp.mean(jnp.square(q - mu), -1, keepdims=True)
    return ((q - mu) * jax.lax.rsqrt(var + 1e-6)).astype(x.dtype)


# Sizes big enough that the templates have blocks to choose (and children to propose).
CASES = {
    "matmul_bias_gelu_softmax": (matmul_bias_gelu_softmax,
                                 [S((512, 1024), bf16), S((1024, 2048), bf16), S((2048,), bf16)],
                                 ()),
    "rmsnorm_3d": (rmsnorm_3d, [S((4, 256, 512), bf16), S((512,), bf16), 1e-6], (2,)),
    "cross_entropy": (cross_entropy,
                      [S((512, 1024), bf16), S((1024, 4096), bf16), S((512,), i32)], ()),
    "groupnorm_after_matmul": (groupnorm_after_matmul,
                               [S((512, 1024), f32), S((1024, 2048), f32)], ()),
    "groupnorm_var_after_matmul": (groupnorm_var_after_matmul,
                                   [S((512, 1024), f32), S((1024, 2048), f32)], ()),
    "maxout_after_matmul": (maxout_after_matmul, [S((512, 1024), f32), S((1024, 2048), f32)], ()),
    "gates_after_matmul": (gates_after_matmul,
                           [S((512, 1024), f32), S((1024, 4, 512), f32), S((512, 512), f32)],
                           ()),
    "cumsum_after_matmul": (cumsum_after_matmul, [S((512, 1024), f32), S((1024, 2048), f32)], ()),
    "residual_per_row_scalar": (residual_per_row_scalar,
                                [S((512, 1024), bf16), S((2048, 1024), bf16),
                                 S((512, 2048), bf16), S((512,), f32), S((), f32)], ()),
    "headnorm_128": (headnorm_after_einsum,
                     [S((512, 1024), bf16), S((1024, 8, 128), bf16), S((8, 128), bf16)], ()),
    "headnorm_64": (headnorm_after_einsum,
                    [S((512, 1024), bf16), S((1024, 16, 64), bf16), S((16, 64), bf16)], ()),
}

if __name__ == "__main__":
    only = sys.argv[1:]   # names to write (default: all)
    for name, (fn, args, static) in CASES.items():
        if only and name not in only:
            continue
        g = analyze(fn, args, static)
        with open(os.path.join(HERE, name + ".json"), "w") as f:
            json.dump(g, f, indent=1, sort_keys=True)
            f.write("\n")
        print("wrote", name)
