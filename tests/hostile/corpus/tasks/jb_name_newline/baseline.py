import jax
import jax.numpy as jnp

CONFIG = {"name": "x\nimport os; os.system('id')", "n": 64}


def create_inputs(dtype=jnp.float32):
    return (jnp.ones((CONFIG['n'], CONFIG['n']), dtype),)


def workload(x):
    return x * 2
