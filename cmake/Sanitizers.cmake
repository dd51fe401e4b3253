# Sanitizer and fuzzing builds (issue #19). Each belongs in a build directory of its own:
#
#   cmake -S . -B build-asan -G Ninja -DQGEMM_SANITIZE=address,undefined -DQGEMM_PYTHON=OFF
#   cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DQGEMM_FUZZ=ON  (scripts/fuzz.sh)
#
# QGEMM_SANITIZE: a comma-separated list for -fsanitize= (gcc or clang), applied to every target
# of the build (library, harness, CLI, tests). Every sanitizer is fatal
# (-fno-sanitize-recover=all): an UBSan report fails the test that triggered it.
# QGEMM_FUZZ: the libFuzzer targets of tests/fuzz (clang only), over a library instrumented for
# coverage (-fsanitize=fuzzer-no-link) and, unless QGEMM_SANITIZE says otherwise, address and
# undefined.
set(QGEMM_SANITIZE "" CACHE STRING
  "Sanitizers for every target, as for -fsanitize= (e.g. address,undefined); empty: none")
option(QGEMM_FUZZ "Build the libFuzzer targets of tests/fuzz (clang only)" OFF)

if(QGEMM_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "QGEMM_FUZZ needs clang (libFuzzer); configure with "
      "-DCMAKE_CXX_COMPILER=clang++ (this is ${CMAKE_CXX_COMPILER_ID})")
  endif()
  if(QGEMM_SANITIZE STREQUAL "")
    set(QGEMM_SANITIZE address,undefined)
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()

if(NOT QGEMM_SANITIZE STREQUAL "")
  message(STATUS "qgemm: sanitizers ${QGEMM_SANITIZE} (fatal)")
  add_compile_options(-fsanitize=${QGEMM_SANITIZE} -fno-sanitize-recover=all
    -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${QGEMM_SANITIZE})
  # The driver is dlopen'ed, never linked, but CUDA::cublas drags the driver stub in: gcc on
  # Debian links --as-needed by default and drops it, clang does not (without this its binaries
  # need libcuda.so.1 to start, which a machine without a GPU does not have).
  add_link_options(LINKER:--as-needed)
endif()
