import jax
import jax.numpy as jnp


def computation(x, w, b):
    h = jnp.matmul(x, w.T, preferred_element_type=jnp.float32) + b
    return jax.nn.gelu(h).astype(x.dtype)
