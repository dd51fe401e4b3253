// The MoE routing shape's rules and workspace sizes (include/qgemm/moe.hpp, src/runtime/moe.hpp),
// without a GPU.
#include <gtest/gtest.h>

#include <string>

#include "moe/routing_args.cuh"
#include "qgemm/error.hpp"
#include "qgemm/moe.hpp"
#include "runtime/moe.hpp"

namespace qgemm {
namespace {

MoeRoutingShape shape_of(std::int64_t tokens, int top_k, int experts, int block) {
  MoeRoutingShape s;
  s.tokens = tokens;
  s.top_k = top_k;
  s.global_experts = experts;
  s.local_experts = experts;
  s.block = block;
  return s;
}

std::string error_of(const MoeRoutingShape& shape) {
  try {
    moe_routing_capacity(shape);
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::InvalidArgument);
    return error.what();
  }
  return "";
}

// Every expert's run may end in up to block − 1 padding positions, and the total is a whole
// number of blocks: capacity = round_up(slots + min(E, slots) · (block − 1), block).
TEST(MoeRouting, CapacityHoldsEveryRoutingOfTheShape) {
  EXPECT_EQ(moe_routing_capacity(shape_of(1, 1, 1, 16)), 16);
  EXPECT_EQ(moe_routing_capacity(shape_of(1, 8, 128, 16)), (8 + 8 * 15 + 15) / 16 * 16);
  EXPECT_EQ(moe_routing_capacity(shape_of(4096, 8, 256, 128)),
            (32768 + 256 * 127 + 127) / 128 * 128);
  EXPECT_EQ(moe_routing_capacity(shape_of(0, 4, 8, 8)), 0);  // no tokens: no runs
  // The workspace holds capacity sorted slots, capacity / block block entries, the slots'
  // positions and the per-expert arrays, each 256-byte aligned.
  const MoeRoutingShape s = shape_of(1000, 8, 64, 64);
  const std::size_t capacity = static_cast<std::size_t>(moe_routing_capacity(s));
  EXPECT_GE(moe_routing_workspace_bytes(s), 4 * (capacity + capacity / 64 + 8000 + 3 * 64 + 2));
  EXPECT_EQ(moe_routing_workspace_bytes(s) % 256, 0u);
}

// The in-place row-block table (moe_row_blocks): at most ceil(rows / tile) + experts blocks, and
// its workspace holds that many expert ids, that many entries of kMoeRowBlockFields ints (what
// the kernel writes: a 2-int sizing let the routed total overwrite an entry on the first GPU
// run) and the routed total, each array 256-byte aligned.
TEST(MoeRouting, RowBlockTableWorkspaceHoldsEveryEntry) {
  EXPECT_EQ(kernels::kMoeRowBlockFields, 3);
  struct Shape {
    std::int64_t rows;
    int experts, tile;
  };
  for (const Shape& s : {Shape{333, 6, 16}, Shape{600, 8, 32}, Shape{1, 1, 8},
                         Shape{32768, 128, 128}, Shape{64 * 48, 64, 8}}) {
    const std::int64_t most = runtime::moe_row_blocks_max(s.rows, s.experts, s.tile);
    EXPECT_EQ(most, (s.rows + s.tile - 1) / s.tile + s.experts);
    const auto aligned = [](std::size_t bytes) { return (bytes + 255) / 256 * 256; };
    const std::size_t entries = static_cast<std::size_t>(most);
    EXPECT_GE(runtime::moe_row_blocks_bytes(s.rows, s.experts, s.tile),
              aligned(entries * 4) + aligned(entries * 4 * kernels::kMoeRowBlockFields) + 4)
        << s.rows << " rows, " << s.experts << " experts, tile " << s.tile;
  }
}

TEST(MoeRouting, BadShapesNameTheFieldAndTheRule) {
  EXPECT_NE(error_of(shape_of(-1, 1, 8, 16)).find("tokens = -1 (rule: >= 0)"), std::string::npos);
  EXPECT_NE(error_of(shape_of(4, 0, 8, 16)).find("top_k = 0"), std::string::npos);
  EXPECT_NE(error_of(shape_of(4, 33, 64, 16)).find("top_k = 33"), std::string::npos);
  EXPECT_NE(error_of(shape_of(4, 2, 0, 16)).find("global_experts = 0"), std::string::npos);
  EXPECT_NE(error_of(shape_of(4, 2, 513, 16)).find("local_experts = 513"), std::string::npos);
  EXPECT_NE(error_of(shape_of(4, 2, 8, 0)).find("block = 0"), std::string::npos);
  EXPECT_NE(error_of(shape_of(4, 2, 8, 512)).find("block = 512"), std::string::npos);
  MoeRoutingShape more_local = shape_of(4, 2, 8, 16);
  more_local.local_experts = 9;
  EXPECT_NE(error_of(more_local).find("local <= global"), std::string::npos);
  // Positions are int32 on the device.
  EXPECT_NE(error_of(shape_of(std::int64_t{1} << 28, 16, 8, 16)).find("below 2^31"),
            std::string::npos);
  EXPECT_EQ(error_of(shape_of(16384, 16, 512, 256)), "");
}

}  // namespace
}  // namespace qgemm
