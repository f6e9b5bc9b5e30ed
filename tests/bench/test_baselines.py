"""Every expert baseline of the suite passes `maxkernel check SPEC --baseline` (lowered for TPU,
tested in TPU interpret mode at reduced size against the spec's reference)."""
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(os.environ.get("MAXKERNEL_BIN", ROOT / "build" / "cli" / "maxkernel"))
SPECS = sorted(p for p in (ROOT / "bench" / "specs").rglob("*.yaml")
               if "\nbaseline:" in p.read_text())

# Known failures, each with its cause; strict, so a fix shows up as an unexpected pass.
KNOWN = {
    "paged_attention_decode": "the spec's atol 1e-3 is tighter than the library kernel's bf16 "
                              "numerics at reduced size (errors of ~5 bf16 ulps)",
    "ragged_paged_attention": "SEQ_BOUNDS must stay MAX_SEQS + 1, a relation the reduction "
                              "cannot know (the spec format has no derived dims)",
}

pytestmark = pytest.mark.skipif(not BIN.exists(), reason="maxkernel is not built")


def test_the_eight_expert_baselines_are_there():
    assert len(SPECS) >= 8


@pytest.mark.parametrize("path", [
    pytest.param(p, marks=pytest.mark.xfail(reason=KNOWN[p.stem], strict=True))
    if p.stem in KNOWN else p for p in SPECS], ids=[p.stem for p in SPECS])
def test_baseline_passes_check(path):
    run = subprocess.run([str(BIN), "check", str(path), "--baseline"], capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
