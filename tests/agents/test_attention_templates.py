"""The attention templates of the expert brain (flash_attention, paged_attention) end to end:
small native specs whose references spell attention in different ways (einsum / @ /
lax.dot_general, [B,H,S,D] / [B,S,H,D] layouts, jax.nn.softmax / hand-written softmax,
GQA by reshape / jnp.repeat, where(-inf) / large negative / additive masks, soft-capping,
normalisation after PV, paged KV caches) go through the built `maxkernel template`, and the
rendered kernel through `maxkernel check` (lowered for TPU, tested in interpret mode against
the reference). A reference that is not attention is refused."""
import json
import subprocess
import sys
import textwrap

import template_cli
from template_cli import ROOT, needs_binary, run, write_spec

pytestmark = needs_binary


def template_and_check(tmp_path, spec, family, params=None):
    return template_cli.template_and_check(tmp_path, spec, family, params, by_name=False)


QKV_BHSD = ["{name: q, shape: [B, H, S, D], dtype: bfloat16}",
            "{name: k, shape: [B, H, S, D], dtype: bfloat16}",
            "{name: v, shape: [B, H, S, D], dtype: bfloat16}"]


def test_einsum_bhsd_causal_jax_nn_softmax(tmp_path):
    spec = write_spec(tmp_path, "einsum_causal", "{B: 1, H: 2, S: 256, D: 128}", QKV_BHSD, """
        import jax, jax.numpy as jnp

        def reference(q, k, v):
            s = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32)
            s = s * q.shape[-1] ** -0.5
            n = q.shape[2]
            s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), s, -jnp.inf)
            p = jax.nn.softmax(s, axis=-1)
            return jnp.einsum("bhqk,bhkd->bhqd", p, v.astype(jnp.float32)).astype(q.dtype)
        """)
    matched, result, source = template_and_check(tmp_path, spec, "flash_attention",
                                                 {"block_q": 128, "block_k": 128})
    assert "mask static" in matched["matches"][0]["summary"]
    # causal: the key blocks above the diagonal are skipped, so the grid's key axis is shorter
    # than the number of key blocks only when counted per row block; the tables are there
    assert "_block_tables" in source and "def _kill" in source
    # blocks the mask leaves whole (row block 1 x key block 0 here) take the scores without
    # the mask: its positions are not even computed there
    live = source.split("def _score_live")[1].split("\n\n")[0]
    assert "ix.r(" not in live and "ix.k(" not in live and "xp.where" not in live, live
    assert "score_live=_score_live" in source

    # both heads in one block: batched dots over a leading head dimension, half the grid
    facts = matched["facts"]
    head = facts["head_axis"]   # the batch of 1 is no kv-row axis: the heads are axis 0
    assert head >= 0 and facts["kv_rows"][head] == 2, facts["kv_rows"]
    _, two, _ = template_and_check(tmp_path, spec, "flash_attention",
                                   {"block_q": 128, "block_k": 128, "block_h": 2})
    one_grid, two_grid = result["pallas_calls"][0]["grid"], two["pallas_calls"][0]["grid"]
    assert one_grid[head] == 2 and two_grid[head] == 1, (one_grid, two_grid)
    assert two_grid[-1] == one_grid[-1], (one_grid, two_grid)
    q_block = two["pallas_calls"][0]["operands"][3]["block_shape"]
    assert q_block[head] == 2, q_block


def test_matmul_bshd_gqa_repeat_handwritten_softmax(tmp_path):
    spec = write_spec(
        tmp_path, "matmul_gqa", "{B: 2, S: 128, HQ: 4, HKV: 2, D: 64}",
        ["{name: q, shape: [B, S, HQ, D], dtype: bfloat16}",
         "{name: k, shape: [B, S, HKV, D], dtype: bfloat16}",
         "{name: v, shape: [B, S, HKV, D], dtype: bfloat16}"], """
        import jax.numpy as jnp

        def reference(q, k, v):
            g = q.shape[2] // k.shape[2]
            k = jnp.repeat(k, g, axis=2)
            v = jnp.repeat(v, g, axis=2)
            qt = jnp.swapaxes(q, 1, 2) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
            s = (qt @ jnp.swapaxes(jnp.swapaxes(k, 1, 2), 2, 3)).astype(jnp.float32)
            n = s.shape[-1]
            s = jnp.where(jnp.arange(n)[:, None] >= jnp.arange(n)[None, :], s, -1e9)
            e = jnp.exp(s - s.max(axis=-1, keepdims=True))
            p = e / e.sum(axis=-1, keepdims=True)
            return jnp.swapaxes(p.astype(v.dtype) @ jnp.swapaxes(v, 1, 2), 1, 2)
        """)
    matched, _, _ = template_and_check(tmp_path, spec, "flash_attention")
    # GQA by repeat: kv rows are (batch, kv head); the group of 2 query heads becomes rows
    summary = matched["matches"][0]["summary"]
    assert "kv rows [2,2]" in summary and "query rows [2,128]" in summary, summary


def test_dot_general_softcap_gqa_reshape(tmp_path):
    spec = write_spec(
        tmp_path, "softcap_gqa", "{B: 1, HQ: 4, HKV: 1, S: 256, D: 128}",
        ["{name: q, shape: [B, HQ, S, D], dtype: bfloat16, generator: {normal: {mean: 0, std: 2}}}",
         "{name: k, shape: [B, HKV, S, D], dtype: bfloat16}",
         "{name: v, shape: [B, HKV, S, D], dtype: bfloat16}",
         "{name: cap, static: 30.0}"], """
        import jax, jax.numpy as jnp
        from jax import lax

        def reference(q, k, v, cap):
            b, hq, s, d = q.shape
            qg = q.reshape(b, k.shape[1], hq // k.shape[1], s, d)
            sc = lax.dot_general(qg, k, (((4,), (3,)), ((0, 1), (0, 1))),
                                 preferred_element_type=jnp.float32) / jnp.sqrt(jnp.float32(d))
            sc = cap * jnp.tanh(sc / cap)
            causal = jnp.arange(s)[None, :] <= jnp.arange(s)[:, None]
            sc = sc + jnp.where(causal, 0.0, -jnp.inf)
            p = jax.nn.softmax(sc, axis=-1)
            o = jnp.einsum("bngqk,bnkd->bngqd", p.astype(jnp.bfloat16), v,
                           preferred_element_type=jnp.float32)
            return o.reshape(b, hq, s, d).astype(q.dtype)
        """)
    matched, _, _ = template_and_check(tmp_path, spec, "flash_attention",
                                       {"block_q": 128, "block_k": 128})
    assert "mask static" in matched["matches"][0]["summary"]


def test_bshd_local_global_mask_read_in_place(tmp_path):
    spec = write_spec(
        tmp_path, "local_global", "{B: 1, S: 512, H: 2, D: 128}",
        ["{name: q, shape: [B, S, H, D], dtype: bfloat16}",
         "{name: k, shape: [B, S, H, D], dtype: bfloat16}",
         "{name: v, shape: [B, S, H, D], dtype: bfloat16}"], """
        import jax, jax.numpy as jnp

        def reference(q, k, v):
            n = q.shape[1]
            s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
            s = s * q.shape[-1] ** -0.5
            qp, kp = jnp.arange(n)[:, None], jnp.arange(n)[None, :]
            mask = (kp <= qp) & ((qp - kp < n // 4) | (kp < n // 32))
            s = jnp.where(mask, s, -jnp.inf)
            p = jax.nn.softmax(s, axis=-1)
            return jnp.einsum("bhqk,bkhd->bqhd", p, v.astype(jnp.float32)).astype(q.dtype)
        """)
    matched, _, source = template_and_check(tmp_path, spec, "flash_attention",
                                            {"block_q": 128, "block_k": 128})
    summary = matched["matches"][0]["summary"]
    assert "layout read in place" in summary, summary  # [B,S,H*D] blocks, no transposes
    assert "jnp.transpose" not in source
    # the window is read as a fraction of the key length (n // 4 at any test size)
    assert "// 4)" in source


def test_normalised_after_pv_with_key_padding_lengths(tmp_path):
    spec = write_spec(
        tmp_path, "deferred_norm", "{B: 2, H: 2, S: 256, D: 128}",
        QKV_BHSD + ["{name: lengths, shape: [B], dtype: int32, structural: true, "
                    "generator: {randint: {low: 1, high: 256}}}"], """
        import jax.numpy as jnp

        def reference(q, k, v, lengths):
            s = jnp.einsum("bhqd,bhkd->bhqk", q.astype(jnp.float32), k.astype(jnp.float32))
            s = s / 8.0
            valid = jnp.arange(k.shape[2])[None, :] < lengths[:, None]
            s = jnp.where(valid[:, None, None, :], s, -1e30)
            e = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
            o = jnp.einsum("bhqk,bhkd->bhqd", e, v.astype(jnp.float32))
            return (o / jnp.sum(e, axis=-1)[..., None]).astype(jnp.bfloat16)
        """)
    # both heads in one block: the mask reads the lengths per batch cell, which they share
    matched, _, _ = template_and_check(tmp_path, spec, "flash_attention",
                                       {"block_q": 128, "block_k": 128, "block_h": 2})
    summary = matched["matches"][0]["summary"]
    assert "mask data-dependent" in summary and "normalised after PV" in summary, summary
    assert matched["facts"]["head_axis"] == 1 and matched["params"]["block_h"] == 2


def test_boolean_mask_input_and_finfo_fill(tmp_path):
    # a mask input (a tile per block) combined with an iota mask; finfo.min as the fill
    spec = write_spec(
        tmp_path, "mask_input", "{B: 1, H: 1, S: 256, D: 128}",
        ["{name: q, shape: [B, H, S, D], dtype: float32}",
         "{name: k, shape: [B, H, S, D], dtype: float32}",
         "{name: v, shape: [B, H, S, D], dtype: float32}",
         "{name: mask, shape: [B, 1, S, S], dtype: bool, generator: {randint: {low: 0, high: 2}}}"],
        """
        import jax, jax.numpy as jnp

        def reference(q, k, v, mask):
            s = jnp.einsum("bhqd,bhkd->bhqk", q, k) * 0.125
            n = q.shape[2]
            s = jnp.where(jnp.triu(jnp.ones((n, n), bool), k=1), jnp.finfo(jnp.float32).min, s)
            s = jnp.where(mask | jnp.eye(n, dtype=bool), s, jnp.finfo(jnp.float32).min)
            return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)
        """, tolerance="{atol: 1.0e-3, rtol: 1.0e-3}")
    matched, _, _ = template_and_check(tmp_path, spec, "flash_attention",
                                       {"block_q": 128, "block_k": 128})
    summary = matched["matches"][0]["summary"]
    # the causal part is still a static mask (blocks above the diagonal skipped)
    assert "mask static" in summary and "1 input(s) in the scores" in summary, summary


def test_paged_decode(tmp_path):
    spec = write_spec(
        tmp_path, "paged_decode",
        "{NS: 4, HQ: 4, HKV: 2, D: 128, NP: 64, PAGE: 16, PPS: 16}",
        ["{name: q, shape: [NS, HQ, D], dtype: bfloat16}",
         "{name: k_pages, shape: [HKV, NP, PAGE, D], dtype: bfloat16}",
         "{name: v_pages, shape: [HKV, NP, PAGE, D], dtype: bfloat16}",
         "{name: lengths, shape: [NS], dtype: int32, structural: true, "
         "generator: {randint: {low: 1, high: 257}}}",
         "{name: page_indices, shape: [NS, PPS], dtype: int32, structural: true, generator: "
         "{code: \"def generate(rng, shape, dtype, dims):\\n"
         "    return rng.integers(0, dims['NP'], shape)\\n\"}}"], """
        import jax, jax.numpy as jnp

        def reference(q, k_pages, v_pages, lengths, page_indices):
            ns, hq, d = q.shape
            hkv, _, page, _ = k_pages.shape
            t = page_indices.shape[1] * page
            k = k_pages[:, page_indices].reshape(hkv, ns, t, d)
            v = v_pages[:, page_indices].reshape(hkv, ns, t, d)
            qg = q.reshape(ns, hkv, hq // hkv, d)
            s = jnp.einsum("bngd,nbtd->bngt", qg, k, preferred_element_type=jnp.float32) / 8.0
            s = jnp.where((jnp.arange(t)[None, :] < lengths[:, None])[:, None, None, :], s,
                          -jnp.inf)
            p = jax.nn.softmax(s, axis=-1)
            o = jnp.einsum("bngt,nbtd->bngd", p, v.astype(jnp.float32))
            return o.reshape(ns, hq, d).astype(q.dtype)
        """)
    matched, result, source = template_and_check(tmp_path, spec, "paged_attention",
                                                 {"pages_per_block": 4})
    assert "make_async_copy" in source
    # both kv heads in one step: each head's pages copied into its slice of the buffers
    head = matched["facts"]["head_axis"]
    assert head >= 0 and matched["facts"]["kv_rows"][head] == 2, matched["facts"]
    _, two, _ = template_and_check(tmp_path, spec, "paged_attention",
                                   {"pages_per_block": 4, "block_h": 2})
    one_grid, two_grid = result["pallas_calls"][0]["grid"], two["pallas_calls"][0]["grid"]
    assert two_grid[head] * 2 == one_grid[head], (one_grid, two_grid)


def test_not_attention_is_refused(tmp_path):
    # a softmax over a matmul, but no probabilities-times-values product
    spec = write_spec(
        tmp_path, "softmax_matmul", "{M: 128, K: 128, N: 256}",
        ["{name: x, shape: [M, K], dtype: float32}",
         "{name: w, shape: [K, N], dtype: float32}"], """
        import jax, jax.numpy as jnp

        def reference(x, w):
            return jax.nn.softmax(x @ w, axis=-1)
        """)
    t = run("template", spec, "--name", "flash_attention", "--json", "-")
    assert t.returncode == 2, t.stderr
    assert json.loads(t.stdout).get("template") is None
    t = run("template", spec, "--name", "paged_attention", "--json", "-")
    assert t.returncode == 2, t.stderr


# Run a rendered kernel and its reference at other sizes (interpret mode, as the worker's
# tester runs it): a kernel that bakes a size-derived constant of the full shapes (a scale
# read from a dim only the reference's own projections see) fails there.
RESIZED_RUN = """
import importlib.util, json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from maxkernel_worker import jax_compat
jax_compat.apply()
import jax, jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
ref_ns = {}
exec(open(sys.argv[3]).read(), ref_ns)
spec = importlib.util.spec_from_file_location("kernel", sys.argv[2])
kernel = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kernel)
rng = np.random.default_rng(0)
args = []
for shape, dtype, std, high in json.loads(sys.argv[4]):
    if high:
        args.append(jnp.asarray(rng.integers(1, high + 1, shape), jnp.int32))
    else:
        args.append(jnp.asarray(rng.normal(0.0, std, shape), jnp.dtype(dtype)))
want = np.asarray(ref_ns["reference"](*args), np.float32)
params = pltpu.InterpretParams(uninitialized_memory="nan", out_of_bounds_reads="raise")
with pltpu.force_tpu_interpret_mode(params):
    got = np.asarray(jax.block_until_ready(kernel.workload(*args)), np.float32)
bad = ~np.isclose(got, want, atol=2e-2, rtol=2e-2)
print(json.dumps({"bad": int(bad.sum()), "size": int(bad.size),
                  "max_abs": float(np.nanmax(np.abs(got - want)))}))
"""


def run_resized(tmp_path, kernel, reference, inputs):
    """inputs: per input (shape, dtype, normal std, lengths upper bound or 0)."""
    script = tmp_path / "resized_run.py"
    script.write_text(RESIZED_RUN)
    ref = tmp_path / "reference.py"
    ref.write_text(textwrap.dedent(reference))
    p = subprocess.run([sys.executable, script, ROOT / "tpu_nodes" / "worker", kernel, ref,
                        json.dumps(inputs)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


MLA_DECODE_REFERENCE = """
    import math
    import jax.numpy as jnp

    def reference(q_nope, q_rope, latents, k_rope, w_uk, w_uv, lengths):
        f32 = jnp.float32
        # the no-RoPE query absorbed into the latent space: [B, H, N] x [H, N, C]
        q_lat = jnp.einsum("bhn,hnc->bhc", q_nope.astype(f32), w_uk.astype(f32))
        kv = latents.astype(f32)
        s = q_lat @ jnp.swapaxes(kv, 1, 2) + (q_rope @ jnp.swapaxes(k_rope, 1, 2)).astype(f32)
        s = s / math.sqrt(q_nope.shape[-1] + q_rope.shape[-1])
        live = jnp.arange(latents.shape[1])[None, None, :] < lengths[:, None, None]
        s = jnp.where(live, s, -1e30)
        e = jnp.exp(s - s.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
        o_lat = p @ kv                     # the latents are the values too
        return jnp.einsum("bhc,hcv->bhv", o_lat, w_uv.astype(f32)).astype(jnp.bfloat16)
    """


def test_mla_decode_latents_are_keys_and_values_scale_from_projection_dim(tmp_path):
    # MLA decode in absorb form: one input is both a key operand and the values; the score
    # is the sum of two products (latent + RoPE parts); the scale is read from the no-RoPE
    # head dim, which only the query's projection (replayed before the kernel) contracts.
    spec = write_spec(
        tmp_path, "mla_decode_like", "{B: 2, H: 16, L: 256, C: 256, N: 128, R: 64, V: 32}",
        ["{name: q_nope, shape: [B, H, N], dtype: bfloat16}",
         "{name: q_rope, shape: [B, H, R], dtype: bfloat16}",
         "{name: latents, shape: [B, L, C], dtype: bfloat16}",
         "{name: k_rope, shape: [B, L, R], dtype: bfloat16}",
         "{name: w_uk, shape: [H, N, C], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.09}}}",
         "{name: w_uv, shape: [H, C, V], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.09}}}",
         "{name: lengths, shape: [B], dtype: int32, structural: true, "
         "generator: {randint: {low: 1, high: 257}}}"], MLA_DECODE_REFERENCE)
    matched, _, source = template_and_check(tmp_path, spec, "flash_attention",
                                            {"block_q": 16, "block_k": 128})
    summary = matched["matches"][0]["summary"]
    assert "qk dims [256+64]" in summary, summary
    # the latent tile is read once, as keys and as values
    assert ", 0),\n" in source.split("o = _flash(")[1], source
    # other sizes than the analysed ones (the tester's ragged case moves them): the no-RoPE
    # dim N is 128 -> 8, so a scale baked as 1/sqrt(128 + 64) is wrong there (the latent
    # dim C differs from N: with C == N the scale could be either and stays a constant)
    b, h, l, c, n, r, v = 2, 8, 384, 128, 8, 64, 32
    res = run_resized(tmp_path, tmp_path / f"{spec.stem}.py", MLA_DECODE_REFERENCE,
                      [[[b, h, n], "bfloat16", 1.0, 0], [[b, h, r], "bfloat16", 1.0, 0],
                       [[b, l, c], "bfloat16", 1.0, 0], [[b, l, r], "bfloat16", 1.0, 0],
                       [[h, n, c], "bfloat16", n ** -0.5, 0], [[h, c, v], "bfloat16", 0.09, 0],
                       [[b], "int32", 0, l]])
    assert res["bad"] == 0, res


MLA_LAYER_REFERENCE = """
        import jax, jax.numpy as jnp

        def rope(x):
            seq, r = x.shape[1], x.shape[-1]
            inv = 1.0 / 10000.0 ** (jnp.arange(0, r, 2, dtype=jnp.float32) / r)
            ang = jnp.arange(seq, dtype=jnp.float32)[:, None] * inv[None, :]
            ang = jnp.concatenate([ang, ang], axis=-1).reshape((1, seq) + (1,) * (x.ndim - 3) + (r,))
            x = x.astype(jnp.float32)
            rot = jnp.concatenate([-x[..., r // 2:], x[..., :r // 2]], axis=-1)
            return (x * jnp.cos(ang) + rot * jnp.sin(ang)).astype(jnp.bfloat16)

        def reference(x, w_q, w_qr, w_dkv, w_kr, w_uk, w_uv, w_o):
            b, seq, _ = x.shape
            q = jnp.einsum("bse,ehd->bhsd", x, w_q)
            q_pe = rope(jnp.einsum("bse,ehr->bshr", x, w_qr))
            c_kv = x @ w_dkv
            k = jnp.einsum("bsc,chd->bhsd", c_kv, w_uk)
            v = jnp.einsum("bsc,chd->bhsd", c_kv, w_uv)
            k_pe = rope(x @ w_kr)                       # [B, S, R]: one RoPE key for all heads
            s = (q.astype(jnp.float32) @ jnp.swapaxes(k, 2, 3).astype(jnp.float32)
                 + jnp.einsum("bqhr,bkr->bhqk", q_pe, k_pe, preferred_element_type=jnp.float32))
            s = s / jnp.sqrt(jnp.float32(q.shape[-1] + q_pe.shape[-1]))
            pos = jnp.arange(seq)                       # one iota read as rows and as keys
            s = jnp.where(pos[:, None] >= pos[None, :], s, -jnp.inf)
            p = jax.nn.softmax(s, axis=-1)
            o = (p @ v.astype(jnp.float32)).astype(x.dtype)   # [B, H, S, V]
            return jnp.swapaxes(o, 1, 2).reshape(b, seq, -1) @ w_o.reshape(-1, w_o.shape[-1])
    """


def test_mla_layer_two_score_products_rope_key_shared_by_heads(tmp_path):
    # A DeepSeek-style MLA layer without its norms: projections through a latent, rotate-half
    # RoPE (halves by slicing), causal scores that are the SUM of a no-RoPE and a RoPE
    # product whose key part is one per token for all heads, then the output projection
    # (heads merged by reshape). The attention core is the kernel; the projections and RoPE
    # before it and the output projection after it are replayed as jnp around it.
    spec = write_spec(
        tmp_path, "mla_layer", "{B: 1, S: 256, E: 256, C: 128, H: 2, N: 128, R: 64, V: 128}",
        ["{name: x, shape: [B, S, E], dtype: bfloat16}",
         "{name: w_q, shape: [E, H, N], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.06}}}",
         "{name: w_qr, shape: [E, H, R], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.06}}}",
         "{name: w_dkv, shape: [E, C], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.06}}}",
         "{name: w_kr, shape: [E, R], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.06}}}",
         "{name: w_uk, shape: [C, H, N], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.09}}}",
         "{name: w_uv, shape: [C, H, V], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.09}}}",
         "{name: w_o, shape: [H, V, E], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.06}}}"],
        MLA_LAYER_REFERENCE, tolerance="{atol: 2.0e-2, rtol: 2.0e-2}")
    # both heads in one block, the rope key shared by them (its product over the heads' rows)
    matched, _, source = template_and_check(tmp_path, spec, "flash_attention",
                                            {"block_q": 128, "block_k": 128, "block_h": 2})
    summary = matched["matches"][0]["summary"]
    assert "qk dims [128+64]" in summary and "mask static" in summary, summary
    assert matched["params"]["block_h"] == 2 and matched["facts"]["head_axis"] >= 0
    body = source.split("def workload(")[1]
    prologue, epilogue = body.split("o = _flash(")
    assert "lax.cos" in prologue and "lax.dot_general" in prologue
    assert "lax.dot_general" in epilogue.split("out = o")[1]
    # the scale is 1/sqrt(N + R) at any size: N 128 -> 64 here (and other sizes elsewhere)
    b, seq, e, c, h, n, r, v = 1, 128, 128, 64, 2, 64, 64, 128
    res = run_resized(tmp_path, tmp_path / f"{spec.stem}.py", MLA_LAYER_REFERENCE,
                      [[[b, seq, e], "bfloat16", 1.0, 0], [[e, h, n], "bfloat16", 0.06, 0],
                       [[e, h, r], "bfloat16", 0.06, 0], [[e, c], "bfloat16", 0.06, 0],
                       [[e, r], "bfloat16", 0.06, 0], [[c, h, n], "bfloat16", 0.09, 0],
                       [[c, h, v], "bfloat16", 0.09, 0], [[h, v, e], "bfloat16", 0.06, 0]])
    assert res["bad"] == 0, res
