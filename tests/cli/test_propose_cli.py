"""`maxkernel propose SPEC`: the agent pool's first answer, end to end with the built binary, the
real worker and real JAX: a correct first kernel from the expert brain, the honest refusal when
no template applies and no LLM is configured, and bad brain configs."""
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("MAXKERNEL_BIN", ROOT / "build" / "cli" / "maxkernel"))

pytestmark = pytest.mark.skipif(not BIN.exists(), reason="maxkernel is not built")


def run(*args, timeout=900):
    return subprocess.run([str(BIN), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def write_spec(tmp_path, name, dims, inputs, reference, tolerance="{atol: 2.0e-2, rtol: 2.0e-2}"):
    spec = tmp_path / f"{name}.yaml"
    body = textwrap.indent(textwrap.dedent(reference).strip() + "\n", "  ")
    spec.write_text(f"name: {name}\ndims: {dims}\ninputs:\n{inputs}\nreference: |\n{body}"
                    f"tolerance: {tolerance}\n")
    return spec


def matmul_epilogue_spec(tmp_path):
    # Spelled with einsum and a transposed weight: the match reads the computation.
    return write_spec(
        tmp_path, "proj_bias_gelu", "{M: 256, K: 512, N: 384}",
        "  - {name: x, shape: [M, K], dtype: bfloat16}\n"
        "  - {name: w, shape: [N, K], dtype: bfloat16, generator: {normal: {std: 0.05}}}\n"
        "  - {name: b, shape: [N], dtype: float32}",
        """
        import jax
        import jax.numpy as jnp

        def reference(x, w, b):
            y = jnp.einsum("mk,nk->mn", x, w, preferred_element_type=jnp.float32)
            return jax.nn.gelu(y + b).astype(jnp.bfloat16)
        """)


@pytest.fixture(scope="module")
def proposed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("propose")
    spec = matmul_epilogue_spec(tmp)
    out = tmp / "out"
    r = run("propose", spec, "--out", out, "--json", "-")
    return spec, out, r


def test_a_correct_first_kernel_from_the_expert_brain(proposed):
    spec, out, r = proposed
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["correct"] is True and j["fallback_to_reference"] is False
    assert j["mode"] == "propose" and j["timing"] == "modeled" and j["backend"] == "model"
    for key in ("schema", "task", "chip", "kernel_time_us", "reference_time_us",
                "baseline_time_us", "speedup_vs_reference", "speedup_vs_baseline",
                "roofline_time_us", "roofline_fraction", "evaluations", "cache_hits",
                "failures", "wall_seconds", "tokens", "cost_usd", "seed", "jax_version",
                "maxkernel_version"):
        assert key in j, key
    assert j["kernel_time_us"] > 0 and j["reference_time_us"] > 0
    assert j["speedup_vs_reference"] == pytest.approx(
        j["reference_time_us"] / j["kernel_time_us"], rel=1e-6)
    assert j["candidate"]["template"], j["candidate"]
    assert j["candidate"]["origin"] == "expert"
    assert j["tokens"] == {"prompt": 0, "completion": 0} and j["cost_usd"] is None
    assert j["plan"] and j["plan"][0]["move"] == "template"
    # The tester's cases ran beyond the node's own test.
    assert j["evaluations"] >= 3
    assert json.loads((out / "result.json").read_text())["correct"] is True


def test_the_written_kernel_passes_check_on_its_own(proposed):
    spec, out, r = proposed
    kernel = out / "kernel.py"
    text = kernel.read_text()
    assert text.startswith("# maxkernel propose: task proj_bias_gelu")
    assert "modeled" in text.splitlines()[2]
    assert "def workload(" in text
    c = run("check", spec, kernel, "--json", "-")
    assert c.returncode == 0, c.stderr
    assert json.loads(c.stdout)["correct"] is True


def test_no_template_and_no_llm_is_exit_2(tmp_path):
    spec = write_spec(
        tmp_path, "sorted_rows", "{R: 16, C: 128}",
        "  - {name: x, shape: [R, C], dtype: float32}",
        """
        import jax.numpy as jnp

        def reference(x):
            return jnp.sort(x, axis=-1)
        """)
    out = tmp_path / "out"
    r = run("propose", spec, "--out", out)
    assert r.returncode == 2, r.stderr
    assert "no template applies" in r.stderr
    assert "sort" in r.stderr
    assert "no LLM brain is configured" in r.stderr
    assert not (out / "kernel.py").exists()


def test_a_bad_brain_config_names_file_line_and_field(tmp_path):
    spec = matmul_epilogue_spec(tmp_path)
    brains = tmp_path / "brains.yaml"
    brains.write_text("planner: [expert, wizard]\n")
    r = run("propose", spec, "--brains", brains)
    assert r.returncode == 2
    assert f"{brains}:1" in r.stderr
    assert "planner" in r.stderr


TRANSPOSE_KERNEL = '''import jax
from jax.experimental import pallas as pl


def _kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...].T


def workload(x):
    m, n = x.shape
    bm, bn = min(m, 128), min(n, 128)
    return pl.pallas_call(
        _kernel,
        grid=(pl.cdiv(m, bm), pl.cdiv(n, bn)),
        in_specs=[pl.BlockSpec((bm, bn), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((bn, bm), lambda i, j: (j, i)),
        out_shape=jax.ShapeDtypeStruct((n, m), x.dtype),
    )(x)
'''


def chat_reply(content, prompt_tokens, completion_tokens):
    return {"status": 200, "body": {
        "id": "chatcmpl-replay", "object": "chat.completion", "model": "replay-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}}}


def test_the_llm_takes_over_where_no_template_applies(tmp_path):
    """planner [expert, llm]: the expert has no template for a transpose, the LLM (a local
    server replaying a recorded exchange) plans and writes the kernel; tokens and cost counted."""
    spec = write_spec(
        tmp_path, "transpose_rows", "{R: 256, C: 384}",
        "  - {name: x, shape: [R, C], dtype: float32}",
        """
        def reference(x):
            return x.T
        """)
    plan = json.dumps([{"move": "write_transpose_kernel", "rationale": "no template: a tiled "
                        "transpose moves each (128, 128) block once",
                        "expected_effect": "one HBM read and write of x",
                        "instructions": "tile by 128 and transpose each block in VMEM",
                        "score": 1.0}])
    exchanges = [
        {"note": "planner", "expect": {"path": "/v1/chat/completions",
                                       "headers": {"Authorization": "Bearer sk-test"},
                                       "body_contains": ["transpose_rows"]},
         "response": chat_reply(f"```json\n{plan}\n```", 900, 120)},
        {"note": "implementer", "expect": {"body_contains": ["tile by 128"]},
         "response": chat_reply(f"A tiled transpose.\n\n```python\n{TRANSPOSE_KERNEL}```", 1500,
                                400)},
    ]
    (tmp_path / "exchanges.json").write_text(json.dumps(exchanges))
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "support" / "replay_server.py"),
         str(tmp_path / "exchanges.json"), "--log", str(tmp_path / "log.jsonl")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        brains = tmp_path / "brains.yaml"
        brains.write_text(
            "planner: [expert, llm]\nimplementer: [expert, llm]\ndebugger: [expert, llm]\n"
            f"llm:\n  base_url: http://127.0.0.1:{port}/v1\n  model: replay-model\n"
            "  api_key_env: MAXKERNEL_TEST_KEY\n  retries: 1\n  backoff_seconds: 0\n"
            "  prices: {prompt: 1.0, completion: 10.0}\n")
        env = dict(os.environ, MAXKERNEL_TEST_KEY="sk-test")
        r = subprocess.run([str(BIN), "propose", str(spec), "--brains", str(brains),
                            "--json", "-"], capture_output=True, text=True, timeout=900, env=env)
    finally:
        server.stdin.close()
        server.wait(timeout=30)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["correct"] is True
    assert j["candidate"]["origin"] == "llm:replay-model"
    assert j["candidate"]["template"] == ""
    assert j["plan"][0]["brain"] == "llm"
    assert j["tokens"] == {"prompt": 2400, "completion": 520}
    assert j["cost_usd"] == pytest.approx((2400 * 1.0 + 520 * 10.0) / 1e6)
    log = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert len(log) == 2 and not any(entry.get("mismatch") for entry in log)
