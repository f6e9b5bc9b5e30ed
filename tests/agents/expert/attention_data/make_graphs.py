"""Writes the analyze summaries (DataflowGraph JSON) that
tests/agents/expert/attention_templates_test.cpp reads: small attention references in several
spellings, analysed by the worker's own analyze(). Re-run after a change to analyze.py:
  .venv/bin/python tests/agents/expert/attention_data/make_graphs.py [case ...]"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "..", "tpu_nodes", "worker"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from maxkernel_worker.analyze import analyze  # noqa: E402

bf16, f32, i32 = jnp.bfloat16, jnp.float32, jnp.int32
S = jax.ShapeDtypeStruct


def causal_bhsd(q, k, v):
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=f32) * q.shape[-1] ** -0.5
    n = q.shape[2]
    s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), s, -jnp.inf)
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1),
                      v.astype(f32)).astype(q.dtype)


def gqa_repeat_bshd(q, k, v):
    g = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, g, axis=2), jnp.repeat(v, g, axis=2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(f32) / 8.0
    e = jnp.exp(s - s.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    return jnp.einsum("bhqk,bkhd->bqhd", p.astype(v.dtype), v)


def paged_decode(q, k_pages, v_pages, lengths, page_indices):
    ns, hq, d = q.shape
    hkv, _, page, _ = k_pages.shape
    t = page_indices.shape[1] * page
    k = k_pages[:, page_indices].reshape(hkv, ns, t, d)
    v = v_pages[:, page_indices].reshape(hkv, ns, t, d)
    s = jnp.einsum("bngd,nbtd->bngt", q.reshape(ns, hkv, hq // hkv, d), k,
                   preferred_element_type=f32)
    s = jnp.where((jnp.arange(t)[None, :] < lengths[:, None])[:, None, None, :], s, -jnp.inf)
    o = jnp.einsum("bngt,nbtd->bngd", jax.nn.softmax(s, axis=-1), v.astype(f32))
    return o.reshape(ns, hq, d).astype(q.dtype)


def two_terms_projected(q_nope, q_pe, latent, k_pe, w_uv):
    s = (jnp.einsum("bhc,blc->bhl", q_nope, latent, preferred_element_type=f32)
         + jnp.einsum("bhr,blr->bhl", q_pe, k_pe, preferred_element_type=f32)) * 0.1
    o = jnp.einsum("bhl,blc->bhc", jax.nn.softmax(s, axis=-1), latent.astype(f32))
    return jnp.einsum("bhc,chd->bhd", o, w_uv.astype(f32)).astype(bf16)


def mla_absorb_scale(q_nope, q_pe, latent, k_pe, w_uk, w_uv):
    # MLA decode in absorb form; the scale reads the no-RoPE dim only W_UK's product sees
    q_lat = jnp.einsum("bhn,hnc->bhc", q_nope, w_uk, preferred_element_type=f32)
    s = (jnp.einsum("bhc,blc->bhl", q_lat, latent.astype(f32))
         + jnp.einsum("bhr,blr->bhl", q_pe, k_pe, preferred_element_type=f32))
    s = s * (q_nope.shape[-1] + q_pe.shape[-1]) ** -0.5
    o = jnp.einsum("bhl,blc->bhc", jax.nn.softmax(s, axis=-1), latent.astype(f32))
    return jnp.einsum("bhc,hcd->bhd", o, w_uv.astype(f32)).astype(bf16)


def one_arange_causal(q, k, v):
    pos = jnp.arange(q.shape[2])
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=f32) / 8.0
    s = jnp.where(pos[:, None] >= pos[None, :], s, -jnp.inf)
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v.astype(f32))


def softmax_of_matmul(x, w):
    return jax.nn.softmax(x @ w, axis=-1)


CASES = {
    "causal_bhsd": (causal_bhsd, [S((2, 4, 256, 128), bf16)] * 3, ()),
    "gqa_repeat_bshd": (gqa_repeat_bshd, [S((2, 128, 8, 128), bf16), S((2, 128, 2, 128), bf16),
                                          S((2, 128, 2, 128), bf16)], ()),
    "paged_decode": (paged_decode, [S((4, 8, 128), bf16), S((2, 64, 16, 128), bf16),
                                    S((2, 64, 16, 128), bf16), S((4,), i32), S((4, 16), i32)],
                     ()),
    "two_terms_projected": (two_terms_projected,
                            [S((4, 16, 256), bf16), S((4, 16, 64), bf16), S((4, 512, 256), bf16),
                             S((4, 512, 64), bf16), S((256, 16, 128), bf16)], ()),
    "softmax_of_matmul": (softmax_of_matmul, [S((128, 256), f32), S((256, 512), f32)], ()),
    "mla_absorb_scale": (mla_absorb_scale,
                         [S((4, 16, 128), bf16), S((4, 16, 64), bf16), S((4, 512, 256), bf16),
                          S((4, 512, 64), bf16), S((16, 128, 256), bf16),
                          S((16, 256, 128), bf16)], ()),
    "one_arange_causal": (one_arange_causal, [S((1, 2, 256, 128), bf16)] * 3, ()),
}

if __name__ == "__main__":
    only = set(sys.argv[1:])   # case names (default: all)
    for name, (fn, args, static) in CASES.items():
        if only and name not in only:
            continue
        g = analyze(fn, args, static)
        with open(os.path.join(HERE, name + ".json"), "w") as f:
            json.dump(g, f, indent=1, sort_keys=True)
            f.write("\n")
        print("wrote", name)
