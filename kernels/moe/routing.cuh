// Routing preparation of an MoE layer on the GPU: top-k expert ids -> the indexed layout of
// moe/routing_args.cuh, in three launches with no host synchronization (graph-capturable; memsets
// before them zero the counts and fill sorted_slots with the sentinel):
//
//   count    grid-stride over slots: a shared-memory histogram per block, added to counts[]
//   offsets  one block: padded counts scanned into offsets[], cursors[] = offsets[],
//            block_experts[] from the offsets
//   scatter  grid-stride over slots: position = atomicAdd(cursors[e], 1)
//   small    (slots ≤ kMoeSmallSlots) all of it, memsets included, in one block
//
// Rows grouped by the caller (contiguous or masked) become top-1 ids (moe_group_ids) for that
// routing, or a table of token blocks read in place (moe_row_blocks).
//
// All three read the slots at memory speed; the offsets step scans local_experts (≤ 512) counts
// in one block of 512 threads and writes the capacity / block block entries.
#pragma once

#include "moe/routing_args.cuh"

namespace qgemm::kernels {

// The local expert of slot s, or −1: another rank's, or routed nowhere (an id outside
// [0, global_experts) or a map entry outside [−1, local_experts): counted in invalid_ids).
__device__ __forceinline__ int moe_local_expert(const MoeRoutingArgs& args, long long s,
                                                bool count_invalid) {
  const int id = args.expert_ids[s];
  const int local = id < 0 || id >= args.global_experts ? -2
                    : args.expert_map != nullptr        ? args.expert_map[id]
                                                        : id;
  if (local < -1 || local >= args.local_experts) {
    if (count_invalid) atomicAdd(args.invalid_ids, 1);
    return -1;
  }
  return local;
}

template <int kThreads>
__device__ void moe_count(const MoeRoutingArgs& args, int* histogram) {
  for (int e = threadIdx.x; e < args.local_experts; e += kThreads) histogram[e] = 0;
  __syncthreads();
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  for (long long s = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; s < args.slots;
       s += stride) {
    const int e = moe_local_expert(args, s, true);
    if (e >= 0) atomicAdd(&histogram[e], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < args.local_experts; e += kThreads)
    if (histogram[e] != 0) atomicAdd(&args.counts[e], histogram[e]);
}

// The inclusive sum of `value` over the block's threads (in thread order): a warp scan
// (shuffles), the warps' totals scanned by warp 0, then each thread adds its warp's base.
// Every thread of the block calls it; `warp_sums` is kThreads / 32 shared ints.
template <int kThreads>
__device__ int block_inclusive_sum(int value, int* warp_sums) {
  static_assert(kThreads % 32 == 0 && kThreads / 32 <= 32, "whole warps, at most 32");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int offset = 1; offset < 32; offset *= 2) {
    const int other = __shfl_up_sync(0xffffffffu, value, offset);
    if (lane >= offset) value += other;
  }
  if (lane == 31) warp_sums[warp] = value;
  __syncthreads();
  if (warp == 0) {
    int total = lane < kThreads / 32 ? warp_sums[lane] : 0;
    for (int offset = 1; offset < 32; offset *= 2) {
      const int other = __shfl_up_sync(0xffffffffu, total, offset);
      if (lane >= offset) total += other;
    }
    if (lane < kThreads / 32) warp_sums[lane] = total;  // inclusive over warps
  }
  __syncthreads();
  return warp > 0 ? value + warp_sums[warp - 1] : value;
}

// One block of kThreads ≥ local_experts threads (the host launches 512 for at most 512
// experts): thread e holds expert e's padded count, padded[e] = the inclusive sum.
template <int kThreads>
__device__ void moe_offsets(const MoeRoutingArgs& args, int* padded) {
  __shared__ int warp_sums[kThreads / 32];
  const int experts = args.local_experts;
  const int e = threadIdx.x;
  const int count = e < experts ? (args.counts[e] + args.block - 1) / args.block * args.block : 0;
  const int value = block_inclusive_sum<kThreads>(count, warp_sums);
  if (e < experts) padded[e] = value;
  __syncthreads();
  // offsets[e] = inclusive[e − 1] (offsets[experts] = the total). The padding already holds the
  // sentinel (the host's memset of sorted_slots before the count step).
  if (e < experts) {
    const int start = e == 0 ? 0 : padded[e - 1];
    args.offsets[e] = start;
    args.cursors[e] = start;
  }
  if (threadIdx.x == 0) args.offsets[experts] = experts > 0 ? padded[experts - 1] : 0;
  // block_experts: the expert whose run holds the block's first position (binary search over
  // the inclusive sums: the first e with padded[e] > position), −1 past the total.
  const int total = experts > 0 ? padded[experts - 1] : 0;
  const long long blocks = args.capacity / args.block;
  for (long long b = threadIdx.x; b < blocks; b += kThreads) {
    const long long position = b * args.block;
    int expert = -1;
    if (position < total) {
      int low = 0, high = experts - 1;
      while (low < high) {
        const int mid = (low + high) / 2;
        if (padded[mid] > position)
          high = mid;
        else
          low = mid + 1;
      }
      expert = low;
    }
    args.block_experts[b] = expert;
  }
}

template <int kThreads>
__device__ void moe_scatter(const MoeRoutingArgs& args) {
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  for (long long s = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; s < args.slots;
       s += stride) {
    const int e = moe_local_expert(args, s, false);
    int position = -1;
    if (e >= 0) {
      position = atomicAdd(&args.cursors[e], 1);
      args.sorted_slots[position] = static_cast<int>(s);
    }
    args.slot_positions[s] = position;
  }
}

// Every step in one block (slots ≤ kMoeSmallSlots): the zeroing and the sentinel fill the host
// otherwise does with memsets, the count in shared memory, the scan, the scatter. Each phase
// ends at a barrier, which also orders the block's global writes for the next.
template <int kThreads>
__device__ void moe_route_in_one_block(const MoeRoutingArgs& args, int* per_expert) {
  if (threadIdx.x == 0) *args.invalid_ids = 0;
  for (int e = threadIdx.x; e < args.local_experts; e += kThreads) per_expert[e] = 0;
  for (long long p = threadIdx.x; p < args.capacity; p += kThreads)
    args.sorted_slots[p] = static_cast<int>(args.slots);
  __syncthreads();
  for (long long s = threadIdx.x; s < args.slots; s += kThreads) {
    const int e = moe_local_expert(args, s, true);
    if (e >= 0) atomicAdd(&per_expert[e], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < args.local_experts; e += kThreads) args.counts[e] = per_expert[e];
  __syncthreads();
  moe_offsets<kThreads>(args, per_expert);
  __syncthreads();
  moe_scatter<kThreads>(args);
}

template <int kStep, int kThreads, int kDynamicSmemBytes>
__global__ void __launch_bounds__(kThreads) moe_routing_kernel(MoeRoutingArgs args) {
  static_assert(kDynamicSmemBytes == 0, "moe_routing uses static shared memory only");
  __shared__ int per_expert[512];  // the host refuses more local experts
  if constexpr (kStep == kMoeCount) {
    moe_count<kThreads>(args, per_expert);
  } else if constexpr (kStep == kMoeOffsets) {
    moe_offsets<kThreads>(args, per_expert);
  } else if constexpr (kStep == kMoeSmall) {
    moe_route_in_one_block<kThreads>(args, per_expert);
  } else {
    moe_scatter<kThreads>(args);
  }
}

// Whether a grouping breaks its rule (offsets that fall, a count outside [0, capacity]), as
// every block of a kernel that reads it sees it: each checks the whole grouping (at most 513
// values, read from L2), so that a broken one fails every row alike, never some of them.
template <int kThreads>
__device__ bool moe_grouping_broken(const MoeRowGroupingArgs& g) {
  bool broken = false;
  if (g.offsets != nullptr) {
    for (int e = threadIdx.x; e < g.experts; e += kThreads)
      broken |= g.offsets[e + 1] < g.offsets[e];
  } else {
    for (int e = threadIdx.x; e < g.experts; e += kThreads)
      broken |= g.counts[e] < 0 || g.counts[e] > g.capacity;
  }
  return __syncthreads_or(broken);
}

// The expert of row r of a valid grouping, or −1 (a row of no expert).
__device__ __forceinline__ int moe_grouped_row_expert(const MoeRowGroupingArgs& g, long long r) {
  if (g.offsets != nullptr) {
    if (r < g.offsets[0] || r >= g.offsets[g.experts]) return -1;
    // The last expert whose run starts at or before r (offsets do not fall).
    int low = 0, high = g.experts - 1;
    while (low < high) {
      const int mid = (low + high + 1) / 2;
      if (g.offsets[mid] <= r)
        low = mid;
      else
        high = mid - 1;
    }
    return low;
  }
  const long long e = r / g.capacity;
  return r - e * g.capacity < g.counts[e] ? static_cast<int>(e) : -1;
}

// Grid-stride over rows.
template <int kThreads, int kDynamicSmemBytes>
__global__ void __launch_bounds__(kThreads) moe_group_ids_kernel(MoeGroupIdsArgs args) {
  static_assert(kDynamicSmemBytes == 0, "moe_group_ids uses no shared memory");
  const MoeRowGroupingArgs& g = args.grouping;
  const bool broken = moe_grouping_broken<kThreads>(g);
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  const long long first = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  for (long long e = first; e <= g.experts; e += stride)
    args.map[e] = e < g.experts ? static_cast<int>(e) : -1;
  for (long long r = first; r < g.rows; r += stride) {
    int id = -1;
    if (!broken) {
      id = moe_grouped_row_expert(g, r);
      if (id < 0) id = g.experts;  // no expert's row: mapped to −1 as another rank's
    }
    args.ids[r] = id;
  }
}

// Block 0 lays the table out: thread e finds expert e's rows and block count, a scan numbers
// the blocks, then the block's threads stride over the blocks (each finds its expert by a
// binary search over the scanned counts, so one expert of many blocks is not one thread's
// work). Every block, when `out` is given, zeroes the rows of no expert it strides over (a warp
// a row, 2-byte stores along it).
template <int kThreads, int kDynamicSmemBytes>
__global__ void __launch_bounds__(kThreads) moe_row_blocks_kernel(MoeRowBlocksArgs args) {
  static_assert(kDynamicSmemBytes == 0, "moe_row_blocks uses static shared memory only");
  __shared__ int warp_sums[kThreads / 32];
  __shared__ int first_row[kThreads], end_row[kThreads], blocks_after[kThreads];
  const MoeRowGroupingArgs& g = args.grouping;
  const int experts = g.experts;
  const bool broken = moe_grouping_broken<kThreads>(g);
  if (blockIdx.x == 0) {
    const int e = threadIdx.x;
    long long first = 0, end = 0;
    if (e < experts && !broken) {
      if (g.offsets != nullptr) {
        first = g.offsets[e], end = g.offsets[e + 1];
      } else {
        first = e * g.capacity, end = first + g.counts[e];
      }
      first = min(max(first, 0LL), g.rows);
      end = min(max(end, first), g.rows);
    }
    const int blocks = static_cast<int>((end - first + args.tile - 1) / args.tile);
    first_row[e] = static_cast<int>(first);
    end_row[e] = static_cast<int>(end);
    blocks_after[e] = block_inclusive_sum<kThreads>(blocks, warp_sums);
    __syncthreads();
    const int total = blocks_after[kThreads - 1];
    for (int b = threadIdx.x; b < total; b += kThreads) {
      int low = 0, high = experts - 1;  // the first expert whose blocks end past b
      while (low < high) {
        const int mid = (low + high) / 2;
        if (blocks_after[mid] > b)
          high = mid;
        else
          low = mid + 1;
      }
      const int before = low == 0 ? 0 : blocks_after[low - 1];
      const int row0 = first_row[low] + (b - before) * args.tile;
      const int load0 =
          row0 + args.tile > g.rows ? max(0, static_cast<int>(g.rows) - args.tile) : row0;
      args.block_experts[b] = low;
      int* entry = args.row_blocks + kMoeRowBlockFields * b;
      entry[kRowBlockLoad0] = load0;
      entry[kRowBlockSkip] = row0 - load0;
      entry[kRowBlockCount] = min(args.tile, end_row[low] - row0);
    }
    if (threadIdx.x == 0) {
      *args.routed_total = total * args.tile;
      if (args.invalid_rows != nullptr)
        *args.invalid_rows = broken ? static_cast<int>(g.rows) : 0;
    }
  }
  if (args.out == nullptr) return;
  const int lane = threadIdx.x % 32;
  const long long warps = static_cast<long long>(gridDim.x) * (kThreads / 32);
  const long long halves = static_cast<long long>(args.n) * args.out_bytes / 2;
  for (long long r = static_cast<long long>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
       r < g.rows; r += warps) {
    if (!broken && moe_grouped_row_expert(g, r) >= 0) continue;
    unsigned short* row = reinterpret_cast<unsigned short*>(static_cast<char*>(args.out) +
                                                            r * args.ldo * args.out_bytes);
    for (long long c = lane; c < halves; c += 32) row[c] = 0;
  }
}

}  // namespace qgemm::kernels
