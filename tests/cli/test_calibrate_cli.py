"""`maxkernel calibrate MEASUREMENTS.csv --chip CHIP` end to end: the built binary, the real
worker (it traces every row), the real model. Fixtures: tests/cli/calibration/README.md."""
import json
import os
import pathlib
import statistics
import subprocess

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("MAXKERNEL_BIN", ROOT / "build" / "cli" / "maxkernel"))
HERE = pathlib.Path(__file__).resolve().parent
CSV = HERE / "calibration" / "v5e_matmul.csv"
SPEC = ROOT / "examples" / "matmul" / "spec.yaml"
KERNEL = HERE / "kernels" / "matmul_blocks_128.py"
HEADER = "spec,kernel,chip,measured_us,source\n"

pytestmark = pytest.mark.skipif(not BIN.exists(), reason="maxkernel is not built")


def calibrate(*args, cwd=None, timeout=600):
    return subprocess.run([str(BIN), "calibrate", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


def efficiency(chip_yaml_text):
    return yaml.safe_load(chip_yaml_text)["efficiency"]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("calibrate")
    out, result = out_dir / "v5e.fitted.yaml", out_dir / "calibration.json"
    run = calibrate(CSV, "--chip", "v5e", "--out", out, "--json", result)
    assert run.returncode == 0, run.stderr
    return run, json.loads(result.read_text()), out


def v5e_rows():
    rows = [line.split(",", 4) for line in CSV.read_text().splitlines()[1:]]
    return [(number, r) for number, r in enumerate(rows, 2) if r[2] == "v5e"]


def test_calibrate_reports_every_row_of_the_chip(fitted):
    _, j, out = fitted
    assert j["chip"] == "v5e"
    assert j["timing"] == "modeled"
    assert j["out"] == str(out)
    expected = v5e_rows()
    assert len(expected) == 3
    # The v6e row of the file is skipped: only the chip's rows, in file order, with their lines.
    assert [p["line"] for p in j["points"]] == [number for number, _ in expected]
    assert [p["measured_us"] for p in j["points"]] == [float(r[3]) for _, r in expected]
    assert j["points"][2]["point"].endswith("reference")
    for p in j["points"]:
        assert p["before_us"] > 0 and p["after_us"] > 0


def median_error(points, key):
    return statistics.median(abs(p[key] - p["measured_us"]) / p["measured_us"] for p in points)


def test_calibrate_does_not_make_the_error_worse(fitted):
    _, j, _ = fitted
    before, after = j["before"], j["after"]
    assert after["median_error"] <= before["median_error"]
    assert after["max_ratio"] >= 1 and before["max_ratio"] >= 1
    # The summary figures are those of the points.
    assert before["median_error"] == pytest.approx(median_error(j["points"], "before_us"), rel=1e-6)
    assert after["median_error"] == pytest.approx(median_error(j["points"], "after_us"), rel=1e-6)
    worst = max(max(p["after_us"] / p["measured_us"], p["measured_us"] / p["after_us"])
                for p in j["points"])
    assert after["max_ratio"] == pytest.approx(worst, rel=1e-6)
    # All three rows share one source: one host overhead per call, never negative.
    assert len(j["host_overhead_us"]) == 1
    assert all(v >= 0 for v in j["host_overhead_us"].values())


def test_prior_is_the_chip_file_and_the_fitted_file_holds_the_fit(fitted):
    run, j, out = fitted
    prior_file = (ROOT / "config" / "chips" / "v5e.yaml").read_text()
    for name, value in efficiency(prior_file).items():
        assert j["prior"][name] == pytest.approx(float(value), rel=1e-9), name
    assert out.exists()
    assert not pathlib.Path(str(out) + ".tmp").exists()
    chip = yaml.safe_load(out.read_text())
    assert chip["name"] == "v5e"
    # Every constant of the chip file's efficiency block carries its fitted value.
    assert set(efficiency(prior_file)) <= set(chip["efficiency"])
    for name in efficiency(prior_file):
        assert float(chip["efficiency"][name]) == pytest.approx(j["fitted"][name], rel=1e-6), name
    assert j["fitted"] != j["prior"], "the fit moved nothing"
    # Only the efficiency block is fitted: the chip's published figures are kept.
    prior = yaml.safe_load(prior_file)
    for key in ("bf16_flops", "hbm_bandwidth", "scoped_vmem_bytes", "mxu_size", "megacore"):
        assert chip[key] == prior[key], key
    assert str(out) in run.stdout
    assert "median error" in run.stdout


def test_every_fitted_constant_is_written_to_the_chip_file(fitted):
    _, j, out = fitted
    written = yaml.safe_load(out.read_text())["efficiency"]
    assert set(written) == set(j["fitted"])
    for name, value in j["fitted"].items():
        assert float(written[name]) == pytest.approx(value, rel=1e-6), name


def test_json_to_stdout_carries_only_the_json(tmp_path):
    out = tmp_path / "fit.yaml"
    run = calibrate(CSV, "--chip", "v5e", "--out", out, "--json", "-")
    assert run.returncode == 0, run.stderr
    j = json.loads(run.stdout)
    assert j["chip"] == "v5e" and len(j["points"]) == 3
    assert "median error" in run.stderr
    assert out.exists()


def test_default_out_is_chip_fitted_yaml_in_the_working_directory(tmp_path):
    run = calibrate(CSV, "--chip", "v5e", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "v5e.fitted.yaml").exists()
    assert "efficiency" in yaml.safe_load((tmp_path / "v5e.fitted.yaml").read_text())


def row(spec=SPEC, kernel=KERNEL, chip="v5e", measured="297.666", source="test"):
    return f"{spec},{kernel},{chip},{measured},{source}\n"


# (CSV text, the line the error must name, words the message must carry)
BAD = {
    "missing_column": ("spec,kernel,chip,source\n" + f"{SPEC},{KERNEL},v5e,test\n", 1,
                       ["measured_us", "missing"]),
    "not_a_number": (HEADER + row() + row(measured="fast"), 3, ["measured_us", "'fast'"]),
    "negative": (HEADER + row(measured="-12.5"), 2, ["measured_us", "'-12.5'"]),
    "zero": (HEADER + row(measured="0"), 2, ["measured_us"]),
    "trailing_garbage": (HEADER + row(measured="12us"), 2, ["measured_us", "'12us'"]),
    "missing_spec": (HEADER + row() + row(spec="/nonexistent/spec.yaml"), 3,
                     ["spec", "/nonexistent/spec.yaml", "does not exist"]),
    "missing_kernel": (HEADER + row(kernel="/nonexistent/kernel.py"), 2,
                       ["kernel", "/nonexistent/kernel.py"]),
    "empty_chip": (HEADER + row(chip=""), 2, ["chip", "empty"]),
    "empty_file": ("", 1, ["empty"]),
    # libcsv without CSV_STRICT_FINI reads the open quote to the end as one field: the error
    # names the line (as "kernel: empty"), not the quote.
    "unterminated_quote": (HEADER + row() + f'"{SPEC},{KERNEL},v5e,1.0,test\n', 3, []),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_measurements_exit_2_naming_file_line_and_field(tmp_path, name):
    text, line, words = BAD[name]
    csv = tmp_path / f"{name}.csv"
    csv.write_text(text)
    out, result = tmp_path / "fit.yaml", tmp_path / "fit.json"
    run = calibrate(csv, "--chip", "v5e", "--out", out, "--json", result)
    assert run.returncode == 2, run.stderr
    assert f"{csv}:{line}:" in run.stderr
    for word in words:
        assert word in run.stderr, word
    assert "Traceback" not in run.stderr
    assert not out.exists() and not result.exists()
    assert not list(tmp_path.glob("*.tmp"))


def test_a_row_with_an_unknown_chip_exits_2_naming_its_line(tmp_path):
    csv = tmp_path / "unknown_chip.csv"
    csv.write_text(HEADER + row() + row(chip="v9"))
    out = tmp_path / "fit.yaml"
    run = calibrate(csv, "--chip", "v5e", "--out", out)
    assert run.returncode == 2, run.stdout
    assert f"{csv}:3:" in run.stderr and "chip" in run.stderr and "v9" in run.stderr
    assert not out.exists()


def test_no_rows_for_the_chip_exits_2(tmp_path):
    out = tmp_path / "fit.yaml"
    run = calibrate(CSV, "--chip", "v7x", "--out", out)
    assert run.returncode == 2
    assert str(CSV) in run.stderr and "no rows for chip v7x" in run.stderr
    assert not out.exists()


def test_a_header_without_rows_exits_2(tmp_path):
    csv = tmp_path / "header_only.csv"
    csv.write_text(HEADER)
    out = tmp_path / "fit.yaml"
    run = calibrate(csv, "--chip", "v5e", "--out", out)
    assert run.returncode == 2
    assert str(csv) in run.stderr and "no measurement rows" in run.stderr
    assert not out.exists()


def test_unknown_chip_option_exits_2(tmp_path):
    out = tmp_path / "fit.yaml"
    run = calibrate(CSV, "--chip", "v9", "--out", out)
    assert run.returncode == 2
    assert "--chip" in run.stderr
    assert not out.exists()


def test_missing_measurements_file_exits_2(tmp_path):
    run = calibrate(tmp_path / "none.csv", "--chip", "v5e")
    assert run.returncode == 2
    assert f"{tmp_path / 'none.csv'}" in run.stderr


def test_a_kernel_that_cannot_be_traced_names_its_line(tmp_path):
    kernel = tmp_path / "broken.py"
    kernel.write_text("def workload(x, y):\n    raise ValueError('no kernel here')\n")
    csv = tmp_path / "untraceable.csv"
    csv.write_text(HEADER + row() + row(kernel=kernel))
    out = tmp_path / "fit.yaml"
    run = calibrate(csv, "--chip", "v5e", "--out", out)
    assert run.returncode == 2, run.stderr
    assert str(csv) in run.stderr and "line 3" in run.stderr
    assert str(kernel) in run.stderr
    assert not out.exists()
