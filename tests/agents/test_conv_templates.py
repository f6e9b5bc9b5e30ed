"""The conv_gemm template of the expert brain end to end: small native specs whose references
spell a convolution in different ways (lax.conv_general_dilated with NHWC or NCHW dimension
numbers, lax.conv, lax.conv_transpose, a 1-D conv with rhs dilation, feature_group_count for a
depthwise conv, a pointwise conv) with epilogues (bias, batchnorm affine, activations, a
residual, a layernorm over channels, a max pool) go through the built `maxkernel template`,
and the rendered kernel through `maxkernel check` (lowered for TPU, tested in interpret mode
against the reference). A reference without a convolution is refused."""
import json

import template_cli
from template_cli import needs_binary, run, write_spec

pytestmark = needs_binary


def template_and_check(tmp_path, spec, params=None):
    matched, _, source = template_cli.template_and_check(tmp_path, spec, "conv_gemm", params)
    assert "pl.pallas_call(" in source
    summary = next(m["summary"] for m in matched["matches"] if m["template"] == "conv_gemm")
    return matched, summary, source


def test_nhwc_conv_bias_relu_maxpool_fused(tmp_path):
    spec = write_spec(tmp_path, "nhwc_pool", "{B: 2, H: 8, W: 16, CI: 8, CO: 16}", [
        "{name: x, shape: [B, H, W, CI], dtype: bfloat16}",
        "{name: w, shape: [3, 3, CI, CO], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.1}}}",
        "{name: b, shape: [CO], dtype: bfloat16}"], """
        import jax, jax.numpy as jnp

        def reference(x, w, b):
            y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                             preferred_element_type=jnp.float32)
            y = jax.nn.relu(y + b.astype(jnp.float32))
            y = jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
            return y.astype(x.dtype)
        """)
    matched, summary, source = template_and_check(tmp_path, spec, {"block_s0": 4})
    assert "2D conv 3x3 stride 1x1, 8 -> 16 channels" in summary
    assert "+ max pool" in summary and "epilogue(" in summary
    # the pool and the cast after it run in the kernel: nothing is left for jnp
    assert "op(s) after as jnp" not in summary
    assert "CHANNEL_MAJOR = False" in source


def test_lax_conv_nchw_stride2_batchnorm_leaky_relu(tmp_path):
    # lax.conv: NCHW / OIHW, here with stride 2 and explicit padding, f32 inputs
    spec = write_spec(tmp_path, "nchw_bn", "{B: 2, C: 8, H: 12, W: 12, CO: 16}", [
        "{name: x, shape: [B, C, H, W], dtype: float32}",
        "{name: w, shape: [CO, C, 3, 3], dtype: float32, generator: {normal: {mean: 0, std: 0.1}}}",
        "{name: gamma, shape: [CO], dtype: float32}",
        "{name: beta, shape: [CO], dtype: float32}",
        "{name: mean, shape: [CO], dtype: float32}",
        "{name: var, shape: [CO], dtype: float32, generator: {uniform: {low: 0.5, high: 1.5}}}"], """
        import jax, jax.numpy as jnp

        def reference(x, w, gamma, beta, mean, var):
            y = jax.lax.conv(x, w, (2, 2), [(1, 1), (1, 1)])
            y = (y - mean[None, :, None, None]) / jnp.sqrt(var[None, :, None, None] + 1e-5)
            y = y * gamma.reshape(1, -1, 1, 1) + beta.reshape(1, -1, 1, 1)
            return jnp.where(y >= 0, y, 0.1 * y)
        """)
    matched, summary, source = template_and_check(tmp_path, spec)
    assert "stride 2x2, 8 -> 16 channels" in summary and "epilogue(" in summary
    # channels come first in the output: the tile is computed and stored channel-major
    assert "CHANNEL_MAJOR = True" in source


def test_depthwise_conv_layernorm_over_channels(tmp_path):
    spec = write_spec(tmp_path, "dw_ln", "{B: 2, H: 8, W: 8, C: 128}", [
        "{name: x, shape: [B, H, W, C], dtype: bfloat16}",
        "{name: dw, shape: [5, 5, 1, C], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.1}}}",
        "{name: g, shape: [C], dtype: float32}",
        "{name: bb, shape: [C], dtype: float32}"], """
        import jax, jax.numpy as jnp

        def reference(x, dw, g, bb):
            y = jax.lax.conv_general_dilated(
                x, dw, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                feature_group_count=x.shape[-1], preferred_element_type=jnp.float32)
            mu = y.mean(-1, keepdims=True)
            var = jnp.mean(jnp.square(y - mu), -1, keepdims=True)
            return ((y - mu) * jax.lax.rsqrt(var + 1e-6) * g + bb).astype(x.dtype)
        """)
    matched, summary, source = template_and_check(tmp_path, spec)
    assert summary.startswith("depthwise 2D conv 5x5 stride 2x2")
    # the layernorm reduces over the channels: one tile holds them all
    assert matched["facts"]["all_channels"] is True
    assert "reduce_sum" in summary

    # the bf16 window converted to f32 once per step (a VMEM copy, or the padded window of a
    # stride-1 conv) or per tap: both correct, the first with fewer conversions on the VPU
    def flops(spec, params):
        template_cli.template_and_check(tmp_path, spec, "conv_gemm", params)
        m = run("model", spec, tmp_path / f"{spec.stem}.py", "--chip", "v6e", "--no-store",
                "--json", "-")
        assert m.returncode == 0, m.stdout + m.stderr
        return sum(c["flops"] for c in json.loads(m.stdout)["chips"][0]["profile"]["calls"])

    assert matched["params"]["f32_window"] is True
    assert flops(spec, {"f32_window": True}) < flops(spec, {"f32_window": False})
    same = write_spec(tmp_path, "dw_same", "{B: 2, H: 8, W: 8, C: 128}", [
        "{name: x, shape: [B, H, W, C], dtype: bfloat16}",
        "{name: dw, shape: [3, 3, 1, C], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.1}}}"],
        """
        import jax, jax.numpy as jnp

        def reference(x, dw):
            return jax.lax.conv_general_dilated(
                x, dw, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                feature_group_count=x.shape[-1])
        """)
    padded = {"pad_in_kernel": True}
    assert flops(same, {**padded, "f32_window": True}) < flops(same, {**padded, "f32_window": False})


def test_conv_transpose_and_pointwise_residual(tmp_path):
    # a transposed conv (lhs dilation) runs as one stride-1 conv per output phase
    spec = write_spec(tmp_path, "convt", "{B: 2, H: 6, W: 8, CI: 16, CO: 8}", [
        "{name: x, shape: [B, H, W, CI], dtype: float32}",
        "{name: w, shape: [4, 4, CI, CO], dtype: float32, generator: {normal: {mean: 0, std: 0.1}}}"],
        """
        import jax, jax.numpy as jnp

        def reference(x, w):
            y = jax.lax.conv_transpose(x, w, (2, 2), "SAME",
                                       dimension_numbers=("NHWC", "HWIO", "NHWC"))
            return jax.nn.relu(y)
        """)
    matched, summary, source = template_and_check(tmp_path, spec)
    assert summary.startswith("transposed 2D conv 4x4 stride 2x2")

    # a 1x1 conv on NCHW is a matmul per image on channels-first blocks: no layout change
    spec = write_spec(tmp_path, "pointwise", "{B: 2, CI: 16, CO: 128, H: 8, W: 16}", [
        "{name: x, shape: [B, CI, H, W], dtype: bfloat16}",
        "{name: w, shape: [CO, CI, 1, 1], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.1}}}",
        "{name: s, shape: [CO], dtype: float32}",
        "{name: r, shape: [B, CO, H, W], dtype: bfloat16}"], """
        import jax, jax.numpy as jnp

        def reference(x, w, s, r):
            y = jax.lax.conv_general_dilated(x, w, (1, 1), "VALID",
                                             dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                             preferred_element_type=jnp.float32)
            y = y * s[None, :, None, None] + r.astype(jnp.float32)
            return jax.nn.relu(y).astype(r.dtype)
        """)
    matched, summary, source = template_and_check(tmp_path, spec)
    assert summary.startswith("2D conv 1x1 stride 1x1, 16 -> 128 channels")
    assert "CHANNEL_MAJOR = True" in source


def test_atrous_conv1d_and_refusal(tmp_path):
    # 1-D, channels-first, rhs dilation 2 (atrous), GELU after the bias
    spec = write_spec(tmp_path, "conv1d", "{B: 2, C: 8, L: 64, CO: 16}", [
        "{name: x, shape: [B, C, L], dtype: float32}",
        "{name: w, shape: [CO, C, 3], dtype: float32, generator: {normal: {mean: 0, std: 0.1}}}",
        "{name: b, shape: [CO], dtype: float32}"], """
        import jax, jax.numpy as jnp

        def reference(x, w, b):
            y = jax.lax.conv_general_dilated(x, w, (1,), [(2, 2)], rhs_dilation=(2,),
                                             dimension_numbers=("NCH", "OIH", "NCH"))
            return jax.nn.gelu(y + b[None, :, None])
        """)
    matched, summary, source = template_and_check(tmp_path, spec)
    assert "1D conv 3 stride 1 dilation 2" in summary

    # no convolution: conv_gemm refuses (and says so)
    spec = write_spec(tmp_path, "matmul", "{M: 64, K: 128, N: 128}", [
        "{name: x, shape: [M, K], dtype: bfloat16}",
        "{name: w, shape: [K, N], dtype: bfloat16}"], """
        import jax.numpy as jnp

        def reference(x, w):
            return jnp.maximum(x @ w, 0)
        """)
    t = run("template", spec, "--name", "conv_gemm", "--json", "-")
    assert t.returncode == 2
    out = json.loads(t.stdout)
    assert all(m["template"] != "conv_gemm" for m in out["matches"])
    assert "does not match" in t.stderr



# Strided convs at sizes the stride does not divide: the graph holds explicit pads only, and
# at the full sizes a VALID or PyTorch-style padding can equal what "SAME" gives there; read
# as SAME, the kernel pads up at other sizes and returns a longer output (a 4x4 stride-4 patch
# embedding at 13 rows: 4 instead of 3). `check` tests these small specs at their full sizes
# only; `propose`'s tester adds the ragged case (free dims at sizes that leave a partial last
# block), so these go through propose.


def propose_correct(tmp_path, spec):
    state = tmp_path / "state"
    p = run("propose", spec, "--out", tmp_path / "out", "--state-dir", state, "--max-repairs", 0,
            "--json", "-")
    result = json.loads(p.stdout)
    assert result["plan"] and result["plan"][0]["template"] == "conv_gemm", result["plan"]
    assert result["correct"] is True and result["fallback_to_reference"] is False, \
        (result["attempts"], p.stderr[-2000:])
    source = (tmp_path / "out" / "kernel.py").read_text()
    assert "# maxkernel expert template: conv_gemm" in source
    return result, source


def test_patch_embedding_valid_at_sizes_the_stride_does_not_divide(tmp_path):
    # swin-style: NCHW images, 4x4 stride 4 VALID (== SAME at 16 x 96), NHWC tokens, layernorm
    spec = write_spec(tmp_path, "patch4", "{B: 2, C: 3, H: 16, W: 96, CO: 128}", [
        "{name: x, shape: [B, C, H, W], dtype: bfloat16}",
        "{name: w, shape: [CO, C, 4, 4], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.1}}}",
        "{name: b, shape: [CO], dtype: bfloat16}"], """
        import jax, jax.numpy as jnp

        def reference(x, w, b):
            y = jax.lax.conv_general_dilated(x, w, window_strides=(4, 4), padding="VALID",
                                             dimension_numbers=("NCHW", "OIHW", "NHWC"),
                                             preferred_element_type=jnp.float32)
            y = y + b.astype(jnp.float32)
            mu = y.mean(-1, keepdims=True)
            y = (y - mu) * jax.lax.rsqrt(y.var(-1, keepdims=True) + 1e-5)
            return y.astype(x.dtype)
        """)
    result, source = propose_correct(tmp_path, spec)
    assert "2D conv 4x4 stride 4x4, 3 -> 128 channels" in source
    assert '"same":False' in source.replace(" ", "")


def test_pytorch_padding_at_sizes_the_stride_does_not_divide(tmp_path):
    # 1-D, channels-last: 4 taps, stride 2, pads (1, 1) as PyTorch writes them (== SAME at 32)
    spec = write_spec(tmp_path, "conv1d_s2", "{B: 2, L: 32, C: 8, CO: 16}", [
        "{name: x, shape: [B, L, C], dtype: float32}",
        "{name: w, shape: [4, C, CO], dtype: float32, generator: {normal: {mean: 0, std: 0.1}}}"],
        """
        import jax, jax.numpy as jnp

        def reference(x, w):
            y = jax.lax.conv_general_dilated(x, w, (2,), ((1, 1),),
                                             dimension_numbers=("NWC", "WIO", "NWC"))
            return jax.nn.relu(y)
        """)
    result, source = propose_correct(tmp_path, spec)
    assert "1D conv 4 stride 2" in source
    assert '"same":False' in source.replace(" ", "")


def test_strided_same_padding_at_sizes_the_stride_does_not_divide(tmp_path):
    # Flax-style NHWC: "SAME" conv with stride 2 (pads (0, 1) at 16) and a "SAME" 3x3 stride-2
    # max pool (pads (0, 1) at 8): both recomputed from the sizes at trace time
    spec = write_spec(tmp_path, "same_s2", "{B: 2, H: 16, W: 16, C: 8, CO: 16}", [
        "{name: x, shape: [B, H, W, C], dtype: float32}",
        "{name: w, shape: [3, 3, C, CO], dtype: float32, generator: {normal: {mean: 0, std: 0.1}}}"],
        """
        import jax, jax.numpy as jnp

        def reference(x, w):
            y = jax.lax.conv_general_dilated(x, w, (2, 2), "SAME",
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"))
            y = jnp.tanh(y)
            return jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1),
                                         "SAME")
        """)
    result, source = propose_correct(tmp_path, spec)
    assert "2D conv 3x3 stride 2x2, 8 -> 16 channels" in source and "+ max pool" in source
    flat = source.replace(" ", "")
    assert '"same":True' in flat and '"pool_same":True' in flat


def test_conv_glu_split_in_the_tail(tmp_path):
    # A gated conv (GLU over channels): jnp.split gives two results of one type; the tail
    # replays it as jnp (each half read by its result index) after the kernel's conv + bias.
    spec = write_spec(tmp_path, "conv_glu", "{B: 2, L: 32, CI: 8, CO: 32}", [
        "{name: x, shape: [B, L, CI], dtype: float32}",
        "{name: w, shape: [3, CI, CO], dtype: float32, generator: {normal: {mean: 0, std: 0.2}}}",
        "{name: b, shape: [CO], dtype: float32}"], """
        import jax, jax.numpy as jnp

        def reference(x, w, b):
            y = jax.lax.conv_general_dilated(x, w, (1,), "SAME",
                                             dimension_numbers=("NWC", "WIO", "NWC")) + b
            gate, value = jnp.split(y, 2, axis=-1)
            return value * jax.nn.sigmoid(gate)
        """)
    matched, summary, source = template_and_check(tmp_path, spec)
    assert "lax.split(" in source, source


def test_output_written_exact_with_ragged_row_tiles(tmp_path):
    # 11 rows in tiles of 4 (the last ragged) and 13 columns padded to the sublane tiling in
    # VMEM: the output array is the conv's output itself (no slice of a padded one after)
    spec = write_spec(tmp_path, "ragged", "{B: 2, H: 11, W: 13, CI: 8, CO: 128}", [
        "{name: x, shape: [B, H, W, CI], dtype: bfloat16}",
        "{name: w, shape: [3, 3, CI, CO], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.1}}}",
        "{name: b, shape: [CO], dtype: float32}"], """
        import jax, jax.numpy as jnp

        def reference(x, w, b):
            y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                             preferred_element_type=jnp.float32)
            return jax.nn.relu(y + b).astype(x.dtype)
        """)
    _, result, _ = template_cli.template_and_check(tmp_path, spec, "conv_gemm", {"block_s0": 4})
    out = [o for o in result["pallas_calls"][0]["operands"] if o["role"] == "output"]
    assert [o["block_shape"][-3:] for o in out] == [[4, 13, 128]], out


def test_transposed_conv_phases_written_in_place(tmp_path):
    # stride-2 transposed conv, 128 channels: each output phase's tile goes straight to its
    # rows and columns of the result (an (n, q0, 2, q1, 2 * c) view of it), no interleave;
    # one phase per grid step, or all four in one step (the input window read once), with
    # the 256 input channels accumulated over two steps of 128
    spec = write_spec(tmp_path, "convt_wide", "{B: 2, H: 4, W: 6, CI: 256, CO: 128}", [
        "{name: x, shape: [B, H, W, CI], dtype: bfloat16}",
        "{name: w, shape: [4, 4, CI, CO], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.05}}}"],
        """
        import jax, jax.numpy as jnp

        def reference(x, w):
            y = jax.lax.conv_transpose(x, w, (2, 2), "SAME",
                                       dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                       preferred_element_type=jnp.float32)
            return jax.nn.relu(y).astype(x.dtype)
        """)
    for in_step, steps, block in ((False, 4, [-1, 4, -1, 6, 128]), (True, 1, [-1, 4, 2, 6, 256])):
        for block_k in (256, 128):
            _, result, _ = template_cli.template_and_check(
                tmp_path, spec, "conv_gemm", {"phases_in_step": in_step, "block_k": block_k})
            call = result["pallas_calls"][0]
            assert call["grid"][0] == steps, call    # the phase axis
            assert call["grid"][-1] == 256 // block_k, call
            out = [o["block_shape"] for o in call["operands"] if o["role"] == "output"]
            assert out == [block], out
            # the input as it is: the zero row before it is put in VMEM
            assert call["operands"][0]["block_shape"][2:4] == [4, 6], call
    # or padded in HBM first
    _, result, _ = template_cli.template_and_check(tmp_path, spec, "conv_gemm",
                                                   {"pad_in_kernel": False})
    assert result["pallas_calls"][0]["operands"][0]["block_shape"][2:4] != [4, 6], result
    # by default all phases in one step when it fits
    t = run("template", spec, "--name", "conv_gemm", "--json", "-")
    assert t.returncode == 0, t.stderr
    assert json.loads(t.stdout)["params"]["phases_in_step"] is True


def test_strided_depthwise_reads_strided_rows_in_vmem(tmp_path):
    # a 5x5 stride-2 depthwise conv on bf16 with its window in f32: the taps read every
    # other row and column of the (zero-padded in VMEM, or padded in HBM) window, no
    # stride-phase split of the input; per-tap conversion keeps the four phases
    spec = write_spec(tmp_path, "dw_s2", "{B: 2, H: 12, W: 13, C: 128}", [
        "{name: x, shape: [B, H, W, C], dtype: bfloat16}",
        "{name: dw, shape: [5, 5, 1, C], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.1}}}"],
        """
        import jax, jax.numpy as jnp

        def reference(x, dw):
            y = jax.lax.conv_general_dilated(
                x, dw, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                feature_group_count=x.shape[-1], preferred_element_type=jnp.float32)
            return jax.nn.relu(y).astype(x.dtype)
        """)
    phases = {}
    for params in ({"f32_window": True, "block_s0": 2}, {"f32_window": True, "pad_in_kernel": False},
                   {"f32_window": False}):
        _, result, _ = template_cli.template_and_check(tmp_path, spec, "conv_gemm", params)
        x_block = result["pallas_calls"][0]["operands"][0]["block_shape"]
        phases[json.dumps(params)] = x_block[1]
    assert list(phases.values()) == [1, 1, 4], phases


def test_several_images_per_grid_step(tmp_path):
    # block_b images per step, each with its own per-image leaf (a time embedding added per
    # image and channel), its own sums over two K steps, and a transposed conv's phases
    # written phase-major (8 channels: not in place) or in place, one step or four
    temb = write_spec(tmp_path, "temb", "{B: 4, H: 6, W: 8, CI: 256, CO: 128}", [
        "{name: x, shape: [B, H, W, CI], dtype: bfloat16}",
        "{name: w, shape: [3, 3, CI, CO], dtype: bfloat16, generator: {normal: {mean: 0, std: 0.05}}}",
        "{name: t, shape: [B, CO], dtype: float32}"], """
        import jax, jax.numpy as jnp

        def reference(x, w, t):
            y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                             preferred_element_type=jnp.float32)
            return jax.nn.silu(y + t[:, None, None, :]).astype(x.dtype)
        """)
    narrow = write_spec(tmp_path, "convt_narrow", "{B: 4, H: 4, W: 4, CI: 16, CO: 8}", [
        "{name: x, shape: [B, H, W, CI], dtype: float32}",
        "{name: w, shape: [4, 4, CI, CO], dtype: float32, generator: {normal: {mean: 0, std: 0.1}}}"],
        """
        import jax, jax.numpy as jnp

        def reference(x, w):
            return jax.nn.relu(jax.lax.conv_transpose(x, w, (2, 2), "SAME",
                                                      dimension_numbers=("NHWC", "HWIO", "NHWC")))
        """)
    for spec, params in ((temb, {"block_b": 2, "block_k": 128}),
                         (temb, {"block_b": 4, "block_k": 256}),
                         (narrow, {"block_b": 2, "phases_in_step": True}),
                         (narrow, {"block_b": 4, "phases_in_step": False})):
        _, result, _ = template_cli.template_and_check(tmp_path, spec, "conv_gemm", params)
        call = result["pallas_calls"][0]
        x_block = call["operands"][0]["block_shape"]
        assert x_block[0] == params["block_b"], (params, call)
        assert 4 // params["block_b"] in call["grid"], (params, call)


def test_params_of_the_wrong_type_exit_2_naming_the_parameter(tmp_path):
    spec = write_spec(tmp_path, "dw_bad", "{B: 2, H: 8, W: 8, C: 128}", [
        "{name: x, shape: [B, H, W, C], dtype: bfloat16}",
        "{name: dw, shape: [3, 3, 1, C], dtype: bfloat16}"], """
        import jax

        def reference(x, dw):
            return jax.lax.conv_general_dilated(
                x, dw, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                feature_group_count=x.shape[-1])
        """)
    out = tmp_path / "k.py"
    for params, name in (('{"block_b": "x"}', "block_b"), ('{"block_s0": 0}', "block_s0"),
                         ('{"f32_window": "yes"}', "f32_window"),
                         ('{"vmem_limit_bytes": -1}', "vmem_limit_bytes")):
        r = run("template", spec, "--name", "conv_gemm", "--params", params, "--out", out)
        assert r.returncode == 2, (params, r.returncode, r.stderr)
        assert name in r.stderr and "internal error" not in r.stderr, r.stderr
        assert not out.exists()
