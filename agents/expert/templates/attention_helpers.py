# ---- shared by the attention templates (agents/expert/templates/attention_helpers.py) ----
# The score function and the mask are generated from the reference's jaxpr as code over an
# index object `ix` (positions of the rows and keys of the current block, grid ids, mask
# inputs) and an array namespace `xp`: the same code runs on a kernel tile (jnp, in VMEM) and,
# for the mask alone, on whole index grids to find the blocks that are fully masked.


def _fit(request, dim, align):
    """The largest multiple of `align` dividing `dim` that is <= request; dim when none is."""
    request = max(1, int(request))
    if dim <= request:
        return dim
    b = request // align * align
    while b >= align:
        if dim % b == 0:
            return b
        b -= align
    return dim


def _prod(xs):
    p = 1
    for x in xs:
        p *= int(x)
    return p


class _NumpyOps:
    """Array namespace for masks evaluated at trace time (static masks)."""
    where = staticmethod(np.where)
    maximum = staticmethod(np.maximum)
    minimum = staticmethod(np.minimum)
    exp = staticmethod(np.exp)
    log = staticmethod(np.log)
    log1p = staticmethod(np.log1p)
    expm1 = staticmethod(np.expm1)
    tanh = staticmethod(np.tanh)
    sqrt = staticmethod(np.sqrt)
    sin = staticmethod(np.sin)
    cos = staticmethod(np.cos)
    tan = staticmethod(np.tan)
    abs = staticmethod(np.abs)
    sign = staticmethod(np.sign)
    floor = staticmethod(np.floor)
    ceil = staticmethod(np.ceil)
    round = staticmethod(np.round)
    isfinite = staticmethod(np.isfinite)
    fmod = staticmethod(np.fmod)
    clip = staticmethod(np.clip)
    power = staticmethod(np.power)
    arctan2 = staticmethod(np.arctan2)

    @staticmethod
    def rsqrt(x):
        return 1 / np.sqrt(x)

    @staticmethod
    def logistic(x):
        return 1 / (1 + np.exp(-x))

    @staticmethod
    def erf(x):
        return np.vectorize(math.erf)(x)

    @staticmethod
    def cast(x, dtype):
        return np.asarray(x).astype(jnp.dtype(dtype))

    @staticmethod
    def idiv(a, b):
        a, b = np.asarray(a), np.asarray(b)
        q = np.abs(a) // np.abs(b)
        return np.where((a < 0) != (b < 0), -q, q).astype(np.result_type(a, b))


class _JaxOps:
    """Array namespace inside kernels and for masks that read the inputs (lengths)."""
    where = staticmethod(jnp.where)
    maximum = staticmethod(jnp.maximum)
    minimum = staticmethod(jnp.minimum)
    exp = staticmethod(jnp.exp)
    log = staticmethod(jnp.log)
    log1p = staticmethod(jnp.log1p)
    expm1 = staticmethod(jnp.expm1)
    tanh = staticmethod(jnp.tanh)
    sqrt = staticmethod(jnp.sqrt)
    sin = staticmethod(jnp.sin)
    cos = staticmethod(jnp.cos)
    tan = staticmethod(jnp.tan)
    abs = staticmethod(jnp.abs)
    sign = staticmethod(jnp.sign)
    floor = staticmethod(jnp.floor)
    ceil = staticmethod(jnp.ceil)
    round = staticmethod(jnp.round)
    isfinite = staticmethod(jnp.isfinite)
    fmod = staticmethod(jnp.fmod)
    clip = staticmethod(jnp.clip)
    power = staticmethod(jnp.power)
    arctan2 = staticmethod(jnp.arctan2)
    rsqrt = staticmethod(jax.lax.rsqrt)
    logistic = staticmethod(jax.nn.sigmoid)
    erf = staticmethod(jax.lax.erf)

    @staticmethod
    def cast(x, dtype):
        return jnp.asarray(x).astype(jnp.dtype(dtype))

    @staticmethod
    def idiv(a, b):
        return jax.lax.div(jnp.asarray(a), jnp.asarray(b))


class _TileIx:
    """Indices of the current (rows x keys) block inside a kernel."""

    def __init__(self, grid_ids, row0, key0, bq, bk, c_sizes, tiles, scalars, scalar_c):
        self.ids, self.row0, self.key0, self.bq, self.bk = grid_ids, row0, key0, bq, bk
        self.c_sizes, self.tiles, self.scalars, self.scalar_c = c_sizes, tiles, scalars, scalar_c

    def c(self, i):
        return self.ids[i]

    def r(self, stride, size):
        bq = self.bq
        if stride % bq == 0:   # constant over the block
            return (self.row0 // stride) % size
        iota = jax.lax.broadcasted_iota(jnp.int32, (bq, 1), 0)
        if stride == 1 and size % bq == 0:
            return (self.row0 % size) + iota
        return ((self.row0 + iota) // stride) % size

    def k(self):
        return self.key0 + jax.lax.broadcasted_iota(jnp.int32, (1, self.bk), 1)

    def t(self, j):
        return self.tiles[j][...]

    def s(self, j):
        flat = 0
        for i in self.scalar_c[j]:
            flat = flat * self.c_sizes[i] + self.ids[i]
        return self.scalars[j][flat]


class _GridIx:
    """Indices over whole grids [kv rows used..., rows, keys] (the mask's block tables)."""

    def __init__(self, xp, c_used, c_sizes, row0, nrows, keys, scalars, scalar_c):
        self.xp, self.c_used, self.c_sizes = xp, list(c_used), c_sizes
        self.row0, self.nrows, self.keys = row0, nrows, keys
        self.scalars, self.scalar_c = scalars, scalar_c
        self.rank = len(self.c_used) + 2
        self.np = np if xp is _NumpyOps else jnp

    def _axis(self, values, pos):
        shape = [1] * self.rank
        shape[pos] = -1
        return values.reshape(shape)

    def c(self, i):
        return self._axis(self.np.arange(self.c_sizes[i], dtype=np.int32), self.c_used.index(i))

    def r(self, stride, size):
        rows = self.row0 + self.np.arange(self.nrows, dtype=np.int32)
        return self._axis((rows // stride) % size, self.rank - 2)

    def k(self):
        return self._axis(self.np.arange(self.keys, dtype=np.int32), self.rank - 1)

    def t(self, j):
        raise NotImplementedError("a mask table never reads a tile input")

    def s(self, j):
        flat = 0
        for i in self.scalar_c[j]:
            flat = flat * self.c_sizes[i] + self.c(i)
        return self.scalars[j][flat]


def _block_tables(kill, static, c_used, uses_rows, c_sizes, rows, keys, bq, bk, scalars,
                  scalar_c, cut=False):
    """Per (kv rows used, row block): the key blocks that are not fully masked, in order,
    padded with the last one (its DMA is then skipped), and their count.
    Returns (ids [n, nk], counts [n], n_row_tables, max_count) flattened, or None; with `cut`,
    also [n, nk]: whether the mask kills anything in the block (where it leaves a block whole,
    the kernel skips computing the mask)."""
    xp = _NumpyOps if static else _JaxOps
    lib = np if static else jnp
    nq, nk = rows // bq, keys // bk
    cshape = [c_sizes[i] for i in c_used]
    ncell = _prod(cshape)
    dead_parts, cut_parts = [], []
    if uses_rows:
        per_block = max(1, ncell * bq * keys)
        chunk = max(1, (1 << 24) // per_block) if static else nq
        for q0 in range(0, nq, chunk):
            nb = min(chunk, nq - q0)
            ix = _GridIx(xp, c_used, c_sizes, q0 * bq, nb * bq, keys, scalars, scalar_c)
            killed = lib.broadcast_to(kill(ix, xp), tuple(cshape) + (nb * bq, keys))
            killed = killed.reshape(tuple(cshape) + (nb, bq, nk, bk))
            dead_parts.append(killed.all(axis=(-3, -1)))
            if cut:
                cut_parts.append(killed.any(axis=(-3, -1)))
        dead = dead_parts[0] if len(dead_parts) == 1 else lib.concatenate(dead_parts, axis=-2)
        if cut:
            cut_parts = [lib.concatenate(cut_parts, axis=-2)]
        nrt = nq
    else:
        ix = _GridIx(xp, c_used, c_sizes, 0, 1, keys, scalars, scalar_c)
        killed = lib.broadcast_to(kill(ix, xp), tuple(cshape) + (1, keys))
        killed = killed.reshape(tuple(cshape) + (1, nk, bk))
        dead = killed.all(axis=-1)
        cut_parts = [killed.any(axis=-1)]
        nrt = 1
    active = ~dead.reshape(ncell * nrt, nk)
    counts = active.sum(axis=-1).astype(np.int32)
    if static:
        order = np.argsort(~active, axis=-1, kind="stable").astype(np.int32)
    else:
        order = jnp.argsort(~active, axis=-1, stable=True).astype(jnp.int32)
    last = lib.take_along_axis(order, lib.maximum(counts - 1, 0)[:, None], axis=-1)
    ids = lib.where(lib.arange(nk)[None, :] < counts[:, None], order, last).astype(np.int32)
    max_count = max(1, int(counts.max())) if static else nk
    if cut:
        return ids.reshape(-1), counts, nrt, max_count, cut_parts[0].reshape(ncell * nrt, nk)
    return ids.reshape(-1), counts, nrt, max_count


def _lanes(x, n):
    """A (..., rows, 128) lane-replicated statistic as (..., rows, n)."""
    w = x.shape[-1]
    if n == w:
        return x
    if n % w == 0:
        return jnp.tile(x, (1,) * (x.ndim - 1) + (n // w,))
    if n < w:
        return x[..., :n]
    return x[..., :1]


def _block_shape(array, axes, c_sizes, bq, bk, head_axis=-1, bh=1):
    shape = []
    for ax, d in zip(axes, array.shape):
        kind = ax[0]
        if kind == "c":
            shape.append(bh if ax[1] == head_axis and bh > 1 else None)
        elif kind == "rows":
            shape.append(bq)
        elif kind == "keys":
            shape.append(bk)
        elif kind == "lane":
            shape.append(d // _prod(c_sizes[i] for i in ax[1]))
        else:   # full, unit
            shape.append(d)
    return tuple(shape)


def _pair_schedule(ids_table, counts, n_cells, nq, nk, cut=None):
    """The (row block, key block) pairs to visit per cell of the mask's kv rows, row block by
    row block: (rows, keys, flags) flattened [n_cells * n_steps], flags bit 0 first pair of
    its row block, bit 1 last, bit 2 compute, bit 3 the mask kills part of the block (per
    `cut`, [n_cells * nq, nk]; every computed block when it is None); and n_steps. A row block
    without any key block still gets one (non-computing) pair so that its output is written."""
    ids = np.asarray(ids_table).reshape(n_cells, nq, nk)
    counts = np.asarray(counts).reshape(n_cells, nq)
    cut = (np.ones((n_cells, nq, nk), bool) if cut is None
           else np.asarray(cut).reshape(n_cells, nq, nk))
    per_cell = []
    for c in range(n_cells):
        pairs = []
        for i in range(nq):
            n = int(counts[c, i])
            if n == 0:
                pairs.append((i, 0, 3))
            for t in range(n):
                kb = int(ids[c, i, t])
                pairs.append((i, kb, (t == 0) | ((t == n - 1) << 1) | 4
                              | (int(cut[c, i, kb]) << 3)))
        per_cell.append(pairs)
    steps = max(len(p) for p in per_cell)
    rows = np.zeros((n_cells, steps), np.int32)
    keys = np.zeros((n_cells, steps), np.int32)
    flags = np.zeros((n_cells, steps), np.int32)
    for c, pairs in enumerate(per_cell):
        pairs = pairs + [(pairs[-1][0], pairs[-1][1], 0)] * (steps - len(pairs))
        rows[c], keys[c], flags[c] = zip(*pairs)
    return rows.reshape(-1), keys.reshape(-1), flags.reshape(-1), steps


def _index_map(axes, c_sizes, ngrid, row_block, key_block):
    def index_map(*args):
        ids, refs = args[:ngrid], args[ngrid:]
        out = []
        for ax in axes:
            kind = ax[0]
            if kind == "c":
                out.append(ids[ax[1]])
            elif kind == "rows":
                out.append(row_block(ids, refs))
            elif kind == "keys":
                out.append(key_block(ids, refs))
            elif kind == "lane":
                flat = 0
                for i in ax[1]:
                    flat = flat * c_sizes[i] + ids[i]
                out.append(flat)
            else:
                out.append(0)
        return tuple(out)
    return index_map
# ---- end of the shared attention helpers ----
