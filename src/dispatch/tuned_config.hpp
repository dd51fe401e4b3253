// The selection layer's use of tuning tables (dispatch/tuning_table.hpp): which table is active,
// whether it belongs to this machine, and the tile config it names for one call.
//
//   Engine::Impl::choose, no forced tile_config
//     └─► tuned_dense_config(device, scheme, M, weight, A type)
//           no active table ....................................► ""   (heuristics)
//           table of another machine ...........................► ""   one warning per table and
//                                                                       device, naming the fields
//           no entry for (scheme, N, K, bucket(M)) .............► ""
//           entry's config unknown or cannot serve (M, weight) .► ""   (info log, once)
//           otherwise ..........................................► the entry's config name
//
// The active table is QGEMM_TUNING_TABLE=path (read at first use) or the one given to
// qgemm::use_tuning_table (include/qgemm/tuning.hpp), which replaces it.
#pragma once

#include <cstdint>
#include <string>

#include "dispatch/gpu_limits.hpp"
#include "dispatch/tuning_table.hpp"
#include "layout/mma_layout.hpp"
#include "qgemm/scheme.hpp"
#include "runtime/driver.hpp"

namespace qgemm::dispatch {

// The installed driver's release ("580.65.06", from /proc/driver/nvidia/version), or
// "CUDA <driver API version>" where that file cannot be read.
std::string driver_release();

// The machine key of a table measured now on `device`: GPU name, SM count, CUDA (the NVRTC
// version the kernels are compiled with), driver release, qgemm version. `qgemm tune` writes
// it; the lookup compares it.
MachineKey machine_key(const runtime::DeviceInfo& device);

// The scheme of a call with unquantized activations of type `activation` (bf16 / fp16): what a
// table entry for a w*a16 preset is keyed by.
Scheme call_scheme(const WeightQuant& weight, const Format& activation, const Format& output);

// The config `table` names for a GEMM of M rows against `weight` under `scheme` (A reaching the
// kernel as `activation`) when there is an entry for (scheme, N, K, bucket(M)) and its config is
// one of dense_gemm_configs() that can serve (M, weight, activation); else empty, with `why`
// (when given) saying which rule refused it. The table's machine is not checked here.
std::string lookup_dense_config(const TuningTable& table, const Scheme& scheme, std::int64_t m,
                                const layout::MmaWeight& weight, const Format& activation,
                                const GpuLimits& gpu, std::string* why = nullptr);

// Makes the table at `path` the active one (empty: none). A file that cannot be read or parsed
// is Error(IoError / InvalidArgument) here, not a silent fallback: the caller asked for it.
void set_active_tuning_table(const std::string& path);

// The config the active table names for this call on `device` (empty: the heuristics choose).
std::string tuned_dense_config(const runtime::DeviceInfo& device, const Scheme& scheme,
                               std::int64_t m, const layout::MmaWeight& weight,
                               const Format& activation);

}  // namespace qgemm::dispatch
