"""The strategy playbook's children end to end (issue 5: "the playbook yields at least three
distinct valid children per candidate"): for a first candidate of several template families,
`maxkernel template --children-dir` writes three children; each differs from the parent and
from the others, and each lowers for TPU and passes its interpret-mode test."""
import json

import pytest

from template_cli import check, needs_binary, run, write_spec

pytestmark = needs_binary

FAMILIES = {
    "matmul": ("{M: 512, K: 512, N: 512}",
               ["{name: x, shape: [M, K], dtype: bfloat16}",
                "{name: w, shape: [K, N], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.05}}}",
                "{name: b, shape: [N], dtype: float32}"],
               """
               import jax
               import jax.numpy as jnp

               def reference(x, w, b):
                   y = jnp.dot(x, w, preferred_element_type=jnp.float32) + b
                   return jax.nn.gelu(y).astype(x.dtype)
               """),
    "rowwise": ("{M: 512, N: 1024}",
                ["{name: x, shape: [M, N], dtype: bfloat16}",
                 "{name: g, shape: [N], dtype: bfloat16}"],
                """
                import jax
                import jax.numpy as jnp

                def reference(x, g):
                    x32 = x.astype(jnp.float32)
                    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
                    return (y * g.astype(jnp.float32)).astype(x.dtype)
                """),
    "flash_attention": ("{B: 1, H: 2, S: 512, D: 128}",
                        ["{name: q, shape: [B, H, S, D], dtype: bfloat16}",
                         "{name: k, shape: [B, H, S, D], dtype: bfloat16}",
                         "{name: v, shape: [B, H, S, D], dtype: bfloat16}"],
                        """
                        import jax
                        import jax.numpy as jnp

                        def reference(q, k, v):
                            s = jnp.einsum("bhqd,bhkd->bhqk", q, k,
                                           preferred_element_type=jnp.float32) * 0.125
                            n = q.shape[2]
                            s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), s, -jnp.inf)
                            p = jax.nn.softmax(s, axis=-1)
                            return jnp.einsum("bhqk,bhkd->bhqd", p.astype(v.dtype), v)
                        """),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_three_distinct_valid_children(tmp_path, family):
    dims, inputs, reference = FAMILIES[family]
    spec = write_spec(tmp_path, f"{family}_children", dims, inputs, reference)
    parent = tmp_path / "parent.py"
    children = tmp_path / "children"
    t = run("template", spec, "--name", family, "--out", parent, "--children-dir", children,
            "--json", "-")
    assert t.returncode == 0, t.stdout + t.stderr
    out = json.loads(t.stdout)
    assert out["template"] == family
    assert len(out["children"]) == 3, out["children"]
    sources = [parent.read_text()] + [open(c["file"]).read() for c in out["children"]]
    assert len(set(sources)) == 4, [c["move"] for c in out["children"]]
    for child in out["children"]:
        assert child["changes"], child
        code, result = check(spec, child["file"])
        assert code == 0 and result["correct"] is True, (child, result)
