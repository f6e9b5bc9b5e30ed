"""JAXBench-style task: a 1024x1024x1024 bf16 matmul with an f32 accumulation."""
import jax
import jax.numpy as jnp

CONFIG = {
    "name": "matmul_1024_bf16",
    "M": 1024,
    "K": 1024,
    "N": 1024,
    "atol": 2e-2,
    "rtol": 2e-2,
}


def create_inputs(dtype=jnp.bfloat16):
    key = jax.random.PRNGKey(0)
    kx, ky = jax.random.split(key)
    x = jax.random.normal(kx, (CONFIG["M"], CONFIG["K"]), dtype=dtype)
    y = jax.random.normal(ky, (CONFIG["K"], CONFIG["N"]), dtype=dtype)
    return x, y


def workload(x, y):
    return jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype)


def get_flops():
    return 2 * CONFIG["M"] * CONFIG["K"] * CONFIG["N"]
