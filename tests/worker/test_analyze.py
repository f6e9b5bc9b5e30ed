"""analyze(): the dataflow graph of a traced function, with XLA-style flop counts."""

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tpu_nodes" / "worker"))

from maxkernel_worker.analyze import analyze  # noqa: E402
from maxkernel_worker.errors import WorkerError  # noqa: E402
from maxkernel_worker.schema import load_schemas  # noqa: E402

S = jax.ShapeDtypeStruct
F32 = jnp.float32


@pytest.fixture(scope="module")
def schema():
    return load_schemas(str(ROOT / "messages" / "schema"))


def nodes_of(graph, primitive):
    return [n for n in graph["nodes"] if n["primitive"] == primitive]


def check_schema(schema, graph):
    msg = schema.DataflowGraph.new_message(**graph)
    back = msg.as_builder().to_dict() if hasattr(msg, "as_builder") else msg.to_dict()
    assert len(back.get("nodes", [])) == len(graph["nodes"])
    assert back.get("flops", 0.0) == pytest.approx(graph["flops"])


def test_matmul_flops_are_2mnk(schema):
    m, k, n = 48, 80, 24
    g = analyze(lambda x, y: x @ y, [S((m, k), F32), S((k, n), F32)], ())
    dots = nodes_of(g, "dot_general")
    assert len(dots) == 1
    assert dots[0]["flops"] == 2 * m * n * k
    assert g["flops"] == 2 * m * n * k
    assert dots[0]["operandIds"] == [-1, -1]
    assert dots[0]["bytes"] == 4 * (m * k + k * n + m * n)
    assert g["minBytes"] == 4 * (m * k + k * n + m * n)
    params = json.loads(dots[0]["params"])
    assert params["lhs_contracting"] == [1] and params["rhs_contracting"] == [0]
    assert g["inputs"] == [{"shape": [m, k], "dtype": "float32"},
                           {"shape": [k, n], "dtype": "float32"}]
    assert g["outputs"] == [{"shape": [m, n], "dtype": "float32"}]
    check_schema(schema, g)


def test_batched_matmul_counts_batch_dims():
    b, m, k, n = 3, 16, 32, 8
    g = analyze(lambda x, y: jnp.einsum("bmk,bkn->bmn", x, y),
                [S((b, m, k), F32), S((b, k, n), F32)], ())
    assert g["flops"] == 2 * b * m * n * k


def test_attention_reference(schema):
    b, h, s, d = 2, 3, 32, 16

    def attention(q, k, v):
        logits = jnp.einsum("bhqd,bhkd->bhqk", q, k)
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(logits, axis=-1), v)

    g = analyze(attention, [S((b, h, s, d), F32)] * 3, ())
    dots = nodes_of(g, "dot_general")
    assert [n["flops"] for n in dots] == [2 * b * h * s * s * d] * 2
    assert sum(n["flops"] for n in nodes_of(g, "exp")) == 0  # exp is a transcendental
    assert g["transcendentals"] == b * h * s * s
    # The second matmul consumes the softmax, a node of the graph; v is a graph input.
    second = dots[1]
    assert second["operandIds"][0] >= 0 and second["operandIds"][1] == -1
    producer = g["nodes"][second["operandIds"][0]]
    assert producer["results"][0]["shape"] == [b, h, s, s]
    # Softmax adds elementwise and reduction work on top of the two matmuls.
    assert g["flops"] > 2 * (2 * b * h * s * s * d)
    check_schema(schema, g)


def test_rmsnorm():
    rows, d = 12, 64

    def rmsnorm(x, w):
        r = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)
        return x * r * w

    g = analyze(rmsnorm, [S((rows, d), F32), S((d,), F32)], ())
    assert g["transcendentals"] == rows  # one rsqrt per row
    assert sum(n["flops"] for n in nodes_of(g, "reduce_sum")) == rows * d
    # x*x, x*r, *w: three elementwise passes over the whole array, plus the reduction.
    assert g["flops"] >= 4 * rows * d
    assert g["flops"] < 4 * rows * d + 4 * rows + 1


def test_layernorm():
    rows, d = 8, 32

    def layernorm(x):
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
        return (x - mu) / jnp.sqrt(var + 1e-5)

    g = analyze(layernorm, [S((rows, d), F32)], ())
    assert g["transcendentals"] == rows  # sqrt per row
    assert sum(n["flops"] for n in nodes_of(g, "reduce_sum")) == 2 * rows * d
    assert g["minBytes"] == 2 * 4 * rows * d


def test_scan_multiplies_body_by_length():
    length, n = 7, 16

    def f(c, ws):
        def body(c, w):
            return jnp.tanh(c @ w), None
        return jax.lax.scan(body, c, ws)[0]

    g = analyze(f, [S((n, n), F32), S((length, n, n), F32)], ())
    dot = nodes_of(g, "dot_general")
    assert len(dot) == 1 and dot[0]["count"] == length
    assert dot[0]["flops"] == 2 * n ** 3
    assert g["flops"] == length * 2 * n ** 3
    assert g["transcendentals"] == length * n * n


def test_fori_and_while_trip_counts():
    n = 8

    def fori(x):
        return jax.lax.fori_loop(0, 5, lambda i, c: c @ c, x)

    def while_(x):
        return jax.lax.while_loop(lambda c: c[0] < 9, lambda c: (c[0] + 1, c[1] @ c[1]),
                                  (0, x))[1]

    def dot_flops(g):
        return sum(d["flops"] * d["count"] for d in nodes_of(g, "dot_general"))

    g = analyze(fori, [S((n, n), F32)], ())
    assert dot_flops(g) == 5 * 2 * n ** 3
    assert g["flops"] - dot_flops(g) <= 2 * 5  # the loop counter's scalar adds
    g = analyze(while_, [S((n, n), F32)], ())
    assert dot_flops(g) == 9 * 2 * n ** 3


def test_cond_counts_most_expensive_branch():
    n = 16
    g = analyze(lambda p, x: jax.lax.cond(p, lambda y: y @ y, lambda y: y + 1.0, x),
                [S((), jnp.bool_), S((n, n), F32)], ())
    assert sum(d["flops"] for d in nodes_of(g, "dot_general")) == 2 * n ** 3
    assert not nodes_of(g, "add")  # the cheap branch is not listed
    assert g["flops"] <= 2 * n ** 3 + 1  # plus the predicate's scalar conversion


def test_jit_and_custom_jvp_are_inlined():
    n = 32

    @jax.jit
    def inner(x):
        return jax.nn.relu(x) @ x

    g = analyze(lambda x: inner(x) * 2.0, [S((n, n), F32)], ())
    prims = [x["primitive"] for x in g["nodes"]]
    assert "pjit" not in prims and "jit" not in prims and "custom_jvp_call" not in prims
    assert "dot_general" in prims and "max" in prims
    mul = nodes_of(g, "mul")[-1]
    assert g["nodes"][mul["operandIds"][0]]["primitive"] == "dot_general"


def test_conv_flops():
    n, c, h, w, o, kh, kw = 2, 3, 16, 16, 8, 3, 3

    def conv(x, k):
        return jax.lax.conv_general_dilated(x, k, (1, 1), "VALID")

    g = analyze(conv, [S((n, c, h, w), F32), S((o, c, kh, kw), F32)], ())
    ho, wo = h - kh + 1, w - kw + 1
    assert g["flops"] == 2 * n * o * ho * wo * c * kh * kw


def test_static_argnums_and_params():
    def f(x, perm):
        return jnp.transpose(x, perm)

    g = analyze(f, [S((2, 3, 4), F32), (2, 0, 1)], (1,))
    t = nodes_of(g, "transpose")
    assert len(t) == 1 and json.loads(t[0]["params"])["permutation"] == [2, 0, 1]
    assert g["flops"] == 0
    assert t[0]["results"][0]["shape"] == [4, 2, 3]


def test_trace_error_is_classified():
    def bad(x, y):
        return x @ y  # shapes do not match

    with pytest.raises(WorkerError) as e:
        analyze(bad, [S((4, 5), F32), S((6, 7), F32)], ())
    assert e.value.error_class == "traceError"
    assert "dot_general" in e.value.message or "shape" in e.value.message.lower()


def test_pallas_call_is_priced_by_its_body_times_grid_steps():
    from jax.experimental import pallas as pl

    m, n, k, bm = 64, 128, 32, 16

    def mm(x, y):
        return pl.pallas_call(
            lambda x_ref, y_ref, o_ref: o_ref.__setitem__(
                ..., jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)),
            grid=(m // bm,),
            in_specs=[pl.BlockSpec((bm, k), lambda i: (i, 0)),
                      pl.BlockSpec((k, n), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((bm, n), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((m, n), F32))(x, y)

    g = analyze(mm, [S((m, k), F32), S((k, n), F32)], ())
    (call,) = nodes_of(g, "pallas_call")
    assert call["flops"] == 2 * m * n * k
    assert call["bytes"] == 4 * (m * k + k * n + m * n)


def test_operands_name_their_graph_inputs_and_literals(schema):
    """The expert brain matches on these: which input feeds an op, which scalar a literal is."""
    def f(x, w, b):
        y = jnp.dot(x, w) + b
        return jnp.maximum(y, 0.5) * 2.0, x
    g = analyze(f, [S((8, 16), F32), S((16, 4), F32), S((4,), F32)], ())
    check_schema(schema, g)
    dot = nodes_of(g, "dot_general")[0]
    assert dot["operandInputs"] == [0, 1]
    assert dot["operandLiterals"] == ["", ""]
    mx = nodes_of(g, "max")[0]
    assert json.loads(mx["operandLiterals"][1]) == 0.5
    assert mx["operandInputs"] == [-1, -1]
    bcast = nodes_of(g, "broadcast_in_dim")[0]
    assert bcast["operandInputs"] == [2]
    mul = nodes_of(g, "mul")[0]
    assert g["outputIds"] == [mul["id"], -1]
    assert g["outputInputs"] == [-1, 0]


def test_infinite_literals_are_json_strings(schema):
    g = analyze(lambda x: jnp.maximum(x, -jnp.inf), [S((8, 128), F32)], ())
    mx = nodes_of(g, "max")[0]
    assert json.loads(mx["operandLiterals"][1]) == "-inf"
