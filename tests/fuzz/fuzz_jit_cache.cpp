// libFuzzer target: JIT kernel-cache entries as bytes from disk (src/jit/cache.cpp). The reader
// takes paths, so each input is written to a file of a private temporary directory:
//
//  1. as a whole entry file, named after the key its header claims (bytes 32..47), and listed
//     by list_disk_entries (`qgemm cache list`): framing, checksum, key and metadata JSON;
//  2. as the metadata JSON of an entry framed around it (valid magic, sizes, checksum and key)
//     for the kernel spec the metadata names (parse_kernel_spec), then read by a fresh
//     KernelCache::get: a disk hit must return the metadata's fields, and anything the reader
//     rejects goes to NVRTC, which the fuzzer's header set makes fail at once (CompileFailed).
//
// Neither may crash or throw anything but qgemm::Error; list_disk_entries never throws.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"
#include "jit/cache.hpp"
#include "jit/compiler.hpp"
#include "jit/hash.hpp"
#include "jit/kernel_spec.hpp"

namespace {

namespace fs = std::filesystem;
using namespace qgemm::jit;

fs::path& work_dir() {
  static fs::path dir;
  return dir;
}

void remove_dir() {
  std::error_code error;
  fs::remove_all(work_dir(), error);
}

void clear_dir() {
  std::error_code error;
  for (const auto& item : fs::directory_iterator(work_dir(), error)) fs::remove(item.path(), error);
}

void write_file(const fs::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) qgemm::fuzz::finding("fuzzer: cannot write " + path.string());
}

template <typename T>
T read_le(std::string_view bytes, std::size_t offset) {
  T value{};
  std::memcpy(&value, bytes.data() + offset, sizeof value);
  return value;
}
template <typename T>
void write_le(std::string& bytes, std::size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof value);
}

// The shared header set: a header that does not compile, so that a rejected entry's rebuild
// fails in NVRTC at once instead of compiling a real kernel.
std::shared_ptr<const HeaderSet> broken_headers() {
  static const auto headers = [] {
    std::vector<EmbeddedHeader> list = HeaderSet::embedded()->headers;
    for (auto& header : list) header.text = "#error qgemm fuzz: no kernels here\n";
    return std::make_shared<const HeaderSet>(HeaderSet::from(std::move(list)));
  }();
  return headers;
}

// Phase 1: the bytes as an entry file.
void list_entry(std::string_view bytes) {
  Hash128 claimed;
  if (bytes.size() >= 48) claimed = {read_le<std::uint64_t>(bytes, 32), read_le<std::uint64_t>(bytes, 40)};
  clear_dir();
  write_file(work_dir() / (claimed.hex() + ".qgk"), bytes);
  const std::vector<DiskEntry> entries = list_disk_entries(work_dir());
  FUZZ_CHECK(entries.size() == 1, "one file, one entry");
  const DiskEntry& entry = entries[0];
  FUZZ_CHECK(entry.valid == entry.problem.empty(), "valid iff no problem: " + entry.problem);
  FUZZ_CHECK(entry.bytes == bytes.size(), "size");
  if (entry.valid) {
    FUZZ_CHECK(bytes.size() >= 64 && bytes.substr(0, 8) == "QGEMMJIT", "valid without the magic");
    FUZZ_CHECK(bytes.find(entry.metadata) == 64, "metadata right after the header");
  }
}

// Phase 2: the bytes as the metadata of a well-framed entry for the spec it names.
void read_entry(std::string_view metadata_text) {
  nlohmann::json metadata;
  try {
    metadata = nlohmann::json::parse(metadata_text);
  } catch (const nlohmann::json::exception&) {
    return;  // the reader would reject it; phase 1 has read it already
  }
  if (!metadata.is_object() || !metadata.contains("spec") || !metadata["spec"].is_string()) return;
  const KernelSpec spec = parse_kernel_spec(metadata["spec"].get<std::string>());  // or Error

  CacheConfig config;
  config.dir = work_dir();
  config.headers = broken_headers();
  KernelCache cache(config);
  const Hash128 key = cache.key(spec);
  const std::string payload = "\x7f" "ELF qgemm fuzz payload";
  std::string bytes(64, '\0');
  std::memcpy(bytes.data(), "QGEMMJIT", 8);
  write_le<std::uint32_t>(bytes, 8, 1);
  write_le<std::uint32_t>(bytes, 12, static_cast<std::uint32_t>(metadata_text.size()));
  write_le<std::uint64_t>(bytes, 16, payload.size());
  bytes.append(metadata_text).append(payload);
  write_le<std::uint64_t>(bytes, 24, hash64(std::string_view(bytes).substr(64)));
  write_le<std::uint64_t>(bytes, 32, key.low);
  write_le<std::uint64_t>(bytes, 40, key.high);
  clear_dir();
  write_file(work_dir() / (key.hex() + ".qgk"), bytes);

  CacheLookup lookup;
  try {
    lookup = cache.get(spec);
  } catch (const qgemm::Error& error) {
    // Rejected, then rebuilt: the broken headers fail to compile.
    FUZZ_CHECK(error.code() == qgemm::ErrorCode::CompileFailed ||
                   error.code() == qgemm::ErrorCode::InvalidArgument ||
                   error.code() == qgemm::ErrorCode::Unsupported,
               error.what());
    return;
  }
  FUZZ_CHECK(lookup.source == CacheSource::Disk, "a compile with the broken headers succeeded");
  const CompiledKernel& kernel = *lookup.kernel;
  FUZZ_CHECK(kernel.cubin == payload, "payload");
  FUZZ_CHECK(kernel.key == key, "key");
  FUZZ_CHECK(kernel.spec_text == to_string(spec), "spec");
  FUZZ_CHECK(kernel.lowered_name == metadata.at("lowered_name").get<std::string>(), "lowered_name");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("QGEMM_LOG_LEVEL", "0", 1);  // a rejected entry logs a warning per input
  setenv("QGEMM_DISABLE_DISK_CACHE", "1", 1);
  work_dir() = fs::temp_directory_path() / ("qgemm-fuzz-cache-" + std::to_string(::getpid()));
  fs::create_directories(work_dir());
  std::atexit(remove_dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  qgemm::fuzz::expect_object_or_error([&] { list_entry(bytes); });
  qgemm::fuzz::expect_object_or_error([&] { read_entry(bytes); });
  return 0;
}
