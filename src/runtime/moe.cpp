#include "runtime/moe.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "../../kernels/moe/glue_args.cuh"
#include "../../kernels/moe/routing_args.cuh"
#include "qgemm/error.hpp"
#include "runtime/driver.hpp"

namespace qgemm {
namespace {

constexpr std::size_t kAlign = 256;
constexpr int kMaxLocalExperts = 512;  // kernels/moe/routing.cuh's shared arrays
constexpr int kMaxTopK = 32;
constexpr int kMaxBlock = 256;  // the largest token tile of the GEMM families

std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// A non-null device pointer to int32 values, 4-byte aligned.
bool int32_array(const void* p) {
  return p != nullptr && reinterpret_cast<std::uintptr_t>(p) % sizeof(std::int32_t) == 0;
}

// The arrays of the workspace, in order: counts, offsets, cursors, sorted_slots, block_experts,
// slot_positions, invalid_ids (int32 each, every array 256-byte aligned).
struct RoutingLayout {
  std::int64_t capacity;
  std::size_t counts, offsets, cursors, sorted, blocks, positions, invalid, bytes;
};

// Validates the shape (through moe_routing_capacity).
RoutingLayout routing_layout(const MoeRoutingShape& shape) {
  const std::int64_t capacity = moe_routing_capacity(shape);
  const auto experts = static_cast<std::size_t>(shape.local_experts);
  const auto slots = static_cast<std::size_t>(shape.tokens * shape.top_k);
  RoutingLayout layout{};
  layout.capacity = capacity;
  std::size_t used = 0;
  auto take = [&](std::size_t count) {
    const std::size_t offset = used;
    used += aligned(std::max<std::size_t>(count, 1) * sizeof(std::int32_t));
    return offset;
  };
  layout.counts = take(experts);
  layout.offsets = take(experts + 1);
  layout.cursors = take(experts);
  layout.sorted = take(static_cast<std::size_t>(capacity));
  layout.blocks = take(static_cast<std::size_t>(capacity / shape.block));
  layout.positions = take(slots);
  layout.invalid = take(1);
  layout.bytes = used;
  return layout;
}

}  // namespace

std::int64_t moe_routing_capacity(const MoeRoutingShape& shape) {
  runtime::check_moe_routing_shape(shape);
  // At most min(experts, slots) runs are non-empty, each padded by at most block − 1.
  const std::int64_t slots = shape.tokens * shape.top_k;
  const std::int64_t needed =
      slots + std::min<std::int64_t>(shape.local_experts, slots) * (shape.block - 1);
  return (needed + shape.block - 1) / shape.block * shape.block;
}

std::size_t moe_routing_workspace_bytes(const MoeRoutingShape& shape) {
  return routing_layout(shape).bytes;
}

namespace runtime {

void check_moe_routing_shape(const MoeRoutingShape& s) {
  require(s.tokens >= 0, "moe routing: tokens = {} (rule: >= 0)", s.tokens);
  require(s.top_k >= 1 && s.top_k <= kMaxTopK, "moe routing: top_k = {} (rule: 1 <= top_k <= {})",
          s.top_k, kMaxTopK);
  require(s.global_experts >= 1, "moe routing: global_experts = {} (rule: >= 1)", s.global_experts);
  require(s.local_experts >= 1 && s.local_experts <= kMaxLocalExperts,
          "moe routing: local_experts = {} (rule: 1 <= local_experts <= {})", s.local_experts,
          kMaxLocalExperts);
  require(s.local_experts <= s.global_experts,
          "moe routing: local_experts = {} but global_experts = {} (rule: local <= global)",
          s.local_experts, s.global_experts);
  require(s.block >= 1 && s.block <= kMaxBlock,
          "moe routing: block = {} (rule: 1 <= block <= {}, the GEMM's token tile)", s.block,
          kMaxBlock);
  // Positions are int32 on the device.
  const std::int64_t needed =
      s.tokens * s.top_k + static_cast<std::int64_t>(s.local_experts) * s.block;
  require(s.tokens <= std::numeric_limits<std::int32_t>::max() / s.top_k &&
              needed <= std::numeric_limits<std::int32_t>::max(),
          "moe routing: tokens = {}, top_k = {}, local_experts = {}, block = {} need {} positions "
          "(rule: below 2^31)",
          s.tokens, s.top_k, s.local_experts, s.block, needed);
}

namespace {

// The large routing: memsets (counts and the invalid count to 0, every position not given a
// slot — each run's padding, the unused tail — to the sentinel), then the three steps.
void launch_moe_routing_steps(const MoeRoutingKernels& kernels, kernels::MoeRoutingArgs& args,
                              CUstream stream) {
  const Driver& driver = Driver::get();
  const long long slots = args.slots;
  const auto address = [](const void* p) { return reinterpret_cast<CUdeviceptr>(p); };
  driver.check(driver.cuMemsetD32Async(address(args.counts), 0u,
                                       static_cast<std::size_t>(args.local_experts), stream),
               "cuMemsetD32Async (moe counts)");
  driver.check(driver.cuMemsetD32Async(address(args.invalid_ids), 0u, 1, stream),
               "cuMemsetD32Async (moe invalid ids)");
  driver.check(driver.cuMemsetD32Async(address(args.sorted_slots), static_cast<unsigned>(slots),
                                       static_cast<std::size_t>(args.capacity), stream),
               "cuMemsetD32Async (moe sorted slots)");
  const int threads = kernels.count.launch.threads_per_block;
  const auto blocks =
      static_cast<unsigned>(std::clamp<std::int64_t>((slots + threads - 1) / threads, 1, 4096));
  launch_kernel(kernels.count, LaunchGrid{blocks, 1, 1}, args, stream);
  launch_kernel(kernels.offsets, LaunchGrid{1, 1, 1}, args, stream);
  launch_kernel(kernels.scatter, LaunchGrid{blocks, 1, 1}, args, stream);
}

}  // namespace

MoeIndexedRouting launch_moe_routing(const MoeRoutingKernels& kernels, const MoeRoutingShape& shape,
                                     const std::int32_t* expert_ids, const std::int32_t* expert_map,
                                     void* workspace, std::size_t workspace_bytes,
                                     CUstream stream) {
  const RoutingLayout layout = routing_layout(shape);  // validates the shape
  require(shape.local_experts == shape.global_experts || expert_map != nullptr,
          "moe routing: local_experts = {} differs from global_experts = {} without an "
          "expert_map (rule: a map from global to local ids, -1 for other ranks' experts)",
          shape.local_experts, shape.global_experts);
  const std::int64_t slots = shape.tokens * shape.top_k;
  require(slots == 0 || int32_array(expert_ids),
          "moe routing: expert_ids = {} (rule: non-null, 4-byte aligned device int32 "
          "[tokens * top_k])",
          fmt::ptr(expert_ids));
  require(expert_map == nullptr || int32_array(expert_map),
          "moe routing: expert_map = {} (rule: null, or 4-byte aligned device int32 "
          "[global_experts])",
          fmt::ptr(expert_map));
  require(workspace != nullptr && reinterpret_cast<std::uintptr_t>(workspace) % kAlign == 0 &&
              workspace_bytes >= layout.bytes,
          "moe routing: workspace of {} bytes at {} (rule: at least "
          "moe_routing_workspace_bytes = {}, 256-byte aligned)",
          workspace_bytes, workspace, layout.bytes);
  auto at = [&](std::size_t offset) {
    return reinterpret_cast<std::int32_t*>(static_cast<char*>(workspace) + offset);
  };
  kernels::MoeRoutingArgs args{};
  args.expert_ids = expert_ids;
  args.expert_map = expert_map;
  args.slots = slots;
  args.global_experts = shape.global_experts;
  args.local_experts = shape.local_experts;
  args.block = shape.block;
  args.capacity = layout.capacity;
  args.counts = at(layout.counts);
  args.offsets = at(layout.offsets);
  args.cursors = at(layout.cursors);
  args.sorted_slots = at(layout.sorted);
  args.block_experts = at(layout.blocks);
  args.slot_positions = at(layout.positions);
  args.invalid_ids = at(layout.invalid);

  if (slots <= kernels::kMoeSmallSlots && kernels.small.function) {
    launch_kernel(kernels.small, LaunchGrid{1, 1, 1}, args, stream);
  } else {
    launch_moe_routing_steps(kernels, args, stream);
  }

  MoeIndexedRouting routing;
  routing.shape = shape;
  routing.capacity = args.capacity;
  routing.sorted_slots = args.sorted_slots;
  routing.offsets = args.offsets;
  routing.counts = args.counts;
  routing.block_experts = args.block_experts;
  routing.slot_positions = args.slot_positions;
  routing.invalid_ids = args.invalid_ids;
  return routing;
}

namespace {

kernels::MoeGlueArgs glue_args(const MoeIndexedRouting& routing, std::int64_t columns) {
  require(routing.sorted_slots != nullptr && routing.slot_positions != nullptr &&
              routing.offsets != nullptr,
          "moe glue: the routing's arrays are null (rule: the result of Engine::route_moe)");
  require(columns >= 1, "moe glue: columns = {} (rule: >= 1)", columns);
  kernels::MoeGlueArgs args{};
  args.sorted_slots = routing.sorted_slots;
  args.offsets = routing.offsets;
  args.slot_positions = routing.slot_positions;
  args.tokens = routing.shape.tokens;
  args.top_k = routing.shape.top_k;
  args.local_experts = routing.shape.local_experts;
  args.capacity = routing.capacity;
  args.columns = columns;
  return args;
}

// A block per row (the kernels stride over rows), at most 16384 blocks.
LaunchGrid glue_grid(std::int64_t rows) {
  return LaunchGrid{static_cast<unsigned>(std::clamp<std::int64_t>(rows, 1, 16384)), 1, 1};
}

}  // namespace

MoeGroupedBlocks MoeGroupedBlocks::of(const MoeIndexedRouting& routing) {
  MoeGroupedBlocks blocks;
  blocks.block_experts = routing.block_experts;
  blocks.routed_total =
      routing.offsets != nullptr ? routing.offsets + routing.shape.local_experts : nullptr;
  blocks.positions = routing.capacity;
  blocks.route_block = routing.shape.block;
  blocks.slots = routing.shape.tokens * routing.shape.top_k;
  blocks.experts = routing.shape.local_experts;
  return blocks;
}

namespace {

// The host fields of a grouping of `rows` rows over `experts` experts, checked, as the kernels
// read them.
kernels::MoeRowGroupingArgs grouping_args(const MoeGroupedRows& groups, std::int64_t rows,
                                          int experts) {
  require(experts >= 1 && experts <= kMaxLocalExperts,
          "moe grouped rows: {} experts (rule: 1 .. {})", experts, kMaxLocalExperts);
  if (groups.grouping == MoeRowGrouping::Contiguous) {
    require(int32_array(groups.offsets),
            "moe grouped rows: offsets = {} (rule: contiguous rows take non-null, 4-byte aligned "
            "device int32 [experts + 1])",
            fmt::ptr(groups.offsets));
  } else {
    require(int32_array(groups.counts),
            "moe grouped rows: counts = {} (rule: masked rows take non-null, 4-byte aligned "
            "device int32 [experts])",
            fmt::ptr(groups.counts));
    require(groups.capacity >= 1 && groups.capacity <= std::numeric_limits<std::int32_t>::max() &&
                rows == groups.capacity * experts,
            "moe grouped rows: {} rows with capacity = {} and {} experts (rule: masked rows are "
            "experts x capacity, 1 <= capacity < 2^31)",
            rows, groups.capacity, experts);
  }
  const bool contiguous = groups.grouping == MoeRowGrouping::Contiguous;
  kernels::MoeRowGroupingArgs g{};
  g.offsets = contiguous ? groups.offsets : nullptr;
  g.counts = contiguous ? nullptr : groups.counts;
  g.capacity = groups.capacity;
  g.rows = rows;
  g.experts = experts;
  return g;
}

}  // namespace

void launch_moe_group_ids(const LoadedKernel& kernel, const MoeGroupedRows& groups,
                          std::int64_t rows, int experts, std::int32_t* ids, std::int32_t* map,
                          CUstream stream) {
  kernels::MoeGroupIdsArgs args{};
  args.grouping = grouping_args(groups, rows, experts);
  require(ids != nullptr && map != nullptr, "moe grouped rows: null ids or map workspace");
  args.ids = ids;
  args.map = map;
  const int threads = kernel.launch.threads_per_block;
  const auto blocks = static_cast<unsigned>(
      std::clamp<std::int64_t>((std::max<std::int64_t>(rows, experts + 1) + threads - 1) / threads,
                               1, 1024));
  launch_kernel(kernel, LaunchGrid{blocks, 1, 1}, args, stream);
}

std::int64_t moe_row_blocks_max(std::int64_t rows, int experts, int tile) {
  return (rows + tile - 1) / tile + experts;
}

namespace {

// The row-block table's arrays in its workspace, int32 each, 256-byte aligned each:
// block_experts [most], row_blocks [most][kMoeRowBlockFields], routed_total [1]; `most` blocks
// at most (moe_row_blocks_max).
struct RowBlocksLayout {
  std::int64_t most;
  std::size_t block_experts, row_blocks, routed_total, bytes;
};

RowBlocksLayout row_blocks_layout(std::int64_t rows, int experts, int tile) {
  RowBlocksLayout layout{};
  layout.most = moe_row_blocks_max(rows, experts, tile);
  const auto most = static_cast<std::size_t>(layout.most);
  layout.block_experts = 0;
  layout.row_blocks = aligned(most * sizeof(std::int32_t));
  layout.routed_total =
      layout.row_blocks + aligned(most * kernels::kMoeRowBlockFields * sizeof(std::int32_t));
  layout.bytes = layout.routed_total + aligned(sizeof(std::int32_t));
  return layout;
}

}  // namespace

std::size_t moe_row_blocks_bytes(std::int64_t rows, int experts, int tile) {
  return row_blocks_layout(rows, experts, tile).bytes;
}

MoeGroupedBlocks launch_moe_row_blocks(const LoadedKernel& kernel, const MoeGroupedRows& groups,
                                       std::int64_t rows, int experts, int tile, void* workspace,
                                       std::size_t workspace_bytes, void* zero_out,
                                       std::int64_t ld_out, std::int64_t n, int out_bytes,
                                       CUstream stream) {
  kernels::MoeRowBlocksArgs args{};
  args.grouping = grouping_args(groups, rows, experts);
  const RowBlocksLayout layout = row_blocks_layout(rows, experts, tile);
  require(rows >= 1 && tile >= 1 && tile <= kMaxBlock &&
              layout.most * tile <= std::numeric_limits<std::int32_t>::max(),
          "moe row blocks: {} rows of {} experts in tiles of {} (rule: tiles of 1 .. {}, at most "
          "2^31 - 1 token positions: (ceil(rows / tile) + experts) x tile)",
          rows, experts, tile, kMaxBlock);
  require(workspace != nullptr && reinterpret_cast<std::uintptr_t>(workspace) % kAlign == 0 &&
              workspace_bytes >= layout.bytes,
          "moe row blocks: workspace of {} bytes at {} (rule: at least moe_row_blocks_bytes = {}, "
          "256-byte aligned)",
          workspace_bytes, workspace, layout.bytes);
  require(zero_out == nullptr || (ld_out >= n && n >= 1 && (out_bytes == 2 || out_bytes == 4)),
          "moe row blocks: an output of {} columns, stride {}, {}-byte elements (rule: stride >= "
          "columns >= 1, 2- or 4-byte elements)",
          n, ld_out, out_bytes);
  auto at = [&](std::size_t offset) {
    return reinterpret_cast<std::int32_t*>(static_cast<char*>(workspace) + offset);
  };
  args.tile = tile;
  args.block_experts = at(layout.block_experts);
  args.row_blocks = at(layout.row_blocks);
  args.routed_total = at(layout.routed_total);
  args.invalid_rows = groups.invalid_rows;
  args.out = zero_out;
  args.ldo = ld_out;
  args.n = static_cast<int>(n);
  args.out_bytes = out_bytes;
  // Block 0 lays the table out; zeroing the rows of no expert takes a warp a row.
  const int warps = kernel.launch.threads_per_block / 32;
  const auto blocks = static_cast<unsigned>(
      zero_out ? std::clamp<std::int64_t>((rows + warps - 1) / warps, 1, 1024) : 1);
  launch_kernel(kernel, LaunchGrid{blocks, 1, 1}, args, stream);

  MoeGroupedBlocks out;
  out.block_experts = args.block_experts;
  out.routed_total = args.routed_total;
  out.row_blocks = args.row_blocks;
  out.positions = layout.most * tile;
  out.route_block = tile;
  out.slots = rows;
  out.experts = experts;
  return out;
}

void launch_moe_gather(const LoadedKernel& kernel, const MoeIndexedRouting& routing,
                       const void* input, std::int64_t ld_input, std::int64_t columns,
                       void* rows_out, std::int64_t ld_rows, CUstream stream) {
  kernels::MoeGlueArgs args = glue_args(routing, columns);
  require((input != nullptr || routing.shape.tokens == 0) && rows_out != nullptr,
          "moe gather: input = {}, rows_out = {} (rule: non-null device pointers)", fmt::ptr(input),
          fmt::ptr(rows_out));
  require(ld_input >= columns && ld_rows >= columns,
          "moe gather: ld_input = {}, ld_rows = {} (rule: >= columns = {})", ld_input, ld_rows,
          columns);
  args.input = static_cast<const unsigned short*>(input);
  args.ld_input = ld_input;
  args.rows_out = rows_out;
  args.ld_rows = ld_rows;
  // The padded total is on the device: the grid covers the capacity, the kernel stops at it.
  launch_kernel(kernel, glue_grid(routing.capacity), args, stream);
}

void launch_moe_combine(const LoadedKernel& kernel, const MoeIndexedRouting& routing,
                        const void* rows, std::int64_t ld_rows, const float* weights,
                        std::int64_t columns, void* output, std::int64_t ld_output,
                        CUstream stream) {
  kernels::MoeGlueArgs args = glue_args(routing, columns);
  require(rows != nullptr && output != nullptr,
          "moe combine: rows = {}, output = {} (rule: non-null device pointers)", rows, output);
  require(ld_rows >= columns && ld_output >= columns,
          "moe combine: ld_rows = {}, ld_output = {} (rule: >= columns = {})", ld_rows, ld_output,
          columns);
  args.rows = rows;
  args.ld_rows = ld_rows;
  args.weights = weights;
  args.output = output;
  args.ld_output = ld_output;
  launch_kernel(kernel, glue_grid(routing.shape.tokens), args, stream);
}

static_assert(static_cast<int>(GluKind::Silu) == kernels::kGluSilu &&
                  static_cast<int>(GluKind::Gelu) == kernels::kGluGelu &&
                  static_cast<int>(GluKind::ClampedSwiglu) == kernels::kGluClampedSwiglu,
              "GluKind and kernels::MoeGluKind list the activations in one order");

void launch_moe_glu(const LoadedKernel& kernel, const MoeIndexedRouting& routing,
                    const GluActivation& activation, const void* rows, std::int64_t ld_rows,
                    std::int64_t columns, void* rows_out, std::int64_t ld_out, CUstream stream) {
  kernels::MoeGlueArgs args = glue_args(routing, columns);
  require(rows != nullptr && rows_out != nullptr,
          "moe glu: rows = {}, rows_out = {} (rule: non-null device pointers)", rows, rows_out);
  require(ld_rows >= 2 * columns && ld_out >= columns,
          "moe glu: ld_rows = {}, ld_out = {} (rule: ld_rows >= 2 * columns, ld_out >= columns = "
          "{})",
          ld_rows, ld_out, columns);
  require(activation.kind != GluKind::ClampedSwiglu ||
              (std::isfinite(activation.alpha) && std::isfinite(activation.limit) &&
               activation.limit > 0),
          "moe glu: clamped SwiGLU alpha = {}, limit = {} (rule: finite, limit > 0)",
          activation.alpha, activation.limit);
  args.rows = rows;
  args.ld_rows = ld_rows;
  args.rows_out = rows_out;
  args.ld_output = ld_out;
  args.glu_kind = static_cast<int>(activation.kind);
  args.glu_alpha = activation.alpha;
  args.glu_limit = activation.limit;
  launch_kernel(kernel, glue_grid(routing.capacity), args, stream);
}

}  // namespace runtime
}  // namespace qgemm
