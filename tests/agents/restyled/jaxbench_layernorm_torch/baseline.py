"""JAXBench-style task: LayerNorm over the hidden axis with an elementwise affine, written the
way a PyTorch port spells it (x.var with ddof 0, division by sqrt)."""
import jax
import jax.numpy as jnp

CONFIG = {
    'name': 'layernorm_torch_style',
    'batch': 4,
    'seq': 64,
    'hidden': 512,
    'eps': 1e-5,
    'atol': 2e-2,
    'rtol': 2e-2,
}


def create_inputs(dtype=jnp.bfloat16):
    key = jax.random.PRNGKey(0)
    k1, k2, k3 = jax.random.split(key, 3)
    x = jax.random.normal(k1, (CONFIG['batch'], CONFIG['seq'], CONFIG['hidden']), dtype=dtype)
    weight = 1.0 + 0.1 * jax.random.normal(k2, (CONFIG['hidden'],), dtype=dtype)
    bias = 0.1 * jax.random.normal(k3, (CONFIG['hidden'],), dtype=dtype)
    return x, weight, bias


def workload(x, weight, bias):
    h = x.astype(jnp.float32)
    mean = h.mean(axis=-1, keepdims=True)
    var = ((h - mean) ** 2).mean(axis=-1, keepdims=True)
    out = (h - mean) / jnp.sqrt(var + CONFIG['eps'])
    return (out * weight.astype(jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)


def get_flops():
    return 8 * CONFIG['batch'] * CONFIG['seq'] * CONFIG['hidden']
