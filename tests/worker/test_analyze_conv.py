"""analyze(): convolutions and ragged dots carry the DotOp of the GEMM the MXU runs, so the
model pads their small channel counts as the hardware does."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
from jax import lax

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tpu_nodes" / "worker"))

from maxkernel_worker.analyze import analyze  # noqa: E402

S = jax.ShapeDtypeStruct
BF16, F32 = jnp.bfloat16, jnp.float32


def node_of(graph, primitive):
    (node,) = [n for n in graph["nodes"] if n["primitive"] == primitive]
    return node


def test_conv2d_is_an_implicit_gemm():
    n, h, w, cin, cout, kh, kw = 2, 16, 12, 3, 64, 3, 3

    def conv(x, k):
        return lax.conv_general_dilated(x, k, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))

    g = analyze(conv, [S((n, h, w, cin), BF16), S((kh, kw, cin, cout), BF16)], ())
    node = node_of(g, "conv_general_dilated")
    assert node["hasDot"]
    dot = node["dot"]
    # m: output positions, n: output features, k: input features x window.
    assert (dot["batch"], dot["m"], dot["n"], dot["k"]) == (1, n * h * w, cout, cin * kh * kw)
    assert node["flops"] == 2 * dot["batch"] * dot["m"] * dot["n"] * dot["k"]


def test_grouped_conv_has_one_gemm_per_group():
    n, h, w, c, groups, k = 1, 8, 8, 32, 4, 3

    def conv(x, kern):
        return lax.conv_general_dilated(x, kern, (1, 1), "VALID",
                                        dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                        feature_group_count=groups)

    g = analyze(conv, [S((n, c, h, w), F32), S((c, c // groups, k, k), F32)], ())
    node = node_of(g, "conv_general_dilated")
    dot = node["dot"]
    out_hw = (h - k + 1) * (w - k + 1)
    assert (dot["batch"], dot["m"], dot["n"], dot["k"]) == (groups, n * out_hw, c // groups,
                                                           (c // groups) * k * k)
    assert node["flops"] == 2 * dot["batch"] * dot["m"] * dot["n"] * dot["k"]


def test_ragged_dot_rows_against_one_group_matrix():
    m, k, n, groups = 64, 32, 48, 4

    def rd(x, w, sizes):
        return lax.ragged_dot(x, w, sizes)

    g = analyze(rd, [S((m, k), BF16), S((groups, k, n), BF16), S((groups,), jnp.int32)], ())
    (node,) = [n for n in g["nodes"] if n["primitive"].startswith("ragged_dot")]
    dot = node["dot"]
    assert (dot["batch"], dot["m"], dot["n"], dot["k"]) == (1, m, n, k)
    assert node["flops"] == 2 * m * k * n
