// What one device of a chip can do, derived from the chip file: per-core rates by element
// type, shared HBM bandwidth, and the padding rules of the MXU and of VMEM tiling.
#pragma once

#include "config/chip.hpp"
#include "maxkernel/schema/kernel_structure.capnp.h"

#include <cstdint>
#include <span>
#include <string_view>

namespace maxkernel::tpu_nodes::model {

struct device_rates {
  const config::chip* chip = nullptr;
  unsigned cores = 1;              // TensorCores of the device
  double bf16_core = 0;            // matmul FLOP/s of one core, bf16
  double int8_core = 0;            // 0: no native int8
  double fp8_core = 0;             // 0: no native fp8
  double vpu_core = 0;             // elementwise FLOP/s of one core
  double eup_core = 0;             // transcendentals/s of one core
  double hbm = 0;                  // B/s of the device, shared by its cores

  explicit device_rates(const config::chip& c);

  // Peak matmul rate of one core for these operand types (f32 runs as bf16 passes).
  double matmul_core(std::string_view lhs, std::string_view rhs) const;
  // 2*batch*m*n*k with n and k padded to the MXU edge and m to the sublane count: the work
  // the MXU really does.
  double padded_matmul_flops(double batch, int64_t m, int64_t n, int64_t k) const;
  // Microseconds of one run of a dot on `on_cores` cores at `efficiency` of their peak, padded
  // as padded_matmul_flops says (its count is not applied).
  double matmul_us(schema::DotOp::Reader dot, double efficiency, unsigned on_cores = 1) const;
  // Bytes a block occupies in VMEM (and moves over DMA): its last two dims padded to the
  // memory tile of its element type; -1 (squeezed) dims count as 1.
  double tiled_bytes(std::span<const int64_t> shape, std::string_view dtype) const;
  // Time of one core's step work with the VLIW slots overlapping as the chip file says.
  double overlapped(double mxu_us, double vpu_us, double eup_us) const;
};

uint32_t itemsize_of(std::string_view dtype);  // 4 for names the model does not know
int64_t round_up(int64_t x, int64_t multiple);

}  // namespace maxkernel::tpu_nodes::model
