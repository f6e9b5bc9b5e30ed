# maxkernel expert template: grouped_matmul
# matched: {{summary}}
# params: {{params}}
# Grouped (ragged) matmul for mixture-of-experts on TPU: rows sorted by expert, group
# offsets and the (row tile, group) schedule in SMEM by scalar prefetch, tiles straddling a
# group boundary masked on store, f32 accumulation. Work the reference does around the
# products (routing, expert ids, casts) is replayed from its graph as XLA ops.
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
{{epilogues}}

@jax.jit
def _run({{graph_inputs}}):
{{body}}


def workload({{signature}}):
    return _run({{graph_inputs}})
