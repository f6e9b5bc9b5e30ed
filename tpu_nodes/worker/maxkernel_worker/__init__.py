"""maxkernel's JAX worker: loads, lowers, tests, extracts and times Pallas TPU kernels.

Run it with `python -m maxkernel_worker --endpoint ipc://DIR/worker.sock --schema-dir
messages/schema --workdir DIR`. Nothing is imported here: __main__ must apply the sandbox
before jax (or any thread) exists.
"""
