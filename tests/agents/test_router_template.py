"""The expert brain's router template end to end: mixture-of-experts routers written in
several styles (jnp.dot or einsum, W as [H, E] or [E, H], softmax or sigmoid with a bias,
work after the top_k in the kernel or after it) are matched on their computation by the
built `maxkernel template`, and the kernel it renders passes `maxkernel check` (TPU lowering
+ interpret-mode test against the reference, ids exact); routers that also need the full
scores are refused. Small shapes: interpret mode is slow."""
import json

from template_cli import check, matches, needs_binary, run, template_and_check, write_spec

pytestmark = needs_binary

EXACT_IDS = "[{output: 0, atol: 1.0e-2, rtol: 1.0e-2}, {output: 1, atol: 0, rtol: 0}]"


def test_softmax_router_hidden_loop_and_row_blocks(tmp_path):
    # Mixtral's router (the workload expansion's reference), with blocks that make a 4 x 4
    # grid: logits accumulated over four hidden blocks, four row blocks.
    inputs = ["{name: x, shape: [T, H], dtype: bfloat16}",
              "{name: w_router, shape: [H, E], dtype: bfloat16, "
              "generator: {normal: {mean: 0, std: 0.02}}}",
              "{name: top_k, static: 2}"]
    spec = write_spec(tmp_path, "softmax_router", "{T: 64, H: 512, E: 8}", inputs, """
        import jax
        import jax.numpy as jnp

        def reference(x, w_router, top_k):
            logits = jnp.dot(x, w_router, preferred_element_type=jnp.float32)
            scores = jax.nn.softmax(logits, axis=-1)
            top_scores, top_experts = jax.lax.top_k(scores, top_k)
            weights = top_scores / jnp.sum(top_scores, axis=-1, keepdims=True)
            return weights, top_experts.astype(jnp.int32)
        """, tolerance=EXACT_IDS)
    matched, result, source = template_and_check(
        tmp_path, spec, "router", {"block_rows": 16, "block_k": 128, "unroll": 1,
                                   "epilogue": "kernel", "dimension_semantics": "parallel",
                                   "vmem_limit_bytes": 1 << 25}, by_name=False)
    summary = matched["matches"][0]["summary"]
    assert "64 rows x 512 hidden" in summary and "8 experts" in summary, summary
    assert "top-2" in summary and "exp" in summary, summary
    call = result["pallas_calls"][0]
    assert call["grid"] == [4, 4], call                 # row blocks x hidden blocks
    assert [o["block_shape"] for o in call["operands"]] == [[16, 128], [128, 8], [16, 2], [16, 2]]
    assert "def _epilogue" in source and "jnp.divide(top_values" in source


def test_sigmoid_bias_router_einsum_transposed_weights(tmp_path):
    # DeepSeek-style scoring: sigmoid plus a per-expert bias, W in torch's [E, H] layout via
    # einsum, f32, a scaling factor after the renormalisation; the work after the top_k
    # replayed after the kernel.
    inputs = ["{name: h, shape: [T, H], dtype: float32}",
              "{name: gate, shape: [E, H], dtype: float32, "
              "generator: {normal: {mean: 0, std: 0.05}}}",
              "{name: bias, shape: [E], dtype: float32}"]
    spec = write_spec(tmp_path, "sigmoid_router", "{T: 32, H: 256, E: 16}", inputs, """
        import jax
        import jax.numpy as jnp

        def reference(h, gate, bias):
            scores = jax.nn.sigmoid(jnp.einsum("th,eh->te", h, gate)) + bias[None, :]
            vals, ids = jax.lax.top_k(scores, 4)
            w = vals / vals.sum(axis=-1, keepdims=True)
            return ids, (w * 2.5).astype(jnp.bfloat16)
        """, tolerance="[{output: 0, atol: 0, rtol: 0}, {output: 1, atol: 1.0e-2, rtol: 1.0e-2}]")
    assert matches(spec)[0] == "router"
    matched, result, source = template_and_check(
        tmp_path, spec, "router", {"block_rows": 8, "block_k": 128, "unroll": 2,
                                   "epilogue": "outside", "dimension_semantics": "arbitrary",
                                   "vmem_limit_bytes": 1 << 25})
    assert "16 experts" in matched["matches"][0]["summary"]
    assert '"w_layout":"nk"' in source and "logistic" in matched["matches"][0]["summary"]
    call = result["pallas_calls"][0]
    assert call["grid"] == [4, 2], call
    # the bias is an [E] operand of the kernel; the outputs are the top values and ids
    assert [o["block_shape"] for o in call["operands"]] == [[8, 128], [16, 128], [1, 16], [8, 4],
                                                          [8, 4]]


def test_router_refuses_full_scores_output(tmp_path):
    # An auxiliary load-balancing loss reads every score: not a router kernel's output.
    inputs = ["{name: x, shape: [T, H], dtype: float32}",
              "{name: w, shape: [H, E], dtype: float32}"]
    spec = write_spec(tmp_path, "router_aux", "{T: 32, H: 256, E: 8}", inputs, """
        import jax
        import jax.numpy as jnp

        def reference(x, w):
            probs = jax.nn.softmax(x @ w, axis=-1)
            vals, ids = jax.lax.top_k(probs, 2)
            return vals, ids, jnp.mean(probs, axis=0)
        """)
    assert "router" not in matches(spec)


def test_router_playbook_children(tmp_path):
    # Three distinct children of the first candidate (issue 5's acceptance), each correct.
    inputs = ["{name: x, shape: [T, H], dtype: bfloat16}",
              "{name: w, shape: [H, E], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.02}}}"]
    spec = write_spec(tmp_path, "router_children", "{T: 64, H: 512, E: 8}", inputs, """
        import jax
        import jax.numpy as jnp

        def reference(x, w):
            p = jax.nn.softmax(jnp.dot(x, w, preferred_element_type=jnp.float32), axis=-1)
            vals, ids = jax.lax.top_k(p, 2)
            return vals / jnp.sum(vals, axis=-1, keepdims=True), ids
        """, tolerance=EXACT_IDS)
    parent = tmp_path / "parent.py"
    t = run("template", spec, "--name", "router", "--out", parent, "--children-dir",
            tmp_path / "children", "--json", "-")
    assert t.returncode == 0, t.stdout + t.stderr
    out = json.loads(t.stdout)
    assert len(out["children"]) == 3, out["children"]
    sources = [parent.read_text()] + [open(c["file"]).read() for c in out["children"]]
    assert len(set(sources)) == 4, [c["move"] for c in out["children"]]
    for child in out["children"]:
        code, result = check(spec, child["file"])
        assert code == 0 and result["correct"] is True, (child, result)
