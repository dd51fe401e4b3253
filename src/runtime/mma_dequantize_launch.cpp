#include "runtime/mma_dequantize_launch.hpp"

#include <fmt/format.h>

#include <cstdint>

#include "gemm/mma_dequantize_shape.cuh"
#include "layout/mma_layout.hpp"
#include "qgemm/error.hpp"

namespace qgemm::runtime {

using Shape = kernels::MmaDequantizeShape;

void check_mma_dequantize_args(const kernels::MmaDequantizeArgs& args,
                               layout::FragmentOrder order) {
  auto fail = [](const std::string& rule) {
    throw Error(ErrorCode::InvalidArgument, "mma_dequantize: " + rule);
  };
  if (!args.words || !args.scales || !args.out)
    fail(fmt::format("{} is null", !args.words ? "words" : !args.scales ? "scales" : "out"));
  if (reinterpret_cast<std::uintptr_t>(args.out) % 16 != 0)
    fail(fmt::format("out = {} is not 16-byte aligned (rule: rows are written in 16-byte chunks)",
                     static_cast<const void*>(args.out)));
  if (args.n_padded < Shape::kTileRows || args.n_padded % Shape::kTileRows != 0)
    fail(fmt::format("n_padded = {} (rule: a positive multiple of 64)", args.n_padded));
  if (args.n_begin < 0 || args.n_begin % Shape::kTileRows != 0)
    fail(fmt::format("n_begin = {} (rule: a non-negative multiple of 64, chunks start on a slice)",
                     args.n_begin));
  if (args.rows < 1 || args.n_begin + args.rows > args.n_padded)
    fail(fmt::format("rows = {} from n_begin = {} (rule: at least 1, within n_padded = {})",
                     args.rows, args.n_begin, args.n_padded));
  if (args.k < 1 || args.k_blocks != layout::stored_k_blocks(order, args.k))
    fail(fmt::format("k = {} with k_blocks = {} in the {} order (rule: k >= 1, k_blocks = "
                     "ceil(k / 16){})",
                     args.k, args.k_blocks, layout::fragment_order_name(order),
                     order == layout::FragmentOrder::Wgmma ? " rounded up to a multiple of 4"
                                                           : ""));
  if (Shape::tiles(args.rows, args.k_blocks) > 0x7fffffff)
    fail(
        fmt::format("rows = {} × k = {} make {} warp tiles (rule: at most 2^31 - 1 per launch; "
                    "split the rows into chunks)",
                    args.rows, args.k, Shape::tiles(args.rows, args.k_blocks)));
  if (args.ld_out < args.k || args.ld_out % Shape::kLdOutMultiple != 0)
    fail(fmt::format("ld_out = {} for k = {} (rule: >= k and a multiple of {}, e.g. {})",
                     args.ld_out, args.k, Shape::kLdOutMultiple, Shape::ld_out(args.k)));
}

int mma_dequantize_blocks_per_sm(const jit::KernelSpec& spec) {
  if (spec.family != "mma_dequantize")
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("mma_dequantize: spec {} is not of the mma_dequantize family",
                            jit::to_string(spec)));
  const std::string& zero = spec.param("zero").choice;
  return Shape::blocks_per_sm(spec.param("weight").format.bits, zero == "int" || zero == "float",
                              zero == "float", static_cast<int>(spec.param("group").value));
}

LaunchGrid mma_dequantize_grid(const jit::KernelSpec& spec, const kernels::MmaDequantizeArgs& args,
                               int sm_count) {
  const long long tiles = Shape::tiles(args.rows, args.k_blocks);
  return {static_cast<unsigned>(Shape::grid_blocks(tiles, sm_count < 1 ? 1 : sm_count,
                                                   mma_dequantize_blocks_per_sm(spec))),
          1, 1};
}

void launch_mma_dequantize(const LoadedKernel& kernel, const jit::KernelSpec& spec,
                           const kernels::MmaDequantizeArgs& args, int sm_count, CUstream stream) {
  check_mma_dequantize_args(args, spec.param("order").choice == "wgmma"
                                      ? layout::FragmentOrder::Wgmma
                                      : layout::FragmentOrder::Mma);
  if (kernel.launch != spec.launch || spec.launch.threads_per_block != Shape::kThreads ||
      spec.launch.dynamic_smem_bytes != Shape::kSmemBytes)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("mma_dequantize: kernel launch shape [threads={},smem={}] is not "
                            "MmaDequantizeShape's [threads={},smem={}] (rule: the kernel of a "
                            "jit::mma_dequantize_spec)",
                            kernel.launch.threads_per_block, kernel.launch.dynamic_smem_bytes,
                            Shape::kThreads, Shape::kSmemBytes));
  launch_kernel(kernel, mma_dequantize_grid(spec, args, sm_count), args, stream);
}

}  // namespace qgemm::runtime
