# ---- grouped matmul core (maxkernel expert templates: grouped_matmul, moe_ffn) ----
# Rows of x are sorted by group; group g owns rows [offsets[g], offsets[g+1]). The grid runs
# (column blocks, work steps, k blocks): a work step is one (row tile, group) pair, in row
# tile order, so a tile that straddles group boundaries is visited once per group it
# overlaps, on consecutive steps (its output block stays resident and each visit stores
# only its group's rows). The step -> (tile, group) tables and the group offsets are scalar
# prefetch operands (SMEM) that the index maps read to pick x's row tile and the group's
# weight block. Accumulation is f32 in VMEM scratch over the k blocks.


def _block(want, dim, align):
    """The largest multiple of align <= want dividing dim, else dim itself (always legal)."""
    if want >= dim:
        return dim
    b = want // align * align
    while b >= align:
        if dim % b == 0:
            return b
        b -= align
    return dim


def _sublanes(dtype):
    # rows per packed (8, 128) tile: f32 8, bf16 16, int8 / fp8 32
    return 8 * max(1, 4 // jnp.dtype(dtype).itemsize)


def _gmm_plan(group_sizes, m, bm):
    """offsets [G+1], per step: group and row tile, the number of real steps, and the static
    step count tiles + G - 1 (the most a sorted layout can need); steps past the real ones
    repeat the last (tile, group) pair, so they copy nothing, and are skipped."""
    groups = group_sizes.shape[0]
    tiles = m // bm
    ends = jnp.cumsum(group_sizes.astype(jnp.int32))
    offsets = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends])
    first = jnp.arange(tiles, dtype=jnp.int32) * bm
    # a row's group: how many groups end at or before it (rows past the end: the last group,
    # whose mask leaves them zero)
    lo = jnp.minimum(jnp.sum(ends[None, :] <= first[:, None], axis=1), groups - 1)
    hi = jnp.minimum(jnp.sum(ends[None, :] <= (first + bm - 1)[:, None], axis=1), groups - 1)
    count = (hi - lo + 1).astype(jnp.int32)
    stop = jnp.cumsum(count)
    steps = tiles + groups - 1
    step = jnp.arange(steps, dtype=jnp.int32)
    tile = jnp.minimum(jnp.sum(stop[None, :] <= step[:, None], axis=1), tiles - 1)
    group = jnp.minimum(lo[tile] + step - (stop - count)[tile], hi[tile])
    return (offsets, group.astype(jnp.int32), tile.astype(jnp.int32),
            stop[-1:].astype(jnp.int32), steps)


def _gmm_kernel(offsets, group, tile, nvalid, x_ref, *refs, nw, ne, bm, bn, m, n, dims,
                epilogue, precision, compute_dtype):
    w_refs, e_refs = refs[:nw], refs[nw:nw + ne]
    o_ref, accs = refs[nw + ne], refs[nw + ne + 1:]
    j = pl.program_id(0)
    s = pl.program_id(1)
    kk = pl.program_id(2)
    g = group[s]
    valid = s < nvalid[0]

    @pl.when(kk == 0)
    def _init():
        for acc in accs:
            acc[...] = jnp.zeros_like(acc)

    @pl.when(valid & (offsets[g + 1] > offsets[g]))
    def _accumulate():
        x = x_ref[...].astype(compute_dtype)
        for w_ref, acc, dn in zip(w_refs, accs, dims):
            acc[...] += lax.dot_general(x, w_ref[...].astype(compute_dtype), dn,
                                        preferred_element_type=jnp.float32, precision=precision)

    @pl.when(valid & (kk == pl.num_programs(2) - 1))
    def _store():
        t = tile[s]
        rows = t * bm + lax.broadcasted_iota(jnp.int32, o_ref.shape, 0)
        inside = (rows >= offsets[g]) & (rows < offsets[g + 1])
        # the first visit of a row tile starts from zeros (rows in no group stay zero)
        fresh = (s == 0) | (tile[jnp.maximum(s - 1, 0)] != t)
        before = jnp.where(fresh, jnp.zeros(o_ref.shape, o_ref.dtype), o_ref[...])
        value = epilogue([acc[...] for acc in accs], [e[...] for e in e_refs], (t * bm, j * bn),
                         (m, n))
        o_ref[...] = jnp.where(inside, value.astype(o_ref.dtype), before)


def _gmm(x, weights, group_sizes, *, n, epilogue, out_dtype, extras=()):
    """epilogue([x @ weights[0][g], x @ weights[1][g], ...], extra blocks, offsets, extents)
    for the rows of each group g. weights: (w, transposed, column offset): w [G, K, N']
    (transposed: [G, N', K]); the output's columns [0, n) read w's columns [offset, offset +
    n). extras: arrays of shape (m or 1, n or 1) the epilogue reads blockwise."""
    m, k = x.shape
    compute_dtype = x.dtype
    for w, _, _ in weights:
        compute_dtype = jnp.promote_types(compute_dtype, w.dtype)
    bm = _block(BLOCK_M, m, _sublanes(x.dtype))
    bk = _block(BLOCK_K, k, 128)
    bn = _block(BLOCK_N, math.gcd(n, *[off for _, _, off in weights]), 128)
    offsets, group, tile, nvalid, steps = _gmm_plan(group_sizes, m, bm)
    in_specs = [pl.BlockSpec((bm, bk), lambda j, s, kk, o, g, t, v: (t[s], kk))]
    dims = []
    for w, transposed, off in weights:
        ob = off // bn
        if transposed:
            in_specs.append(pl.BlockSpec((None, bn, bk),
                                         lambda j, s, kk, o, g, t, v, ob=ob: (g[s], j + ob, kk)))
            dims.append((((1,), (1,)), ((), ())))
        else:
            in_specs.append(pl.BlockSpec((None, bk, bn),
                                         lambda j, s, kk, o, g, t, v, ob=ob: (g[s], kk, j + ob)))
            dims.append((((1,), (0,)), ((), ())))
    for e in extras:
        rows, cols = e.shape[0] != 1 or m == 1, e.shape[1] != 1 or n == 1
        in_specs.append(pl.BlockSpec(
            (bm if rows else 1, bn if cols else 1),
            lambda j, s, kk, o, g, t, v, rows=rows, cols=cols: (t[s] if rows else 0,
                                                                j if cols else 0)))
    precision = lax.Precision.HIGHEST if compute_dtype == jnp.float32 else None
    nw = len(weights)
    flops = 2 * m * k * n * nw
    bytes_accessed = (x.size * x.dtype.itemsize * (n // bn)
                      + sum(w.size * w.dtype.itemsize for w, _, _ in weights)
                      + sum(e.size * e.dtype.itemsize for e in extras)
                      + m * n * jnp.dtype(out_dtype).itemsize)
    return pl.pallas_call(
        functools.partial(_gmm_kernel, nw=nw, ne=len(extras), bm=bm, bn=bn, m=m, n=n, dims=dims,
                          epilogue=epilogue, precision=precision, compute_dtype=compute_dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4,
            grid=(n // bn, steps, k // bk),
            in_specs=in_specs,
            out_specs=pl.BlockSpec((bm, bn), lambda j, s, kk, o, g, t, v: (t[s], j)),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32) for _ in weights],
        ),
        out_shape=jax.ShapeDtypeStruct((m, n), out_dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=(N_SEMANTICS, "arbitrary", "arbitrary"),
            vmem_limit_bytes=VMEM_LIMIT_BYTES),
        cost_estimate=pl.CostEstimate(flops=flops, transcendentals=0,
                                      bytes_accessed=bytes_accessed),
    )(offsets, group, tile, nvalid, x, *[w for w, _, _ in weights], *extras)


def _gmm_by_ids(x, weights, ids, groups, *, n, epilogue, out_dtype, extras=()):
    """The rows of x in any order, row r multiplied by group ids[r]: sort the rows by group
    (stable), run the grouped kernel, put the rows back. Ids outside [0, groups) give zeros."""
    m = x.shape[0]
    ids = ids.astype(jnp.int32)
    ids = jnp.where((ids >= 0) & (ids < groups), ids, groups)  # out of range: sorted last
    order = jnp.argsort(ids, stable=True)
    sizes = jnp.sum(ids[None, :] == jnp.arange(groups, dtype=jnp.int32)[:, None], axis=1,
                    dtype=jnp.int32)
    extras = [jnp.take(e, order, axis=0) if e.shape[0] == m and m != 1 else e for e in extras]
    y = _gmm(jnp.take(x, order, axis=0), weights, sizes, n=n, epilogue=epilogue,
             out_dtype=out_dtype, extras=extras)
    return jnp.zeros_like(y).at[order].set(y)
# ---- end of grouped matmul core ----
