// Engine::route_moe (kernels/moe/routing.cuh) against a host twin of the indexed layout
// (include/qgemm/moe.hpp), on random routings and the edge cases of issue #17: every token to one
// expert, experts with no tokens, top_k 1 and 8, M = 0 and 1, E = 256, other ranks' experts, and
// ids routed nowhere. Outputs are poisoned before each call; the order of slots inside an expert's
// run is not defined, so runs are compared as sets. Then the glue (kernels/moe/glue.cuh): the
// gather bit for bit, the combine against the same fp32 sums in choice order on the host.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "gpu/gpu_test_util.hpp"
#include "jit/cache.hpp"
#include "jit/catalog.hpp"
#include "qgemm/engine.hpp"
#include "qgemm/error.hpp"
#include "qgemm/format.hpp"
#include "runtime/device_memory.hpp"
#include "runtime/driver.hpp"
#include "runtime/kernel_loader.hpp"
#include "runtime/moe.hpp"

namespace qgemm {
namespace {

using runtime::DeviceBuffer;

struct Expected {
  std::vector<int> counts, offsets, block_experts;
  std::vector<std::vector<int>> runs;  // slots of each local expert, ascending
  int invalid = 0;
};

Expected host_routing(const MoeRoutingShape& shape, const std::vector<int>& ids,
                      const std::vector<int>& map) {
  Expected x;
  const int experts = shape.local_experts;
  x.counts.assign(experts, 0);
  x.runs.resize(experts);
  for (std::size_t s = 0; s < ids.size(); ++s) {
    const int id = ids[s];
    int local = id < 0 || id >= shape.global_experts ? -2 : map.empty() ? id : map[id];
    if (local < -1 || local >= experts) {
      ++x.invalid;
      continue;
    }
    if (local == -1) continue;
    ++x.counts[local];
    x.runs[local].push_back(static_cast<int>(s));
  }
  x.offsets.assign(experts + 1, 0);
  for (int e = 0; e < experts; ++e)
    x.offsets[e + 1] = x.offsets[e] + (x.counts[e] + shape.block - 1) / shape.block * shape.block;
  const std::int64_t capacity = moe_routing_capacity(shape);
  for (std::int64_t b = 0; b < capacity / shape.block; ++b) {
    int expert = -1;
    for (int e = 0; e < experts; ++e)
      if (b * shape.block >= x.offsets[e] && b * shape.block < x.offsets[e + 1]) expert = e;
    x.block_experts.push_back(expert);
  }
  return x;
}

std::vector<int> read_ints(const std::int32_t* p, std::size_t count) {
  const runtime::Driver& driver = runtime::Driver::get();
  std::vector<int> out(count);
  driver.check(
      driver.cuMemcpyDtoH(out.data(), reinterpret_cast<CUdeviceptr>(p), count * sizeof(int)),
      "cuMemcpyDtoH");
  return out;
}

void check_routing(Engine& engine, const MoeRoutingShape& shape, const std::vector<int>& ids,
                   const std::vector<int>& map, const std::string& label) {
  SCOPED_TRACE(label);
  const Expected x = host_routing(shape, ids, map);
  const std::size_t bytes = moe_routing_workspace_bytes(shape);
  DeviceBuffer workspace(bytes);
  workspace.fill_bytes(0xA5);  // poison: every array the call promises must be written
  DeviceBuffer ids_device = DeviceBuffer::from(ids.empty() ? std::vector<int>{0} : ids);
  DeviceBuffer map_device = DeviceBuffer::from(map.empty() ? std::vector<int>{0} : map);
  const MoeIndexedRouting r = engine.route_moe(
      shape, ids_device.as<std::int32_t>(), map.empty() ? nullptr : map_device.as<std::int32_t>(),
      workspace.as<void>(), bytes, nullptr);
  const runtime::Driver& driver = runtime::Driver::get();
  driver.check(driver.cuCtxSynchronize(), "cuCtxSynchronize");
  const int experts = shape.local_experts;
  const auto slots = static_cast<int>(ids.size());
  EXPECT_EQ(read_ints(r.invalid_ids, 1)[0], x.invalid);
  EXPECT_EQ(read_ints(r.counts, experts), x.counts);
  EXPECT_EQ(read_ints(r.offsets, experts + 1), x.offsets);
  EXPECT_EQ(read_ints(r.block_experts, r.capacity / shape.block), x.block_experts);
  const std::vector<int> sorted = read_ints(r.sorted_slots, r.capacity);
  const std::vector<int> positions = read_ints(r.slot_positions, ids.size());
  for (int e = 0; e < experts; ++e) {
    std::vector<int> run(sorted.begin() + x.offsets[e],
                         sorted.begin() + x.offsets[e] + x.counts[e]);
    std::sort(run.begin(), run.end());
    EXPECT_EQ(run, x.runs[e]) << "expert " << e;
    for (int p = x.offsets[e] + x.counts[e]; p < x.offsets[e + 1]; ++p)
      EXPECT_EQ(sorted[p], slots) << "padding of expert " << e << " at " << p;
  }
  for (std::int64_t p = x.offsets[experts]; p < r.capacity; ++p)
    ASSERT_EQ(sorted[p], slots) << "unused position " << p;
  for (int s = 0; s < slots; ++s) {
    const int p = positions[s];
    if (p < 0) {
      EXPECT_EQ(p, -1) << "slot " << s;
      continue;
    }
    ASSERT_LT(p, r.capacity) << "slot " << s;
    EXPECT_EQ(sorted[p], s) << "slot " << s << " at position " << p;
  }
  // Every slot on this rank has a position; the others have none.
  int placed = 0;
  for (int p : positions) placed += p >= 0;
  int expected_placed = 0;
  for (int c : x.counts) expected_placed += c;
  EXPECT_EQ(placed, expected_placed);
}

std::vector<int> random_ids(std::mt19937& rng, std::int64_t tokens, int top_k, int experts) {
  // top-k distinct experts per token, as a router picks them.
  std::vector<int> ids;
  std::vector<int> all(experts);
  for (int e = 0; e < experts; ++e) all[e] = e;
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::shuffle(all.begin(), all.end(), rng);
    ids.insert(ids.end(), all.begin(), all.begin() + top_k);
  }
  return ids;
}

TEST(MoeRoutingGpu, MatchesTheHostTwinOnEveryEdgeCase) {
  QGEMM_REQUIRE_GPU();
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  Engine engine(0);
  auto shape = [](std::int64_t tokens, int top_k, int experts, int block) {
    MoeRoutingShape s;
    s.tokens = tokens;
    s.top_k = top_k;
    s.global_experts = experts;
    s.local_experts = experts;
    s.block = block;
    return s;
  };
  // Random routings of serving shapes.
  for (auto [tokens, top_k, experts, block] : {std::tuple{1000, 8, 128, 16},
                                               {4096, 8, 256, 128},
                                               {1, 8, 128, 8},
                                               {1, 1, 8, 16},
                                               {7, 4, 128, 64},
                                               {4096, 1, 16, 256},
                                               {333, 2, 512, 32}}) {
    const MoeRoutingShape s = shape(tokens, top_k, experts, block);
    check_routing(engine, s, random_ids(rng, tokens, top_k, experts), {},
                  "random M=" + std::to_string(tokens) + " top_k=" + std::to_string(top_k) +
                      " E=" + std::to_string(experts) + " block=" + std::to_string(block));
  }
  // Every token to one expert (the others empty); no tokens at all.
  check_routing(engine, shape(257, 1, 8, 16), std::vector<int>(257, 5), {}, "all to expert 5");
  check_routing(engine, shape(0, 4, 8, 8), {}, {}, "M=0");
  // Expert parallelism: 64 global experts, this rank holds the odd ones as local 0..31.
  {
    MoeRoutingShape s = shape(500, 8, 64, 16);
    s.local_experts = 32;
    std::vector<int> map(64, -1);
    for (int e = 1; e < 64; e += 2) map[e] = e / 2;
    check_routing(engine, s, random_ids(rng, 500, 8, 64), map, "expert map, odd experts local");
  }
  // Ids routed nowhere are counted, not placed: out of range, and a map entry past the local
  // experts.
  {
    MoeRoutingShape s = shape(6, 2, 8, 16);
    s.local_experts = 4;
    std::vector<int> map = {0, 1, 2, 3, -1, -1, 7, -1};  // 7: not a local expert
    check_routing(engine, s, {0, 9, -3, 1, 6, 2, 4, 3, 8, 0, 5, 7}, map, "invalid ids");
  }
}

TEST(MoeRoutingGpu, RefusesAWorkspaceTooSmallAndAMissingMap) {
  QGEMM_REQUIRE_GPU();
  Engine engine(0);
  MoeRoutingShape s;
  s.tokens = 16;
  s.top_k = 2;
  s.global_experts = 8;
  s.local_experts = 8;
  s.block = 16;
  DeviceBuffer ids = DeviceBuffer::from(std::vector<int>(32, 1));
  const std::size_t bytes = moe_routing_workspace_bytes(s);
  DeviceBuffer workspace(bytes);
  try {
    engine.route_moe(s, ids.as<std::int32_t>(), nullptr, workspace.as<void>(), bytes - 256,
                     nullptr);
    ADD_FAILURE() << "a short workspace was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("moe_routing_workspace_bytes"), std::string::npos)
        << error.what();
  }
  s.local_experts = 4;
  try {
    engine.route_moe(s, ids.as<std::int32_t>(), nullptr, workspace.as<void>(), bytes, nullptr);
    ADD_FAILURE() << "local experts without a map were accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("expert_map"), std::string::npos) << error.what();
  }
}

runtime::LoadedKernel load(const jit::KernelSpec& spec) {
  return runtime::KernelLoader::global().get(*jit::KernelCache::global().get(spec).kernel);
}

// Gather then combine around a stand-in for the grouped GEMM (random fp32 rows, one per
// position, padding rows poisoned with NaN: a combine that reads one fails), with an expert map
// so that some choices belong to another rank.
TEST(MoeRoutingGpu, GatherAndCombineMatchTheHost) {
  QGEMM_REQUIRE_GPU();
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  Engine engine(0);
  const jit::Arch arch = test::device_arch();
  MoeRoutingShape shape;
  shape.tokens = 300;
  shape.top_k = 4;
  shape.global_experts = 16;
  shape.local_experts = 12;
  shape.block = 16;
  std::vector<int> map(16, -1);
  for (int e = 0; e < 12; ++e) map[e + 4] = e;  // experts 0-3 live on another rank
  const std::vector<int> ids = random_ids(rng, shape.tokens, shape.top_k, 16);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<float> router(ids.size());
  for (float& w : router) w = uniform(rng);

  const std::int64_t k = 200, ld_input = 208, n = 96;
  std::vector<std::uint16_t> input(static_cast<std::size_t>(shape.tokens * ld_input), 0x7fc0);
  for (std::int64_t t = 0; t < shape.tokens; ++t)
    for (std::int64_t c = 0; c < k; ++c)
      input[t * ld_input + c] = static_cast<std::uint16_t>(encode(formats::bf16, normal(rng)));

  const std::size_t bytes = moe_routing_workspace_bytes(shape);
  DeviceBuffer workspace(bytes),
      ids_device = DeviceBuffer::from(ids), map_device = DeviceBuffer::from(map),
      input_device = DeviceBuffer::from(input), router_device = DeviceBuffer::from(router);
  const MoeIndexedRouting r =
      engine.route_moe(shape, ids_device.as<std::int32_t>(), map_device.as<std::int32_t>(),
                       workspace.as<void>(), bytes, nullptr);
  const std::int64_t capacity = r.capacity;
  DeviceBuffer gathered(static_cast<std::size_t>(capacity * k) * 2);
  gathered.fill_bytes(0xFF);
  runtime::launch_moe_gather(load(jit::moe_gather_spec(formats::bf16, arch)), r,
                             input_device.as<void>(), ld_input, k, gathered.as<void>(), k, nullptr);
  const runtime::Driver& driver = runtime::Driver::get();
  driver.check(driver.cuCtxSynchronize(), "cuCtxSynchronize");
  const std::vector<int> sorted = read_ints(r.sorted_slots, capacity);
  const std::vector<int> positions = read_ints(r.slot_positions, ids.size());
  const int total = read_ints(r.offsets + shape.local_experts, 1)[0];
  const auto rows = gathered.to_vector<std::uint16_t>(static_cast<std::size_t>(capacity * k));
  const auto slots = static_cast<int>(ids.size());
  std::size_t wrong = 0;
  for (int p = 0; p < total; ++p)
    for (std::int64_t c = 0; c < k; ++c) {
      const std::uint16_t want =
          sorted[p] < slots ? input[sorted[p] / shape.top_k * ld_input + c] : std::uint16_t{0};
      wrong += rows[p * k + c] != want;
    }
  EXPECT_EQ(wrong, 0u) << "gathered elements differ from their token's row";

  // The grouped GEMM's rows: random where a slot sits, NaN in the padding.
  std::vector<float> gemm_rows(static_cast<std::size_t>(capacity * n),
                               std::numeric_limits<float>::quiet_NaN());
  for (int p = 0; p < total; ++p)
    if (sorted[p] < slots)
      for (std::int64_t c = 0; c < n; ++c) gemm_rows[p * n + c] = normal(rng);
  DeviceBuffer rows_device = DeviceBuffer::from(gemm_rows),
               out(static_cast<std::size_t>(shape.tokens * n) * 2);
  out.fill_bytes(0xFF);
  runtime::launch_moe_combine(load(jit::moe_combine_spec(formats::fp32, formats::bf16, arch)), r,
                              rows_device.as<void>(), n, router_device.as<float>(), n,
                              out.as<void>(), n, nullptr);
  driver.check(driver.cuCtxSynchronize(), "cuCtxSynchronize");
  const auto got = out.to_vector<std::uint16_t>(static_cast<std::size_t>(shape.tokens * n));
  wrong = 0;
  for (std::int64_t t = 0; t < shape.tokens; ++t)
    for (std::int64_t c = 0; c < n; ++c) {
      float sum = 0.0f;
      for (int j = 0; j < shape.top_k; ++j) {
        const int p = positions[t * shape.top_k + j];
        if (p >= 0) sum = std::fma(router[t * shape.top_k + j], gemm_rows[p * n + c], sum);
      }
      wrong += got[t * n + c] != static_cast<std::uint16_t>(encode(formats::bf16, sum));
    }
  EXPECT_EQ(wrong, 0u) << "combined elements differ from the fp32 sums in choice order";
}

// The token-block table of rows grouped by their caller (kernels/moe/routing.cuh,
// moe_row_blocks), read in place by the grouped kernels: against a host twin (experts in order,
// each expert's rows clipped to [0, rows), ceil(count / tile) blocks of at most `tile` rows, a
// block near the end reading the last `tile` rows),
// entry for entry, with the routed total and invalid_rows; the output's rows of no expert zeroed
// and every other row untouched (poisoned before). Contiguous groupings with rows before the
// first expert, after the last, offsets below 0 and past the rows, empty experts and one expert
// of many blocks; masked ones with counts 0 .. capacity; a broken one of each (no block, every
// row zeroed and counted); tiles of 8, 16 and 128.
TEST(MoeRoutingGpu, RowBlockTableCoversEachExpertsRowsOnce) {
  QGEMM_REQUIRE_GPU();
  const unsigned seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  Engine engine(0);  // the context the kernels load in
  const jit::Arch arch = test::device_arch();
  const runtime::LoadedKernel kernel = load(jit::moe_row_blocks_spec(arch));
  const runtime::Driver& driver = runtime::Driver::get();
  struct Grouping {
    std::string label;
    MoeRowGrouping kind;
    std::vector<int> values;  // offsets [E + 1] or counts [E]
    std::int64_t rows, capacity;
    bool broken;
  };
  std::vector<Grouping> cases = {
      {"contiguous", MoeRowGrouping::Contiguous, {5, 5, 17, 300, 301, 301, 320}, 333, 0, false},
      {"contiguous past the ends", MoeRowGrouping::Contiguous, {-7, 3, 40, 90, 120}, 100, 0, false},
      {"falling offsets", MoeRowGrouping::Contiguous, {0, 10, 9, 20}, 30, 0, true},
      {"masked", MoeRowGrouping::Masked, {0, 40, 1, 39, 17}, 200, 40, false},
      {"count past the capacity", MoeRowGrouping::Masked, {3, 41, 0}, 120, 40, true},
  };
  {  // random contiguous and masked groupings of 64 experts
    std::uniform_int_distribution<int> cut(0, 2000), count(0, 48);
    Grouping random_contiguous{"random contiguous", MoeRowGrouping::Contiguous, {}, 2000, 0, false};
    for (int e = 0; e <= 64; ++e) random_contiguous.values.push_back(cut(rng));
    std::sort(random_contiguous.values.begin(), random_contiguous.values.end());
    Grouping random_masked{"random masked", MoeRowGrouping::Masked, {}, 64 * 48, 48, false};
    for (int e = 0; e < 64; ++e) random_masked.values.push_back(count(rng));
    cases.push_back(random_contiguous);
    cases.push_back(random_masked);
  }
  const std::int64_t n = 24;
  for (const Grouping& g : cases)
    for (const int tile : {8, 16, 128})
      for (const int out_bytes : {2, 4}) {
        SCOPED_TRACE(g.label + ", tile " + std::to_string(tile) + ", " + std::to_string(out_bytes) +
                     "-byte output");
        const bool contiguous = g.kind == MoeRowGrouping::Contiguous;
        const int experts = static_cast<int>(contiguous ? g.values.size() - 1 : g.values.size());
        // The host twin.
        std::vector<int> expert_of_row(static_cast<std::size_t>(g.rows), -1);
        std::vector<int> block_experts, row_blocks;
        for (int e = 0; e < experts && !g.broken; ++e) {
          std::int64_t first = contiguous ? g.values[e] : e * g.capacity;
          std::int64_t end = contiguous ? g.values[e + 1] : first + g.values[e];
          first = std::clamp<std::int64_t>(first, 0, g.rows);
          end = std::clamp<std::int64_t>(end, first, g.rows);
          for (std::int64_t r = first; r < end; ++r) expert_of_row[r] = e;
          for (std::int64_t row0 = first; row0 < end; row0 += tile) {
            // A block that would read past the last row reads the last `tile` rows instead.
            const std::int64_t load0 =
                row0 + tile > g.rows ? std::max<std::int64_t>(0, g.rows - tile) : row0;
            block_experts.push_back(e);
            row_blocks.push_back(static_cast<int>(load0));
            row_blocks.push_back(static_cast<int>(row0 - load0));
            row_blocks.push_back(static_cast<int>(std::min<std::int64_t>(tile, end - row0)));
          }
        }
        const DeviceBuffer values = DeviceBuffer::from(g.values);
        MoeGroupedRows groups;
        groups.grouping = g.kind;
        groups.offsets = contiguous ? values.as<const std::int32_t>() : nullptr;
        groups.counts = contiguous ? nullptr : values.as<const std::int32_t>();
        groups.capacity = g.capacity;
        DeviceBuffer invalid(4), workspace(runtime::moe_row_blocks_bytes(g.rows, experts, tile));
        invalid.fill_bytes(0x7f);
        workspace.fill_bytes(0xee);
        groups.invalid_rows = invalid.as<std::int32_t>();
        const std::int64_t ld = n + 3;
        DeviceBuffer out(static_cast<std::size_t>(g.rows * ld) * out_bytes);
        out.fill_bytes(0xff);
        const runtime::MoeGroupedBlocks table = runtime::launch_moe_row_blocks(
            kernel, groups, g.rows, experts, tile, workspace.as<void>(), workspace.bytes(),
            out.as<void>(), ld, n, out_bytes, nullptr);
        driver.check(driver.cuCtxSynchronize(), "cuCtxSynchronize");
        EXPECT_EQ(table.route_block, tile);
        EXPECT_EQ(table.positions, runtime::moe_row_blocks_max(g.rows, experts, tile) * tile);
        const std::size_t blocks = block_experts.size();
        ASSERT_LE(static_cast<std::int64_t>(blocks), table.positions / tile);
        EXPECT_EQ(read_ints(table.routed_total, 1)[0], static_cast<int>(blocks) * tile);
        if (blocks > 0) {
          EXPECT_EQ(read_ints(table.block_experts, blocks), block_experts);
          EXPECT_EQ(read_ints(table.row_blocks, 3 * blocks), row_blocks);
        }
        EXPECT_EQ(invalid.to_vector<std::int32_t>(1)[0], g.broken ? g.rows : 0);
        const auto bytes =
            out.to_vector<std::uint8_t>(static_cast<std::size_t>(g.rows * ld) * out_bytes);
        int wrong = 0;
        for (std::int64_t r = 0; r < g.rows; ++r)
          for (std::int64_t b = 0; b < ld * out_bytes; ++b) {
            // Columns < n of a row of no expert are zero; everything else keeps the poison.
            const bool zeroed = expert_of_row[r] < 0 && b < n * out_bytes;
            wrong += bytes[r * ld * out_bytes + b] != (zeroed ? 0x00 : 0xff);
          }
        EXPECT_EQ(wrong, 0) << "output bytes zeroed where they should not be, or not zeroed";
      }
}

}  // namespace
}  // namespace qgemm
