// The selection layer's use of tuning tables (dispatch/tuning_table.hpp): which table is active
// and whether it belongs to this machine. The selector (dispatch/select.hpp) looks the call up
// in the table it is given and prefers the entry's candidate where that candidate can serve.
//
//   applicable_tuning_table(device)
//     no active table ....................► null   (the cost model ranks)
//     table of another machine ...........► null   one warning per table and device, naming
//                                                  the fields that differ
//     otherwise ..........................► the table
//
// The active table is QGEMM_TUNING_TABLE=path (read at first use) or the one given to
// qgemm::use_tuning_table (include/qgemm/tuning.hpp), which replaces it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dispatch/tuning_table.hpp"
#include "runtime/driver.hpp"

namespace qgemm::dispatch {

// The installed driver's release ("580.65.06", from /proc/driver/nvidia/version), or
// "CUDA <driver API version>" where that file cannot be read.
std::string driver_release();

// The machine key of a table measured now on `device`: GPU name, SM count, CUDA (the NVRTC
// version the kernels are compiled with), driver release, qgemm version. `qgemm tune` writes
// it; the lookup compares it.
MachineKey machine_key(const runtime::DeviceInfo& device);

// Makes the table at `path` the active one (empty: none). A file that cannot be read or parsed
// is Error(IoError / InvalidArgument) here, not a silent fallback: the caller asked for it.
void set_active_tuning_table(const std::string& path);

// The active table when it applies to `device` (measured on this machine); else null.
std::shared_ptr<const TuningTable> applicable_tuning_table(const runtime::DeviceInfo& device);

// Changes whenever the active table does: plans cached under an older value are made again.
std::uint64_t tuning_table_generation();

}  // namespace qgemm::dispatch
