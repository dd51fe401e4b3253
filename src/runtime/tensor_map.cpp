#include "runtime/tensor_map.hpp"

#include <fmt/format.h>

#include <cstring>

#include "qgemm/error.hpp"
#include "runtime/driver.hpp"

namespace qgemm::runtime {

static_assert(sizeof(kernels::TensorMapStorage) == sizeof(CUtensorMap) &&
                  alignof(kernels::TensorMapStorage) == alignof(CUtensorMap),
              "the kernels' tensor map storage must match cuda.h's CUtensorMap");

kernels::TensorMapStorage activation_tensor_map(CUdeviceptr base, std::int64_t rows,
                                                std::int64_t cols, std::int64_t stride,
                                                int box_rows, int element_bytes) {
  if (element_bytes != 1 && element_bytes != 2)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("tensor map: element_bytes = {} (rule: 1 for e4m3 codes or 2 for "
                            "bf16/fp16)",
                            element_bytes));
  const std::int64_t stride_bytes = stride * element_bytes;
  if (base % 16 != 0 || stride_bytes % 16 != 0)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("tensor map: A at {:#x} with a row stride of {} bytes (rule: both "
                            "multiples of 16 bytes)",
                            static_cast<unsigned long long>(base), stride_bytes));
  const auto& driver = Driver::get();
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(stride_bytes)};  // bytes, dim 1
  // A box row is 128 bytes, the width of the 128-byte swizzle.
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(128 / element_bytes),
                             static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  // The element type only sets the size here (TMA moves bits; bf16 and fp16 are both 2 bytes,
  // e4m3 codes 1).
  const CUtensorMapDataType type =
      element_bytes == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_UINT16;
  driver.check(driver.cuTensorMapEncodeTiled(
                   &map, type, 2, reinterpret_cast<void*>(base), dims,
                   strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                   CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
               "cuTensorMapEncodeTiled (activations)");
  kernels::TensorMapStorage out;
  static_assert(sizeof(out) == sizeof(map));
  std::memcpy(&out, &map, sizeof(map));
  return out;
}

}  // namespace qgemm::runtime
