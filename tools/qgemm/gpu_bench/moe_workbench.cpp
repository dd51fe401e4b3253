#include "gpu_bench/moe_workbench.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "qgemm/error.hpp"

namespace qgemm::bench {
namespace {

constexpr int kDrawnExperts = 8;

}  // namespace

MoeCaseWeights::MoeCaseWeights(const RecipeCase& recipe_case, std::size_t case_index,
                               std::uint64_t seed, const std::vector<Backend>& backends)
    : case_(&recipe_case), case_index_(case_index) {
  require(recipe_case.kind == CaseKind::Moe && recipe_case.experts >= 1,
          "bench: case {} is not an MoE case", recipe_case.label);
  const std::int64_t n = recipe_case.n, k = recipe_case.k;
  const int drawn = std::min(recipe_case.experts, kDrawnExperts);
  for (int d = 0; d < drawn; ++d) {
    const std::vector<float> values =
        random_normal(n * k,
                      derive_seed(seed, kWeightTensor, case_index * kDrawnExperts +
                                                           static_cast<std::uint64_t>(d)),
                      kWeightSigma);
    drawn_.push_back(quantize_weight(recipe_case.scheme.weight, values.data(), n, k));
    if (uses(backends, Backend::CublasBf16))
      bf16_codes_.push_back(
          quantize_activation(unquantized(formats::bf16), values.data(), n, k).codes);
  }
  dense_.resize(drawn_.size());
}

const QuantWeight& MoeCaseWeights::experts_prepared(Engine& engine) {
  if (experts_error_) throw *experts_error_;
  if (!experts_) {
    try {
      std::vector<PackedWeight> all;
      all.reserve(static_cast<std::size_t>(experts()));
      for (int e = 0; e < experts(); ++e) all.push_back(packed(e));
      experts_ = engine.prepare_experts(all, case_->scheme.activation);
    } catch (const Error& error) {
      experts_error_ = error;
      throw;
    }
  }
  return *experts_;
}

const QuantWeight& MoeCaseWeights::dense_prepared(Engine& engine, int expert) {
  std::optional<QuantWeight>& slot = dense_[drawn_of(expert)];
  if (!slot) slot = engine.prepare_weight(packed(expert), unquantized(formats::bf16));
  return *slot;
}

const runtime::DeviceBuffer& MoeCaseWeights::bf16_device() {
  require(!bf16_codes_.empty(), "bench: bf16 experts were not made for this case");
  if (!bf16_device_.bytes()) {
    const std::size_t one = bf16_codes_.front().size();
    bf16_device_ = runtime::DeviceBuffer(one * static_cast<std::size_t>(experts()));
    for (int e = 0; e < experts(); ++e)
      check_cuda(cudaMemcpy(bf16_device_.as<char>() + one * static_cast<std::size_t>(e),
                            bf16_codes(e).data(), one, cudaMemcpyHostToDevice),
                 "cudaMemcpy (bf16 experts)");
  }
  return bf16_device_;
}

MoeProblem::MoeProblem(MoeCaseWeights& weights, std::int64_t m, std::uint64_t seed)
    : weights_(weights),
      case_(weights.recipe_case()),
      m_(m),
      rows_(m * std::min(weights.recipe_case().top_k, weights.experts())),
      activation_seed_(derive_seed(seed, kActivationTensor * 0x100000000ull + weights.case_index(),
                                   static_cast<std::uint64_t>(m))) {
  const int experts = weights.experts();
  const int top_k = std::min(case_.top_k, experts);
  // Each token to top_k distinct experts, uniformly (random routing, as the figures).
  std::mt19937_64 rng(activation_seed_);
  std::vector<int> order(static_cast<std::size_t>(experts));
  std::iota(order.begin(), order.end(), 0);
  expert_rows_.assign(static_cast<std::size_t>(experts), 0);
  for (std::int64_t t = 0; t < m; ++t) {
    for (int j = 0; j < top_k; ++j) {
      std::uniform_int_distribution<int> pick(j, experts - 1);
      std::swap(order[static_cast<std::size_t>(j)], order[static_cast<std::size_t>(pick(rng))]);
      ++expert_rows_[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])];
    }
  }
  row_start_.assign(static_cast<std::size_t>(experts), 0);
  std::vector<std::int32_t> offsets(static_cast<std::size_t>(experts) + 1, 0);
  for (int e = 0; e < experts; ++e) {
    row_start_[static_cast<std::size_t>(e)] = offsets[static_cast<std::size_t>(e)];
    offsets[static_cast<std::size_t>(e) + 1] = static_cast<std::int32_t>(
        offsets[static_cast<std::size_t>(e)] + expert_rows_[static_cast<std::size_t>(e)]);
    for (std::int64_t r = 0; r < expert_rows_[static_cast<std::size_t>(e)]; ++r)
      row_expert_.push_back(e);
  }
  offsets_device_ = runtime::DeviceBuffer::from(offsets);
  const std::vector<float> values = random_normal(rows_ * case_.k, activation_seed_ + 1, 1.0);
  const Format input = case_.scheme.activation.is_quantized() ? formats::bf16
                                                              : case_.scheme.activation.format;
  input_ = quantize_activation(unquantized(input), values.data(), rows_, case_.k);
  input_device_ = runtime::DeviceBuffer::from(input_.codes);
  output_ = runtime::DeviceBuffer(static_cast<std::size_t>(rows_ * case_.n * 4));
  sample_ = sample_output(rows_, case_.n, scale_row_alignment(weights.packed(0)));
}

std::vector<double> MoeProblem::reference(bool bf16_product) {
  std::optional<std::vector<double>>& cached = bf16_product ? bf16_expected_ : qgemm_expected_;
  if (cached) return *cached;
  std::vector<double> all;
  OutputSample one_row = sample_;
  one_row.rows = {0};
  // Quantized activations: the scheme's quantization of every routed row (a tensor scale from
  // all of them), as moe_gemm_grouped quantizes them.
  PackedActivation quantized;
  if (!bf16_product && case_.scheme.activation.is_quantized()) {
    const std::vector<float> values = decode_to_float(input_.codes, input_.quant.format);
    quantized = quantize_activation(case_.scheme.activation, values.data(), rows_, case_.k);
  }
  const PackedActivation& a = quantized.codes.empty() ? input_ : quantized;
  for (const std::int64_t r : sample_.rows) {
    const int e = row_expert_[static_cast<std::size_t>(r)];
    const PackedActivation row = select_activation_rows(a, {r});
    const std::vector<double> part =
        bf16_product ? sampled_bf16_product(row.codes, weights_.bf16_codes(e), case_.k, one_row)
                     : sampled_reference(case_.scheme, row, weights_.packed(e), one_row);
    all.insert(all.end(), part.begin(), part.end());
  }
  cached = std::move(all);
  return *cached;
}

std::function<double()> MoeProblem::error_function(const Format& output, bool bf16_product) {
  return [this, output, bf16_product] {
    const std::vector<double> actual =
        read_sampled_output(output_.as<void>(), output, case_.n, sample_);
    return relative_frobenius_error(actual, reference(bf16_product));
  };
}

BackendCall MoeProblem::call(Backend backend, GpuBench& gpu) {
  const std::int64_t rows = rows_, n = case_.n, k = case_.k;
  const int experts = weights_.experts();
  const Scheme& scheme = case_.scheme;
  // qdq multiplies the rows in 16 bits: the scheme's activation quantization is not its math.
  if (scheme.activation.is_quantized() && backend == Backend::Qdq)
    throw Error(ErrorCode::Unsupported,
                fmt::format("{} activations: qdq's grouped cuBLAS call multiplies 16-bit rows",
                            scheme.activation.format.name()));
  BackendCall out;
  out.output = output_.as<void>();
  out.tolerance = error_tolerance(backend);
  out.activation_bytes = rows * k * 2;
  std::int64_t routed_bytes = 0;  // the experts with rows: what a call must read
  for (int e = 0; e < experts; ++e)
    if (expert_rows_[static_cast<std::size_t>(e)] > 0) routed_bytes += packed_bytes(weights_.packed(e));
  Engine& engine = gpu.engine();
  void* c = output_.as<void>();
  void* a = input_device_.as<void>();
  switch (backend) {
    case Backend::Qgemm: {
      const QuantWeight& weight = weights_.experts_prepared(engine);
      const Format input = input_.quant.format, output = scheme.output;
      const GemmPlan plan = engine.plan(gemm_problem(weight, rows, input, output), weight,
                                        gpu.stream());
      out.kernel = plan.choice_for(rows).kernel;
      MoeGroupedRows groups;
      groups.offsets = offsets_device_.as<const std::int32_t>();
      out.call = [&engine, &weight, plan, groups, a, c, rows, n, k, input,
                  output](cudaStream_t stream) {
        engine.moe_gemm_grouped(plan, groups, {a, rows, k, k, input}, weight,
                                {c, rows, n, n, output}, stream);
      };
      out.output_bytes = rows * n * output.storage_bytes();
      out.error_now = error_function(output, false);
      out.weight_bytes = routed_bytes;
      out.weight_device_bytes = static_cast<std::int64_t>(weight.device_bytes());
      return out;
    }
    case Backend::CublasBf16:
    case Backend::Qdq: {
      if (input_.quant.format != formats::bf16)
        throw Error(ErrorCode::Unsupported,
                    fmt::format("{} rows: the grouped cuBLAS baseline multiplies bf16",
                                input_.quant.format.name()));
      const bool qdq = backend == Backend::Qdq;
      CublasBf16Gemm& blas = gpu.cublas_bf16();
      const std::size_t expert_bytes = static_cast<std::size_t>(n * k * 2);
      // The weight each expert's group reads: the bf16 layer, or qdq's dequantized copies.
      char* base = nullptr;
      if (qdq) {
        if (dequantized_.bytes() < expert_bytes * static_cast<std::size_t>(experts))
          dequantized_ = runtime::DeviceBuffer(expert_bytes * static_cast<std::size_t>(experts));
        base = dequantized_.as<char>();
      } else {
        base = weights_.bf16_device().as<char>();
      }
      std::vector<const void*> pointers;
      for (int e = 0; e < experts; ++e) pointers.push_back(base + expert_bytes * static_cast<std::size_t>(e));
      auto& grouped = qdq ? qdq_grouped_ : bf16_grouped_;
      grouped = CublasBf16Gemm::prepare_grouped(expert_rows_, row_start_, pointers, n, k, a, c);
      const CublasBf16Gemm::Grouped* g = &*grouped;
      out.kernel = CublasBf16Gemm::grouped_description();
      if (qdq) {
        // Every expert with rows dequantized, then the grouped product.
        std::vector<std::pair<const QuantWeight*, void*>> jobs;
        for (int e = 0; e < experts; ++e)
          if (expert_rows_[static_cast<std::size_t>(e)] > 0)
            jobs.emplace_back(&weights_.dense_prepared(engine, e),
                              const_cast<void*>(pointers[static_cast<std::size_t>(e)]));
        out.kernel = "Engine::dequantize per expert, then " + out.kernel;
        out.dequantize = [&engine, jobs, n, k](cudaStream_t stream) {
          for (const auto& [weight, w16] : jobs)
            engine.dequantize(*weight, {w16, n, k, k, formats::bf16}, stream);
        };
        const GpuCall dequantize = out.dequantize;
        out.call = [&blas, g, dequantize](cudaStream_t stream) {
          dequantize(stream);
          blas.grouped_gemm(stream, *g);
        };
        out.error_now = error_function(formats::bf16, false);
        out.weight_bytes = routed_bytes;
      } else {
        out.call = [&blas, g](cudaStream_t stream) { blas.grouped_gemm(stream, *g); };
        out.error_now = error_function(formats::bf16, true);
        out.weight_bytes = 2 * n * k * static_cast<std::int64_t>(std::count_if(
                                            expert_rows_.begin(), expert_rows_.end(),
                                            [](std::int64_t r) { return r > 0; }));
      }
      out.weight_device_bytes = 2 * n * k * experts;
      out.output_bytes = rows * n * 2;
      return out;
    }
    case Backend::CublasLtFp8:
    case Backend::CublasLtFp8Exact:
    case Backend::QgemmCodes:
      throw Error(ErrorCode::Unsupported,
                  fmt::format("{} has no MoE form in qgemm bench", to_string(backend)));
  }
  throw Error(ErrorCode::Internal, "backend out of range");
}

}  // namespace qgemm::bench
