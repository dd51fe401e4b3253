// Helpers shared by the reference and check tests: fresh random inputs (the seed goes into
// every failure message) and error-message capture.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "qgemm/error.hpp"

namespace qgemm_test {

inline std::uint64_t fresh_test_seed() {
  std::random_device device;
  return (std::uint64_t{device()} << 32) ^ device();
}

inline std::vector<double> random_doubles(std::mt19937_64& rng, std::size_t count) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> values(count);
  for (double& value : values) value = normal(rng);
  return values;
}

inline std::vector<float> random_floats(std::mt19937_64& rng, std::size_t count, double sigma) {
  std::normal_distribution<double> normal(0.0, sigma);
  std::vector<float> values(count);
  for (float& value : values) value = static_cast<float>(normal(rng));
  return values;
}

// The message of the qgemm::Error `call` throws, or "(no error)".
template <class Call>
std::string error_message_of(Call&& call) {
  try {
    call();
  } catch (const qgemm::Error& error) {
    return error.what();
  }
  return "(no error)";
}

}  // namespace qgemm_test
