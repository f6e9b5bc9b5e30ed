"""The matmul and rowwise templates of the expert brain end to end: small native specs whose
references spell a matmul with an epilogue in different ways (einsum, @, jnp.dot,
lax.dot_general with a transposed weight or a transposed lhs, int8 weights cast before the
dot, batch dims, bias + gelu + row softmax, cross-entropy against labels) and row-wise
chains (layernorm with weight and bias, log-softmax) go through the built `maxkernel
template`, and the rendered kernel through `maxkernel check` (lowered for TPU, tested in
interpret mode against the reference). References the generator cannot express are refused."""
import json

from template_cli import needs_binary, run, template_and_check, write_spec

pytestmark = needs_binary


def summary(matched, family):
    return next(m["summary"] for m in matched["matches"] if m["template"] == family)


XW = ["{name: x, shape: [M, K], dtype: bfloat16}", "{name: w, shape: [K, N], dtype: bfloat16}"]


def test_einsum_bias_gelu_row_softmax(tmp_path):
    spec = write_spec(tmp_path, "einsum_softmax", "{M: 64, K: 256, N: 256}",
                      XW + ["{name: b, shape: [N], dtype: bfloat16}"], """
        import jax, jax.numpy as jnp

        def reference(x, w, b):
            y = jnp.einsum("mk,kn->mn", x, w, preferred_element_type=jnp.float32)
            y = jax.nn.gelu(y + b.astype(jnp.float32), approximate=False)
            return jax.nn.softmax(y, axis=-1).astype(x.dtype)
        """)
    matched, _, source = template_and_check(tmp_path, spec, "matmul",
                                            {"block_m": 32, "block_k": 128, "block_n": 128})
    # the softmax needs whole rows: N is not tiled, K is
    assert "in row mode" in summary(matched, "matmul")
    assert "jax.lax.erf(" in source


def test_reshaped_activations_transposed_weight_residual_relu_n_major(tmp_path):
    spec = write_spec(tmp_path, "at_wt", "{B: 2, S: 64, K: 256, N: 256}",
                      ["{name: x, shape: [B, S, K], dtype: bfloat16}",
                       "{name: w, shape: [N, K], dtype: bfloat16}",
                       "{name: r, shape: [B, S, N], dtype: bfloat16}"], """
        import jax.numpy as jnp

        def reference(x, w, r):
            b, s, k = x.shape
            y = (x.reshape(-1, k) @ w.T).astype(jnp.float32).reshape(b, s, -1)
            return jnp.maximum(y + r.astype(jnp.float32), 0.0).astype(jnp.bfloat16)
        """)
    matched, _, _ = template_and_check(tmp_path, spec, "matmul",
                                       {"block_m": 64, "block_n": 128, "block_k": 128,
                                        "grid_order": "n_major"})
    # rows are B*S, the weight is read transposed in place
    assert "M=128" in summary(matched, "matmul")
    assert "(mk nk" in summary(matched, "matmul") and "tile mode" in summary(matched, "matmul")


def test_dot_general_transposed_lhs_int8_weight_scales(tmp_path):
    spec = write_spec(tmp_path, "int8_t", "{M: 64, K: 256, N: 256}",
                      ["{name: xt, shape: [K, M], dtype: bfloat16}",
                       "{name: wq, shape: [K, N], dtype: int8, generator: {randint: {low: -100, high: 100}}}",
                       "{name: scale, shape: [N], dtype: float32, generator: {uniform: {low: 0.001, high: 0.01}}}"],
                      """
        import jax, jax.numpy as jnp

        def reference(xt, wq, scale):
            y = jax.lax.dot_general(xt, wq.astype(jnp.bfloat16), (((0,), (0,)), ((), ())),
                                    preferred_element_type=jnp.float32)
            return (y * scale[None, :]).astype(jnp.bfloat16)
        """)
    matched, _, source = template_and_check(tmp_path, spec, "matmul",
                                            {"block_m": 64, "block_n": 128, "block_k": 128})
    assert "(km kn" in summary(matched, "matmul")
    assert '"casts":[[],["bfloat16"]]' in source


def test_batched_einsum_transposed_output_scalar_scale(tmp_path):
    spec = write_spec(tmp_path, "bmm", "{B: 2, M: 256, K: 128, N: 64}",
                      ["{name: a, shape: [B, M, K], dtype: float32}",
                       "{name: b, shape: [B, K, N], dtype: float32}",
                       "{name: alpha, shape: [], dtype: float32}"], """
        import jax, jax.numpy as jnp

        def reference(a, b, alpha):
            return jnp.tanh(jnp.einsum("bmk,bkn->bnm", a, b) * alpha)
        """)
    matched, result, _ = template_and_check(tmp_path, spec, "matmul",
                                            {"block_m": 32, "block_n": 128, "block_k": 128})
    # the transposed product is computed as b^T a^T: rows are N, columns M
    assert "B=2 M=64 N=256" in summary(matched, "matmul")
    assert "(km nk" in summary(matched, "matmul")


def test_heads_normalised_on_their_slices_of_a_wide_block(tmp_path):
    # a layer norm per 128-wide head with a per-head bias (ViT-22B's QK norm): two heads per
    # column block, each normalised on its own slice with its own bias and the shared scale
    spec = write_spec(tmp_path, "qknorm", "{M: 64, K: 256, H: 4, DH: 128}",
                      ["{name: x, shape: [M, K], dtype: bfloat16}",
                       "{name: w, shape: [K, H, DH], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.05}}}",
                       "{name: b, shape: [H, DH], dtype: bfloat16, generator: {normal: {mean: 0, std: 1.0}}}",
                       "{name: s, shape: [DH], dtype: bfloat16, generator: {normal: {mean: 1, std: 0.5}}}"],
                      """
        import jax, jax.numpy as jnp

        def reference(x, w, b, s):
            q = jnp.einsum("mk,khd->mhd", x, w, preferred_element_type=jnp.float32)
            q = q + b.astype(jnp.float32)
            mu = q.mean(axis=-1, keepdims=True)
            var = jnp.mean(jnp.square(q - mu), axis=-1, keepdims=True)
            return ((q - mu) * jax.lax.rsqrt(var + 1e-6) * s.astype(jnp.float32)).astype(x.dtype)
        """)
    matched, result, source = template_and_check(tmp_path, spec, "matmul",
                                                 {"block_m": 32, "block_n": 256, "block_k": 128})
    assert "in group mode" in summary(matched, "matmul")
    assert '"group_blocks":True' in source
    call = result["pallas_calls"][0]
    assert call["grid"] == [1, 2, 2, 2], call  # 4 heads in 2 column blocks of 2
    shapes = [o["block_shape"] for o in call["operands"]]
    assert [-1, 32, 256] in shapes and [-1, 1, 256] in shapes, shapes  # output, bias
    assert [-1, 1, 128] in shapes, shapes  # the scale: one head's, every block


def test_row_softmax_in_pieces_accumulated_in_the_f32_output(tmp_path):
    # an LM head's log-softmax with a temperature per row and a bias per column: the f32
    # output block is the accumulator, the dot runs in column slices and the epilogue on 32
    # rows at a time, each piece scaled by its own rows' temperatures
    spec = write_spec(tmp_path, "lm_rows", "{M: 128, K: 256, N: 512}",
                      ["{name: h, shape: [M, K], dtype: bfloat16}",
                       "{name: w, shape: [K, N], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.05}}}",
                       "{name: t, shape: [M], dtype: float32, generator: {uniform: {low: 0.5, high: 2.0}}}",
                       "{name: b, shape: [N], dtype: float32}"], """
        import jax, jax.numpy as jnp

        def reference(h, w, t, b):
            logits = jnp.dot(h, w, preferred_element_type=jnp.float32) / t[:, None] + b
            return jax.nn.log_softmax(logits, axis=-1)
        """)
    matched, _, source = template_and_check(tmp_path, spec, "matmul",
                                            {"block_m": 64, "block_k": 128, "epilogue_rows": 32,
                                             "dot_cols": 128})
    assert "in row mode" in summary(matched, "matmul")
    assert '"acc_in_out":True' in source
    assert '"epilogue_rows":32' in source and '"dot_cols":128' in source
    # at these sizes the defaults are whole blocks: no pieces written in
    _, _, whole = template_and_check(tmp_path, spec, "matmul", {"block_m": 64, "block_k": 128})
    assert '"epilogue_rows"' not in whole.split("PARAMS = ")[1].splitlines()[0]


def test_cross_entropy_streams_over_the_vocabulary(tmp_path):
    spec = write_spec(tmp_path, "ce", "{M: 64, K: 128, N: 512}",
                      ["{name: h, shape: [M, K], dtype: bfloat16}",
                       "{name: w, shape: [K, N], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.05}}}",
                       """{name: labels, shape: [M], dtype: int32, structural: true, generator: {code: "def generate(rng, shape, dtype, dims):\\n    return rng.integers(0, dims['N'], size=shape).astype(dtype)\\n"}}"""],
                      """
        import jax, jax.numpy as jnp

        def reference(h, w, labels):
            logits = jnp.dot(h, w, preferred_element_type=jnp.float32)
            lse = jax.nn.logsumexp(logits, axis=-1)
            return lse - jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
        """)
    matched, _, source = template_and_check(tmp_path, spec, "matmul",
                                            {"block_m": 32, "block_n": 128, "block_k": 128})
    assert "in stream mode" in summary(matched, "matmul")
    assert "def epilogue_step(" in source


def test_rowwise_layernorm_weight_bias(tmp_path):
    spec = write_spec(tmp_path, "ln", "{B: 2, S: 32, D: 256}",
                      ["{name: x, shape: [B, S, D], dtype: bfloat16}",
                       "{name: g, shape: [D], dtype: float32}",
                       "{name: beta, shape: [D], dtype: float32}",
                       "{name: eps, static: 1.0e-5}"], """
        import jax, jax.numpy as jnp

        def reference(x, g, beta, eps):
            x = x.astype(jnp.float32)
            mu = x.mean(-1, keepdims=True)
            var = jnp.var(x, axis=-1, keepdims=True)
            return ((x - mu) * jax.lax.rsqrt(var + eps) * g + beta).astype(jnp.bfloat16)
        """)
    matched, _, _ = template_and_check(tmp_path, spec, "rowwise", {"block_rows": 16})
    assert "row mode" in summary(matched, "rowwise")


def test_rowwise_log_softmax_streams_when_only_statistics(tmp_path):
    spec = write_spec(tmp_path, "lse_rows", "{R: 64, V: 1024}",
                      ["{name: z, shape: [R, V], dtype: float32}"], """
        import jax, jax.numpy as jnp

        def reference(z):
            return jax.scipy.special.logsumexp(z / 2.0, axis=-1)
        """)
    matched, _, _ = template_and_check(tmp_path, spec, "rowwise",
                                       {"block_rows": 32, "block_d": 256})
    assert "stream mode" in summary(matched, "rowwise")


def test_refuses_what_the_generator_cannot_express(tmp_path):
    cumsum = write_spec(tmp_path, "cumsum_mm", "{M: 64, K: 128, N: 256}", XW, """
        import jax.numpy as jnp

        def reference(x, w):
            return jnp.cumsum(x @ w, axis=-1)
        """)
    # groups of rows, not of columns: the pooled reduction runs along the lane axis only
    grouped = write_spec(tmp_path, "grouped_rows_max_mm", "{M: 64, K: 128, N: 256}", XW, """
        import jax.numpy as jnp

        def reference(x, w):
            y = (x @ w).astype(jnp.float32)
            return y.reshape(y.shape[0] // 4, 4, y.shape[1]).max(1)
        """)
    for spec in (cumsum, grouped):
        t = run("template", spec, "--json", "-")
        families = [m["template"] for m in json.loads(t.stdout).get("matches", [])] \
            if t.stdout.strip() else []
        assert "matmul" not in families and "rowwise" not in families, (spec, t.stdout)


def test_maxout_bias_reshape_max(tmp_path):
    # maxout: groups of 4 adjacent output columns reduced by max; the output is N // 4 wide
    spec = write_spec(tmp_path, "maxout4", "{M: 64, K: 128, N: 1024}",
                      XW + ["{name: b, shape: [N], dtype: bfloat16}"], """
        import jax.numpy as jnp

        def reference(x, w, b):
            m, n = x.shape[0], w.shape[1]
            z = jnp.dot(x, w, preferred_element_type=jnp.float32) + b
            return z.reshape(m, n // 4, 4).max(axis=-1).astype(x.dtype)
        """)
    matched, _, source = template_and_check(tmp_path, spec, "matmul",
                                            {"block_m": 32, "block_n": 512, "block_k": 128})
    assert "pooled by 4" in summary(matched, "matmul")
    assert "_member_major" in source


def test_maxout_spellings_reduce_max_and_sum(tmp_path):
    # lax.reduce_max over a 3-D view after einsum + relu (pairs), and a sum of groups of 8
    pairs = write_spec(tmp_path, "maxout2", "{M: 32, K: 128, N: 512}", XW, """
        import jax, jax.numpy as jnp

        def reference(x, w):
            y = jax.nn.relu(jnp.einsum("mk,kn->mn", x, w).astype(jnp.float32))
            v = jnp.reshape(y, (y.shape[0], y.shape[1] // 2, 2))
            return jax.lax.reduce_max(v, axes=(2,))
        """)
    matched, _, _ = template_and_check(tmp_path, pairs, "matmul",
                                       {"block_m": 32, "block_n": 256, "block_k": 128})
    assert "pooled by 2" in summary(matched, "matmul")
    eights = write_spec(tmp_path, "sumpool8", "{M: 32, K: 128, N: 2048}", XW, """
        import jax.numpy as jnp

        def reference(x, w):
            y = jnp.tanh(x.astype(jnp.float32) @ w.astype(jnp.float32))
            return jnp.sum(y.reshape(-1, y.shape[-1] // 8, 8), axis=2)
        """)
    matched, _, _ = template_and_check(tmp_path, eights, "matmul",
                                       {"block_m": 32, "block_n": 1024, "block_k": 128})
    assert "pooled by 8" in summary(matched, "matmul")


def test_gate_slices_of_two_contractions_lstm_cell(tmp_path):
    # An LSTM cell spelled with dot_general and einsum on [K, 4, N] weights:
    # gates[:, g] slices one member of the product's leading N factor; x and h contract over
    # different dims (K != N), so the two products run one after the other along K. The
    # weights are read in place (no member-major copy) and c comes in per column.
    spec = write_spec(tmp_path, "lstm_small", "{B: 32, K: 256, N: 128}",
                      ["{name: x, shape: [B, K], dtype: bfloat16}",
                       "{name: h, shape: [B, N], dtype: bfloat16}",
                       "{name: c, shape: [B, N], dtype: float32}",
                       "{name: w_ih, shape: [K, 4, N], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.05}}}",
                       "{name: w_hh, shape: [N, 4, N], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.05}}}",
                       "{name: bias, shape: [4, N], dtype: float32}"], """
        import jax, jax.numpy as jnp

        def reference(x, h, c, w_ih, w_hh, bias):
            dn = (((1,), (0,)), ((), ()))
            gates = (jax.lax.dot_general(x, w_ih, dn, preferred_element_type=jnp.float32)
                     + jnp.einsum("bm,mgn->bgn", h, w_hh, preferred_element_type=jnp.float32)
                     + bias[None])
            i, f, g, o = [gates[:, j, :] for j in range(4)]
            c_new = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            return (jax.nn.sigmoid(o) * jnp.tanh(c_new)).astype(h.dtype), c_new
        """)
    matched, _, source = template_and_check(tmp_path, spec, "matmul",
                                            {"block_m": 16, "block_n": 512, "block_k": 128})
    s = summary(matched, "matmul")
    assert "sliced into members by 4" in s and "2 contractions in turn" in s, s
    # the weights reach the kernel as they are (a free reshape), one BlockSpec per gate
    assert '"pool_outer":True' in source and "jnp.reshape(w_ih, (B, K[0], N))" in source
