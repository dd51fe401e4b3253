// Shared by the libFuzzer targets of tests/fuzz (issue #19). Each target feeds its input to one
// parser and asserts the contract every qgemm parser has: it returns a valid object, or it throws
// qgemm::Error. Any other exception, a failed check of the returned object, a crash or a
// sanitizer report (address, undefined) is a finding: the fuzzer stops and writes the input.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <typeinfo>

#include "qgemm/error.hpp"

namespace qgemm::fuzz {

[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "\n==qgemm-fuzz== FINDING: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// FUZZ_CHECK(condition, message): the returned object broke an invariant.
#define FUZZ_CHECK(condition, message)                                                    \
  do {                                                                                    \
    if (!(condition))                                                                     \
      ::qgemm::fuzz::finding(std::string("check failed: " #condition ": ") + (message)); \
  } while (0)

// Runs `parse_and_check`; qgemm::Error is the expected rejection, anything else a finding.
template <typename Body>
void expect_object_or_error(Body&& parse_and_check) {
  try {
    parse_and_check();
  } catch (const qgemm::Error&) {
    // rejected with the library's error: the contract holds
  } catch (const std::exception& error) {
    finding(std::string("exception other than qgemm::Error: ") + typeid(error).name() + ": " +
            error.what());
  } catch (...) {
    finding("exception of a non-std type");
  }
}

}  // namespace qgemm::fuzz
