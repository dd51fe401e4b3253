// repack_weight: canonical packed codes [n, k] -> K-major interleaved 32-bit words.
//
//   codes_per_word P = floor(32 / bits)   (4 bits: 8, 3 bits: 10, 8 bits: 4; top 32 − P·bits
//                                          bits of a word are zero)
//   words[w][r] = Σ_i code(r, w·P + i) << (i·bits),  i < P,  codes past k are 0
//   words is [ceil(k / P)][n]: for one K-word, the n rows are adjacent, so a warp that walks
//   n reads 32 consecutive words (128 bytes) per K step.
//
//   row r, bits 4:  k: 0 1 2 3 4 5 6 7 | 8 ... 15 | ...
//                   word w=0 of row r ─┘  w=1      ...      → words[0][r], words[1][r], ...
//
// This is the simple interim layout; the fragment-ordered layout of the GEMM kernels replaces it
// in issue 4. One thread per output word; consecutive threads take consecutive rows r.
#pragma once

#include "util/packed_codes.cuh"
#include "util/utility_args.cuh"

namespace qgemm::kernels {

template <int kBits>
__host__ __device__ constexpr int codes_per_word() {
  return 32 / kBits;
}

template <int kBits, int kThreads, int kDynamicSmemBytes>
__global__ void __launch_bounds__(kThreads) repack_weight_kernel(RepackWeightArgs args) {
  static_assert(kBits >= 1 && kBits <= 8, "packed codes are 1..8 bits");
  static_assert(kDynamicSmemBytes == 0, "repack_weight uses no shared memory");
  constexpr int per_word = codes_per_word<kBits>();
  const long long word_rows = (args.k + per_word - 1) / per_word;
  const long long total = word_rows * args.n;
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  for (long long index = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x; index < total;
       index += stride) {
    const long long word_row = index / args.n;
    const long long row = index - word_row * args.n;
    const unsigned char* codes = args.codes + row * args.row_bytes;
    const long long first = word_row * per_word;
    unsigned int word = 0;
    for (int i = 0; i < per_word && first + i < args.k; ++i) {
      word |= read_packed_code<kBits>(codes, args.row_bytes, first + i) << (i * kBits);
    }
    args.words[index] = word;
  }
}

}  // namespace qgemm::kernels
