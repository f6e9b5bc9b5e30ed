#include "tpu_nodes/model/device_rates.hpp"

#include "config/dtype_info.hpp"

#include <algorithm>

namespace maxkernel::tpu_nodes::model {

namespace {

bool is_int8(std::string_view t) { return t == "int8" || t == "uint8" || t == "int4"; }
bool is_fp8(std::string_view t) { return t.starts_with("float8"); }
bool is_f32(std::string_view t) { return t == "float32" || t == "float64" || t == "int32"; }

}  // namespace

uint32_t itemsize_of(std::string_view dtype) {
  auto info = config::find_dtype(dtype);
  return info ? info->itemsize : 4;
}

int64_t round_up(int64_t x, int64_t multiple) {
  if (multiple <= 1)
    return x;
  return (x + multiple - 1) / multiple * multiple;
}

device_rates::device_rates(const config::chip& c) : chip(&c) {
  double share = c.device_share();
  cores = std::max(1u, c.cores_per_device);
  double per_core = share / cores;
  bf16_core = c.bf16_flops * per_core;
  int8_core = c.int8_ops * per_core;
  fp8_core = c.fp8_flops * per_core;
  vpu_core = c.vpu_flops * per_core;
  eup_core = c.transcendentals * per_core;
  hbm = c.hbm_bandwidth * share;
}

double device_rates::matmul_core(std::string_view lhs, std::string_view rhs) const {
  if (is_int8(lhs) && is_int8(rhs) && int8_core > 0)
    return int8_core;
  if (is_fp8(lhs) && is_fp8(rhs) && fp8_core > 0)
    return fp8_core;
  if (is_f32(lhs) || is_f32(rhs))
    return bf16_core / std::max(1.0, chip->efficiency.f32_matmul_passes);
  // bf16, f16 and unsupported narrow types (converted to bf16 first) run at the bf16 rate.
  return bf16_core;
}

double device_rates::padded_matmul_flops(double batch, int64_t m, int64_t n, int64_t k) const {
  int64_t mxu = std::max(1u, chip->mxu_size);
  return 2.0 * batch * static_cast<double>(round_up(std::max<int64_t>(m, 1), chip->sublanes))
         * static_cast<double>(round_up(std::max<int64_t>(n, 1), mxu))
         * static_cast<double>(round_up(std::max<int64_t>(k, 1), mxu));
}

double device_rates::matmul_us(schema::DotOp::Reader dot, double efficiency,
                               unsigned on_cores) const {
  double padded = padded_matmul_flops(std::max<int64_t>(dot.getBatch(), 1), dot.getM(),
                                      dot.getN(), dot.getK());
  double rate = matmul_core(dot.getLhsDtype().cStr(), dot.getRhsDtype().cStr()) * on_cores;
  return padded / (rate * efficiency) * 1e6;
}

double device_rates::tiled_bytes(std::span<const int64_t> shape, std::string_view dtype) const {
  uint32_t size = itemsize_of(dtype);
  if (shape.empty())
    return size;
  auto dim = [&](size_t i) { return std::max<int64_t>(shape[i], 1); };
  double bytes = size;
  size_t rank = shape.size();
  if (rank == 1)
    return bytes * static_cast<double>(round_up(dim(0), int64_t{chip->sublanes} * chip->lanes));
  // Packed types fill more sublanes per tile on chips that tile them that way.
  int64_t sublane_tile = chip->sublanes;
  if (chip->packed_sublane_tiling && size < 4)
    sublane_tile = chip->sublanes * (4 / size);
  for (size_t i = 0; i + 2 < rank; ++i)
    bytes *= static_cast<double>(dim(i));
  bytes *= static_cast<double>(round_up(dim(rank - 2), sublane_tile));
  bytes *= static_cast<double>(round_up(dim(rank - 1), chip->lanes));
  return bytes;
}

double device_rates::overlapped(double mxu_us, double vpu_us, double eup_us) const {
  double longest = std::max({mxu_us, vpu_us, eup_us});
  double rest = mxu_us + vpu_us + eup_us - longest;
  return longest + (1.0 - chip->efficiency.slot_overlap) * rest;
}

}  // namespace maxkernel::tpu_nodes::model
