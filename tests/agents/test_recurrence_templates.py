"""The expert brain's chunked recurrences and backward passes end to end: small native specs
whose references write the same computation in different ways go through the built
`maxkernel template`, and the rendered kernel through `maxkernel check` (lowered for TPU,
tested in interpret mode against the reference). Families: retention (RetNet: torchscale's
parallel form with row normalisation / a plain decay mask in another layout), chunked_recurrence
(Mamba-2 SSD: the paper's chunked einsums / head-major matmuls with an unrolled
state loop), matmul_backward (jax.vjp /
explicit einsums over a 3-D activation), attention_backward (jax.vjp of a causal einsum
attention / jax.grad of a hand-written unmasked one in [B, S, H, D]). Each family also refuses
a reference that is close to it but not of it."""
import json

from template_cli import matches, needs_binary, run, template_and_check, write_spec

pytestmark = needs_binary


# ---------------------------------------------------------------------------- retention

QKV = ["{name: q, shape: [B, H, S, D], dtype: bfloat16}",
       "{name: k, shape: [B, H, S, D], dtype: bfloat16}",
       "{name: v, shape: [B, H, S, D], dtype: bfloat16}"]


def test_retention_torchscale_parallel_form(tmp_path):
    spec = write_spec(tmp_path, "retnet", "{B: 1, H: 2, S: 256, D: 128}", QKV, """
        import jax.numpy as jnp

        def reference(q, k, v):
            num_heads, seq_len, head_dim = q.shape[1], q.shape[2], q.shape[3]
            log_gamma = jnp.log(1.0 - 2.0 ** (-5.0 - jnp.arange(num_heads, dtype=jnp.float32)))
            n = jnp.arange(seq_len)[:, None]
            m = jnp.arange(seq_len)[None, :]
            distance = jnp.maximum(n - m, 0).astype(jnp.float32)
            decay = jnp.where(n >= m, jnp.exp(distance[None] * log_gamma[:, None, None]), 0.0)
            decay = decay / jnp.sqrt(jnp.sum(decay, axis=-1, keepdims=True))
            scores = jnp.einsum("bhnd,bhmd->bhnm", q, k, preferred_element_type=jnp.float32)
            scores = scores * head_dim ** -0.5 * decay
            scores = scores / jnp.maximum(jnp.sum(jnp.abs(scores), axis=-1, keepdims=True), 1.0)
            out = jnp.einsum("bhnm,bhmd->bhnd", scores, v.astype(jnp.float32))
            return out.astype(q.dtype)
        """)
    matched, result, source = template_and_check(tmp_path, spec, "retention",
                                                 {"block_q": 128, "block_k": 128})
    summary = matched["matches"][0]["summary"]
    assert "row-normalised" in summary and "causal" in summary, summary
    assert 'ROW_SCALE = "div"' in source and "CAUSAL_SKIP = True" in source
    # the [S, S] decay is built per tile from replayed position vectors, never passed in
    assert "def row_seeds(q, k, v):" in source
    assert len(result["pallas_calls"]) == 1


def test_retention_plain_decay_other_layout(tmp_path):
    inputs = ["{name: q, shape: [B, S, H, D], dtype: bfloat16}",
              "{name: k, shape: [B, S, H, D], dtype: bfloat16}",
              "{name: v, shape: [B, S, H, D], dtype: bfloat16}"]
    spec = write_spec(tmp_path, "decay_bshd", "{B: 1, S: 256, H: 2, D: 128}", inputs, """
        import jax
        import jax.numpy as jnp

        def reference(q, k, v):
            seq_len, heads, dim = q.shape[1], q.shape[2], q.shape[3]
            gamma = 1.0 - jnp.exp2(-5.0 - jnp.arange(heads, dtype=jnp.float32))
            idx = jnp.arange(seq_len)
            dist = (idx[:, None] - idx[None, :]).astype(jnp.float32)
            mask = jnp.tril(jnp.ones((seq_len, seq_len), dtype=bool))
            decay = jnp.where(mask[None], gamma[:, None, None] ** jnp.where(mask, dist, 0.0), 0.0)
            s = jax.lax.dot_general(q.astype(jnp.float32) / jnp.sqrt(dim * 1.0),
                                    k.astype(jnp.float32),
                                    (((3,), (3,)), ((0, 2), (0, 2))))      # [B, H, S, S]
            w = s * decay[None]
            out = jnp.einsum("bhnm,bmhd->bnhd", w, v.astype(jnp.float32))
            return out.astype(q.dtype)
        """)
    matched, result, source = template_and_check(tmp_path, spec, "retention",
                                                 {"block_q": 128, "block_k": 128})
    assert "causal" in matched["matches"][0]["summary"]
    assert "ROW_SCALE = None" in source


def test_retention_refuses_softmax_attention(tmp_path):
    spec = write_spec(tmp_path, "softmax_attn", "{B: 1, H: 2, S: 256, D: 128}", QKV, """
        import jax, jax.numpy as jnp

        def reference(q, k, v):
            s = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32)
            p = jax.nn.softmax(s * 0.088, axis=-1)
            return jnp.einsum("bhqk,bhkd->bhqd", p, v.astype(jnp.float32)).astype(q.dtype)
        """)
    found = matches(spec)
    assert "retention" not in found and "attention_backward" not in found, found


# ---------------------------------------------------------------------------- SSD

SSD_INPUTS = ["{name: x, shape: [BATCH, SEQ, H, P], dtype: bfloat16}",
              "{name: dt, shape: [BATCH, SEQ, H], dtype: float32, generator: {uniform: {low: 0.001, high: 0.1}}}",
              "{name: A, shape: [H], dtype: float32, generator: {uniform: {low: -16.0, high: -1.0}}}",
              "{name: B, shape: [BATCH, SEQ, N], dtype: bfloat16}",
              "{name: C, shape: [BATCH, SEQ, N], dtype: bfloat16}",
              "{name: D, shape: [H], dtype: float32, generator: {normal: {mean: 1, std: 0.1}}}"]


def test_ssd_chunked_einsums(tmp_path):
    spec = write_spec(tmp_path, "ssd_chunked", "{BATCH: 1, SEQ: 256, H: 2, P: 64, N: 128}",
                      SSD_INPUTS + ["{name: chunk_size, static: 64}"], """
        import math
        import jax.numpy as jnp

        def segsum(x):
            length = x.shape[-1]
            cumsum = jnp.cumsum(x, axis=-1)
            diff = cumsum[..., :, None] - cumsum[..., None, :]
            return jnp.where(jnp.tril(jnp.ones((length, length), dtype=bool)), diff, -jnp.inf)

        def reference(x, dt, A, B, C, D, chunk_size):
            batch, seq_len, num_heads, head_dim = x.shape
            state = B.shape[-1]
            length = math.gcd(seq_len, chunk_size)
            chunks = seq_len // length
            X = (x.astype(jnp.float32) * dt[..., None]).reshape(batch, chunks, length, num_heads, head_dim)
            A_dt = (A * dt).reshape(batch, chunks, length, num_heads).transpose(0, 3, 1, 2)
            Bc = B.astype(jnp.float32).reshape(batch, chunks, length, state)
            Cc = C.astype(jnp.float32).reshape(batch, chunks, length, state)
            A_cumsum = jnp.cumsum(A_dt, axis=-1)
            L = jnp.exp(segsum(A_dt))
            Y_diag = jnp.einsum("bcln,bcsn,bhcls,bcshp->bclhp", Cc, Bc, L, X)
            decay_states = jnp.exp(A_cumsum[..., -1:] - A_cumsum)
            states = jnp.einsum("bcln,bhcl,bclhp->bchpn", Bc, decay_states, X)
            states = jnp.concatenate([jnp.zeros_like(states[:, :1]), states], axis=1)
            decay_chunk = jnp.exp(segsum(jnp.pad(A_cumsum[..., -1], ((0, 0), (0, 0), (1, 0)))))
            states = jnp.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)[:, :-1]
            Y_off = jnp.einsum("bcln,bchpn,bhcl->bclhp", Cc, states, jnp.exp(A_cumsum))
            y = (Y_diag + Y_off).reshape(batch, seq_len, num_heads, head_dim)
            return (y + x.astype(jnp.float32) * D[:, None]).astype(x.dtype)
        """)
    matched, result, source = template_and_check(tmp_path, spec, "chunked_recurrence",
                                                 {"block_t": 128, "block_h": 2})
    summary = matched["matches"][0]["summary"]
    assert "x=in0 dt=in1 A=in2 B=in3 C=in4 D=in5" in summary, summary
    # the kernel's chunk (128) differs from the reference's (64): the scan does not care
    assert "HAS_D = True" in source
    # x [b, t, h, p] is read in place: blocks of [1, chunk, 2 heads * 64] in and out
    assert '"x_layout":"in_place"' in source and '"mxu_dtype":"split_bf16"' in source
    ops = result["pallas_calls"][0]["operands"]
    assert [o["block_shape"] for o in ops if o["role"] == "output"] == [[1, 128, 128]], ops
    # the same kernel with head-major copies of x and y, and f32 dots
    _, result, source = template_and_check(tmp_path, spec, "chunked_recurrence",
                                           {"block_t": 128, "block_h": 2,
                                            "x_layout": "transposed", "mxu_dtype": "float32"})
    ops = result["pallas_calls"][0]["operands"]
    assert [o["block_shape"] for o in ops if o["role"] == "output"] == [[1, 2, 128, 64]], ops


def test_ssd_head_major_matmuls(tmp_path):
    # Another spelling: x [b, h, t, p] and dt [b, h, t] (head-major), jnp.matmul and swapaxes
    # instead of einsum, the states carried by an unrolled Python loop, B and C swapped in
    # the argument list.
    inputs = ["{name: x, shape: [BATCH, H, SEQ, P], dtype: bfloat16}",
              "{name: dt, shape: [BATCH, H, SEQ], dtype: float32, generator: {uniform: {low: 0.001, high: 0.1}}}",
              SSD_INPUTS[2],
              "{name: C, shape: [BATCH, SEQ, N], dtype: bfloat16}",
              "{name: B, shape: [BATCH, SEQ, N], dtype: bfloat16}",
              SSD_INPUTS[5]]
    spec = write_spec(tmp_path, "ssd_head_major", "{BATCH: 1, SEQ: 256, H: 2, P: 64, N: 128}",
                      inputs, """
        import jax.numpy as jnp

        def reference(x, dt, A, C, B, D):
            f32 = jnp.float32
            b, h, t, p = x.shape
            n = B.shape[-1]
            size = 64
            c = t // size
            acum = jnp.cumsum((dt * A[None, :, None]).reshape(b, h, c, size), axis=-1)
            xs = (x.astype(f32) * dt[..., None]).reshape(b, h, c, size, p)
            Bc = B.astype(f32).reshape(b, c, size, n)
            Cc = C.astype(f32).reshape(b, c, size, n)
            idx = jnp.arange(size)
            seg = acum[..., :, None] - acum[..., None, :]
            decay = jnp.exp(jnp.where(idx[:, None] >= idx[None, :], seg, -jnp.inf))
            G = jnp.matmul(Cc, jnp.swapaxes(Bc, -1, -2))                    # [b, c, l, s]
            y_diag = jnp.matmul(G[:, None] * decay, xs)                      # [b, h, c, l, p]
            w = jnp.exp(acum[..., -1:] - acum)
            st = jnp.matmul(jnp.swapaxes(xs * w[..., None], -1, -2), Bc[:, None])   # [b, h, c, p, n]
            carry = jnp.zeros((b, h, p, n), f32)
            prev = []
            for ci in range(c):
                prev.append(carry)
                carry = carry * jnp.exp(acum[:, :, ci, -1])[..., None, None] + st[:, :, ci]
            prev = jnp.stack(prev, axis=2)
            y_off = jnp.matmul(Cc[:, None], jnp.swapaxes(prev, -1, -2)) * jnp.exp(acum)[..., None]
            y = (y_diag + y_off).reshape(b, h, t, p) + x.astype(f32) * D[None, :, None, None]
            return y.astype(x.dtype)
        """)
    matched, result, source = template_and_check(tmp_path, spec, "chunked_recurrence",
                                                 {"block_t": 128, "block_h": 1})
    summary = matched["matches"][0]["summary"]
    assert "B=in4 C=in3 D=in5" in summary, summary
    assert "X_PERM = [0,2,1,3]" in source and "DT_PERM = [0,2,1]" in source


def test_ssd_refuses_sequential_scan(tmp_path):
    # A lax.scan over time: the analyze summary lists the body once, without the state it
    # carries, so the recurrence cannot be verified: refused.
    inputs = SSD_INPUTS[:5]
    spec = write_spec(tmp_path, "ssd_scan", "{BATCH: 1, SEQ: 256, H: 2, P: 64, N: 128}",
                      inputs, """
        import jax
        import jax.numpy as jnp

        def reference(x, dt, A, B, C):
            batch, seq_len, heads, dim = x.shape

            def step(h, inp):
                x_t, dt_t, b_t, c_t = inp
                upd = (dt_t[:, :, None] * x_t.astype(jnp.float32))[..., None] * b_t[:, None, None, :]
                h = h * jnp.exp(dt_t * A)[:, :, None, None] + upd
                return h, jnp.einsum("bhpn,bn->bhp", h, c_t)

            h0 = jnp.zeros((batch, heads, dim, B.shape[-1]), jnp.float32)
            xs = (jnp.swapaxes(x, 0, 1), jnp.swapaxes(dt, 0, 1),
                  jnp.swapaxes(B.astype(jnp.float32), 0, 1), jnp.swapaxes(C.astype(jnp.float32), 0, 1))
            _, ys = jax.lax.scan(step, h0, xs)
            return jnp.swapaxes(ys, 0, 1).astype(x.dtype)
        """)
    assert "chunked_recurrence" not in matches(spec)


def test_ssd_refuses_computed_step(tmp_path):
    # dt goes through softplus inside the reference: the template does not replay preludes.
    inputs = SSD_INPUTS[:5]
    spec = write_spec(tmp_path, "ssd_softplus", "{BATCH: 1, SEQ: 256, H: 2, P: 64, N: 128}",
                      inputs, """
        import jax
        import jax.numpy as jnp

        def reference(x, dt, A, B, C):
            dt = jax.nn.softplus(dt)
            a = jnp.cumsum(A * dt, axis=1)                                  # [b, t, h]
            seg = a[:, :, None, :] - a[:, None, :, :]                       # [b, t, s, h]
            t = jnp.arange(x.shape[1])
            L = jnp.where((t[:, None] >= t[None, :])[None, :, :, None], jnp.exp(seg), 0.0)
            G = jnp.einsum("btn,bsn->bts", C.astype(jnp.float32), B.astype(jnp.float32))
            y = jnp.einsum("bts,btsh,bshp->bthp", G, L, x.astype(jnp.float32) * dt[..., None])
            return y.astype(x.dtype)
        """)
    assert "chunked_recurrence" not in matches(spec)


# ---------------------------------------------------------------------------- matmul backward

def test_matmul_backward_vjp(tmp_path):
    inputs = ["{name: x, shape: [M, K], dtype: bfloat16}",
              "{name: w, shape: [K, N], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.05}}}",
              "{name: d_y, shape: [M, N], dtype: bfloat16}"]
    spec = write_spec(tmp_path, "dense_vjp", "{M: 256, K: 384, N: 256}", inputs, """
        import jax
        import jax.numpy as jnp

        def reference(x, w, d_y):
            _, vjp = jax.vjp(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32), x, w)
            d_x, d_w = vjp(d_y.astype(jnp.float32))
            return d_x.astype(x.dtype), d_w.astype(w.dtype)
        """)
    matched, result, source = template_and_check(tmp_path, spec, "matmul_backward",
                                                 {"bm0": 128, "bn0": 128, "bk0": 128,
                                                  "bm1": 128, "bn1": 128, "bk1": 128})
    summary = matched["matches"][0]["summary"]
    # dX reads w transposed, dW reads x transposed: no transpose in HBM
    assert "out0 = in2 @ in1^T" in summary and "out1 = in0^T @ in2" in summary, summary
    assert len(result["pallas_calls"]) == 2


def test_matmul_backward_einsum_3d_scaled(tmp_path):
    inputs = ["{name: d_y, shape: [B, S, N], dtype: bfloat16}",
              "{name: x, shape: [B, S, K], dtype: bfloat16}",
              "{name: w, shape: [N, K], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.05}}}"]
    spec = write_spec(tmp_path, "dense_3d", "{B: 2, S: 128, K: 256, N: 384}", inputs, """
        import jax.numpy as jnp

        def reference(d_y, x, w):
            # y = x @ w.T (torch Linear layout); the loss is averaged over 2 shards
            d_w = jnp.einsum("bsn,bsk->nk", d_y, x, preferred_element_type=jnp.float32) * 0.5
            d_x = jnp.einsum("bsn,nk->bsk", d_y.astype(jnp.float32), w.astype(jnp.float32))
            return d_w.astype(jnp.bfloat16), d_x.astype(jnp.bfloat16)
        """)
    matched, result, source = template_and_check(tmp_path, spec, "matmul_backward",
                                                 {"bm0": 128, "bn0": 128, "bk0": 128,
                                                  "bm1": 128, "bn1": 128, "bk1": 128})
    summary = matched["matches"][0]["summary"]
    assert "out0 = 0.5 * in0^T @ in1" in summary and "out1 = in0 @ in2" in summary, summary


def test_matmul_backward_refuses_elementwise_between(tmp_path):
    inputs = ["{name: x, shape: [M, K], dtype: bfloat16}",
              "{name: w, shape: [K, N], dtype: bfloat16}",
              "{name: d_y, shape: [M, N], dtype: bfloat16}"]
    spec = write_spec(tmp_path, "dense_gelu_bwd", "{M: 256, K: 256, N: 256}", inputs, """
        import jax
        import jax.numpy as jnp

        def reference(x, w, d_y):
            # a gelu between the matmuls: d_y must be multiplied by gelu'(x @ w) first
            _, vjp = jax.vjp(lambda a, b: jax.nn.gelu(jnp.dot(a, b, preferred_element_type=jnp.float32)), x, w)
            d_x, d_w = vjp(d_y.astype(jnp.float32))
            return d_x.astype(x.dtype), d_w.astype(w.dtype)
        """)
    assert "matmul_backward" not in matches(spec)


def test_shared_operand_matmul_allgather(tmp_path):
    # out[d] = concat(x[0..D-1]) @ w[d]: the all-gather matmul written as one program
    inputs = ["{name: x, shape: [DEV, MS, K], dtype: bfloat16}",
              "{name: w, shape: [DEV, K, NS], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.05}}}"]
    spec = write_spec(tmp_path, "allgather_mm", "{DEV: 2, MS: 64, K: 256, NS: 256}", inputs, """
        import jax.numpy as jnp

        def reference(x, w):
            gathered = x.reshape(-1, x.shape[-1])
            return jnp.einsum("mk,dkn->dmn", gathered, w,
                              preferred_element_type=jnp.float32).astype(x.dtype)
        """)
    matched, result, source = template_and_check(tmp_path, spec, "shared_operand_matmul",
                                                 {"bm0": 128, "bn0": 128, "bk0": 128})
    assert "per each of 2 batches of B" in matched["matches"][0]["summary"]
    # a plain single matmul stays the matmul family's
    plain = write_spec(tmp_path, "plain_mm", "{M: 128, K: 256, N: 256}",
                       ["{name: x, shape: [M, K], dtype: bfloat16}",
                        "{name: w, shape: [K, N], dtype: bfloat16}"], """
        import jax.numpy as jnp

        def reference(x, w):
            return x @ w
        """)
    found = matches(plain)
    assert "shared_operand_matmul" not in found and "matmul_backward" not in found, found


# ---------------------------------------------------------------------------- attention backward

QKVD = QKV + ["{name: d_out, shape: [B, H, S, D], dtype: bfloat16}"]


def test_attention_backward_vjp_causal(tmp_path):
    spec = write_spec(tmp_path, "attn_vjp", "{B: 1, H: 2, S: 256, D: 128}", QKVD, """
        import jax
        import jax.numpy as jnp

        def attention(q, k, v):
            n, d = q.shape[2], q.shape[3]
            s = jnp.einsum("bhqd,bhkd->bhqk", q.astype(jnp.float32), k.astype(jnp.float32)) * d ** -0.5
            s = jnp.where(jnp.tril(jnp.ones((n, n), dtype=bool)), s, -jnp.inf)
            return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v.astype(jnp.float32))

        def reference(q, k, v, d_out):
            _, vjp = jax.vjp(attention, q, k, v)
            dq, dk, dv = vjp(d_out.astype(jnp.float32))
            return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)
        """)
    matched, result, source = template_and_check(tmp_path, spec, "attention_backward",
                                                 {"block_q": 128, "block_k": 128})
    assert matched["matches"][0]["summary"].startswith("causal"), matched
    assert "CAUSAL = True" in source
    assert len(result["pallas_calls"]) == 3
    assert [c["grid"][0] for c in result["pallas_calls"]] == [2, 2, 2]
    # both heads in one block: batched dots, half the grid steps, the same gradients
    _, result, _ = template_and_check(tmp_path, spec, "attention_backward",
                                      {"block_q": 128, "block_k": 128, "block_b": 2})
    assert [c["grid"][0] for c in result["pallas_calls"]] == [1, 1, 1], result["pallas_calls"]
    # the first kernel's children: the search can grow block_b from its first kernel's 1
    t = run("template", spec, "--name", "attention_backward", "--out", tmp_path / "first.py",
            "--children-dir", tmp_path / "children", "--json", "-")
    assert t.returncode == 0, t.stdout + t.stderr
    moves = json.loads(t.stdout)["children"]
    assert any(c["changes"].get("block_b") == 2 for c in moves), moves


def test_attention_backward_grad_bshd_unmasked(tmp_path):
    inputs = ["{name: d_out, shape: [B, S, H, D], dtype: bfloat16}",
              "{name: q, shape: [B, S, H, D], dtype: bfloat16}",
              "{name: k, shape: [B, S, H, D], dtype: bfloat16}",
              "{name: v, shape: [B, S, H, D], dtype: bfloat16}"]
    spec = write_spec(tmp_path, "attn_grad", "{B: 1, S: 256, H: 2, D: 128}", inputs, """
        import jax
        import jax.numpy as jnp

        def attention(q, k, v):
            q = q.astype(jnp.float32) * 0.125
            s = jax.lax.dot_general(q, k.astype(jnp.float32), (((3,), (3,)), ((0, 2), (0, 2))))
            e = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))
            p = e / jnp.sum(e, axis=-1, keepdims=True)                    # [B, H, S, S]
            return jnp.einsum("bhqk,bkhd->bqhd", p, v.astype(jnp.float32))

        def reference(d_out, q, k, v):
            loss = lambda q, k, v: jnp.sum(attention(q, k, v) * d_out.astype(jnp.float32))
            dq, dk, dv = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
            return dk.astype(k.dtype), dv.astype(v.dtype), dq.astype(q.dtype)
        """)
    matched, result, source = template_and_check(tmp_path, spec, "attention_backward",
                                                 {"block_q": 128, "block_k": 128, "block_b": 2})
    summary = matched["matches"][0]["summary"]
    assert summary.startswith("unmasked") and "q=in1 k=in2 v=in3 dO=in0" in summary, summary
    assert 'return grads["dk"], grads["dv"], grads["dq"]' in source


def test_attention_backward_refuses_extra_bias(tmp_path):
    spec = write_spec(tmp_path, "attn_bias_vjp", "{B: 1, H: 2, S: 256, D: 128}",
                      QKVD + ["{name: bias, shape: [S, S], dtype: float32}"], """
        import jax
        import jax.numpy as jnp

        def attention(q, k, v, bias):
            s = jnp.einsum("bhqd,bhkd->bhqk", q.astype(jnp.float32), k.astype(jnp.float32)) + bias
            return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v.astype(jnp.float32))

        def reference(q, k, v, d_out, bias):
            _, vjp = jax.vjp(lambda a, b, c: attention(a, b, c, bias), q, k, v)
            dq, dk, dv = vjp(d_out.astype(jnp.float32))
            return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)
        """)
    assert "attention_backward" not in matches(spec)


# ---------------------------------------------------------------------------- top-k

def test_topk_scaled_then_renormalised(tmp_path):
    inputs = ["{name: logits, shape: [B, V], dtype: float32, generator: {normal: {mean: 0, std: 2}}}",
              "{name: k, static: 20}"]
    spec = write_spec(tmp_path, "topk_probs", "{B: 16, V: 1024}", inputs, """
        import jax
        import jax.numpy as jnp

        def reference(logits, k):
            vals, ids = jax.lax.top_k(logits * 1.25, k)       # a temperature of 0.8
            probs = jnp.exp(vals - vals[:, :1])
            probs = probs / probs.sum(axis=-1, keepdims=True)
            return ids, probs
        """, tolerance="{atol: 1.0e-5, rtol: 1.0e-5}")
    matched, result, source = template_and_check(tmp_path, spec, "topk", {"block_rows": 8})
    assert "top-20 over 16 rows of 1024" in matched["matches"][0]["summary"]
    assert "SCALE = 1.25" in source


def test_topk_refuses_full_vocabulary_normaliser(tmp_path):
    inputs = ["{name: logits, shape: [B, V], dtype: float32}"]
    spec = write_spec(tmp_path, "topk_logprobs", "{B: 16, V: 1024}", inputs, """
        import jax
        import jax.numpy as jnp

        def reference(logits):
            vals, ids = jax.lax.top_k(logits, 8)
            return vals - jax.nn.logsumexp(logits, axis=-1, keepdims=True), ids
        """)
    assert "topk" not in matches(spec)


# ---------------------------------------------------------------------------- einsum core

def test_einsum_core_triangle_incoming(tmp_path):
    # AlphaFold's triangle update with INCOMING edges (x_ij = sum_k a_ki b_kj), layer norms
    # by hand (N large next to the channels: the contraction dominates the projections), weights in torch's [out, in] layout
    inputs = ["{name: z, shape: [N, N, C], dtype: bfloat16}",
              "{name: w_a, shape: [CH, C], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.088}}}",
              "{name: w_b, shape: [CH, C], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.088}}}",
              "{name: w_g, shape: [CH, C], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.088}}}",
              "{name: w_o, shape: [C, CH], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.088}}}"]
    spec = write_spec(tmp_path, "tri_in", "{N: 256, C: 32, CH: 32}", inputs, """
        import jax
        import jax.numpy as jnp

        def norm(x):
            x = x.astype(jnp.float32)
            mu = x.mean(-1, keepdims=True)
            return (x - mu) / jnp.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)

        def reference(z, w_a, w_b, w_g, w_o):
            zn = norm(z).astype(z.dtype)
            gate = jax.nn.sigmoid(jnp.einsum("ijc,hc->ijh", zn, w_g))
            a = gate * jnp.einsum("ijc,hc->ijh", zn, w_a)
            b = gate * jnp.einsum("ijc,hc->ijh", zn, w_b)
            x = jnp.einsum("kih,kjh->ijh", a, b, preferred_element_type=jnp.float32)
            return jnp.einsum("ijh,ch->ijc", norm(x).astype(z.dtype), w_o)
        """)
    matched, result, source = template_and_check(tmp_path, spec, "einsum_core")
    assert "batch 32, 256x256x256" in matched["matches"][0]["summary"], matched
    assert "core = _contract(" in source


def test_einsum_core_leaves_plain_matmuls_alone(tmp_path):
    inputs = ["{name: x, shape: [M, K], dtype: bfloat16}", "{name: w, shape: [K, N], dtype: bfloat16}"]
    spec = write_spec(tmp_path, "mm_gelu", "{M: 256, K: 256, N: 256}", inputs, """
        import jax

        def reference(x, w):
            return jax.nn.gelu(x @ w)
        """)
    assert "einsum_core" not in matches(spec)
