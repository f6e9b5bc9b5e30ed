"""Writes the analyze summaries (DataflowGraph JSON) that recurrence_templates_test.cpp reads:
small references of the retention, chunked_recurrence, matmul_backward,
shared_operand_matmul, attention_backward and topk templates, analysed by the worker's own
analyze(). Re-run after a change to analyze.py:
  .venv/bin/python tests/agents/expert/recurrence_data/make_graphs.py"""
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "..", "tpu_nodes", "worker"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from maxkernel_worker.analyze import analyze  # noqa: E402

bf16, f32 = jnp.bfloat16, jnp.float32
S = jax.ShapeDtypeStruct


def retention(q, k, v):
    heads, n, d = q.shape[1], q.shape[2], q.shape[3]
    log_gamma = jnp.log(1.0 - 2.0 ** (-5.0 - jnp.arange(heads, dtype=f32)))
    i = jnp.arange(n)[:, None]
    j = jnp.arange(n)[None, :]
    decay = jnp.where(i >= j, jnp.exp(jnp.maximum(i - j, 0).astype(f32)[None] * log_gamma[:, None, None]), 0.0)
    decay = decay / jnp.sqrt(jnp.sum(decay, axis=-1, keepdims=True))
    s = jnp.einsum("bhnd,bhmd->bhnm", q, k, preferred_element_type=f32) * d ** -0.5 * decay
    s = s / jnp.maximum(jnp.sum(jnp.abs(s), axis=-1, keepdims=True), 1.0)
    return jnp.einsum("bhnm,bhmd->bhnd", s, v.astype(f32)).astype(q.dtype)


def ssd(x, dt, A, B, C, D):
    b, t, h, p = x.shape
    n = B.shape[-1]
    size = 64
    c = t // size

    def segsum(a):
        cs = jnp.cumsum(a, axis=-1)
        diff = cs[..., :, None] - cs[..., None, :]
        length = a.shape[-1]
        return jnp.where(jnp.tril(jnp.ones((length, length), bool)), diff, -jnp.inf)

    X = (x.astype(f32) * dt[..., None]).reshape(b, c, size, h, p)
    A_dt = (A * dt).reshape(b, c, size, h).transpose(0, 3, 1, 2)
    Bc = B.astype(f32).reshape(b, c, size, n)
    Cc = C.astype(f32).reshape(b, c, size, n)
    A_cs = jnp.cumsum(A_dt, axis=-1)
    y_diag = jnp.einsum("bcln,bcsn,bhcls,bcshp->bclhp", Cc, Bc, jnp.exp(segsum(A_dt)), X)
    states = jnp.einsum("bcln,bhcl,bclhp->bchpn", Bc, jnp.exp(A_cs[..., -1:] - A_cs), X)
    states = jnp.concatenate([jnp.zeros_like(states[:, :1]), states], axis=1)
    dc = jnp.exp(segsum(jnp.pad(A_cs[..., -1], ((0, 0), (0, 0), (1, 0)))))
    states = jnp.einsum("bhzc,bchpn->bzhpn", dc, states)[:, :-1]
    y_off = jnp.einsum("bcln,bchpn,bhcl->bclhp", Cc, states, jnp.exp(A_cs))
    y = (y_diag + y_off).reshape(b, t, h, p) + x.astype(f32) * D[:, None]
    return y.astype(x.dtype)


def matmul_vjp(x, w, d_y):
    _, vjp = jax.vjp(lambda a, b: jnp.dot(a, b, preferred_element_type=f32), x, w)
    d_x, d_w = vjp(d_y.astype(f32))
    return d_x.astype(x.dtype), d_w.astype(w.dtype)


def allgather(x, w):
    return jnp.einsum("mk,dkn->dmn", x.reshape(-1, x.shape[-1]), w,
                      preferred_element_type=f32).astype(x.dtype)


def attention_vjp(q, k, v, d_out):
    def attention(q, k, v):
        n, d = q.shape[2], q.shape[3]
        s = jnp.einsum("bhqd,bhkd->bhqk", q.astype(f32), k.astype(f32)) * d ** -0.5
        s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), s, -jnp.inf)
        return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v.astype(f32))
    _, vjp = jax.vjp(attention, q, k, v)
    dq, dk, dv = vjp(d_out.astype(f32))
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


def topk_sampling(logits, uniform):
    vals, ids = jax.lax.top_k(logits, 8)
    cdf = jnp.cumsum(jax.nn.softmax(vals / 0.7, axis=-1), axis=-1)
    choice = jnp.minimum(jnp.sum(cdf <= uniform[:, None], axis=-1), 7)
    return vals, ids, jnp.take_along_axis(ids, choice[:, None], axis=-1)[:, 0]


CASES = {
    "retention": (retention, [S((1, 2, 512, 128), bf16)] * 3),
    "ssd": (ssd, [S((1, 512, 4, 64), bf16), S((1, 512, 4), f32), S((4,), f32),
                  S((1, 512, 128), bf16), S((1, 512, 128), bf16), S((4,), f32)]),
    "matmul_vjp": (matmul_vjp, [S((512, 1024), bf16), S((1024, 768), bf16), S((512, 768), bf16)]),
    "allgather": (allgather, [S((4, 256, 1024), bf16), S((4, 1024, 512), bf16)]),
    "attention_vjp": (attention_vjp, [S((1, 2, 512, 128), bf16)] * 4),
    "topk_sampling": (topk_sampling, [S((64, 4096), f32), S((64,), f32)]),
}

if __name__ == "__main__":
    for name, (fn, args) in CASES.items():
        graph = analyze(fn, args, ())
        with open(os.path.join(HERE, name + ".json"), "w") as f:
            json.dump(graph, f, sort_keys=True)
        print(name, len(graph["nodes"]), "nodes")
