// QGEMM_HOST_DEVICE marks constexpr helpers that both NVRTC (kernels) and the host compiler
// (src/dispatch, src/layout, the tests) evaluate: tile shapes, layouts, codes.
#pragma once

#if defined(__CUDACC__)
#define QGEMM_HOST_DEVICE __host__ __device__
#else
#define QGEMM_HOST_DEVICE
#endif
