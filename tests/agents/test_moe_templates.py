"""The expert brain's mixture-of-experts and fused-MLP templates (grouped_matmul, swiglu_mlp,
moe_ffn) end to end: references written in several styles are matched on their computation
by the built `maxkernel template`, and the kernel it renders passes `maxkernel check` (TPU
lowering + interpret-mode test against the reference); references of another family are
refused. Small shapes: interpret mode is slow."""
import json
import os
import pathlib
import subprocess
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("MAXKERNEL_BIN", ROOT / "build" / "cli" / "maxkernel"))

pytestmark = pytest.mark.skipif(not BIN.exists(), reason="maxkernel is not built")

GROUP_SIZES = """\
  - name: group_sizes
    shape: [G]
    dtype: int32
    structural: true
    generator:
      code: |
        import numpy as np
        def generate(rng, shape, dtype, dims):
            return rng.multinomial(dims["M"], rng.dirichlet(np.full(shape[0], 1.0)))
"""

EXPERT_IDS = ("  - {name: expert, shape: [M], dtype: int32, structural: true, "
              "generator: {randint: {low: 0, high: 4}}}\n")


def spec(name, dims, inputs, reference, tol="{atol: 1.0e-3, rtol: 1.0e-3}"):
    return (f"name: {name}\ndims: {dims}\ninputs:\n{inputs}reference: |\n"
            + textwrap.indent(textwrap.dedent(reference).strip() + "\n", "  ")
            + f"tolerance: {tol}\n")


def run(*args, timeout=600):
    return subprocess.run([str(BIN), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def template(path, out, name=None):
    extra = ["--name", name] if name else []
    return run("template", path, "--json", "-", "--out", out, *extra)


# name -> (spec text, the template that must be chosen)
MATCHING = {
    # jax.lax.ragged_dot_general with the weights transposed ([G, N, K]), f32
    "ragged_dot_general_transposed": (spec(
        "ragged_t", "{M: 128, K: 128, N: 256, G: 4}",
        "  - {name: x, shape: [M, K], dtype: float32}\n"
        "  - {name: w, shape: [G, N, K], dtype: float32}\n" + GROUP_SIZES,
        """
        import jax
        from jax import lax
        def reference(x, w, group_sizes):
            dn = lax.RaggedDotDimensionNumbers(dot_dimension_numbers=(([1], [2]), ([], [])),
                                               lhs_ragged_dimensions=[0], rhs_group_dimensions=[0])
            return lax.ragged_dot_general(x, w, group_sizes, dn)
        """), "grouped_matmul"),
    # rows in any order, weights gathered by expert id (jnp.take), bias + relu + scale after
    "take_weights_bias_relu": (spec(
        "take_relu", "{M: 128, K: 128, N: 256, G: 4}",
        EXPERT_IDS + "  - {name: x, shape: [M, K], dtype: float32}\n"
        "  - {name: w, shape: [G, K, N], dtype: float32}\n"
        "  - {name: b, shape: [N], dtype: float32}\n",
        """
        import jax, jax.numpy as jnp
        def reference(expert, x, w, b):
            sel = jnp.take(w, expert, axis=0)
            return jax.nn.relu(jnp.einsum("mk,mkn->mn", x, sel) + b) * 0.5
        """), "grouped_matmul"),
    # every expert densely in bf16 -> f32, masked by a hand-written one-hot and summed
    "dense_all_experts_onehot_sum": (spec(
        "onehot_sum", "{M: 128, K: 128, N: 256, G: 4}",
        "  - {name: x, shape: [M, K], dtype: bfloat16}\n"
        "  - {name: w, shape: [G, K, N], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.05}}}\n"
        + EXPERT_IDS,
        """
        import jax.numpy as jnp
        def reference(x, w, expert):
            y = jnp.einsum("mk,gkn->mgn", x.astype(jnp.float32), w.astype(jnp.float32))
            mask = (expert[:, None] == jnp.arange(w.shape[0])[None, :]).astype(jnp.float32)
            return jnp.sum(y * mask[:, :, None], axis=1).astype(jnp.bfloat16)
        """, "{atol: 2.0e-2, rtol: 2.0e-2}"), "grouped_matmul"),
    # sorted rows: ids from the group sizes (searchsorted), jax.nn.one_hot contraction
    "searchsorted_one_hot_einsum": (spec(
        "searchsorted", "{M: 128, K: 128, N: 256, G: 4}",
        "  - {name: x, shape: [M, K], dtype: float32}\n" + GROUP_SIZES
        + "  - {name: w, shape: [G, N, K], dtype: float32}\n",
        """
        import jax, jax.numpy as jnp
        def reference(x, group_sizes, w):
            ids = jnp.searchsorted(jnp.cumsum(group_sizes), jnp.arange(x.shape[0]), side="right")
            oh = jax.nn.one_hot(ids, w.shape[0], dtype=x.dtype)
            return jnp.einsum("mgn,mg->mn", jnp.einsum("mk,gnk->mgn", x, w), oh)
        """), "grouped_matmul"),
    # a Python loop over the experts, rows masked by their group's range
    "segment_loop_unrolled": (spec(
        "segment_loop", "{M: 128, K: 128, N: 256, G: 4}",
        "  - {name: x, shape: [M, K], dtype: float32}\n"
        "  - {name: w, shape: [G, K, N], dtype: float32}\n" + GROUP_SIZES,
        """
        import jax.numpy as jnp
        def reference(x, w, group_sizes):
            ends = jnp.cumsum(group_sizes)
            starts = ends - group_sizes
            rows = jnp.arange(x.shape[0])[:, None]
            out = jnp.zeros((x.shape[0], w.shape[2]), jnp.float32)
            for g in range(w.shape[0]):
                mask = (rows >= starts[g]) & (rows < ends[g])
                out = out + jnp.where(mask, x @ w[g], 0.0)
            return out
        """), "grouped_matmul"),
    # a sparse MoE (MaxText / megablox style): argsort the routed rows, ragged_dot gate / up /
    # down, weighted scatter-add back to the tokens
    "sparse_moe_argsort_ragged_dots": (spec(
        "sparse_moe", "{T: 32, E: 128, F: 256, X: 4}",
        "  - {name: x, shape: [T, E], dtype: float32}\n"
        "  - {name: w_router, shape: [E, X], dtype: float32, generator: {normal: {mean: 0, std: 0.1}}}\n"
        "  - {name: w_gate, shape: [X, E, F], dtype: float32, generator: {normal: {mean: 0, std: 0.05}}}\n"
        "  - {name: w_up, shape: [X, E, F], dtype: float32, generator: {normal: {mean: 0, std: 0.05}}}\n"
        "  - {name: w_down, shape: [X, F, E], dtype: float32, generator: {normal: {mean: 0, std: 0.05}}}\n",
        """
        import jax, jax.numpy as jnp
        def reference(x, w_router, w_gate, w_up, w_down):
            w, idx = jax.lax.top_k(x @ w_router, 2)
            w = jax.nn.softmax(w, axis=-1)
            flat = idx.reshape(-1)
            order = jnp.argsort(flat)
            tok = order // 2
            sizes = jnp.bincount(flat, length=w_router.shape[1])
            xs = x[tok]
            g = jax.lax.ragged_dot(xs, w_gate, sizes)
            u = jax.lax.ragged_dot(xs, w_up, sizes)
            y = jax.lax.ragged_dot(jax.nn.silu(g) * u, w_down, sizes)
            return jnp.zeros_like(x).at[tok].add(y * w.reshape(-1)[order][:, None])
        """), "grouped_matmul"),
    # SwiGLU front half, g * sigmoid(g) by hand, f32 products cast to bf16
    "swiglu_sigmoid_by_hand": (spec(
        "swiglu_sig", "{M: 128, K: 128, F: 256}",
        "  - {name: x, shape: [M, K], dtype: bfloat16}\n"
        "  - {name: wg, shape: [K, F], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.05}}}\n"
        "  - {name: wu, shape: [K, F], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.05}}}\n",
        """
        import jax, jax.numpy as jnp
        def reference(x, wg, wu):
            g = jnp.dot(x, wg, preferred_element_type=jnp.float32)
            u = jnp.dot(x, wu, preferred_element_type=jnp.float32)
            return (g * jax.nn.sigmoid(g) * u).astype(x.dtype)
        """, "{atol: 1.0e-2, rtol: 1.0e-2}"), "swiglu_mlp"),
    # GeGLU with torch.nn.Linear weights (x @ W.T), 3-D tokens, down projection
    "geglu_transposed_weights": (spec(
        "geglu_t", "{B: 2, S: 32, E: 128, F: 256}",
        "  - {name: x, shape: [B, S, E], dtype: float32}\n"
        "  - {name: w1, shape: [F, E], dtype: float32, generator: {normal: {mean: 0, std: 0.05}}}\n"
        "  - {name: w3, shape: [F, E], dtype: float32, generator: {normal: {mean: 0, std: 0.05}}}\n"
        "  - {name: w2, shape: [E, F], dtype: float32, generator: {normal: {mean: 0, std: 0.05}}}\n",
        """
        import jax
        def reference(x, w1, w3, w2):
            return (jax.nn.gelu(x @ w1.T) * (x @ w3.T)) @ w2.T
        """), "swiglu_mlp"),
    # bf16 SwiGLU MLP in einsums (the reference rounds every step of silu in bf16)
    "swiglu_bf16_einsum_down": (spec(
        "swiglu_bf16", "{B: 2, S: 64, E: 256, F: 256}",
        "  - {name: x, shape: [B, S, E], dtype: bfloat16}\n"
        "  - {name: w_gate, shape: [E, F], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.02}}}\n"
        "  - {name: w_up, shape: [E, F], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.02}}}\n"
        "  - {name: w_down, shape: [F, E], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.02}}}\n",
        """
        import jax, jax.numpy as jnp
        def reference(x, w_gate, w_up, w_down):
            gate = jnp.einsum("bse,ef->bsf", x, w_gate)
            up = jnp.einsum("bse,ef->bsf", x, w_up)
            return jnp.einsum("bsf,fe->bse", jax.nn.silu(gate) * up, w_down)
        """), "swiglu_mlp"),
    # one fused [E, 2F] gate|up weight sliced in halves, silu written out, bias after down
    "fused_gate_up_slices_bias": (spec(
        "fused_gu", "{M: 64, E: 128, F: 256, F2: 512}",
        "  - {name: x, shape: [M, E], dtype: float32}\n"
        "  - {name: w_gu, shape: [E, F2], dtype: float32, generator: {normal: {mean: 0, std: 0.05}}}\n"
        "  - {name: w_d, shape: [F, E], dtype: float32, generator: {normal: {mean: 0, std: 0.05}}}\n"
        "  - {name: b_d, shape: [E], dtype: float32}\n",
        """
        import jax.numpy as jnp
        def reference(x, w_gu, w_d, b_d):
            gu = jnp.einsum("me,ef->mf", x, w_gu)
            f = gu.shape[-1] // 2
            gate, up = gu[:, :f], gu[:, f:]
            h = gate / (1.0 + jnp.exp(-gate)) * up
            return jnp.einsum("mf,fe->me", h, w_d) + b_d
        """), "swiglu_mlp"),
    # Mixtral's dense MoE path in bf16 (router top-2 then softmax, combine by one-hot)
    "moe_dense_top2_softmax": (spec(
        "moe_dense", "{B: 2, S: 16, E: 128, F: 256, X: 4}",
        "  - {name: x, shape: [B, S, E], dtype: bfloat16}\n"
        "  - {name: w_router, shape: [E, X], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.1}}}\n"
        "  - {name: w_gate, shape: [X, E, F], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.05}}}\n"
        "  - {name: w_up, shape: [X, E, F], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.05}}}\n"
        "  - {name: w_down, shape: [X, F, E], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.05}}}\n"
        "  - {name: top_k, static: 2}\n",
        """
        import jax, jax.numpy as jnp
        def reference(x, w_router, w_gate, w_up, w_down, top_k):
            logits = jnp.einsum("bse,ex->bsx", x, w_router, preferred_element_type=jnp.float32)
            top_logits, top_experts = jax.lax.top_k(logits, top_k)
            w = jax.nn.softmax(top_logits, axis=-1)
            combine = jnp.sum(jax.nn.one_hot(top_experts, w_router.shape[1]) * w[..., None], axis=-2)
            gate = jnp.einsum("bse,xef->bsxf", x, w_gate)
            up = jnp.einsum("bse,xef->bsxf", x, w_up)
            y = jnp.einsum("bsxf,xfe->bsxe", jax.nn.silu(gate) * up, w_down)
            return jnp.einsum("bsxe,bsx->bse", y.astype(jnp.float32), combine).astype(x.dtype)
        """, "{atol: 1.0e-3, rtol: 1.0e-2}"), "moe_ffn"),
    # HF-style routing (softmax, top-2, renormalise, scatter), torch weight layouts, 2-D tokens
    "moe_hf_routing_transposed": (spec(
        "moe_hf", "{T: 32, E: 128, F: 256, X: 4}",
        "  - {name: hidden, shape: [T, E], dtype: float32}\n"
        "  - {name: router, shape: [X, E], dtype: float32, generator: {normal: {mean: 0, std: 0.1}}}\n"
        "  - {name: w1, shape: [X, F, E], dtype: float32, generator: {normal: {mean: 0, std: 0.05}}}\n"
        "  - {name: w3, shape: [X, F, E], dtype: float32, generator: {normal: {mean: 0, std: 0.05}}}\n"
        "  - {name: w2, shape: [X, E, F], dtype: float32, generator: {normal: {mean: 0, std: 0.05}}}\n",
        """
        import jax, jax.numpy as jnp
        def reference(hidden, router, w1, w3, w2):
            probs = jax.nn.softmax(hidden @ router.T, axis=-1)
            w, idx = jax.lax.top_k(probs, 2)
            w = w / jnp.sum(w, axis=-1, keepdims=True)
            rows = jnp.arange(hidden.shape[0])[:, None]
            combine = jnp.zeros_like(probs).at[rows, idx].set(w)
            g = jnp.einsum("te,xfe->txf", hidden, w1)
            u = jnp.einsum("te,xfe->txf", hidden, w3)
            y = jnp.einsum("txf,xef->txe", jax.nn.silu(g) * u, w2)
            return jnp.einsum("txe,tx->te", y, combine)
        """), "moe_ffn"),
}


@pytest.mark.parametrize("case", sorted(MATCHING))
def test_matched_and_correct(case, tmp_path):
    text, family = MATCHING[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(text)
    kernel = tmp_path / "kernel.py"
    t = template(path, kernel)
    assert t.returncode == 0, t.stderr
    chosen = json.loads(t.stdout)
    assert chosen["template"] == family, chosen["matches"]
    source = kernel.read_text()
    assert "pallas_call" in source and "def workload(" in source
    assert "interpret" not in source  # interpret mode is switched on from outside
    c = run("check", path, kernel, "--json", "-")
    result = json.loads(c.stdout)
    assert c.returncode == 0 and result["correct"], c.stderr
    assert result["pallas_calls"], "the kernel's work runs in Pallas"


REFUSED = {
    # a plain activation MLP: no gate of two projections
    "swiglu_mlp": spec(
        "plain_mlp", "{M: 64, E: 128, F: 256}",
        "  - {name: x, shape: [M, E], dtype: float32}\n"
        "  - {name: w1, shape: [E, F], dtype: float32}\n"
        "  - {name: w2, shape: [F, E], dtype: float32}\n",
        """
        import jax
        def reference(x, w1, w2):
            return jax.nn.silu(x @ w1) @ w2
        """),
    # one weight matrix for every row: nothing grouped
    "grouped_matmul": spec(
        "plain_matmul", "{M: 64, K: 128, N: 256}",
        "  - {name: x, shape: [M, K], dtype: float32}\n"
        "  - {name: w, shape: [K, N], dtype: float32}\n",
        """
        import jax.numpy as jnp
        def reference(x, w):
            return jnp.tanh(x @ w)
        """),
    # dense MoE whose experts are ungated relu MLPs mixed by softmax weights
    "moe_ffn": spec(
        "relu_experts", "{T: 32, E: 128, F: 256, X: 4}",
        "  - {name: hidden, shape: [T, E], dtype: float32}\n"
        "  - {name: router, shape: [E, X], dtype: float32}\n"
        "  - {name: w1, shape: [X, E, F], dtype: float32}\n"
        "  - {name: w2, shape: [X, F, E], dtype: float32}\n",
        """
        import jax, jax.numpy as jnp
        def reference(hidden, router, w1, w2):
            probs = jax.nn.softmax(hidden @ router, axis=-1)
            h = jax.nn.relu(jnp.einsum("te,xef->txf", hidden, w1))
            return jnp.einsum("txe,tx->te", jnp.einsum("txf,xfe->txe", h, w2), probs)
        """),
}


@pytest.mark.parametrize("family", sorted(REFUSED))
def test_other_families_refused(family, tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(REFUSED[family])
    t = template(path, tmp_path / "kernel.py", name=family)
    assert t.returncode == 2, t.stdout + t.stderr
    assert family not in [m["template"] for m in json.loads(t.stdout)["matches"]]
    assert not (tmp_path / "kernel.py").exists()


def test_rendering_is_deterministic_and_params_change_the_kernel(tmp_path):
    text, _ = MATCHING["ragged_dot_general_transposed"]
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    a, b, c = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    assert template(path, a).returncode == 0
    assert template(path, b).returncode == 0
    assert a.read_text() == b.read_text()
    r = run("template", path, "--out", c, "--params", '{"block_m": 64}')
    assert r.returncode == 0, r.stderr
    assert "BLOCK_M = 64" in c.read_text() and c.read_text() != a.read_text()
