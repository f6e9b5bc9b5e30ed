{{header}}
# Convolution as an implicit GEMM on the MXU. The input is read channels-last (batch,
# spatial..., channels; moved there outside the kernel when the reference's layout differs).
# Each grid step owns one output tile (a run of leading spatial rows, the whole last spatial
# row padded to the sublane tiling, a tile of output channels); it reads its input window with
# its halo (pl.Element windows) and, for every group of kernel taps, multiplies the taps'
# shifted windows (concatenated along K) by their weight matrices into an f32 accumulator (a
# VMEM scratch when input channels are tiled over the last, "arbitrary" grid axis).
# Stride-1 convolutions zero-pad the window in VMEM; strided ones are padded and split into
# stride phases (space-to-depth) outside, so every tap reads a unit-stride window, except
# strided depthwise ones with an f32 window, whose taps read strided rows in VMEM. Depthwise
# convolutions multiply on the VPU, in f32: with `f32_window` a narrow input's window is
# converted once per step into a VMEM scratch (the padded window doubles as it) instead of
# once per tap. Transposed convolutions (lhs dilation) run as one
# stride-1 convolution per output phase (sub-pixel decomposition): no zeros are inserted,
# and the zero rows its taps read before the input are put in VMEM (pad_in_kernel);
# with `phases_in_step` all phases share a grid step (one read of the input window), and
# each phase's tile is written straight to its rows and columns of the result. Unpooled
# outputs of 2-D and 3-D convs are the exact arrays (a ragged last row tile is clipped by
# Pallas, the padded last dim dropped in VMEM), so nothing slices them after the call.
# With `block_b`, a grid step takes several images (each through the same body in turn):
# fewer, larger steps for small images.
# When the output layout puts channels first, tiles are computed (channels, positions) and
# stored in that layout; a pointwise conv on channels-first input reads it as it is. The
# fused epilogue (generated from the reference's per-position ops: bias, batchnorm,
# activations, residuals, channel softmax or layernorm), max pools over the tile and a cast
# after them run before the tile is written. Whatever else the reference does runs as jnp
# around the kernel.
import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# The convolution as the reference wrote it (dimension numbers, strides, padding, dilations,
# feature groups); padding "same" is recomputed from the input size at trace time.
CONV = {{conv}}
PARAMS = {{params}}
# Operands of the epilogue: roles of each axis ("n" batch, "c" channel, "s<i>" spatial dim i,
# None for a broadcast axis); kind row = per channel, nrow = per image and channel, full.
LEAVES = {{leaves}}
# The epilogue's results: roles of each axis, dtype, whether they keep the channel axis, and
# the max pool fused after them (per spatial dim: window, stride, low and high padding; with
# pool_same the pads are "SAME"'s, recomputed from the size it pools at trace time).
OUTS = {{outs}}
EPI_NEEDS_ALL_CHANNELS = {{all_channels}}
# The epilogue's tiles are (channels, rows) (the output layout puts channels first).
CHANNEL_MAJOR = {{channel_major}}


# The fused epilogue on a (rows, channels) tile of the convolution (rows: output positions of
# one image, channels: a tile of output channels); generated from the reference's graph.
{{epilogue}}


def _t(v):
    """A 2-D tile transposed (floats in f32, which every TPU transposes)."""
    if jnp.issubdtype(v.dtype, jnp.floating):
        v = v.astype(jnp.float32)
    return v.T


def _round_up(a, b):
    return -(-a // b) * b


def _divisor_tile(extent, request, align=1):
    """Largest divisor of extent that is a multiple of align and <= request, else extent."""
    best = None
    for t in range(align, min(extent, max(request, 1)) + 1, align):
        if extent % t == 0:
            best = t
    return best if best is not None else extent


def _leading_tile(extent, request, align):
    """Tile along a leading spatial dim: a divisor of the extent near the request (a multiple
    of align), else balanced tiles whose last one overhangs (its rows are sliced off)."""
    request = max(align, min(request, extent)) // align * align
    div = _divisor_tile(extent, request, align)
    if div <= request and 2 * div >= request:
        return div
    tiles = -(-extent // request)
    return _round_up(-(-extent // tiles), align)


def _same_pads(size, k, s, r):
    out = -(-size // s)
    total = max((out - 1) * s + (k - 1) * r + 1 - size, 0)
    return (total // 2, total - total // 2)


def _pool_at(o, sizes):
    """Output o's max pool (window, stride, lo, hi per spatial dim) on a conv output of
    these spatial sizes: "SAME" pads recomputed for them, else as written."""
    if o["pool"] is None or not o.get("pool_same"):
        return o["pool"]
    return [(w, s) + _same_pads(sizes[i], w, s, 1) for i, (w, s, _, _) in enumerate(o["pool"])]


def _ravel(index, extents):
    flat = 0
    for i, e in zip(index, extents):
        flat = flat * e + i
    return flat


def _plan_direct(x, w, stride, rdil, pads, fold):
    """Direct convolution: pad, fold taps into channels (fold 1: last spatial dim, 2: all),
    split stride phases. Returns the kernel's input, weights, taps and output extents."""
    d = len(stride)
    ks = list(w.shape[:d])
    stride, rdil = list(stride), list(rdil)
    x = lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0)] + [(lo, hi, 0) for lo, hi in pads]
                + [(0, 0, 0)])
    sizes = x.shape[1:-1]
    outs = [(sizes[i] - (ks[i] - 1) * rdil[i] - 1) // stride[i] + 1 for i in range(d)]
    fold_dims = list(range(d)) if fold >= 2 else [d - 1] if fold == 1 else []
    for i in fold_dims:
        if ks[i] == 1 and stride[i] == 1:
            continue
        pieces = [lax.slice_in_dim(x, k * rdil[i], k * rdil[i] + (outs[i] - 1) * stride[i] + 1,
                                   stride[i], axis=1 + i) for k in range(ks[i])]
        x = jnp.concatenate(pieces, axis=-1)        # channel index = tap * C + c
        wk = jnp.moveaxis(w, i, d - 1)
        shp = wk.shape
        wk = wk.reshape(shp[:d - 1] + (shp[d - 1] * shp[d], shp[d + 1]))
        w = jnp.expand_dims(wk, i)
        ks[i], stride[i], rdil[i] = 1, 1, 1
    n, c = x.shape[0], x.shape[-1]
    sizes = x.shape[1:-1]
    hs = [-(-sizes[i] // stride[i]) for i in range(d)]
    x = lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0)]
                + [(0, hs[i] * stride[i] - sizes[i], 0) for i in range(d)] + [(0, 0, 0)])
    x = x.reshape((n,) + sum(((hs[i], stride[i]) for i in range(d)), ()) + (c,))
    perm = (0,) + tuple(2 + 2 * i for i in range(d)) + tuple(1 + 2 * i for i in range(d)) \
        + (2 * d + 1,)
    p_in = math.prod(stride)
    x = x.transpose(perm).reshape((n, p_in) + tuple(hs) + (c,))
    taps = []
    for k in itertools.product(*[range(e) for e in ks]):
        e = [k[i] * rdil[i] for i in range(d)]
        taps.append((_ravel(k, ks), _ravel([e[i] % stride[i] for i in range(d)], stride),
                     tuple(e[i] // stride[i] for i in range(d))))
    t = math.prod(ks)
    w = w.reshape((1, t) + w.shape[d:])
    return x, w, [taps], outs, [1] * d


def _plan_transposed(x, w, ldil, rdil, pads, pad_here=True):
    """Convolution with lhs dilation (a transposed convolution), stride 1: one stride-1
    convolution per output phase r (out[L*q + r]) over the undilated input, with the taps
    that land on input samples. Returns the same as _plan_direct and the zero rows `lo` put
    before the input (by lax.pad here, or by the kernel in VMEM when not pad_here): tap
    offsets count them."""
    d = len(ldil)
    ks = list(w.shape[:d])
    sizes = x.shape[1:-1]
    outs = [(sizes[i] - 1) * ldil[i] + pads[i][0] + pads[i][1] - (ks[i] - 1) * rdil[i] + 1
            for i in range(d)]
    per_dim = []
    for i in range(d):
        phases = []
        for r in range(ldil[i]):
            phases.append([(k, (r + k * rdil[i] - pads[i][0]) // ldil[i]) for k in range(ks[i])
                           if (r + k * rdil[i] - pads[i][0]) % ldil[i] == 0])
        per_dim.append(phases)
    lo = [max(0, -min([o for ph in per_dim[i] for _, o in ph] or [0])) for i in range(d)]
    if pad_here:
        x = lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0)] + [(lo[i], 0, 0) for i in range(d)]
                    + [(0, 0, 0)])
    x = x.reshape((x.shape[0], 1) + x.shape[1:])
    t_all = math.prod(ks)
    wt = w.reshape((t_all,) + w.shape[d:])
    taps, ws = [], []
    for r in itertools.product(*[range(l) for l in ldil]):
        lists = [per_dim[i][r[i]] for i in range(d)]
        tl = []
        for combo in itertools.product(*lists):
            tl.append((_ravel([k for k, _ in combo], ks), 0,
                       tuple(combo[i][1] + lo[i] for i in range(d))))
        taps.append(tl)
    tmax = max(1, max(len(tl) for tl in taps))
    for p, tl in enumerate(taps):
        rows = [wt[t] for t, _, _ in tl]
        rows += [jnp.zeros_like(wt[0])] * (tmax - len(rows))
        ws.append(jnp.stack(rows))
        taps[p] = [(j, pin, offs) for j, (_, pin, offs) in enumerate(tl)]
    return x, jnp.stack(ws), taps, outs, list(ldil), lo


def _block_diagonal(w, groups):
    """Grouped weights (..., Cin/G, Cout) as dense (..., Cin, Cout) block-diagonal ones."""
    cin_g, cout = w.shape[-2], w.shape[-1]
    cout_g = cout // groups
    dense = jnp.zeros(w.shape[:-2] + (cin_g * groups, cout), w.dtype)
    for g in range(groups):
        dense = dense.at[..., g * cin_g:(g + 1) * cin_g, g * cout_g:(g + 1) * cout_g].set(
            w[..., g * cout_g:(g + 1) * cout_g])
    return dense


def _lane_tile(extent, request):
    return _divisor_tile(extent, request, 128) if extent % 128 == 0 else extent


def _pool_plan(pool, tiles, q, qp, sub, ntiles):
    """Per spatial dim: (window, stride, lo, hi, pooled per tile, block extent, scratch extent,
    real pooled size), or None when the fused pool does not fit the tiling."""
    plan = []
    d = len(tiles)
    for i, (win, st, lo, hi) in enumerate(pool):
        if ntiles[i] > 1:
            if lo or hi or win != st or tiles[i] % st:
                return None
            per = tiles[i] // st
            plan.append((win, st, 0, 0, per, per, tiles[i], ntiles[i] * per if q[i] == qp[i]
                         else (q[i] - win) // st + 1))
            continue
        real = (q[i] + lo + hi - win) // st + 1
        if real < 1:
            return None
        per = _round_up(real, sub) if i == d - 1 else real
        extent = max(lo + tiles[i] + hi, (win - 1) + (per - 1) * st + 1)
        plan.append((win, st, lo, hi, per, per, extent, real))
    return plan


def _kernel(*refs, cfg):
    """One grid step: block_b images, one after the other, each through _image with its
    views of the refs that have an image axis (the padded window and pool scratch are
    shared, each image has its own accumulator)."""
    bn = cfg["bn"]
    if bn == 1:
        _image(refs, cfg, 0)
        return
    nl, no = len(LEAVES), len(OUTS)
    leaf_refs, out_refs = refs[2:2 + nl], refs[2 + nl:2 + nl + no]
    scratch = list(refs[2 + nl + no:])
    acc_at = (1 if cfg["inpad"] else 0) + (1 if cfg["upcast"] and not cfg["inpad"] else 0)
    for b in range(bn):
        def at(ref, axis, b=b):
            return ref if axis is None else ref.at[(slice(None),) * axis + (b,)]

        sc = list(scratch)
        if cfg["nk"] > 1:
            sc[acc_at] = sc[acc_at].at[b]
        _image([refs[0].at[b], refs[1]]
               + [at(r, a) for r, a in zip(leaf_refs, cfg["leaf_n"])]
               + [at(r, a) for r, a in zip(out_refs, cfg["out_n"])] + sc, cfg, b)


def _image(refs, cfg, img):
    d, taps, tiles, nk = cfg["d"], cfg["taps"], cfg["tiles"], cfg["nk"]
    nl, no = len(LEAVES), len(OUTS)
    x_ref, w_ref = refs[0], refs[1]
    leaf_refs = refs[2:2 + nl]
    out_refs = refs[2 + nl:2 + nl + no]
    scratch = list(refs[2 + nl + no:])
    pad_ref = scratch.pop(0) if cfg["inpad"] else None
    # depthwise on a narrow input: the window converted to f32 once per step, not per tap
    wide_ref = scratch.pop(0) if cfg["upcast"] and pad_ref is None else None
    acc_ref = scratch.pop(0) if nk > 1 else None
    pos = cfg["pos"]
    rows = cfg["rows"]
    tn = cfg["tn"]
    cm = cfg["cm"]            # the tile is (channels, rows): the epilogue's space order
    k_id = pl.program_id(pos["k"])
    contract = (((0,), (1,)), ((), ()))   # (g*tk, tn) x (rows, g*tk) -> (tn, rows)

    def tap_rows(i, start):   # a tap's rows along dim i: every ts-th when the input is unsplit
        st = cfg["ts"][i]
        return pl.ds(start, tiles[i], stride=st) if st > 1 else pl.ds(start, tiles[i])

    def window(pin, offs):
        if pad_ref is not None:
            return pad_ref[tuple(tap_rows(i, offs[i]) for i in range(d)) + (slice(None),)]
        idx = (pin,) + tuple(tap_rows(i, offs[i]) for i in range(d)) + (slice(None),)
        return (x_ref if wide_ref is None else wide_ref)[idx]

    def fill_padded():
        # the clamped input window -> the zero-padded window, per class of tiles
        win = cfg["window"]
        for combo in itertools.product(*cfg["pad_classes"]):
            conds = [(pl.program_id(pos["s%d" % i]) >= t0) & (pl.program_id(pos["s%d" % i]) <= t1)
                     for i, (t0, t1, _, _, _) in enumerate(combo) if t0 > 0 or t1 < cfg["ntiles"][i] - 1]

            def body(combo=combo):
                for i, (_, _, a, b, dst) in enumerate(combo):
                    for lo, hi in ((0, dst), (dst + b - a, win[i])):
                        if hi > lo:
                            idx = tuple(pl.ds(lo, hi - lo) if k == i else slice(None)
                                        for k in range(d)) + (slice(None),)
                            pad_ref[idx] = jnp.zeros(
                                tuple(hi - lo if k == i else win[k] for k in range(d))
                                + (pad_ref.shape[-1],), pad_ref.dtype)
                src = (0,) + tuple(pl.ds(a, b - a) for (_, _, a, b, _) in combo) + (slice(None),)
                dst = tuple(pl.ds(c[4], c[3] - c[2]) for c in combo) + (slice(None),)
                if all(c[3] > c[2] for c in combo):
                    pad_ref[dst] = x_ref[src].astype(pad_ref.dtype)

            if conds:
                cond = conds[0]
                for c in conds[1:]:
                    cond = cond & c
                pl.when(cond)(body)
            else:
                body()

    def mxu(a):
        return a if cfg["mxu_dtype"] is None else a.astype(cfg["mxu_dtype"])

    def compute(p):
        if cfg["cm_in"]:
            # pointwise conv on channels-first input: (tk, tn)^T x (tk, rows)
            return lax.dot_general(mxu(w_ref[0]), mxu(x_ref[...]), (((0,), (0,)), ((), ())),
                                   preferred_element_type=jnp.float32)
        acc = None
        group = cfg["tap_group"]
        tl = taps[p]
        wp = w_ref.at[p] if cfg["all_phases"] else w_ref   # this phase's weights
        for g0 in range(0, len(tl), 1 if cfg["depthwise"] else group):
            if cfg["depthwise"]:
                t, pin, offs = tl[g0]
                prod = window(pin, offs).astype(jnp.float32) * wp[t].astype(jnp.float32)
            else:
                # taps packed along K: one dot of (rows, g*tk) x (g*tk, tn)
                chunk = tl[g0:g0 + group]
                xs = [window(pin, offs).reshape(rows, -1) for _, pin, offs in chunk]
                xs = xs[0] if len(xs) == 1 else jnp.concatenate(xs, axis=-1)
                t0 = chunk[0][0]
                wt = wp[pl.ds(t0, len(chunk))]
                wt = wt.reshape(len(chunk) * wt.shape[1], wt.shape[2])
                if cm:
                    prod = lax.dot_general(mxu(wt), mxu(xs), contract,
                                           preferred_element_type=jnp.float32)
                else:
                    prod = jnp.dot(mxu(xs), mxu(wt), preferred_element_type=jnp.float32)
            acc = prod if acc is None else acc + prod
        if acc is None:
            return jnp.zeros((tn, rows) if cm else (rows, tn), jnp.float32)
        if cfg["depthwise"]:
            acc = acc.reshape(rows, tn)
            return _t(acc) if cm else acc
        return acc

    all_phases = cfg["all_phases"]

    def finish(acc, p):
        y = acc.astype(cfg["conv_dtype"])
        leaves = []
        for spec, ref in zip(LEAVES, leaf_refs):
            v = ref[p] if all_phases and spec["kind"] == "full" else ref[...]
            if spec["kind"] == "full" and not cfg["cm_out"]:
                v = v.reshape(rows, v.shape[-1])
                v = _t(v) if cm else v
            leaves.append(v)
        offsets = (pl.program_id(pos["n"]) * cfg["bn"] + img, 0, pl.program_id(pos["j"]) * tn)
        vals = _epilogue(y, leaves, offsets, cfg["extents"])
        si = 0
        for o, ref, v, pplan in zip(OUTS, out_refs, vals, cfg["pools"]):
            width = tn if o["chan"] else 1
            if cfg["cm_out"] and o["pool"] is None:
                v = jnp.broadcast_to(v, (width, rows)) if v.shape != (width, rows) else v
                ref[...] = v.astype(ref.dtype)
                continue
            if cm:
                v = _t(jnp.broadcast_to(v, (width, rows)) if v.shape != (width, rows) else v)
            v = jnp.broadcast_to(v, (rows, width)) if v.shape != (rows, width) else v
            if pplan is None:
                v = v.reshape(tuple(tiles) + (width,))
                if ref.shape[-2] < tiles[-1]:      # the exact output: the padding stays here
                    v = v[..., :ref.shape[-2], :]
                if all_phases and cfg["in_place"] and o["chan"] and o["pool"] is None:
                    r = np.unravel_index(p, cfg["lph"])   # phase p's rows and channel block
                    idx = sum(((slice(None), int(r[i])) for i in range(d - 1)), ())
                    ref[idx + (slice(None), pl.ds(int(r[-1]) * width, width))] = \
                        v.astype(ref.dtype)
                    continue
                if all_phases:
                    ref[p] = v.astype(ref.dtype)
                else:
                    ref[...] = v.astype(ref.dtype)
                continue
            pref = scratch[si]
            si += 1
            v = v.reshape(tuple(tiles) + (width,))
            for i in range(d):
                if cfg["qp"][i] > cfg["q"][i]:
                    base = pl.program_id(pos["s%d" % i]) * tiles[i]
                    idx = lax.broadcasted_iota(jnp.int32, v.shape, i) + base
                    v = jnp.where(idx < cfg["q"][i], v, -jnp.inf)
            pref[...] = jnp.full(pref.shape, -jnp.inf, pref.dtype)
            pref[tuple(pl.ds(pp[2], tiles[i]) for i, pp in enumerate(pplan)) + (slice(None),)] = \
                v.astype(pref.dtype)
            best = None
            for k in itertools.product(*[range(pp[0]) for pp in pplan]):
                idx = tuple(pl.ds(k[i], pp[4], stride=pp[1]) if pp[1] > 1
                            else pl.ds(k[i], pp[4]) for i, pp in enumerate(pplan))
                win = pref[idx + (slice(None),)]
                best = win if best is None else jnp.maximum(best, win)
            ref[...] = best.astype(ref.dtype)

    if pad_ref is not None:
        fill_padded()
    if wide_ref is not None:
        wide_ref[...] = x_ref[...].astype(wide_ref.dtype)
    p_id = pl.program_id(pos["p"])
    for p in range(len(taps)):
        def branch(p=p):
            acc = compute(p)
            if nk == 1:
                finish(acc, p)
                return
            at = p if all_phases else Ellipsis

            @pl.when(k_id == 0)
            def _():
                acc_ref[at] = acc

            @pl.when(k_id > 0)
            def _():
                acc_ref[at] += acc

            @pl.when(k_id == nk - 1)
            def _():
                finish(acc_ref[at], p)

        if len(taps) == 1 or all_phases:
            branch()
        else:
            pl.when(p_id == p)(branch)


def _to_order(v, roles, sizes, order):
    """A value in the reference's layout (axis roles `roles`) with its axes put in `order`
    (roles "n", "c", "s<i>"), size-1 where it broadcasts; sizes: role -> extent."""
    keep = [i for i, r in enumerate(roles) if r is not None]
    v = v.reshape(tuple(v.shape[i] for i in keep))
    present = [roles[i] for i in keep]
    v = jnp.transpose(v, [present.index(r) for r in order if r in present])
    return v.reshape(tuple(sizes[r] if r in present else 1 for r in order))


def _from_order(v, order, roles):
    """(axes in `order`) -> the reference's layout of a value with these axis roles."""
    present = [r for r in roles if r is not None]
    src = [r for r in order if r in present]
    v = v.reshape(tuple(v.shape[j] for j, r in enumerate(order) if r in present))
    v = jnp.transpose(v, [src.index(r) for r in present])
    shape, it = [], iter(v.shape)
    for r in roles:
        shape.append(next(it) if r is not None else 1)
    return v.reshape(tuple(shape))


def _phase_major(v, ldil, q, qp):
    """(n, spatial..., c) -> (phases, n, q..., c) padded to qp (output phase r of dim i holds
    out[L_i * q + r_i])."""
    d = len(ldil)
    n, c = v.shape[0], v.shape[-1]
    cfg = [(0, 0, 0)] + [(0, q[i] * ldil[i] - v.shape[1 + i], 0) for i in range(d)] + [(0, 0, 0)]
    v = lax.pad(v, jnp.zeros((), v.dtype), cfg) if any(x[1] for x in cfg) else v
    v = v.reshape((n,) + sum(((q[i], ldil[i]) for i in range(d)), ()) + (c,))
    perm = tuple(2 + 2 * i for i in range(d)) + (0,) + tuple(1 + 2 * i for i in range(d)) \
        + (2 * d + 1,)
    v = v.transpose(perm).reshape((math.prod(ldil), n) + tuple(q) + (c,))
    pad = [(0, 0, 0), (0, 0, 0)] + [(0, qp[i] - q[i], 0) for i in range(d)] + [(0, 0, 0)]
    return lax.pad(v, jnp.zeros((), v.dtype), pad) if any(x[1] for x in pad) else v


def _interleave(v, ldil, sizes):
    """(phases, n, q..., c) -> (n, sizes..., c): the inverse of _phase_major."""
    d = len(ldil)
    n, c = v.shape[1], v.shape[-1]
    q = v.shape[2:-1]
    v = v.reshape(tuple(ldil) + (n,) + tuple(q) + (c,))
    perm = (d,) + sum(((d + 1 + i, i) for i in range(d)), ()) + (2 * d + 1,)
    v = v.transpose(perm).reshape((n,) + tuple(q[i] * ldil[i] for i in range(d)) + (c,))
    return v[(slice(None),) + tuple(slice(0, s) for s in sizes) + (slice(None),)]


def _pad_to(v, shape):
    cfg = [(0, t - s, 0) for s, t in zip(v.shape, shape)]
    return lax.pad(v, jnp.zeros((), v.dtype), cfg) if any(c[1] for c in cfg) else v


def _conv_gemm(lhs, rhs, leaves):
    d = len(CONV["strides"])
    ls, rs = CONV["lhs_spec"], CONV["rhs_spec"]
    stride, ldil, rdil = CONV["strides"], CONV["lhs_dilation"], CONV["rhs_dilation"]
    groups = CONV["groups"]
    n, cin = lhs.shape[ls[0]], lhs.shape[ls[1]]
    spatial_in = tuple(lhs.shape[a] for a in ls[2:])
    ks = tuple(rhs.shape[a] for a in rs[2:])
    cin_g, cout = rhs.shape[rs[1]], rhs.shape[rs[0]]
    if CONV["same"]:
        pads = [_same_pads(spatial_in[i], ks[i], stride[i], rdil[i]) for i in range(d)]
    else:
        pads = [tuple(p) for p in CONV["padding"]]
    depthwise = groups > 1 and cin_g == 1
    transposed = any(l > 1 for l in ldil)
    cm = CHANNEL_MAJOR
    # A pointwise conv on channels-first input is a plain matmul per image: no layout change.
    pointwise = (groups == 1 and not transposed and all(k == 1 for k in ks)
                 and all(s == 1 for s in stride) and all(p == (0, 0) for p in pads))
    cm_in = (cm and pointwise and list(ls) == sorted(ls) and ls[1] < min(ls[2:])
             and all(o["pool"] is None for o in OUTS))
    w = jnp.transpose(rhs, tuple(rs[2:]) + (rs[1], rs[0]))
    inpad = unsplit = False
    vpads = pads      # the zero padding the kernel puts around its window in VMEM (inpad)
    upcast = (depthwise and not cm_in and jnp.dtype(lhs.dtype) != jnp.float32
              and bool(PARAMS.get("f32_window", False)))
    if cm_in:
        x = lhs.reshape(n, cin, math.prod(spatial_in))
        w = w.reshape(1, 1, cin, cout)
        taps, outs, lph = [[(0, 0, (0,) * d)]], list(spatial_in), [1] * d
    else:
        inpad = False
        x = jnp.transpose(lhs, (ls[0],) + tuple(ls[2:]) + (ls[1],))
        if groups > 1 and not depthwise:
            w = _block_diagonal(w, groups)
        if depthwise and cout != cin:
            x = jnp.repeat(x, cout // cin, axis=-1)
        fold = 0 if depthwise or transposed else int(PARAMS.get("fold", 0))
        # A strided depthwise conv on an f32 window reads each tap's strided rows in VMEM:
        # the input is not split into stride phases in HBM.
        unsplit = (upcast and not transposed and d >= 2 and any(s > 1 for s in stride)
                   and all(lo >= 0 and hi >= 0 for lo, hi in pads))
        # Zero padding inside the kernel (no padded copy of the input in HBM): stride-1
        # direct convs (and unsplit strided ones) with non-negative padding.
        inpad = (d >= 2 and not transposed and fold == 0
                 and (all(s == 1 for s in stride) or unsplit)
                 and any(lo or hi for lo, hi in pads) and all(lo >= 0 and hi >= 0 for lo, hi in pads)
                 and PARAMS.get("pad_in_kernel", True))
        if transposed:
            # the zero rows before the input go in VMEM too (pad_in_kernel)
            in_vmem = d >= 2 and bool(PARAMS.get("pad_in_kernel", True))
            x, w, taps, outs, lph, lo = _plan_transposed(x, w, ldil, rdil, pads,
                                                         pad_here=not in_vmem)
            inpad = in_vmem and any(lo)
            vpads = [(l, 0) for l in lo]
        elif inpad or unsplit:
            if not inpad:
                x = lax.pad(x, jnp.zeros((), x.dtype),
                            [(0, 0, 0)] + [(lo, hi, 0) for lo, hi in pads] + [(0, 0, 0)])
            grown = [x.shape[1 + i] + (pads[i][0] + pads[i][1] if inpad else 0) for i in range(d)]
            outs = [(grown[i] - (ks[i] - 1) * rdil[i] - 1) // stride[i] + 1 for i in range(d)]
            taps = [[(_ravel(k, ks), 0, tuple(k[i] * rdil[i] for i in range(d)))
                     for k in itertools.product(*[range(e) for e in ks])]]
            w = w.reshape((1, math.prod(ks)) + w.shape[d:])
            x = x.reshape((n, 1) + x.shape[1:])
            lph = [1] * d
        else:
            x, w, taps, outs, lph = _plan_direct(x, w, stride, rdil, pads, fold)
    ck = x.shape[1] if cm_in else x.shape[-1]
    p_out = len(taps)
    q = [-(-outs[i] // lph[i]) for i in range(d)]
    pool_at = [_pool_at(o, outs) for o in OUTS]

    itemsizes = [jnp.dtype(x.dtype).itemsize] + [jnp.dtype(o["dtype"]).itemsize for o in OUTS]
    sub = max(8, 32 // min(itemsizes + [4]))
    # Fused pools: a dim with overlapping or padded windows is kept whole in a tile; one
    # with disjoint windows is tiled by multiples of the stride.
    whole, align = [False] * d, [1] * d
    for pool in pool_at:
        if pool is not None and not transposed:
            for i, (win, st, lo, hi) in enumerate(pool):
                if win != st or lo or hi:
                    whole[i] = True
                else:
                    align[i] = align[i] * st // math.gcd(align[i], st)
    tiles, qp = [], []
    if cm_in:
        # rows: the flattened positions, a 128-multiple divisor or all of them
        r_all = math.prod(spatial_in)
        req = int(PARAMS.get("block_s0", r_all)) * math.prod(spatial_in[1:])
        rows = _divisor_tile(r_all, req, 128) if r_all % 128 == 0 else r_all
        tiles, qp, ntiles = [rows], [r_all], [r_all // rows]
    else:
        for i in range(d):
            req = int(PARAMS.get("block_s%d" % i, q[i]))
            if i < d - 1:
                t = _leading_tile(q[i], req, align[i]) if not whole[i] else q[i]
                tiles.append(t)
                qp.append(_round_up(q[i], t))
            elif d == 1:
                t = min(max(sub, req // sub * sub), _round_up(q[i], sub))
                tiles.append(t)
                qp.append(_round_up(q[i], t))
            else:
                tiles.append(_round_up(q[i], sub))
                qp.append(tiles[-1])
        ntiles = [qp[i] // tiles[i] for i in range(d)]
        rows = math.prod(tiles)
        halo = [max([offs[i] for tl in taps for _, _, offs in tl] or [0]) for i in range(d)]
        # Input windows: the tile's rows (every ts-th when unsplit) + halo; on the last
        # (sublane) dim a multiple of the tiling.
        ts = list(stride) if unsplit else [1] * d
        window = [(tiles[i] - 1) * ts[i] + 1 + halo[i] for i in range(d)]
        if ntiles[d - 1] > 1:
            window[d - 1] = _round_up(window[d - 1], sub)
        need = [(ntiles[i] - 1) * tiles[i] * ts[i] + window[i] for i in range(d)]
        have = x.shape[2:-1]
        if inpad:
            # the kernel reads clamped windows of the unpadded input and pads them in VMEM:
            # per leading dim, the tiles fall in a few classes (top border, interior, bottom
            # border) of static (source rows, destination row) copies
            window[d - 1] = need[d - 1]
            ewin = [min(window[i], have[i]) for i in range(d - 1)] + [have[d - 1]]
            pad_classes = []
            for i in range(d):
                if i == d - 1:
                    pad_classes.append([(0, ntiles[i] - 1, 0, have[i], vpads[i][0])])
                    continue
                cls = []
                for t in range(ntiles[i]):
                    u = t * tiles[i] * ts[i] - vpads[i][0]
                    c0 = min(max(u, 0), have[i] - ewin[i])
                    a, b = max(u, c0), min(u + window[i], c0 + ewin[i])
                    key = (a - c0, max(b, a) - c0, a - u)
                    if cls and cls[-1][2:] == key and cls[-1][1] == t - 1:
                        cls[-1] = (cls[-1][0], t) + key
                    else:
                        cls.append((t, t) + key)
                pad_classes.append(cls)
        if not inpad:
            x = lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0), (0, 0, 0)]
                        + [(0, max(0, need[i] - have[i]), 0) for i in range(d)] + [(0, 0, 0)]) \
                if any(need[i] > have[i] for i in range(d)) else x
            x = x[(slice(None), slice(None)) + tuple(slice(0, need[i]) for i in range(d))] \
                if any(need[i] < have[i] for i in range(d)) else x
    # Channel-major outputs go straight to (n, c, positions) blocks when a tile is a run of
    # whole trailing rows whose length the lane tiling allows.
    inner = math.prod(qp[1:]) if not cm_in else 1
    cm_out = cm and p_out == 1 and (cm_in or (
        all(tiles[i] == qp[i] for i in range(1, d)) and (rows % 128 == 0 or ntiles[0] == 1)))

    if depthwise:
        tn = _lane_tile(cout, int(PARAMS.get("block_n", cout)))
        tk, nk = tn, 1
    else:
        tn = _lane_tile(cout, int(PARAMS.get("block_n", cout)))
        tk = _lane_tile(ck, int(PARAMS.get("block_k", ck)))
        nk = ck // tk
    if EPI_NEEDS_ALL_CHANNELS:
        tn = cout
    nj = cout // tn
    # images per grid step (block_b): fewer, larger steps for small images
    bn = _divisor_tile(n, int(PARAMS.get("block_b", 1)), 1)
    nb = None if bn == 1 else bn
    # All of a transposed conv's phases in one grid step (their weights and output tiles in
    # VMEM together): the input window is read once, not once per phase.
    all_phases = p_out > 1 and bool(PARAMS.get("phases_in_step", False))
    # A transposed conv's phases written in place: the output viewed as (n, q0, L0, q1, L1,
    # ..., q_last, L_last * c) (a free reshape of the result), phase r's tile at index r_i of
    # each L_i (of the last one: its channel block), so no interleaving copy after the call.
    in_place = (d >= 2 and transposed and all(outs[i] == q[i] * lph[i] for i in range(d))
                and (cout % 128 == 0 or lph[-1] == 1) and (nj == 1 or not all_phases))

    dd = 1 if cm_in else d
    names = ["p", "n"] + ["s%d" % i for i in range(dd)] + ["j", "k"]
    if PARAMS.get("grid_order", "spatial_outer") == "cout_outer":
        names = ["p", "j", "n"] + ["s%d" % i for i in range(dd)] + ["k"]
    pos = {a: names.index(a) for a in names}
    extent = dict(p=1 if all_phases else p_out, n=n // bn, j=nj, k=nk,
                  **{"s%d" % i: ntiles[i] for i in range(dd)})
    grid = tuple(extent[a] for a in names)

    def sp(g):
        return tuple(g[pos["s%d" % i]] for i in range(dd))

    pblk = p_out if all_phases else None     # the phase axis of weights, leaves and outputs

    def ph(g):
        return 0 if all_phases else g[pos["p"]]

    def phase_digits(g):
        p, digits = ph(g), []
        for i in reversed(range(d)):
            digits.append(p % lph[i])
            p = p // lph[i]
        return digits[::-1]

    def chan(width, g):
        return g[pos["j"]] if width > 1 else 0

    if cm_in:
        x_spec = pl.BlockSpec((nb, tk, rows), lambda *g: (g[pos["n"]], g[pos["k"]], g[pos["s0"]]))
    else:
        def x_map(*g):
            c0 = g[pos["j"]] * tn if depthwise else g[pos["k"]] * tk
            if inpad:
                rows0 = tuple(jnp.clip(s * tiles[i] * ts[i] - vpads[i][0], 0, have[i] - ewin[i])
                              for i, s in enumerate(sp(g)[:d - 1])) + (0,)
                return (g[pos["n"]] * bn, 0) + rows0 + (c0,)
            return (g[pos["n"]] * bn, 0) + tuple(s * tiles[i] * ts[i]
                                            for i, s in enumerate(sp(g))) + (c0,)

        # element offsets on every dim (the window's halo), images too when several
        x_spec = pl.BlockSpec((None if bn == 1 else pl.Element(bn), pl.Element(x.shape[1]))
                              + tuple(pl.Element(ewin[i] if inpad else window[i])
                                      for i in range(d))
                              + (pl.Element(tk),), x_map)
    if depthwise:
        w_spec = pl.BlockSpec((pblk, w.shape[1], 1, tn),
                              lambda *g: (ph(g), 0, 0, g[pos["j"]]))
    else:
        w_spec = pl.BlockSpec((pblk, w.shape[1], tk, tn),
                              lambda *g: (ph(g), 0, g[pos["k"]], g[pos["j"]]))

    sizes = dict(n=n, c=cout, **{"s%d" % i: outs[i] for i in range(d)})
    rm_order = ["n"] + ["s%d" % i for i in range(d)] + ["c"]
    cm_order = ["n", "c"] + ["s%d" % i for i in range(d)]
    in_specs, leaf_arrays = [x_spec, w_spec], []
    leaf_n, out_n = [], []    # where each leaf's and output's image axis is in the kernel
    for spec, v in zip(LEAVES, leaves):
        width = cout if "c" in spec["roles"] else 1
        lw = tn if width > 1 else 1
        if spec["kind"] == "row":
            arr = _to_order(v, spec["roles"], sizes, ["c"])
            if cm:
                arr = arr.reshape(width, 1)
                bs = pl.BlockSpec((lw, 1), lambda *g, width=width: (chan(width, g), 0))
            else:
                arr = arr.reshape(1, width)
                bs = pl.BlockSpec((1, lw), lambda *g, width=width: (0, chan(width, g)))
        elif spec["kind"] == "nrow":
            arr = _to_order(v, spec["roles"], sizes, ["n", "c"])
            arr = jnp.broadcast_to(arr, (n, width))
            if cm:
                arr = arr.reshape(n, width, 1)
                bs = pl.BlockSpec((nb, lw, 1),
                                  lambda *g, width=width: (g[pos["n"]], chan(width, g), 0))
            else:
                arr = arr.reshape(n, 1, width)
                bs = pl.BlockSpec((nb, 1, lw),
                                  lambda *g, width=width: (g[pos["n"]], 0, chan(width, g)))
        elif cm_out:
            arr = _to_order(v, spec["roles"], sizes, cm_order)
            arr = jnp.broadcast_to(arr, (n, width) + tuple(outs))
            if not cm_in:
                arr = _pad_to(arr, (n, width) + tuple(qp))
            arr = arr.reshape(1, n, width, math.prod(qp))
            bs = pl.BlockSpec((None, nb, lw, rows),
                              lambda *g, width=width: (0, g[pos["n"]], chan(width, g),
                                                       g[pos["s0"]]))
        else:
            arr = _to_order(v, spec["roles"], sizes, rm_order)
            arr = jnp.broadcast_to(arr, (n,) + tuple(outs) + (width,))
            arr = _phase_major(arr, lph, q, qp)
            bs = pl.BlockSpec((pblk, nb) + tuple(tiles) + (lw,),
                              lambda *g, width=width: (ph(g), g[pos["n"]]) + sp(g)
                              + (chan(width, g),))
        leaf_arrays.append(arr)
        in_specs.append(bs)
        leaf_n.append(None if spec["kind"] == "row"
                      else 1 if spec["kind"] == "full" and not cm_out and all_phases else 0)

    out_shapes, out_specs, pools, scratch = [], [], [], []
    exact = d >= 2 and p_out == 1 and not transposed
    if inpad:
        scratch.append(pltpu.VMEM(tuple(window) + (tk,), jnp.float32 if upcast else x.dtype))
    elif upcast:
        scratch.append(pltpu.VMEM((x.shape[1],) + tuple(window) + (tk,), jnp.float32))
    if nk > 1:
        scratch.append(pltpu.VMEM(((bn,) if bn > 1 else ()) + ((p_out,) if all_phases else ())
                                  + ((tn, rows) if cm else (rows, tn)), jnp.float32))
    pool_scratch = []
    for o, pool in zip(OUTS, pool_at):
        width = cout if o["chan"] else 1
        lw = tn if o["chan"] else 1
        pplan = None
        if pool is not None and not transposed and not cm_in:
            pplan = _pool_plan(pool, tiles, q, qp, sub, ntiles)
        pools.append(pplan)
        if cm_out and o["pool"] is None:
            out_shapes.append(jax.ShapeDtypeStruct((1, n, width, math.prod(qp)), o["dtype"]))
            out_n.append(0)
            out_specs.append(pl.BlockSpec(
                (None, nb, lw, rows),
                lambda *g, width=width: (0, g[pos["n"]], chan(width, g), g[pos["s0"]])))
            continue
        if pplan is None and in_place and o["chan"] and o["pool"] is None:
            def spatial_map(*g, width=width):
                r = phase_digits(g)
                lead = sum(((g[pos["s%d" % i]], r[i]) for i in range(d - 1)), ())
                return (g[pos["n"]],) + lead + (0, r[-1] * (width // lw) + chan(width, g))

            out_shapes.append(jax.ShapeDtypeStruct(
                (n,) + sum(((q[i], lph[i]) for i in range(d - 1)), ()) + (q[-1], lph[-1] * width),
                o["dtype"]))
            ls = lph if all_phases else [None] * d
            out_n.append(0)
            out_specs.append(pl.BlockSpec(
                (nb,) + sum(((tiles[i], ls[i]) for i in range(d - 1)), ())
                + (q[-1], lw * (lph[-1] if all_phases else 1)), spatial_map))
            continue
        if pplan is None and exact:
            # the output array is the output: Pallas clips a ragged last tile along a leading
            # dim and the padded last dim is dropped in VMEM, so no slice copies it after
            ext, blk = tuple(q), tuple(tiles[:-1]) + (q[-1],)
        elif pplan is None:
            ext, blk = tuple(qp), tuple(tiles)
        else:
            ext = tuple(ntiles[i] * pp[5] for i, pp in enumerate(pplan))
            blk = tuple(pp[5] for pp in pplan)
            pool_scratch.append(pltpu.VMEM(tuple(pp[6] for pp in pplan) + (lw,), jnp.float32))
        out_shapes.append(jax.ShapeDtypeStruct((p_out, n) + ext + (width,), o["dtype"]))
        out_n.append(1 if all_phases else 0)
        out_specs.append(pl.BlockSpec(
            (pblk, nb) + blk + (lw,),
            lambda *g, width=width: (ph(g), g[pos["n"]]) + sp(g) + (chan(width, g),)))
    scratch += pool_scratch

    mxu = None
    if PARAMS.get("mxu_bf16", False) and jnp.dtype(x.dtype) == jnp.float32:
        mxu = jnp.bfloat16
    group = max(1, int(PARAMS.get("tap_group", 1)))
    cfg = dict(d=d, taps=taps, tiles=tiles, nk=nk, pos=pos, tn=tn, depthwise=depthwise,
               tap_group=group, upcast=upcast, bn=bn, leaf_n=leaf_n, out_n=out_n,
               ts=ts if not cm_in else [1] * d, all_phases=all_phases, in_place=in_place,
               lph=lph, rows=rows, cm=cm, cm_in=cm_in, cm_out=cm_out,
               inpad=inpad, pad_classes=pad_classes if inpad else None, ntiles=ntiles,
               window=window if not cm_in else None,
               mxu_dtype=mxu, conv_dtype=jnp.dtype(CONV["out_dtype"]), pools=pools, q=q, qp=qp,
               extents=(n, math.prod(outs), cout))
    semantics = tuple("arbitrary" if a == "k" else "parallel" for a in names)
    taps_total = sum(len(tl) for tl in taps)
    macs = n * math.prod(qp) * taps_total * (cout if depthwise else ck * cout)
    bytes_accessed = x.size * x.dtype.itemsize * (1 if depthwise else nj) \
        + w.size * w.dtype.itemsize + sum(math.prod(s.shape) * jnp.dtype(s.dtype).itemsize
                                          for s in out_shapes)
    results = pl.pallas_call(
        functools.partial(_kernel, cfg=cfg),
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shapes,
        scratch_shapes=scratch,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=semantics,
            vmem_limit_bytes=int(PARAMS.get("vmem_limit_bytes", 32 * 1024 * 1024))),
        cost_estimate=pl.CostEstimate(flops=int(2 * macs), transcendentals=0,
                                      bytes_accessed=int(bytes_accessed)),
    )(x, w, *leaf_arrays)

    finals = []
    for o, r, pplan, pool in zip(OUTS, results, pools, pool_at):
        if cm_out and o["pool"] is None:
            v = r[0].reshape((n, r.shape[2]) + tuple(outs if cm_in else qp))
            if not cm_in:
                v = v[(slice(None), slice(None)) + tuple(slice(0, q[i]) for i in range(d))]
            finals.append(_from_order(v, cm_order, o["roles"]))
            continue
        if pplan is None and in_place and o["chan"] and o["pool"] is None:
            finals.append(_from_order(r.reshape((n,) + tuple(outs) + (r.shape[-1] // lph[-1],)),
                                      rm_order, o["roles"]))
            continue
        if pplan is None:
            v = r
            if tuple(r.shape[2:2 + d]) != tuple(q):
                v = r[(slice(None), slice(None)) + tuple(slice(0, q[i]) for i in range(d))]
            v = _interleave(v, lph, outs) if transposed else v[0]
            if o["pool"] is not None:
                v = _pool_outside(v, pool)
        else:
            v = r[0][(slice(None),) + tuple(slice(0, pp[7]) for pp in pplan)]
        finals.append(_from_order(v, rm_order, o["roles"]))
    return finals


def _pool_outside(v, pool):
    """The max pool on (n, spatial..., c) when it could not be fused into the kernel tile."""
    init = jnp.array(-jnp.inf, v.dtype)
    win = (1,) + tuple(p[0] for p in pool) + (1,)
    st = (1,) + tuple(p[1] for p in pool) + (1,)
    pad = ((0, 0),) + tuple((p[2], p[3]) for p in pool) + ((0, 0),)
    return lax.reduce_window(v, init, lax.max, win, st, pad)


def workload({{args}}):
{{prologue}}
    outs = _conv_gemm(lhs, rhs, leaves)
{{tail}}
    return {{result}}
