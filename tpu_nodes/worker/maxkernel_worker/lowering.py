"""Lowering a candidate's workload for TPU on this (CPU) machine, with classified failures.

Tracing and lowering are separate steps so that an error of the candidate's Python
(shapes, dtypes, names) is told apart from Mosaic refusing the kernel.
"""

import re

import jax
from jax.sharding import AbstractDevice, AbstractMesh, AxisType

from .errors import WorkerError

# Chip name -> (device_kind as a real TPU reports it, TensorCores per JAX device). Some
# lowering paths (rank-1 blocks, tpu_info) ask the current device, which is a CPU here: an
# abstract mesh with a TPU AbstractDevice answers for it.
CHIPS = {
    "v4": ("TPU v4", 2),
    "v5e": ("TPU v5 lite", 1),
    "v5p": ("TPU v5", 2),
    "v6e": ("TPU v6 lite", 1),
    "v7x": ("TPU7x", 1),
}
DEFAULT_CHIP = "v5e"

_BLOCK_SHAPE = re.compile(r"block shape|block_shape|blocks of rank|blockspec|block spec|"
                          r"divisible by 8 and 128|only blocks having", re.IGNORECASE)
_UNSUPPORTED = re.compile(r"unimplemented|not implemented|unsupported|not supported",
                          re.IGNORECASE)


def abstract_mesh(chip: str) -> AbstractMesh:
    kind, cores = CHIPS.get(chip or DEFAULT_CHIP, CHIPS[DEFAULT_CHIP])
    device = AbstractDevice(device_kind=kind, num_cores=cores, platform="tpu")
    # Auto, not Explicit: explicit sharding inference is missing for some primitives in the
    # pinned JAX (ragged_dot_general raises NotImplementedError under Explicit).
    return AbstractMesh((1,), ("x",), (AxisType.Auto,), abstract_device=device)


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _message(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def classify_lowering_error(exc: BaseException) -> WorkerError:
    """Mosaic's own message, kept verbatim, under the class its rule belongs to."""
    chain = list(_chain(exc))
    for e in chain:
        if type(e).__name__ in ("VerificationError", "MLIRError"):
            return WorkerError("lowerVerification", str(e))
    for e in chain:
        if isinstance(e, ValueError) and _BLOCK_SHAPE.search(str(e)):
            return WorkerError("lowerBlockShape", str(e))
    for e in chain:
        if isinstance(e, NotImplementedError) or _UNSUPPORTED.search(str(e)):
            return WorkerError("lowerUnsupported", str(e))
    return WorkerError("lowerError", _message(exc))


def lower(workload, abstract_args: list, static_argnums: tuple, chip: str = "") -> dict:
    """Traces and lowers workload for TPU; returns {"mlirBytes": size of the module text}.

    abstract_args: jax.ShapeDtypeStruct for arrays, Python values for static arguments.
    Raises WorkerError traceError / lowerBlockShape / lowerUnsupported / lowerVerification /
    lowerError.
    """
    jitted = jax.jit(workload, static_argnums=static_argnums)
    with jax.sharding.use_abstract_mesh(abstract_mesh(chip)):
        try:
            jitted.trace(*abstract_args)
        except (KeyboardInterrupt, WorkerError):
            raise
        except BaseException as e:   # the candidate's own Python fails on abstract inputs
            raise WorkerError("traceError", _message(e)) from e
        try:
            exported = jax.export.export(jitted, platforms=["tpu"])(*abstract_args)
        except Exception as e:
            raise classify_lowering_error(e) from e
    return {"mlirBytes": len(exported.mlir_module())}
