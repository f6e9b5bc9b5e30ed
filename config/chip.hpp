// A TPU generation as data (config/chips/<name>.yaml): what the performance model needs to
// price a kernel on it. Rates and sizes are per chip as published; the model divides them by
// the devices a chip exposes and the TensorCores a device has.
#pragma once

#include <cstdint>
#include <string>

namespace maxkernel::config {

// The model's efficiency constants: the share of a peak a well-formed kernel reaches, and
// fixed costs. Fitted by `maxkernel calibrate`; everything else in a chip file is published.
struct chip_efficiency {
  double mxu = 0.9;                 // of the peak matmul rate on MXU-aligned blocks
  double vpu = 0.6;                 // of the peak vector (VPU) rate
  double hbm = 0.85;                // of the peak HBM bandwidth for pipelined block copies
  double dma_latency_us = 0.5;      // issue-to-completion latency of one DMA
  double step_overhead_us = 0.35;   // fixed cost of one grid step (pipeline bookkeeping)
  double kernel_launch_us = 2.0;    // fixed cost of one pallas_call
  double xla_mxu = 0.8;             // XLA's fused dots, of the peak matmul rate
  double xla_hbm = 0.8;             // XLA's fusions, of the peak HBM bandwidth
  double xla_fusion_us = 1.5;       // fixed cost of one XLA fusion (kernel launch)
  double f32_matmul_passes = 3.0;   // f32 dots run as this many bf16 passes on the MXU
  double slot_overlap = 0.75;       // share of the shorter of MXU, VPU and EUP work hidden
                                    // under the longest (1: the VLIW slots overlap fully)
};

struct chip {
  std::string name;                 // v6e; equals the file's stem
  std::string source_path;          // the file it was read from

  // Layout of the chip.
  unsigned devices_per_chip = 1;    // JAX devices one chip exposes (v7x: 2)
  unsigned cores_per_device = 1;    // TensorCores per device (2 on megacore chips)
  bool megacore = false;            // "parallel" grid axes split across the device's cores
  unsigned mxus_per_core = 4;
  unsigned mxu_size = 128;          // MXU edge; matmul dims pad to a multiple of it
  double clock_hz = 0;

  // Peak rates per chip (FLOP/s or OP/s); 0 where the chip has no native support.
  double bf16_flops = 0;
  double int8_ops = 0;
  double fp8_flops = 0;
  double vpu_flops = 0;             // f32 vector ops per second per chip
  double transcendentals = 0;       // EUP results per second per chip

  // Memory.
  uint64_t hbm_bytes = 0;
  double hbm_bandwidth = 0;         // B/s per chip
  uint64_t vmem_bytes = 0;          // per TensorCore
  uint64_t scoped_vmem_bytes = 0;   // default scoped VMEM limit of the compiler
  uint64_t smem_bytes = 0;          // per TensorCore
  unsigned sublanes = 8;            // vreg shape: sublanes x lanes of 32-bit words
  unsigned lanes = 128;
  bool packed_sublane_tiling = false;  // bf16 tiles (16,128), int8 (32,128) instead of (8,128)

  // Interconnect.
  double ici_link_bandwidth = 0;    // B/s one way per link
  unsigned ici_links = 0;

  chip_efficiency efficiency;

  // Per device (what one tpu_node prices against).
  double device_share() const { return 1.0 / devices_per_chip; }
};

}  // namespace maxkernel::config
