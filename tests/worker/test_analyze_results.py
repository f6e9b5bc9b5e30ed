"""analyze(): every operand records which result of its producer it reads (operandResults),
so a consumer of one of several results of the same type (jnp.split's halves) is told apart."""

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
F32 = jnp.float32


@pytest.fixture(scope="module")
def schema():
    return load_schemas(str(ROOT / "messages" / "schema"))


def only(graph, primitive):
    found = [n for n in graph["nodes"] if n["primitive"] == primitive]
    assert len(found) == 1, [n["primitive"] for n in graph["nodes"]]
    return found[0]


def rotate_half(x):
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1 * 3.0], axis=-1)


def test_split_halves_used_differently_record_their_result_index(schema):
    g = analyze(rotate_half, [S((4, 16), F32)], ())
    split, neg, mul = only(g, "split"), only(g, "neg"), only(g, "mul")
    assert len(split["results"]) == 2 and split["results"][0] == split["results"][1]
    assert neg["operandIds"] == [split["id"]] and neg["operandResults"] == [1]
    assert mul["operandIds"][0] == split["id"] and mul["operandResults"] == [0, -1]
    # a graph input or a literal is no node's result
    assert split["operandResults"] == [-1]
    for n in g["nodes"]:
        assert len(n["operandResults"]) == len(n["operandIds"])
        for producer, r in zip(n["operandIds"], n["operandResults"]):
            assert (r >= 0) == (producer >= 0)
    msg = schema.DataflowGraph.new_message(**g)
    back = msg.to_dict()
    assert [list(n.get("operandResults", [])) for n in back["nodes"]] == \
        [n["operandResults"] for n in g["nodes"]]


def test_result_index_through_jit_and_reordered_outputs():
    @jax.jit
    def swapped(x):
        a, b = jnp.split(x, 2, axis=0)
        return b, a

    def f(x):
        b, a = swapped(x)
        return jnp.exp(b) - a

    g = analyze(f, [S((8, 4), F32)], ())
    split, exp, sub = only(g, "split"), only(g, "exp"), only(g, "sub")
    assert exp["operandIds"] == [split["id"]] and exp["operandResults"] == [1]
    assert sub["operandIds"] == [exp["id"], split["id"]]
    assert sub["operandResults"] == [0, 0]


def test_result_index_of_a_loop_result_is_its_body_nodes():
    # A loop's results are listed as its body's nodes: the consumer after the loop reads the
    # body node's result the loop returns in that place (here the halves swapped).
    def f(x):
        def body(_, carry):
            a, b = jnp.split(jnp.concatenate(carry, axis=-1), 2, axis=-1)
            return (b, a)
        lo, hi = jax.lax.fori_loop(0, 3, body, (x, x + 1.0))
        return jnp.tanh(lo) * jnp.log(hi)

    g = analyze(f, [S((4, 8), F32)], ())
    split, tanh, log = only(g, "split"), only(g, "tanh"), only(g, "log")
    assert tanh["operandIds"] == [split["id"]] and tanh["operandResults"] == [1]
    assert log["operandIds"] == [split["id"]] and log["operandResults"] == [0]
