"""EvalOptions.configuration: extract (and time) work on the configuration the request names."""

from conftest import MATMUL_REFERENCE, candidate, phase

BLOCK = 128  # tests/worker/kernels/matmul.py's BM = BN = BK


def two_configuration_spec(shapes) -> dict:
    """A native spec whose configurations have literal (unnamed) shapes: (m, k, n) each."""
    def tensor(name, shape):
        return {"name": name, "type": {"shape": list(shape), "dtype": "bfloat16"},
                "generator": {"normal": {"mean": 0.0, "std": 1.0}}, "dimNames": ["", ""]}
    return {
        "schemaVersion": 1, "name": "matmul2", "format": "native",
        "sourcePath": "/nonexistent/specs/matmul2.yaml",
        "configurations": [{"name": f"c{i}", "inputs": [tensor("a", (m, k)), tensor("b", (k, n))],
                            "outputs": [{"shape": [m, n], "dtype": "bfloat16"}]}
                           for i, (m, k, n) in enumerate(shapes)],
        "reference": MATMUL_REFERENCE, "referenceEntry": "reference",
        "tolerances": [{"output": -1, "atol": 2e-2, "rtol": 2e-2}], "chip": "v5e",
    }


SHAPES = [(256, 256, 256), (128, 512, 384)]


def test_configuration_selects_the_shapes_extract_sees(worker):
    spec, cand = two_configuration_spec(SHAPES), candidate("matmul.py")
    for c, (m, k, n) in enumerate(SHAPES):
        result = worker.evaluate("extract", spec, cand, {"configuration": c})
        assert result["hasStructure"], result["phases"]
        (call,) = result["structure"]["pallasCalls"]
        assert call["grid"] == [m // BLOCK, n // BLOCK, k // BLOCK]
        a = [o for o in call["operands"] if o["role"] == "input" and o["index"] == 0][0]
        assert a["type"]["shape"] == [m, k]
        (dot,) = call["stepDots"]
        assert (dot["m"], dot["n"], dot["k"]) == (BLOCK, BLOCK, BLOCK)


def test_configuration_out_of_range_is_bad_input(worker):
    spec, cand = two_configuration_spec(SHAPES), candidate("matmul.py")
    for kind in ("extract", "time"):
        reply = worker.request(**{kind: {"schemaVersion": 1, "spec": spec, "candidate": cand,
                                         "options": {"configuration": 2}}})
        error = reply["error"]
        assert error["errorClass"] == "badInput"
        assert "configuration 2" in error["message"] and "2 configurations" in error["message"]


def test_time_takes_the_configuration_too(worker):
    # No TPU here: an in-range configuration reaches the profile phase (and fails there).
    spec, cand = two_configuration_spec(SHAPES), candidate("matmul.py")
    result = worker.evaluate("time", spec, cand, {"configuration": 1})
    assert "no TPU" in phase(result, "profile")["message"]

