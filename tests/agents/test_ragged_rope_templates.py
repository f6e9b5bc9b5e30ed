"""The ragged_paged_attention and rope_projection templates of the expert brain end to end:
specs written here in other dims and other spellings than the benchmark's (so the matchers
are not shaped to one file), and the benchmark specs themselves, go through the built
`maxkernel template` and `maxkernel check` (the worker's interpret-mode test at reduced
sizes, against the reference at the spec's tolerances)."""
import json
import pathlib

from template_cli import ROOT, check, matches, needs_binary, run, template_and_check, write_spec

pytestmark = needs_binary

RAGGED_INPUTS = [
    "{name: q, shape: [T, HQ, D], dtype: bfloat16}",
    "{name: kv_pages, shape: [NP, PAGE, KVC, D], dtype: bfloat16}",
    # kv lengths at least the longest chunk, at most the page capacity
    "{name: kv_lens, shape: [MS], dtype: int32, structural: true, generator: {code: \"def "
    "generate(rng, shape, dtype, dims):\\n    cap = dims['PPS'] * dims['PAGE']\\n"
    "    return rng.integers(cap // 2, cap + 1, shape)\\n\"}}",
    "{name: page_indices, shape: [MS, PPS], dtype: int32, structural: true, generator: {code: "
    "\"def generate(rng, shape, dtype, dims):\\n    return rng.integers(0, dims['NP'], shape)\\n\"}}",
    # uneven chunks in a random order: one decode, one long chunk, the rest even; all used
    "{name: cu_q_lens, shape: [SB], dtype: int32, structural: true, generator: {code: \"import "
    "numpy as np\\ndef generate(rng, shape, dtype, dims):\\n    n = shape[0] - 1\\n"
    "    q = np.full(n, dims['T'] // n)\\n    q[1] += q[0] - 1\\n    q[0] = 1\\n"
    "    q[-1] += dims['T'] - q.sum()\\n"
    "    return np.concatenate([[0], np.cumsum(rng.permutation(q))])\\n\"}}",
    "{name: num_seqs, shape: [1], dtype: int32, structural: true, generator: {code: \"def "
    "generate(rng, shape, dtype, dims):\\n    return [dims['MS'] - 1]\\n\"}}",
]


def test_ragged_paged_attention_other_dims_and_spelling(tmp_path):
    # 8 query heads over 2 kv heads (GQA 4), pages of 8 rows, V at the even and K at the odd
    # combined heads, the scale on the queries, vmap over tokens instead of lax.map; the last
    # sequence slot is inactive (num_seqs = MS - 1): its tokens are zero
    spec = write_spec(
        tmp_path, "ragged_variant",
        "{T: 64, HQ: 8, KVC: 4, D: 128, NP: 32, PAGE: 8, MS: 4, SB: 5, PPS: 8}",
        RAGGED_INPUTS, """
        import jax, jax.numpy as jnp

        def reference(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs):
            t, hq, d = q.shape
            _, page, comb, _ = kv_pages.shape
            hkv = comb // 2
            cap = page_indices.shape[1] * page
            tok = jnp.arange(t)
            seq = jnp.minimum(jnp.searchsorted(cu_q_lens[1:], tok, side="right"),
                              page_indices.shape[0] - 1)
            pos = kv_lens[seq] - (cu_q_lens[seq + 1] - cu_q_lens[seq]) + tok - cu_q_lens[seq]
            qs = q * (1.0 / jnp.sqrt(jnp.float32(d))).astype(q.dtype)

            def one(qt, s, p):
                pages = kv_pages[page_indices[s]]
                v = pages[:, :, 0::2].reshape(cap, hkv, d)
                k = pages[:, :, 1::2].reshape(cap, hkv, d)
                qg = qt.reshape(hkv, hq // hkv, d)
                sc = jnp.einsum("ngd,knd->ngk", qg, k, preferred_element_type=jnp.float32)
                sc = jnp.where(jnp.arange(cap) <= p, sc, -jnp.inf)
                pr = jax.nn.softmax(sc, axis=-1)
                return jnp.einsum("ngk,knd->ngd", pr, v.astype(jnp.float32)).reshape(hq, d)

            out = jax.vmap(one)(qs, seq, pos)
            return jnp.where((seq < num_seqs[0])[:, None, None], out, 0.0).astype(q.dtype)
        """, tolerance="{atol: 3.90625e-3, rtol: 1.0e-2}")
    matched, result, source = template_and_check(
        tmp_path, spec, "ragged_paged_attention", {"block_q": 16, "pages_per_block": 2})
    summary = matched["matches"][0]["summary"]
    assert "8 heads x 128 over 2 kv heads" in summary, summary
    assert "K/V at slots 1/0" in summary, summary
    assert "PrefetchScalarGridSpec" in source and "make_async_copy" in source


def test_ragged_paged_attention_benchmark_spec(tmp_path):
    spec = ROOT / "bench" / "specs" / "operators" / "ragged_paged_attention.yaml"
    assert matches(spec)[0] == "ragged_paged_attention"
    template_and_check(tmp_path, spec, "ragged_paged_attention", by_name=False)


def test_dense_paged_decode_is_not_ragged(tmp_path):
    # one query per sequence, pages per kv head: paged_attention's, not the ragged family
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
    assert "ragged_paged_attention" not in matches(spec)


ROPE_INPUTS = [
    "{name: x, shape: [S, E], dtype: bfloat16}",
    "{name: w, shape: [E, H, D], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.05}}}",
    "{name: pos, shape: [S], dtype: int32, structural: true, generator: {randint: {low: 0, "
    "high: 8192}}}",
]


def test_rope_projection_other_dims_and_spelling(tmp_path):
    # one projection of unbatched rows, 4 heads of 128, theta 10000; the halves taken by
    # slicing, the rotation written as x * cos + rotate_half(x) * sin with the products in
    # the other order, tables from jnp.outer, f32 projection (no rounding before the rotation)
    spec = write_spec(
        tmp_path, "rope_variant", "{S: 256, E: 256, H: 4, D: 128}", ROPE_INPUTS, """
        import jax.numpy as jnp

        def reference(x, w, pos):
            d = w.shape[-1]
            y = jnp.einsum("se,ehd->shd", x, w, preferred_element_type=jnp.float32)
            inv = 1.0 / (10000.0 ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
            ang = jnp.outer(pos.astype(jnp.float32), inv)
            emb = jnp.concatenate([ang, ang], axis=-1)[:, None, :]
            rot = jnp.concatenate([-y[..., d // 2:], y[..., : d // 2]], axis=-1)
            return (jnp.sin(emb) * rot + jnp.cos(emb) * y).astype(jnp.bfloat16)
        """)
    matched, result, source = template_and_check(
        tmp_path, spec, "rope_projection",
        {"block_m": 128, "block_n": 256, "block_k": 128, "vmem_limit_bytes": 33554432})
    assert "1 projection(s)" in matched["matches"][0]["summary"]


def test_rope_qk_projection_benchmark_spec(tmp_path):
    spec = ROOT / "bench" / "specs" / "beyond" / "rope_qk_projection.yaml"
    assert matches(spec)[0] == "rope_projection"
    template_and_check(tmp_path, spec, "rope_projection", by_name=False)


def test_projection_without_rotation_is_refused(tmp_path):
    # a projection scaled by a per-row table, no half swap: not RoPE
    spec = write_spec(
        tmp_path, "scaled_projection", "{S: 256, E: 256, H: 4, D: 128}", ROPE_INPUTS, """
        import jax.numpy as jnp

        def reference(x, w, pos):
            y = jnp.einsum("se,ehd->shd", x, w, preferred_element_type=jnp.float32)
            c = jnp.cos(pos.astype(jnp.float32))[:, None, None]
            return (y * c + y * c).astype(jnp.bfloat16)
        """)
    t = run("template", spec, "--name", "rope_projection", "--json", "-")
    assert t.returncode == 2, t.stdout + t.stderr
    assert json.loads(t.stdout).get("template") is None
