#include "runtime/utility_kernels.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "qgemm/error.hpp"
#include "quant/block_quant.hpp"
#include "runtime/driver.hpp"

namespace qgemm::runtime {
namespace {

template <typename T>
T* device_pointer(CUdeviceptr address) {
  return reinterpret_cast<T*>(static_cast<std::uintptr_t>(address));
}

// Blocks for a grid-stride loop over `items`: enough to fill any GPU several times over, few
// enough that each thread does a handful of items on large tensors.
LaunchGrid grid_stride(std::int64_t items, int threads) {
  constexpr std::int64_t kMaxBlocks = 65536;
  const std::int64_t blocks =
      std::clamp<std::int64_t>((items + threads - 1) / threads, 1, kMaxBlocks);
  return LaunchGrid{static_cast<unsigned>(blocks), 1, 1};
}

std::int64_t packed_row_bytes(std::int64_t count, int bits) { return (count * bits + 7) / 8; }

}  // namespace

kernels::DequantizeWeightArgs dequantize_weight_args(const PackedWeight& weight, CUdeviceptr codes,
                                                     CUdeviceptr scales, CUdeviceptr zeros,
                                                     CUdeviceptr out) {
  require(weight.n > 0 && weight.k > 0, "dequantize_weight: n = {}, k = {} (rule: both >= 1)",
          weight.n, weight.k);
  const ScaleGrid grid = weight.scale_grid();
  kernels::DequantizeWeightArgs args{};
  args.codes = device_pointer<const unsigned char>(codes);
  args.scales = device_pointer<const unsigned char>(scales);
  args.zeros = device_pointer<const unsigned char>(zeros);
  args.out = device_pointer<unsigned short>(out);
  args.n = weight.n;
  args.k = weight.k;
  args.row_bytes = weight.row_bytes();
  args.scale_cols = grid.cols;
  args.scale_rows_per = grid.rows_per;
  args.scale_cols_per = grid.cols_per;
  // Integer zero points are packed per grid row like codes (include/qgemm/quant.hpp).
  args.zero_row_bytes = packed_row_bytes(grid.cols, weight.quant.format.bits);
  args.global_scale = static_cast<float>(weight.global_scale);
  return args;
}

void launch_dequantize_weight(const LoadedKernel& kernel, const kernels::DequantizeWeightArgs& args,
                              CUstream stream) {
  launch_kernel(kernel, grid_stride(args.n * args.k, kernel.launch.threads_per_block), args,
                stream);
}

kernels::QuantizeActivationArgs quantize_activation_args(const ActivationQuant& quant,
                                                         std::int64_t m, std::int64_t k,
                                                         CUdeviceptr input, std::int64_t lda,
                                                         double static_scale) {
  require(m > 0 && k > 0, "quantize_activation: m = {}, k = {} (rule: both >= 1)", m, k);
  require(k < (std::int64_t{1} << 31), "quantize_activation: k = {} (rule: < 2^31)", k);
  require(lda >= k, "quantize_activation: lda = {} (rule: >= k = {})", lda, k);
  require(quant.is_quantized(), "quantize_activation: {} activations are not quantized",
          quant.format.name());
  kernels::QuantizeActivationArgs args{};
  args.input = device_pointer<const unsigned short>(input);
  args.lda = lda;
  args.m = m;
  args.k = k;
  args.group = quant.group > 0 ? quant.group : k;
  // The canonical scale grid, row-major (include/qgemm/quant.hpp).
  const ScaleGrid grid = activation_scale_grid(quant, m, k);
  args.scale_row_stride = quant.scaling == ActivationScaling::StaticTensor ? 0 : grid.cols;
  args.scale_cell_stride = 1;
  args.scale_copies = 1;
  args.element_max = quant.format.max_finite();
  args.nv_denominator = args.element_max * quant.scale_format.max_finite();
  if (quant.scaling == ActivationScaling::StaticTensor && static_scale > 0)
    args.static_scale = quant_detail::finalize_scale(quant.scale_format, static_scale);
  return args;
}

bool needs_tensor_absmax(const ActivationQuant& quant, double static_scale) {
  return quant.scaling == ActivationScaling::NV ||
         (quant.scaling == ActivationScaling::StaticTensor && !(static_scale > 0));
}

LaunchGrid quantize_activation_grid(const kernels::QuantizeActivationArgs& args,
                                    int threads_per_block) {
  // One block per row (grid-stride over rows beyond the cap); short cells (group, MX, NV) are
  // independent, so a few rows are shared by gridDim.y blocks each, up to about
  // kQuantizeTargetBlocks in all and each warp keeping at least one pass of cells
  // (short_cell_walk's cells_per_warp; row-wide scalings have one cell per row: group = k).
  // fp8-block 7168×18432 from bf16 at M = 1 (144 cells a row): 19 µs behind the same GEMM on
  // given codes with one block, 2.4 µs spread over 18 (H100, bench/NOTES.md).
  constexpr std::int64_t kQuantizeTargetBlocks = 1024;
  const kernels::ShortCellWalk walk =
      kernels::short_cell_walk(args.group, args.vector8 ? 8 : 1);
  const std::int64_t cells_per_block = threads_per_block / 32 * walk.cells_per_warp;
  const std::int64_t cells = (args.k + args.group - 1) / args.group;
  const std::int64_t wanted = std::min<std::int64_t>(
      (cells + cells_per_block - 1) / cells_per_block, kQuantizeTargetBlocks / args.m);
  return {static_cast<unsigned>(std::min<std::int64_t>(args.m, 65535)),
          static_cast<unsigned>(std::clamp<std::int64_t>(wanted, 1, 65535)), 1};
}

void launch_quantize_activation(const LoadedKernel& kernel,
                                const kernels::QuantizeActivationArgs& args, CUstream stream) {
  // Eight values per thread where every row of every array the emission touches starts 16 bytes
  // aligned (the kernel's vector8; operand8's permuted K stays one at a time, and its operand
  // pointer is then the only one set besides the input).
  auto aligned16 = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  kernels::QuantizeActivationArgs launched = args;
  launched.vector8 = args.operand8 == nullptr && args.k % 8 == 0 && args.lda % 8 == 0 &&
                     aligned16(args.input) && args.group % 8 == 0 &&
                     (args.codes == nullptr || aligned16(args.codes)) &&
                     (args.operand == nullptr || (aligned16(args.operand) && args.ldo % 8 == 0));
  launch_kernel(kernel, quantize_activation_grid(launched, kernel.launch.threads_per_block),
                launched, stream);
}

void launch_expand_activation(const LoadedKernel& kernel, const kernels::ExpandActivationArgs& args,
                              CUstream stream) {
  launch_kernel(kernel, grid_stride(args.m * args.k, kernel.launch.threads_per_block), args,
                stream);
}

void launch_tensor_absmax(const LoadedKernel& kernel, CUdeviceptr input, std::int64_t m,
                          std::int64_t k, std::int64_t lda, CUdeviceptr absmax, CUstream stream) {
  kernels::TensorAbsmaxArgs args{};
  args.input = device_pointer<const unsigned short>(input);
  args.lda = lda;
  args.m = m;
  args.k = k;
  args.absmax = device_pointer<float>(absmax);
  const Driver& driver = Driver::get();
  driver.check(driver.cuMemsetD32Async(absmax, 0u, 1, stream), "cuMemsetD32Async");
  // A few blocks per SM's worth: each thread reduces many elements before the one atomic.
  const std::int64_t blocks = std::min<std::int64_t>(1024, (m * k + 4095) / 4096);
  launch_kernel(kernel, LaunchGrid{static_cast<unsigned>(std::max<std::int64_t>(blocks, 1)), 1, 1},
                args, stream);
}

void launch_tensor_absmax_for(const LoadedKernel& kernel, kernels::QuantizeActivationArgs& args,
                              float* absmax, CUstream stream) {
  launch_tensor_absmax(kernel, reinterpret_cast<CUdeviceptr>(args.input), args.m, args.k,
                       args.lda, reinterpret_cast<CUdeviceptr>(absmax), stream);
  args.tensor_absmax = absmax;
}

void launch_quantize_weight(const LoadedKernel& kernel, const kernels::QuantizeWeightArgs& args,
                            kernels::WeightQuantizeStep step, CUstream stream) {
  const int threads = kernel.launch.threads_per_block;
  std::int64_t items = 0;
  switch (step) {
    case kernels::kWeightStats: items = args.n * args.grid_cols * 32; break;
    case kernels::kWeightCells: items = args.grid_rows * ((args.grid_cols + 7) / 8); break;
    case kernels::kWeightCodes: items = args.n * ((args.k + 7) / 8); break;
  }
  launch_kernel(kernel, grid_stride(items, threads), args, stream);
}

std::int64_t repacked_word_count(std::int64_t n, std::int64_t k, int bits) {
  const std::int64_t per_word = 32 / bits;
  return (k + per_word - 1) / per_word * n;
}

kernels::RepackWeightArgs repack_weight_args(std::int64_t n, std::int64_t k, int bits,
                                             CUdeviceptr codes, CUdeviceptr words) {
  require(n > 0 && k > 0, "repack_weight: n = {}, k = {} (rule: both >= 1)", n, k);
  require(bits >= 1 && bits <= 8, "repack_weight: bits = {} (rule: 1..8)", bits);
  kernels::RepackWeightArgs args{};
  args.codes = device_pointer<const unsigned char>(codes);
  args.words = device_pointer<unsigned int>(words);
  args.n = n;
  args.k = k;
  args.row_bytes = packed_row_bytes(k, bits);
  return args;
}

void launch_repack_weight(const LoadedKernel& kernel, const kernels::RepackWeightArgs& args,
                          int bits, CUstream stream) {
  const std::int64_t words = repacked_word_count(args.n, args.k, bits);
  launch_kernel(kernel, grid_stride(words, kernel.launch.threads_per_block), args, stream);
}

}  // namespace qgemm::runtime
