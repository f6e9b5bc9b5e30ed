"""Writes the analyze summaries (DataflowGraph JSON) that tests/agents/expert/moe_replay_test.cpp
reads: small mixture-of-experts and gated-MLP references, analysed by the worker's own
analyze(). Re-run after a change to analyze.py:
    .venv/bin/python tests/agents/expert/moe_data/make_graphs.py"""
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


def dense_moe(x, w_router, w_gate, w_up, w_down):
    # Mixtral's dense path: top-2 of the router logits, softmax, one-hot combine
    logits = jnp.einsum("bse,ex->bsx", x, w_router, preferred_element_type=f32)
    top_logits, top_experts = jax.lax.top_k(logits, 2)
    w = jax.nn.softmax(top_logits, axis=-1)
    combine = jnp.sum(jax.nn.one_hot(top_experts, w_router.shape[1]) * w[..., None], axis=-2)
    gate = jnp.einsum("bse,xef->bsxf", x, w_gate)
    up = jnp.einsum("bse,xef->bsxf", x, w_up)
    y = jnp.einsum("bsxf,xfe->bsxe", jax.nn.silu(gate) * up, w_down)
    return jnp.einsum("bsxe,bsx->bse", y.astype(f32), combine).astype(x.dtype)


def gathered_weights(x, w, ids):
    return jnp.einsum("mk,mkn->mn", x, w[ids])


def glu_f32(x, wg, wu):
    g = x @ wg
    return jax.nn.sigmoid(g) * g * (x @ wu)


def iota_of_equal_sizes(a, b):
    # the iota's size (8) is the size of a dim of both inputs and is tied to neither
    return a * jnp.sum(jnp.arange(8, dtype=f32)) + jnp.sum(b)


CASES = {
    "dense_moe": (dense_moe, [S((2, 64, 256), bf16), S((256, 8), bf16), S((8, 256, 512), bf16),
                              S((8, 256, 512), bf16), S((8, 512, 256), bf16)], ()),
    "gathered_weights": (gathered_weights, [S((128, 256), bf16), S((4, 256, 384), bf16),
                                            S((128,), i32)], ()),
    "glu_f32": (glu_f32, [S((128, 256), f32), S((256, 512), f32), S((256, 512), f32)], ()),
    "iota_of_equal_sizes": (iota_of_equal_sizes, [S((16, 8), f32), S((8,), f32)], ()),
}

if __name__ == "__main__":
    for name, (fn, args, static) in CASES.items():
        g = analyze(fn, args, static)
        with open(os.path.join(HERE, name + ".json"), "w") as f:
            json.dump(g, f, indent=1, sort_keys=True)
            f.write("\n")
        print("wrote", name)
