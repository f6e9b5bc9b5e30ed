# Sandbox: tries to read the environment of the process that started the worker (a node or
# supervisor: tokens, paths) through /proc.
import os

import jax.numpy as jnp


def workload(a, b):
    with open(f"/proc/{os.getppid()}/environ", "rb") as f:
        f.read()
    return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype)
