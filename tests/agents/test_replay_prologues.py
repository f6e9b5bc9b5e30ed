"""End to end: an attention core preceded by a prologue the kernel does not compute (latent
projections, RMS norms, rotate-half RoPE through jnp.split) matches flash_attention with the
prologue replayed as jnp before the kernel. Two things the replay needs: which half of the
split each consumer reads (analyze's operandResults), and jnp.mean's divisor written as the
reduced dim's size, so the prologue stays right at the tester's reduced and ragged sizes."""
import json

import pytest

from template_cli import needs_binary, run, template_and_check, write_spec

pytestmark = needs_binary

# MLA-like: queries and keys each through a latent of C dims with an RMS norm over C (the
# tester reduces C, the last axis of w_dq, 512 -> 128; C is no other dim's size, so no
# block of the kernel pins it), rotate-half RoPE over the head dim
# (halves by jnp.split, the second negated), causal softmax attention.
REFERENCE = """
import jax
import jax.numpy as jnp

def rms_norm(x, weight, eps=1e-6):
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * weight.astype(jnp.float32)).astype(x.dtype)

def rope(x):
    seq_len, dim = x.shape[1], x.shape[-1]
    inv_freq = 1.0 / 10000.0 ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
    angles = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    angles = jnp.concatenate([angles, angles], axis=-1)[None, :, None, :]
    x32 = x.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    return (x32 * jnp.cos(angles) + jnp.concatenate([-x2, x1], axis=-1) * jnp.sin(angles)
            ).astype(x.dtype)

def reference(x, w_dq, g_q, w_uq, w_dk, g_k, w_uk, w_v):
    q = rope(jnp.einsum("bsc,chd->bshd", rms_norm(x @ w_dq, g_q), w_uq))
    k = rope(jnp.einsum("bsc,chd->bshd", rms_norm(x @ w_dk, g_k), w_uk))
    v = jnp.einsum("bse,ehd->bshd", x, w_v)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    s = s * q.shape[-1] ** -0.5
    seq_len = x.shape[1]
    causal = jnp.tril(jnp.ones((seq_len, seq_len), dtype=bool))
    p = jax.nn.softmax(jnp.where(causal, s, -jnp.inf), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v.astype(jnp.float32)).astype(x.dtype)
"""

INPUTS = [
    "{name: x, shape: [B, S, E], dtype: bfloat16}",
    "{name: w_dq, shape: [E, C], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.08}}}",
    "{name: g_q, shape: [C], dtype: bfloat16, generator: {normal: {mean: 1, std: 0.1}}}",
    "{name: w_uq, shape: [C, H, D], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.12}}}",
    "{name: w_dk, shape: [E, C], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.08}}}",
    "{name: g_k, shape: [C], dtype: bfloat16, generator: {normal: {mean: 1, std: 0.1}}}",
    "{name: w_uk, shape: [C, H, D], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.12}}}",
    "{name: w_v, shape: [E, H, D], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.08}}}",
]


def test_rmsnorm_rope_prologue_replayed_before_flash_attention(tmp_path):
    spec = write_spec(tmp_path, "norm_rope_attention",
                      "{B: 1, S: 256, E: 128, C: 512, H: 2, D: 128}", INPUTS, REFERENCE)
    matched, result, source = template_and_check(tmp_path, spec, "flash_attention",
                                                 {"block_q": 128, "block_k": 128})
    prologue = source.split("def workload(")[1].split("_flash(")[0]
    # both halves of the split are read, the second one negated
    assert "lax.split(" in prologue and "lax.neg(" in prologue, prologue
    # the mean's divisor is the latent's size at trace time, not 512.0
    assert "512.0" not in prologue, prologue

    # propose's tester runs at reduced and ragged sizes (C 512 -> 128)
    out = tmp_path / "propose"
    p = run("propose", spec, "--out", out, "--state-dir", tmp_path / "state",
            "--max-repairs", "0", "--json", "-", timeout=1200)
    report = json.loads(p.stdout)
    assert report["correct"] is True, (report.get("attempts"), p.stderr[-2000:])
    assert "flash_attention" in json.dumps(report["plan"]), report["plan"]


def test_mean_divisor_not_explained_by_sizes_stays_a_constant(tmp_path):
    # sum / 100.0 over a 512 dim is no mean: the replay keeps the constant (at reduced sizes
    # the reference divides by 100 too).
    reference = REFERENCE.replace(
        "jnp.mean(x32 * x32, axis=-1, keepdims=True)",
        "jnp.sum(x32 * x32, axis=-1, keepdims=True) / 100.0")
    spec = write_spec(tmp_path, "norm_rope_attention_sum",
                      "{B: 1, S: 256, E: 128, C: 512, H: 2, D: 128}", INPUTS, reference)
    _, _, source = template_and_check(tmp_path, spec, "flash_attention",
                                      {"block_q": 128, "block_k": 128})
    prologue = source.split("def workload(")[1].split("_flash(")[0]
    assert "100.0" in prologue, prologue
