#include "layout/mma_repack_gpu.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "gemm/mma_repack_args.cuh"
#include "jit/cache.hpp"
#include "qgemm/error.hpp"
#include "quant/quantize_on_device.hpp"
#include "runtime/driver.hpp"
#include "runtime/kernel_loader.hpp"

namespace qgemm::layout {
namespace {

constexpr int kThreads = 256;

// Zeroes a buffer of 4-byte words on `stream`, ahead of the repack on the same stream (without
// the context synchronization of DeviceBuffer::fill_bytes, three a repack).
void zero_on_stream(const runtime::DeviceBuffer& buffer, CUstream stream) {
  const auto& driver = runtime::Driver::get();
  driver.check(driver.cuMemsetD32Async(buffer.address(), 0u, buffer.bytes() / 4, stream),
               "mma repack: cuMemsetD32Async");
}

const char* zero_choice(MmaZeroMode mode) {
  switch (mode) {
    case MmaZeroMode::Integer: return "int";
    case MmaZeroMode::Float: return "float";
    default: return "none";
  }
}

}  // namespace

jit::KernelSpec mma_repack_spec(const PackedWeight& weight, jit::Arch arch, FragmentOrder order) {
  const MmaWeight meta = mma_shape(weight.quant, weight.n, weight.k, weight.global_scale, order);
  jit::KernelSpec spec;
  spec.family = "mma_repack";
  spec.arch = arch;
  spec.params = {jit::SpecParam::number_format("weight", weight.quant.format),
                 jit::SpecParam::number_format("scale", weight.quant.scale_format),
                 jit::SpecParam::chosen("zero", zero_choice(meta.zero_mode)),
                 jit::SpecParam::chosen("order", fragment_order_name(order))};
  spec.launch.threads_per_block = kThreads;
  spec.launch.dynamic_smem_bytes = 0;
  return spec;
}

MmaDeviceWeight repack_for_mma_on_device(const PackedWeight& w, jit::Arch arch, CUstream stream,
                                         FragmentOrder order, std::int64_t glu_inter) {
  check_packed_weight(w, "mma repack");
  const quant_detail::DeviceQuantizedWeight source = quant_detail::upload_packed_weight(w);
  return repack_for_mma_on_device(
      w, {source.codes.address(), source.scales.address(), source.zeros.address()}, arch, stream,
      order, glu_inter);
}

MmaDeviceWeight repack_for_mma_on_device(const PackedWeight& w, const CanonicalOnDevice& source,
                                         jit::Arch arch, CUstream stream, FragmentOrder order,
                                         std::int64_t glu_inter) {
  if (glu_inter < 0 || (glu_inter > 0 && w.n != 2 * glu_inter))
    throw Error(ErrorCode::Internal,
                fmt::format("mma repack: glu_inter {} for a weight of {} rows (rule: 0, or half "
                            "the rows: gate then up)",
                            glu_inter, w.n));
  MmaDeviceWeight out;
  // The scale flags come from the kernel, which decodes every scale anyway: the host's
  // mma_metadata would scan the scales on the host (NVFP4's 28672 x 8192: 14.7 M of them).
  out.meta = mma_shape(w.quant, w.n, w.k, w.global_scale, order);
  const MmaWeight& m = out.meta;
  const int bits = w.quant.format.bits;
  const bool stored_zeros = m.stores_zeros();
  const std::size_t lanes = static_cast<std::size_t>(m.n_padded / 64 * m.k_blocks * 32);
  const std::size_t scale_count = static_cast<std::size_t>(m.groups) * m.n_padded;

  out.words = runtime::DeviceBuffer(lanes * bits * sizeof(std::uint32_t));
  out.scales = runtime::DeviceBuffer(scale_count * sizeof(float));
  zero_on_stream(out.scales, stream);  // padding columns stay 0 (words are all written)
  if (stored_zeros) {
    out.zeros = runtime::DeviceBuffer(scale_count * sizeof(float));
    zero_on_stream(out.zeros, stream);
  }

  const ScaleGrid grid = w.scale_grid();
  kernels::MmaRepackArgs args{};
  auto bytes_at = [](CUdeviceptr address) {
    return reinterpret_cast<const unsigned char*>(static_cast<std::uintptr_t>(address));
  };
  args.codes = bytes_at(source.codes);
  args.scales = bytes_at(source.scales);
  args.zeros = source.zeros ? bytes_at(source.zeros) : nullptr;
  args.row_bytes = w.row_bytes();
  args.zero_row_bytes = (grid.cols * bits + 7) / 8;
  args.n = w.n;
  args.k = w.k;
  args.grid_cols = grid.cols;
  args.rows_per = grid.rows_per;
  args.cols_per = grid.cols_per;
  args.words = out.words.as<unsigned>();
  args.scales_out = out.scales.as<float>();
  args.zeros_out = stored_zeros ? out.zeros.as<float>() : nullptr;
  args.n_padded = m.n_padded;
  args.k_blocks = m.k_blocks;
  args.groups = m.groups;
  args.group_size = m.group_size;
  args.zero_offset = w.quant.format.is_signed ? static_cast<float>(1 << (bits - 1)) : 0.0f;
  runtime::DeviceBuffer scale_inexact(sizeof(unsigned));
  zero_on_stream(scale_inexact, stream);
  args.scale_inexact = scale_inexact.as<unsigned>();
  args.glu_inter = glu_inter;

  const auto compiled = jit::KernelCache::global().get(mma_repack_spec(w, arch, order));
  const runtime::LoadedKernel kernel = runtime::KernelLoader::global().get(*compiled.kernel);
  const std::size_t total =
      lanes + static_cast<std::size_t>(m.groups) * kernels::repack_scale_rows(args);
  const auto blocks =
      static_cast<unsigned>(std::min<std::size_t>((total + kThreads - 1) / kThreads, 65535u * 8));
  runtime::launch_kernel(kernel, {blocks, 1, 1}, args, stream);
  const auto& driver = runtime::Driver::get();
  driver.check(driver.cuStreamSynchronize(stream), "mma repack: cuStreamSynchronize");
  const unsigned inexact = scale_inexact.to_vector<unsigned>(1)[0];
  out.meta.scales_exact_in_bf16 = !(inexact & 1u);
  out.meta.scales_exact_in_fp16 = !(inexact & 2u);
  return out;
}

}  // namespace qgemm::layout
