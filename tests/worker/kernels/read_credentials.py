# Sandbox: tries to read a file it must not see (the test puts the cluster token's path, or a
# file in a hidden directory, in TARGET).
import jax.numpy as jnp

TARGET = "/nonexistent/token"


def workload(a, b):
    with open(TARGET) as f:
        secret = f.read()
    return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype) + len(secret) * 0
