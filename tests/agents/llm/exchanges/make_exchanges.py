#!/usr/bin/env python3
"""Writes the recorded exchanges replayed by tests/support/replay_server.py for the LLM
brain's tests (tests/agents/llm). Rerun after changing it: python3 make_exchanges.py

The replies are what an OpenAI-compatible server sends (choices[0].message.content, usage);
the kernels in them are real Pallas TPU modules (the matmul lowers for TPU and matches
jnp.dot in interpret mode with JAX 0.10.2)."""

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = "/v1/chat/completions"
KEY = "sk-replay-0123456789abcdef"       # the value the tests put in MAXKERNEL_TEST_LLM_KEY
AUTH = {"Authorization": "Bearer " + KEY}
MODEL = "replay-model"

MATMUL = '''import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _pick(dim, target, align):
    b = min(target, dim) // align * align
    while b >= align:
        if dim % b == 0:
            return b
        b -= align
    return dim


def _kernel(x_ref, w_ref, o_ref, acc_ref):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def workload(x, w):
    m, kd = x.shape
    n = w.shape[1]
    bm, bn, bk = _pick(m, 256, 8), _pick(n, 256, 128), _pick(kd, 512, 128)
    return pl.pallas_call(
        _kernel,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        grid=(m // bm, n // bn, kd // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, k: (i, k)),
                  pl.BlockSpec((bk, bn), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(x, w)
'''

# The failing kernel of the repair exchange: a 100-row block breaks the (8, 128) rule.
MISALIGNED = MATMUL.replace("bm, bn, bk = _pick(m, 256, 8), _pick(n, 256, 128), _pick(kd, 512, 128)",
                            "bm, bn, bk = 100, 256, 512")
REPAIRED = MATMUL.replace("_pick(m, 256, 8)", "_pick(m, 128, 8)")

# Cut off inside the pallas_call: '(' never closes.
TRUNCATED = MATMUL[:MATMUL.index("        out_specs=")]

# What JAX 0.10.2 says when lowering MISALIGNED for TPU (the tests put it in the EvalResult).
LOWER_ERROR = ("ValueError: The Pallas TPU lowering currently requires that the last two "
               "dimensions of your block shape are divisible by 8 and 128 respectively, or be "
               "equal to the respective dimensions of the overall array. Block spec for args[0] "
               "in pallas_call _kernel at kernel.py:16 has block shape "
               "(Blocked(block_size=100), Blocked(block_size=512)), array shape (256, 512)")


def completion(content, prompt=1000, completion_tokens=500, finish="stop"):
    return {"id": "chatcmpl-replay", "object": "chat.completion", "created": 1764700000,
            "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion_tokens,
                      "total_tokens": prompt + completion_tokens}}


def code(text, intro="I tile the matmul with an f32 VMEM accumulator."):
    return intro + "\n\n```python\n" + text + "```\n"


def ok(content, **kw):
    return {"status": 200, "body": completion(content, **kw)}


def expect(*contains, headers=AUTH):
    e = {"method": "POST", "path": PATH, "headers": headers, "json": {"model": MODEL}}
    if contains:
        e["body_contains"] = list(contains)
    return e


PLAN = [
    {"move": "write_tiled_matmul", "parent": None,
     "rationale": "no candidate yet; 2*256*512*256 FLOP on a 256x512 bf16 input",
     "expected_effect": "a correct first kernel near the memory roofline",
     "instructions": "Tile (bm, bn, bk) = (256, 256, 512) with an f32 VMEM accumulator.",
     "score": 0.4},
    {"move": "grow_block", "parent": "a1b2c3d4e5",
     "rationale": "memory-bound at 41% of HBM bandwidth; x is re-read 4 times along axis 1",
     "expected_effect": "HBM traffic -60%; VMEM 6 of 16 MiB",
     "instructions": "Raise bn from 256 to 1024 so that axis 1 has one step.",
     "score": 0.9, "changes": {"bn": 1024}},
]

FILES = {
    "plain_reply": [
        {"note": "one completion; the server checks the key and the model",
         "expect": expect("Write a matmul kernel."),
         "response": ok(code(MATMUL), prompt=1200, completion_tokens=800)},
    ],
    "plan_from_json": [
        {"note": "the planner's reply: prose, then the steps in a ```json fence",
         "expect": expect("Candidates so far", "a1b2c3d4e5f6", "memory-bound at 41%",
                          "tiled_matmul"),
         "response": ok("Two options, ranked:\n\n```json\n" + json.dumps(PLAN, indent=2)
                        + "\n```\n", prompt=3000, completion_tokens=400)},
    ],
    "code_reply": [
        {"note": "the implementer's reply: one sentence and the module",
         "expect": expect("tiled_matmul", "write_tiled_matmul", "(none: write the kernel from scratch)"),
         "response": ok(code(MATMUL), prompt=2500, completion_tokens=900)},
    ],
    "timeout_then_success": [
        {"note": "answers after the client's timeout (0.5 s in the test)",
         "expect": expect(), "response": {"delay_seconds": 3, **ok(code(MATMUL))}},
        {"expect": expect(), "response": ok(code(MATMUL), prompt=2500, completion_tokens=900)},
    ],
    "rate_limited_then_success": [
        {"note": "HTTP 429 with Retry-After: 1 (the test's backoff is 0.01 s)",
         "expect": expect(),
         "response": {"status": 429, "headers": {"Retry-After": "1"},
                      "body": {"error": {"message": "Rate limit reached for requests",
                                         "type": "requests", "code": "rate_limit_exceeded"}}}},
        {"expect": expect(), "response": ok(code(MATMUL))},
    ],
    "server_error_then_success": [
        {"expect": expect(),
         "response": {"status": 500, "body": {"error": {"message": "The server had an error"}}}},
        {"expect": expect(),
         "response": {"status": 503, "body": "<html><body>Service Unavailable</body></html>",
                      "headers": {"Content-Type": "text/html"}}},
        {"expect": expect(), "response": ok(code(MATMUL))},
    ],
    "server_errors_exhausted": [
        {"expect": expect(), "response": {"status": 502, "body": {"error": {"message": "bad gateway"}}}},
        {"expect": expect(), "response": {"status": 502, "body": {"error": {"message": "bad gateway"}}}},
        {"expect": expect(), "response": {"status": 502, "body": {"error": {"message": "bad gateway"}}}},
    ],
    "unauthorized": [
        {"note": "401: not retried; the second exchange must stay unused",
         "expect": expect(),
         "response": {"status": 401,
                      "body": {"error": {"message": "Incorrect API key provided: sk-repl***",
                                         "type": "invalid_request_error",
                                         "code": "invalid_api_key"}}}},
        {"expect": expect(), "response": ok(code(MATMUL))},
    ],
    "malformed_body_then_success": [
        {"note": "a 200 whose body is cut-off JSON",
         "expect": expect(), "response": {"status": 200, "body": '{"id": "chatcmpl-1", "choices": [{"message": {"content": "```python'}},
        {"expect": expect(), "response": ok(code(MATMUL))},
    ],
    "connection_dropped_then_success": [
        {"note": "the server closes the connection without answering",
         "expect": expect(), "response": {"close": True}},
        {"expect": expect(), "response": ok(code(MATMUL))},
    ],
    "retry_after_too_long": [
        {"expect": expect(),
         "response": {"status": 429, "headers": {"Retry-After": "7200"},
                      "body": {"error": {"message": "quota exhausted for today"}}}},
    ],
    "unparsable_code_retried": [
        {"note": "the code is cut off: '(' never closes",
         "expect": expect(),
         "response": ok(code(TRUNCATED), prompt=2500, completion_tokens=700)},
        {"note": "the second request carries the first reply and the parse error",
         "expect": expect("Your reply could not be used", "is never closed",
                          "\"role\":\"assistant\""),
         "response": ok(code(MATMUL), prompt=3400, completion_tokens=900)},
    ],
    "never_parses": [
        {"expect": expect(), "response": ok("I would tile the matmul with 256x256 blocks.")},
        {"expect": expect("no ```python code block"), "response": ok("Use bigger blocks.")},
        {"expect": expect("no ```python code block"), "response": ok("Sorry, I cannot.")},
    ],
    "repair": [
        {"note": "the debugger's request carries the lowering error; the reply repairs it",
         "expect": expect("lowerBlockShape", "Blocked(block_size=100)", "bm, bn, bk = 100, 256, 512"),
         "response": ok("Cause: a block of 100 rows is not a multiple of 8.\n"
                        "Fix: derive bm with _pick(m, 128, 8) so it is aligned and divides m.\n\n"
                        "```python\n" + REPAIRED + "```\n", prompt=2800, completion_tokens=950)},
    ],
    "give_up": [
        {"expect": expect("mismatch"),
         "response": ok("GIVE UP: the reference sorts each row; a sort has no lowering inside a "
                        "Pallas TPU kernel.")},
    ],
    "no_key": [
        {"note": "a local server without authentication: no Authorization header",
         "expect": expect(headers={"Authorization": None}),
         "response": ok(code(MATMUL))},
    ],
}

SOURCES = {"matmul.py": MATMUL, "misaligned.py": MISALIGNED, "repaired.py": REPAIRED,
           "lower_error.txt": LOWER_ERROR}

if __name__ == "__main__":
    for name, exchanges in FILES.items():
        with open(os.path.join(HERE, name + ".json"), "w", encoding="utf-8") as f:
            json.dump(exchanges, f, indent=1)
            f.write("\n")
    # The kernels, for the tests' assertions on the candidates.
    for name, text in SOURCES.items():
        with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
            f.write(text)
