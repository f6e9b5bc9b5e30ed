# maxkernel expert template: moe_ffn
# matched: {{summary}}
# params: {{params}}
# Mixture-of-experts feed-forward block: the router's work (logits, top-k, softmax, combine
# weights) is replayed from the reference's graph as XLA ops, so tokens route exactly as in
# the reference; each token's rows for its top-k experts (the nonzero combine weights) are
# sorted by expert, and two grouped-matmul Pallas kernels (group offsets in SMEM by scalar
# prefetch) compute glu(x @ W_gate[e], x @ W_up[e]) and its down projection for the routed
# rows only; the expert outputs are weighted and summed back per token.
import functools
import math

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_M = {{block_m}}
BLOCK_K = {{block_k}}
BLOCK_N = {{block_n}}
N_SEMANTICS = "{{n_semantics}}"
VMEM_LIMIT_BYTES = {{vmem_limit_bytes}}

{{gmm_core}}

{{replay_prelude}}

{{glu}}


def _expert_out(accs, extras, offsets, extents):
    return accs[0]


def _moe(x, combine, *, k, gate, up, down, f, h_dtype, y_dtype):
    """sum over the top-k experts e of token t: combine[t, e] * down_e(glu(x_t @ gate_e,
    x_t @ up_e)). x: [T, E]; combine: [T, X] (zero for experts a token does not use)."""
    t, _ = x.shape
    experts = combine.shape[1]
    weight, expert = lax.top_k(combine, k)          # the nonzero weights of each token
    ids = expert.reshape(-1).astype(jnp.int32)       # row r = token r // k, its expert
    order = jnp.argsort(ids, stable=True)
    sizes = jnp.sum(ids[None, :] == jnp.arange(experts, dtype=jnp.int32)[:, None], axis=1,
                    dtype=jnp.int32)
    token = order // k
    rows = jnp.take(x, token, axis=0)
    h = _gmm(rows, [gate, up], sizes, n=f, epilogue=_glu, out_dtype=h_dtype)
    wd, td = down
    n = wd.shape[1] if td else wd.shape[2]
    y = _gmm(h, [(wd, td, 0)], sizes, n=n, epilogue=_expert_out, out_dtype=y_dtype)
    w = jnp.take(weight.reshape(-1), order).astype(jnp.float32)
    return jnp.zeros((t, n), jnp.float32).at[token].add(y.astype(jnp.float32) * w[:, None])


@jax.jit
def _run({{graph_inputs}}):
{{body}}


def workload({{signature}}):
    return _run({{graph_inputs}})
