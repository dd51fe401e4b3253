// The MoE cases of `qgemm bench` (a recipe case with kind: moe): one grouped GEMM of `experts`
// experts of [n, k], M tokens each routed to top_k distinct experts drawn at random, over the
// routed rows grouped by expert (the contiguous layout: expert 0's rows, then expert 1's, ...),
// as an engine's own dispatch hands them over:
//
//   rows [M · top_k, k] ─ grouped GEMM (expert e's rows · W_eᵀ) ─► [M · top_k, n]
//
//   qgemm        Engine::moe_gemm_grouped (its routing, gather, activation quantization where
//                the scheme has one, grouped GEMM and the rows put back: all of qgemm's cost)
//   cublas-bf16  one cublasGemmGroupedBatchedEx over bf16 experts (the unquantized layer)
//   qdq          every expert that has rows dequantized into bf16 (Engine::dequantize of its
//                dense weight), then the same grouped cuBLAS call: the layer without a fused
//                kernel
//
// Weights: min(experts, 8) experts are drawn and quantized; expert e is a copy of drawn e mod 8
// with device memory of its own, so a call reads the whole layer's bytes (qdq's dequantization
// reads the drawn ones again, which may stay in L2: the baseline's advantage, not ours). Every
// routed row is drawn fresh. Schemes with quantized activations: qgemm quantizes the routed
// rows as the scheme says (part of its time); qdq has no such form (its cuBLAS call multiplies
// 16-bit rows).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "gpu_bench/workbench.hpp"

namespace qgemm::bench {

class MoeCaseWeights {
 public:
  MoeCaseWeights(const RecipeCase& recipe_case, std::size_t case_index, std::uint64_t seed,
                 const std::vector<Backend>& backends);
  std::size_t case_index() const { return case_index_; }
  const RecipeCase& recipe_case() const { return *case_; }
  int experts() const { return case_->experts; }
  // The drawn weight expert e copies.
  const PackedWeight& packed(int expert) const { return drawn_[drawn_of(expert)]; }
  const std::vector<std::uint8_t>& bf16_codes(int expert) const {
    return bf16_codes_[drawn_of(expert)];
  }
  // Every expert for Engine::moe_gemm_grouped (prepare_experts); its Error is thrown again at
  // every call.
  const QuantWeight& experts_prepared(Engine& engine);
  // Drawn expert d as a dense weight (qdq's dequantization).
  const QuantWeight& dense_prepared(Engine& engine, int expert);
  // Every expert's bf16 weight, [experts][n][k] (cublas-bf16).
  const runtime::DeviceBuffer& bf16_device();

 private:
  std::size_t drawn_of(int expert) const { return static_cast<std::size_t>(expert) % drawn_.size(); }

  const RecipeCase* case_;
  std::size_t case_index_;
  std::vector<PackedWeight> drawn_;
  std::vector<std::vector<std::uint8_t>> bf16_codes_;  // empty unless cublas-bf16 runs
  std::optional<QuantWeight> experts_;
  std::optional<Error> experts_error_;
  std::vector<std::optional<QuantWeight>> dense_;
  runtime::DeviceBuffer bf16_device_;
};

// One MoE case at one M: a routing, the routed rows, their output and its checked sample.
class MoeProblem {
 public:
  MoeProblem(MoeCaseWeights& weights, std::int64_t m, std::uint64_t seed);
  std::int64_t m() const { return m_; }
  std::int64_t rows() const { return rows_; }
  std::uint64_t activation_seed() const { return activation_seed_; }
  const OutputSample& sample() const { return sample_; }
  // Error(Unsupported) when the backend cannot run this case.
  BackendCall call(Backend backend, GpuBench& gpu);

 private:
  // The sampled rows' references, each row against its own expert.
  std::vector<double> reference(bool bf16_product);
  std::function<double()> error_function(const Format& output, bool bf16_product);

  MoeCaseWeights& weights_;
  const RecipeCase& case_;
  std::int64_t m_, rows_;
  std::uint64_t activation_seed_;
  std::vector<std::int64_t> expert_rows_, row_start_;  // per expert
  std::vector<int> row_expert_;                        // per routed row
  PackedActivation input_;                             // the routed rows (bf16 / fp16 codes)
  runtime::DeviceBuffer input_device_, offsets_device_, output_, dequantized_;
  std::optional<CublasBf16Gemm::Grouped> bf16_grouped_, qdq_grouped_;
  OutputSample sample_;
  std::optional<std::vector<double>> qgemm_expected_, bf16_expected_;
};

}  // namespace qgemm::bench
