{{header}}
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

PARAMS = {{params}}

# What the matcher found: the number of row inputs (seeds) in (rows, D) form, the extra
# operands' presence along (rows, D) (None: a scalar in SMEM), the outputs' presence and
# dtypes, the mode (tile: elementwise only; row: a block holds whole rows; stream: row
# statistics accumulated across D blocks; col: the chain reduces the middle axis R of a
# (P, R, D) view, see _colwise) and the alignment of (rows, D) blocks.
CFG = {{config}}


# The row program, generated from the reference's jaxpr (agents/expert/block_program).
{{program}}


def _fit(dim, want, align):
    """The block really used: the largest divisor of dim that is a multiple of align and at
    most want, else dim itself (always legal)."""
    if want >= dim:
        return dim
    b = (want // align) * align
    while b >= align:
        if dim % b == 0:
            return b
        b -= align
    return dim


def _rowwise(seeds, extras, R, D):
    mode = CFG["mode"]
    ar, ad = CFG["align"]
    br = _fit(R, int(PARAMS["block_rows"]), ar)
    bd = D if mode == "row" else _fit(D, int(PARAMS["block_d"]), ad)
    nr, nd = R // br, D // bd

    def space_spec(pres):
        return pl.BlockSpec((br if pres[0] else 1, bd if pres[1] else 1),
                            lambda i, j: (i if pres[0] else 0, j if pres[1] else 0))

    in_specs = [space_spec((True, True)) for _ in seeds]
    for pres in CFG["extras"]:
        in_specs.append(pl.BlockSpec(memory_space=pltpu.SMEM) if pres is None
                        else space_spec(pres))
    out_specs, out_shape = [], []
    for pres, dt in CFG["outputs"]:
        out_specs.append(space_spec(pres))
        out_shape.append(jax.ShapeDtypeStruct((R if pres[0] else 1, D if pres[1] else 1),
                                              jnp.dtype(dt)))
    nseed, nextra, nout = len(seeds), len(extras), len(out_shape)
    scratch = [pltpu.VMEM((br, 1), jnp.dtype(dt)) for dt in CFG["stream_accs"]]

    def kernel(*refs):
        seed_refs = refs[:nseed]
        extra_refs = refs[nseed:nseed + nextra]
        out_refs = refs[nseed + nextra:nseed + nextra + nout]
        stat_refs = refs[nseed + nextra + nout:]
        i, j = pl.program_id(0), pl.program_id(1)
        offsets = (i * br, j * bd)
        extents = (R, D)

        def extra_values():
            return [r[0] if pres is None else r[...]
                    for r, pres in zip(extra_refs, CFG["extras"])]

        def store(outs):
            for o, v in zip(out_refs, outs):
                o[...] = jnp.broadcast_to(v, o.shape).astype(o.dtype)

        if mode != "stream":
            store(rows([r[...] for r in seed_refs], extra_values(), offsets, extents))
            return

        @pl.when(j == 0)
        def _init():
            for s, v in zip(stat_refs, rows_init((br, 1))):
                s[...] = v

        accs = rows_step([s[...] for s in stat_refs], [r[...] for r in seed_refs],
                         extra_values(), offsets, extents)
        for s, v in zip(stat_refs, accs):
            s[...] = v

        @pl.when(j == nd - 1)
        def _final():
            store(rows_final([s[...] for s in stat_refs], extra_values(), offsets, extents,
                             (br, 1)))

    rows_axis = PARAMS.get("dimension_semantics", "parallel")
    # Parallel axes must be a prefix of the grid: rows in order leave the columns in order too.
    parallel_cols = mode != "stream" and rows_axis == "parallel"
    semantics = (rows_axis, "parallel" if parallel_cols else "arbitrary")
    in_bytes = sum(x.size * x.dtype.itemsize for x in list(seeds) + list(extras))
    out_bytes = sum(math.prod(s.shape) * s.dtype.itemsize for s in out_shape)
    cost = pl.CostEstimate(flops=R * D * CFG["flops_per_element"],
                           transcendentals=R * D * CFG["transcendentals"],
                           bytes_accessed=int(in_bytes + out_bytes))
    return pl.pallas_call(
        kernel,
        grid=(nr, nd),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        scratch_shapes=scratch,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=semantics,
            vmem_limit_bytes=int(PARAMS["vmem_limit_bytes"])),
        cost_estimate=cost,
    )(*seeds, *extras)


def _colwise(seeds, extras, P, R, D):
    """Column mode: the reduction runs over R of a (P, R, D) view of the reference's arrays
    (softmax over axis 0, over the classes of [B, C, S]). A block holds one P entry, all of R
    (sublanes) and bd columns of D (lanes); the program reduces its axis 1."""
    bd = _fit(D, int(PARAMS["block_d"]), CFG["align"][1])
    nd = D // bd

    def space_spec(pres):
        return pl.BlockSpec((None, R if pres[1] else 1, bd if pres[2] else 1),
                            lambda p, j: (p if pres[0] else 0, 0, j if pres[2] else 0))

    in_specs = [space_spec((True, True, True)) for _ in seeds]
    for pres in CFG["extras"]:
        in_specs.append(pl.BlockSpec(memory_space=pltpu.SMEM) if pres is None
                        else space_spec(pres))
    out_specs, out_shape = [], []
    for pres, dt in CFG["outputs"]:
        out_specs.append(space_spec(pres))
        out_shape.append(jax.ShapeDtypeStruct(
            (P if pres[0] else 1, R if pres[1] else 1, D if pres[2] else 1), jnp.dtype(dt)))
    nseed, nextra = len(seeds), len(extras)

    def kernel(*refs):
        seed_refs = refs[:nseed]
        extra_refs = refs[nseed:nseed + nextra]
        out_refs = refs[nseed + nextra:]
        p, j = pl.program_id(0), pl.program_id(1)
        extras_now = [r[0] if pres is None else r[...]
                      for r, pres in zip(extra_refs, CFG["extras"])]
        outs = rows([r[...] for r in seed_refs], extras_now, (p, 0, j * bd), (P, R, D))
        for o, v in zip(out_refs, outs):
            o[...] = jnp.broadcast_to(v, o.shape).astype(o.dtype)

    par = PARAMS.get("dimension_semantics", "parallel")
    in_bytes = sum(x.size * x.dtype.itemsize for x in list(seeds) + list(extras))
    out_bytes = sum(math.prod(s.shape) * s.dtype.itemsize for s in out_shape)
    cost = pl.CostEstimate(flops=P * R * D * CFG["flops_per_element"],
                           transcendentals=P * R * D * CFG["transcendentals"],
                           bytes_accessed=int(in_bytes + out_bytes))
    return pl.pallas_call(
        kernel,
        grid=(P, nd),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=(par, par),
            vmem_limit_bytes=int(PARAMS["vmem_limit_bytes"])),
        cost_estimate=cost,
    )(*seeds, *extras)


def workload({{args}}):
{{prep}}
    if CFG["mode"] == "col":
        outs = _colwise(seeds, extras, P, R, D)
    else:
        outs = _rowwise(seeds, extras, R, D)
{{result}}
