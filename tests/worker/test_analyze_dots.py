"""analyze(): the DotOp of every dot_general (the sizes the MXU sees) in a reference's graph."""

import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tpu_nodes" / "worker"))

from maxkernel_worker.analyze import analyze  # noqa: E402
from maxkernel_worker.schema import load_schemas  # noqa: E402

S = jax.ShapeDtypeStruct
F32, BF16 = jnp.float32, jnp.bfloat16


@pytest.fixture(scope="module")
def schema():
    return load_schemas(str(ROOT / "messages" / "schema"))


def dots_of(graph):
    return [n for n in graph["nodes"] if n["primitive"] == "dot_general"]


def test_einsum_batch_dims(schema):
    b, h, s, t, d = 2, 3, 16, 24, 8

    def scores(q, k):
        return jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=F32)

    g = analyze(scores, [S((b, h, s, d), BF16), S((b, h, t, d), BF16)], ())
    (node,) = dots_of(g)
    assert node["hasDot"]
    dot = node["dot"]
    assert (dot["batch"], dot["m"], dot["n"], dot["k"]) == (b * h, s, t, d)
    assert (dot["lhsDtype"], dot["rhsDtype"], dot["outDtype"]) == ("bfloat16", "bfloat16",
                                                                   "float32")
    assert dot["count"] == 1
    # The node's flops are the DotOp's: 2 * batch * m * n * k.
    assert node["flops"] == 2 * dot["batch"] * dot["m"] * dot["n"] * dot["k"]
    # Other nodes carry no DotOp.
    assert all(not n["hasDot"] for n in g["nodes"] if n["primitive"] != "dot_general")

    msg = schema.DataflowGraph.new_message(**g)
    back = [n for n in msg.to_dict()["nodes"] if n["primitive"] == "dot_general"][0]
    assert back["hasDot"] and back["dot"]["batch"] == b * h and back["dot"]["k"] == d


def test_several_free_and_contracting_dims_multiply():
    # lhs free dims (m, c), rhs free dims (n, e), contracting dims (k, l), batch dim b.
    b, m, c, k, l, n, e = 2, 3, 5, 4, 6, 7, 2
    g = analyze(lambda x, y: jnp.einsum("bmckl,bklne->bmcne", x, y),
                [S((b, m, c, k, l), F32), S((b, k, l, n, e), F32)], ())
    (node,) = dots_of(g)
    dot = node["dot"]
    assert (dot["batch"], dot["m"], dot["n"], dot["k"]) == (b, m * c, n * e, k * l)
    assert node["flops"] == 2 * b * m * c * n * e * k * l


def test_transposed_operands_and_mixed_dtypes():
    m, k, n = 12, 20, 36
    # x^T @ y^T: both contracting dims are not the usual ones.
    g = analyze(lambda xt, yt: jax.lax.dot_general(xt, yt, (((0,), (1,)), ((), ())),
                                                   preferred_element_type=F32),
                [S((k, m), BF16), S((n, k), jnp.int8)], ())
    dot = dots_of(g)[0]["dot"]
    assert (dot["batch"], dot["m"], dot["n"], dot["k"]) == (1, m, n, k)
    assert (dot["lhsDtype"], dot["rhsDtype"], dot["outDtype"]) == ("bfloat16", "int8", "float32")


def test_dot_count_follows_loops():
    length, n, trips = 5, 16, 3

    def f(c, ws):
        def body(c, w):
            c = jax.lax.fori_loop(0, trips, lambda i, x: x @ w, c)
            return jnp.tanh(c), None
        return jax.lax.scan(body, c, ws)[0]

    g = analyze(f, [S((n, n), F32), S((length, n, n), F32)], ())
    (node,) = dots_of(g)
    assert node["count"] == length * trips
    assert node["dot"]["count"] == node["count"]
    assert (node["dot"]["m"], node["dot"]["n"], node["dot"]["k"]) == (n, n, n)
    assert g["flops"] >= length * trips * 2 * n ** 3


def test_attention_reference_has_two_dots():
    b, h, s, d = 2, 4, 32, 16

    def attention(q, k, v):
        logits = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(d)
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(logits, axis=-1), v)

    g = analyze(attention, [S((b, h, s, d), F32)] * 3, ())
    got = [(n["dot"]["batch"], n["dot"]["m"], n["dot"]["n"], n["dot"]["k"]) for n in dots_of(g)]
    assert got == [(b * h, s, s, d), (b * h, s, d, s)]
