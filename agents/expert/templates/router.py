{{header}}
# A mixture-of-experts router as one Pallas kernel per block of token rows: the logits
# x @ W accumulate in f32 VMEM scratch over blocks of the hidden dim (all experts at once: E
# is small), then, at the last hidden step, the scores are computed from them in VMEM (the
# reference's own row-wise chain: softmax, sigmoid, bias), the k best experts are picked one
# at a time (row max, the lowest column holding it, that column masked out: lax.top_k's
# order, nothing sorted), and the [rows, k] work after the top_k (renormalised weights, int32
# ids) is done before the store when it is row-local. Neither the [T, E] logits nor the
# scores ever reach HBM: x and W are read once, [T, k] written.
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

PARAMS = {{params}}
K = {{k}}
# What the matcher found: the operands' layouts (x "mk": [rows, hidden], "km": its
# transpose; W "kn": [hidden, E], "nk": [E, hidden]) and the dtypes the reference casts them
# to before the dot, a scalar factor on the logits, the scores' and top values' dtypes, the
# scores' extra operands (True: an [E] vector, None: a scalar in SMEM), the kernel's
# outputs when the work after the top_k runs in it (name, width, dtype).
CFG = {{config}}


# The scores from the logits, generated from the reference's jaxpr (block_program).
{{program}}


def _epilogue(top_values, top_indices, _rows):
    # ---- replayed from the reference on the block's [rows, k] results ----
{{kernel_epilogue}}
    return [{{kernel_returns}}]


def _divisor(extent, want, align):
    if want >= extent:
        return extent
    b = (want // align) * align
    while b >= align:
        if extent % b == 0:
            return b
        b -= align
    return extent


def _sublanes(dtype):
    return 8 * max(1, 4 // jnp.dtype(dtype).itemsize)


def _router_kernel(x_ref, w_ref, *refs, nextra, nout, nk, rows, experts, unroll):
    extra_refs = refs[:nextra]
    out_refs = refs[nextra:nextra + nout]
    acc_ref = refs[nextra + nout]
    i, j = pl.program_id(0), pl.program_id(1)

    @pl.when(j == 0)
    def _init():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    x = x_ref[...].astype(jnp.dtype(CFG["x_cast"]))
    w = w_ref[...].astype(jnp.dtype(CFG["w_cast"]))
    lc = 1 if CFG["x_layout"] == "mk" else 0
    rc = 0 if CFG["w_layout"] == "kn" else 1
    acc_ref[...] += lax.dot_general(x, w, (((lc,), (rc,)), ((), ())),
                                    preferred_element_type=jnp.float32)

    @pl.when(j == nk - 1)
    def _finish():
        logits = acc_ref[...]
        if CFG["scale"] != 1.0:
            logits = logits * CFG["scale"]
        extras = [r[0] if pres is None else r[...] for r, pres in zip(extra_refs, CFG["extras"])]
        br, width = logits.shape
        s = _scores([logits], extras, (i * br, 0), (rows, experts))[0]
        # the reference's top_k sees its scores' dtype: round to it (same ties)
        s = jnp.broadcast_to(s, logits.shape).astype(jnp.dtype(CFG["score_dtype"]))
        s = s.astype(jnp.float32)
        col = lax.broadcasted_iota(jnp.int32, (br, width), 1)
        lanes = max(128, -(-K // 128) * 128)
        slot = lax.broadcasted_iota(jnp.int32, (br, lanes), 1)

        def pick(t, carry):
            work, vals, idxs = carry
            m = jnp.max(work, axis=1, keepdims=True)
            # the lowest column holding the max (lax.top_k's order among equal values)
            c = jnp.min(jnp.where(work == m, col, width), axis=1, keepdims=True)
            work = jnp.where(col == c, -jnp.inf, work)
            return work, jnp.where(slot == t, m, vals), jnp.where(slot == t, c, idxs)

        init = (s, jnp.zeros((br, lanes), jnp.float32), jnp.zeros((br, lanes), jnp.int32))
        _, vals, idxs = lax.fori_loop(0, K, pick, init, unroll=unroll)
        top_values = vals[:, :K].astype(jnp.dtype(CFG["value_dtype"]))
        top_indices = idxs[:, :K]
        outs = _epilogue(top_values, top_indices, br)
        for o, v in zip(out_refs, outs):
            o[...] = jnp.broadcast_to(v, o.shape).astype(o.dtype)


def _router(x, w, extras):
    mk, kn = CFG["x_layout"] == "mk", CFG["w_layout"] == "kn"
    rows, hidden = x.shape if mk else x.shape[::-1]
    experts = w.shape[1] if kn else w.shape[0]
    br = _divisor(rows, int(PARAMS["block_rows"]), _sublanes(x.dtype) if mk else 128)
    # hidden on lanes in x (mk) or W (nk): 128; else on sublanes of both
    k_align = 128 if (mk or not kn) else max(_sublanes(x.dtype), _sublanes(w.dtype))
    bk = _divisor(hidden, int(PARAMS["block_k"]), k_align)
    nk = hidden // bk
    in_specs = [pl.BlockSpec((br, bk), lambda i, j: (i, j)) if mk
                else pl.BlockSpec((bk, br), lambda i, j: (j, i)),
                pl.BlockSpec((bk, experts), lambda i, j: (j, 0)) if kn
                else pl.BlockSpec((experts, bk), lambda i, j: (0, j))]
    for pres in CFG["extras"]:
        in_specs.append(pl.BlockSpec(memory_space=pltpu.SMEM) if pres is None
                        else pl.BlockSpec((1, experts if pres else 1), lambda i, j: (0, 0)))
    if CFG["epilogue"] == "kernel":
        outs = [(n, dt) for _, n, dt in CFG["outputs"]]
    else:
        outs = [(K, CFG["value_dtype"]), (K, "int32")]
    out_specs = [pl.BlockSpec((br, n), lambda i, j: (i, 0)) for n, _ in outs]
    out_shape = [jax.ShapeDtypeStruct((rows, n), jnp.dtype(dt)) for n, dt in outs]
    kernel = functools.partial(_router_kernel, nextra=len(extras), nout=len(outs), nk=nk,
                               rows=rows, experts=experts, unroll=int(PARAMS["unroll"]))
    in_bytes = x.size * x.dtype.itemsize + w.size * w.dtype.itemsize
    out_bytes = sum(math.prod(o.shape) * o.dtype.itemsize for o in out_shape)
    return pl.pallas_call(
        kernel,
        grid=(rows // br, nk),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        scratch_shapes=[pltpu.VMEM((br, experts), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=(PARAMS["dimension_semantics"], "arbitrary"),
            vmem_limit_bytes=int(PARAMS["vmem_limit_bytes"])),
        cost_estimate=pl.CostEstimate(
            flops=2 * rows * hidden * experts + 4 * K * rows * experts,
            transcendentals=rows * experts * CFG["transcendentals"],
            bytes_accessed=int(in_bytes + out_bytes)),
    )(x, w, *extras)


def workload({{args}}):
    ({{kernel_returns}},) = _router({{x}}, {{w}}, [{{extras}}])
    # ---- replayed from the reference: what it does with the top k after the kernel ----
{{outside_epilogue}}
    return {{returns}}
