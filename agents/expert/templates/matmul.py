{{header}}
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

PARAMS = {{params}}

# What the matcher found: the dots (lhs operand, rhs operand, scale), each operand's layout in
# its canonical (batch, rows, cols) form and the casts done on its blocks, the extra operands'
# presence along (batch, M, N) (None: a scalar in SMEM), the outputs' presence and dtypes, the
# epilogue mode (tile: elementwise only; row: a block holds whole rows of N; stream: row
# statistics accumulated across N blocks; group: a block holds one group of NI columns, the
# epilogue reducing within groups; with group_blocks (NI lane-aligned) a block holds whole
# groups and the epilogue runs on each group's slice), and the alignment of (M, N, K) blocks.
# An extra marked "inner" spans one group and is the same block for every column block. With
# pool > 1 the epilogue reduces groups of `pool` adjacent columns (maxout): it reads each
# column block member-major (see _member_major) and its outputs are bn // pool wide. With
# pool_outer the members are the OUTER factor of N (the gates of [K, G, N'] weights): member
# g of a column block is one contiguous block of the reference's columns, fetched by its own
# BlockSpec (no copy), and the accumulator holds the members side by side. extra_pooled: the
# extra holds one value per group (bn // pool wide, natural order). mat_segments: dots over
# different contractions (x @ w_ih + h @ w_hh) run one after the other along the K grid
# axis, each operand's block index held at its segment's ends outside it (no refetch).
# acc_in_out: the one dot accumulates straight into its f32 output block (no scratch copy).
# With row_pieces (row mode, every row independent) the dot runs in column slices of
# PARAMS["dot_cols"] and the epilogue on PARAMS["epilogue_rows"] rows at a time, so their f32
# temporaries stay a few MiB however wide the rows (bm x N f32 is 16 MiB at bm 512, N 8192)
# and bm can grow instead.
CFG = {{config}}


# The fused epilogue, generated from the reference's jaxpr (agents/expert/block_program).
{{epilogue}}


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


def _member_major(x, axis, bn, g):
    """x with the columns of every block of bn along axis reordered member-major: column
    c * g + r of a block moves to r * (bn // g) + c, so member r of every group of g adjacent
    columns is one lane-aligned slice of the block (an HBM copy, no lane shuffles in VMEM)."""
    s = x.shape
    x = x.reshape(s[:axis] + (s[axis] // bn, bn // g, g) + s[axis + 1:])
    return jnp.swapaxes(x, axis + 1, axis + 2).reshape(s)


def _cast(x, chain):
    for dt in chain:
        x = x.astype(jnp.dtype(dt))
    return x


def _matmul(mats, extras, B, M, N, K, NI=None):
    mode = CFG["mode"]
    am, an, ak = CFG["align"]
    bm = M if CFG["full_m"] else _fit(M, int(PARAMS["block_m"]), am)
    if mode == "row":
        bn = N
    elif mode == "group":  # whole groups: several when group_blocks, each on its own slice
        bn = _fit(N, max(int(PARAMS.get("block_n", NI)), NI), NI) if CFG.get("group_blocks") else NI
    else:
        bn = _fit(N, int(PARAMS["block_n"]), an)
    Ks = tuple(K) if isinstance(K, (tuple, list)) else (K,)
    bks = [_fit(k, int(PARAMS["block_k"]), ak) for k in Ks]
    nks = [k // b for k, b in zip(Ks, bks)]
    starts = [sum(nks[:s]) for s in range(len(nks))]
    segments = CFG.get("mat_segments") or [0] * len(mats)
    nm, nn, nk = M // bm, N // bn, sum(nks)
    pool = CFG["pool"]
    outer = pool > 1 and CFG.get("pool_outer", False)
    pooled_extra = CFG.get("extra_pooled") or [False] * len(extras)
    bw = bn // pool
    if pool > 1 and not outer:
        mats = [_member_major(x, 2 if lay == "kn" else 1, bn, pool) if lay in ("kn", "nk")
                else x for x, lay in zip(mats, CFG["mat_layouts"])]
        extras = [x if pres is None or not pres[2] or pp else _member_major(x, 2, bn, pool)
                  for x, pres, pp in zip(extras, CFG["extras"], pooled_extra)]
    n_major = mode == "tile" and PARAMS.get("grid_order", "m_major") == "n_major"
    grid = (B, nn, nm, nk) if n_major else (B, nm, nn, nk)

    def spec(shape, f):
        if n_major:
            return pl.BlockSpec(shape, lambda b, j, i, k: f(b, i, j, k))
        return pl.BlockSpec(shape, f)

    def space_spec(pres, cols=bn, member=None):
        shape = (None, bm if pres[1] else 1, cols if pres[2] else 1)
        inner = len(pres) > 3  # one group, whichever column block
        # member g of a member-outer column block: column block g * (N // pool // bw) + j
        step = (N // pool) // bw if member is not None else 0

        def col(j):
            if not pres[2] or inner:
                return 0
            return j if member is None else member * step + j
        return spec(shape, lambda b, i, j, k: (b if pres[0] else 0, i if pres[1] else 0,
                                               col(j)))

    def mat_spec(layout, seg, member=None):
        bk, n_k, k0 = bks[seg], nks[seg], starts[seg]
        kk = (lambda k: k) if len(Ks) == 1 else (
            lambda k: jnp.minimum(jnp.maximum(k - k0, 0), n_k - 1))
        cols = bn if member is None else bw
        step = (N // pool) // bw if member is not None else 0
        jj = (lambda j: j) if member is None else (lambda j: member * step + j)
        blocks = {
            "mk": ((None, bm, bk), lambda b, i, j, k: (b, i, kk(k))),
            "km": ((None, bk, bm), lambda b, i, j, k: (b, kk(k), i)),
            "kn": ((None, bk, cols), lambda b, i, j, k: (b, kk(k), jj(j))),
            "nk": ((None, cols, bk), lambda b, i, j, k: (b, jj(j), kk(k))),
        }
        return spec(*blocks[layout])

    # Kernel inputs: each mat once, or once per member (member-outer rhs and full extras).
    in_specs, in_arrays, mat_slots, extra_slots = [], [], [], []
    for x, layout, seg in zip(mats, CFG["mat_layouts"], segments):
        members = range(pool) if outer and layout in ("kn", "nk") else [None]
        mat_slots.append(list(range(len(in_specs), len(in_specs) + len(members))))
        for g in members:
            in_specs.append(mat_spec(layout, seg, g))
            in_arrays.append(x)
    for x, pres, pp in zip(extras, CFG["extras"], pooled_extra):
        if pres is None:
            extra_slots.append([len(in_specs)])
            in_specs.append(pl.BlockSpec(memory_space=pltpu.SMEM))
            in_arrays.append(x)
            continue
        members = range(pool) if outer and pres[2] and not pp else [None]
        extra_slots.append(list(range(len(in_specs), len(in_specs) + len(members))))
        for g in members:
            cols = bw if pp or g is not None else NI if len(pres) > 3 else bn
            in_specs.append(space_spec(pres, cols, g))
            in_arrays.append(x)
    out_specs, out_shape = [], []
    for pres, dt in CFG["outputs"]:
        out_specs.append(space_spec(pres, bn // pool))
        out_shape.append(jax.ShapeDtypeStruct(
            (B if pres[0] else 1, M if pres[1] else 1, N // pool if pres[2] else 1),
            jnp.dtype(dt)))

    dots = CFG["dots"]
    casts = CFG["native_casts"] if PARAMS.get("fp8_mxu") == "native" else CFG["casts"]
    acc_dtype = jnp.dtype(CFG["acc_dtype"])
    nin, nout = len(in_specs), len(out_shape)
    in_out = CFG.get("acc_in_out", False)
    pieces = CFG.get("row_pieces", False)
    piece_rows = _fit(bm, int(PARAMS.get("epilogue_rows", bm)), am) if pieces else bm
    piece_cols = _fit(bn, int(PARAMS.get("dot_cols", bn)), 128) if pieces else bn
    scratch = [] if in_out else [pltpu.VMEM((bm, bn), acc_dtype) for _ in dots]
    scratch += [pltpu.VMEM((bm, 1), jnp.dtype(dt)) for dt in CFG["stream_accs"]]

    def kernel(*refs):
        in_refs = refs[:nin]
        out_refs = refs[nin:nin + nout]
        nacc = 0 if in_out else len(dots)
        acc_refs = out_refs[:1] if in_out else refs[nin + nout:nin + nout + nacc]
        stat_refs = refs[nin + nout + nacc:]
        if n_major:
            b, j, i, k = (pl.program_id(a) for a in range(4))
        else:
            b, i, j, k = (pl.program_id(a) for a in range(4))

        @pl.when(k == 0)
        def _zero():
            for acc in acc_refs:
                acc[...] = jnp.zeros(acc.shape, acc.dtype)

        def accumulate(li, ri, acc):
            lhs = _cast(in_refs[mat_slots[li][0]][...], casts[li])
            lc = 1 if CFG["mat_layouts"][li] == "mk" else 0
            rc = 0 if CFG["mat_layouts"][ri] == "kn" else 1
            slots = mat_slots[ri]
            for g, slot in enumerate(slots):
                if len(slots) > 1:  # member g of a member-outer block: its lane-aligned slice
                    part = jax.lax.dot_general(lhs, _cast(in_refs[slot][...], casts[ri]),
                                               (((lc,), (rc,)), ((), ())),
                                               preferred_element_type=acc_dtype)
                    acc[:, g * bw:(g + 1) * bw] += part
                    continue
                for c0 in range(0, bn, piece_cols):
                    cols = slice(c0, c0 + piece_cols)
                    rhs = in_refs[slot][:, cols] if rc == 0 else in_refs[slot][cols, :]
                    acc[:, cols] += jax.lax.dot_general(
                        lhs, _cast(rhs, casts[ri]), (((lc,), (rc,)), ((), ())),
                        preferred_element_type=acc_dtype)

        for (li, ri, _), acc in zip(dots, acc_refs):
            seg = segments[li]
            if len(Ks) == 1:
                accumulate(li, ri, acc)
                continue

            @pl.when((k >= starts[seg]) & (k < starts[seg] + nks[seg]))
            def _segment(li=li, ri=ri, acc=acc):
                accumulate(li, ri, acc)

        # cols: the block's columns the epilogue sees (one group's lane-aligned slice);
        # rows: its rows (row mode's pieces)
        def seeds(cols=slice(None), rows=slice(None)):
            vals = []
            for (_, _, scale), acc in zip(dots, acc_refs):
                v = acc[rows, cols]
                vals.append(v * scale if scale != 1.0 else v)
            return vals

        def extra_values(cols=slice(None), rows=slice(None)):
            vals = []
            for slots, pres in zip(extra_slots, CFG["extras"]):
                if pres is None:
                    vals.append(in_refs[slots[0]][0])
                elif len(slots) == 1:
                    spans = pres[2] and len(pres) <= 3  # not an inner (one-group) block
                    vals.append(in_refs[slots[0]][rows if pres[1] else slice(None),
                                                  cols if spans else slice(None)])
                else:  # a member-outer block from its members' blocks
                    vals.append(jnp.concatenate([in_refs[s][...] for s in slots], axis=-1))
            return vals

        if mode == "group":
            extents = (B, M, N // NI, NI)
        else:
            offsets = (b, i * bm, j * bn)
            extents = (B, M, N)

        def store(outs, cols=slice(None), rows=slice(None)):
            for o, v in zip(out_refs, outs):
                shape = (o.shape[0] if isinstance(rows, slice) else piece_rows,
                         NI if cols != slice(None) else o.shape[1])
                o[rows, cols] = jnp.broadcast_to(v, shape).astype(o.dtype)

        @pl.when(k == nk - 1)
        def _epilogue():
            if mode == "group":
                for g in range(bn // NI):
                    cols = slice(g * NI, (g + 1) * NI) if bn > NI else slice(None)
                    at = (b, i * bm, j * (bn // NI) + g, 0)  # group j * (bn // NI) + g
                    store(epilogue(seeds(cols), extra_values(cols), at, extents), cols)
                return
            if mode != "stream" and piece_rows < bm:
                def piece(r, carry):
                    r0 = pl.multiple_of(r * piece_rows, piece_rows)
                    rows = pl.ds(r0, piece_rows)
                    store(epilogue(seeds(rows=rows), extra_values(rows=rows),
                                   (b, i * bm + r0, j * bn), extents), rows=rows)
                    return carry

                jax.lax.fori_loop(0, bm // piece_rows, piece, 0)
                return
            if mode != "stream":
                store(epilogue(seeds(), extra_values(), offsets, extents))
                return

            @pl.when(j == 0)
            def _init():
                for s, v in zip(stat_refs, epilogue_init((bm, 1))):
                    s[...] = v

            accs = epilogue_step([s[...] for s in stat_refs], seeds(), extra_values(),
                                 offsets, extents)
            for s, v in zip(stat_refs, accs):
                s[...] = v

            @pl.when(j == nn - 1)
            def _final():
                store(epilogue_final([s[...] for s in stat_refs], extra_values(), offsets,
                                     extents, (bm, 1)))

    par = PARAMS.get("dimension_semantics", "parallel")
    if mode == "stream":
        semantics = (par, par, "arbitrary", "arbitrary")
    else:
        semantics = (par, par, par, "arbitrary")
    in_bytes = sum(x.size * x.dtype.itemsize for x in list(mats) + list(extras))
    out_bytes = sum(math.prod(s.shape) * s.dtype.itemsize for s in out_shape)
    cost = pl.CostEstimate(flops=2 * B * M * N * sum(Ks[segments[li]] for li, _, _ in dots),
                           transcendentals=B * M * N * CFG["transcendentals"],
                           bytes_accessed=int(in_bytes + out_bytes))
    return pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        scratch_shapes=scratch,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=semantics,
            vmem_limit_bytes=int(PARAMS["vmem_limit_bytes"])),
        cost_estimate=cost,
    )(*in_arrays)


def workload({{args}}):
{{prep}}
    outs = _matmul(mats, extras, B, M, N, K, NI)
{{result}}
