// libFuzzer target: schemes (parse_scheme), preset names and the compact text form
// "w=<fmt>[:...];a=<fmt>[:...];o=<fmt>". A parsed scheme must validate, print as a text form
// that parses back to the same scheme (to_string is canonical), and give scale grids.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"
#include "qgemm/scheme.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  qgemm::fuzz::expect_object_or_error([&] {
    const qgemm::Scheme scheme = qgemm::parse_scheme(text);
    qgemm::validate(scheme);  // parse_scheme returns only valid schemes
    const std::string canonical = qgemm::to_string(scheme);
    qgemm::Scheme again;
    try {
      again = qgemm::parse_scheme(canonical);
    } catch (const qgemm::Error& error) {
      qgemm::fuzz::finding("to_string gives '" + canonical + "', which does not parse: " +
                           error.what());
    }
    FUZZ_CHECK(again == scheme, "'" + canonical + "' parses to '" + qgemm::to_string(again) + "'");
    FUZZ_CHECK(qgemm::to_string(again) == canonical, canonical);
    // Shapes: any K suits any group (the last group is shorter), so these must pass.
    for (std::int64_t k : {1, 7, 128, 2880}) {
      qgemm::validate_shape(scheme, 1, 3, k);
      const auto grid = qgemm::weight_scale_grid(scheme.weight, 3, k);
      FUZZ_CHECK(grid.rows >= 1 && grid.cols >= 1, canonical);
      FUZZ_CHECK(grid.rows * grid.rows_per >= 3 && grid.cols * grid.cols_per >= k, canonical);
      if (scheme.activation.is_quantized()) {
        const auto agrid = qgemm::activation_scale_grid(scheme.activation, 5, k);
        FUZZ_CHECK(agrid.rows >= 1 && agrid.cols >= 1, canonical);
      }
    }
  });
  return 0;
}
