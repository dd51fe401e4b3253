// NVRTC compiles and the kernel cache: catalog compiles, memory/disk hits, key sensitivity,
// corruption recovery, concurrency (8 threads, 2 processes), unwritable directories, errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <barrier>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "scoped_env.hpp"
#include "jit/cache.hpp"
#include "jit/catalog.hpp"
#include "jit/compiler.hpp"
#include "jit/hash.hpp"
#include "jit/prewarm.hpp"
#include "qgemm/error.hpp"

namespace qgemm::jit {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::random_device random;
    path_ = fs::temp_directory_path() /
            ("qgemm-jit-test-" + std::to_string(::getpid()) + "-" + std::to_string(random()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code error;
    fs::remove_all(path_, error);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

CacheConfig disk_config(const fs::path& dir) {
  CacheConfig config;
  config.dir = dir;
  return config;
}
CacheConfig memory_config() { return CacheConfig{}; }

std::vector<fs::path> entry_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& item : fs::directory_iterator(dir)) {
    if (item.path().extension() == ".qgk") files.push_back(item.path());
  }
  return files;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void expect_plausible_cubin(const CompiledKernel& kernel) {
  ASSERT_GT(kernel.cubin.size(), 1000u) << kernel.spec_text;
  EXPECT_EQ(kernel.cubin.substr(0, 4), std::string("\x7f"
                                                   "ELF"))
      << kernel.spec_text;
  EXPECT_EQ(kernel.lowered_name.rfind("_Z", 0), 0u) << kernel.lowered_name;
  EXPECT_GT(kernel.resources.registers, 0) << kernel.spec_text;
  EXPECT_LE(kernel.resources.registers, 255) << kernel.spec_text;
  EXPECT_EQ(kernel.resources.spill_bytes(), 0) << kernel.spec_text;
}

KernelSpec small_spec(Arch arch = Arch::sm_80) { return repack_weight_spec(4, arch); }

// The whole catalog for sm_90a (on 2 threads), one spec per family for sm_80.
TEST(JitCompile, CatalogCompilesForSm90a) {
  KernelCache cache(memory_config());
  const auto specs = catalog_specs(Arch::sm_90a);
  const auto results = prewarm(cache, specs, 2);
  ASSERT_EQ(results.size(), specs.size());
  for (const auto& result : results) {
    ASSERT_TRUE(result.lookup.kernel) << to_string(result.spec) << ": " << result.error;
    EXPECT_EQ(result.lookup.source, CacheSource::Compiled);
    expect_plausible_cubin(*result.lookup.kernel);
  }
  EXPECT_EQ(cache.compile_count(), specs.size());
}

TEST(JitCompile, OneSpecPerFamilyCompilesForSm80) {
  KernelCache cache(memory_config());
  std::set<std::string> families;
  std::vector<KernelSpec> specs;
  for (const auto& spec : catalog_specs(Arch::sm_80)) {
    if (families.insert(spec.family).second) specs.push_back(spec);
  }
  for (const char* utility : {"dequantize_weight", "quantize_activation", "repack_weight"}) {
    EXPECT_EQ(families.count(utility), 1u) << utility;
  }
  for (const auto& result : prewarm(cache, specs, 2)) {
    ASSERT_TRUE(result.lookup.kernel) << result.error;
    expect_plausible_cubin(*result.lookup.kernel);
  }
}

TEST(JitCompile, AFailedCompileCarriesTheSpecAndTheLog) {
  std::vector<EmbeddedHeader> headers = HeaderSet::embedded()->headers;
  for (auto& header : headers) {
    if (header.path == "util/repack.cuh") header.text += "\nthis_is_not_cxx;\n";
  }
  const HeaderSet broken = HeaderSet::from(headers);
  const KernelSpec spec = small_spec();
  try {
    compile_kernel(spec, broken, CompileOptions{});
    FAIL() << "the broken header compiled";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::CompileFailed);
    const std::string message = error.what();
    EXPECT_NE(message.find(to_string(spec)), std::string::npos) << message;
    EXPECT_NE(message.find("this_is_not_cxx"), std::string::npos) << message;  // NVRTC's log
  }
  // Through a cache: the error propagates, nothing is cached, a retry compiles again.
  CacheConfig config = memory_config();
  config.headers = std::make_shared<const HeaderSet>(broken);
  KernelCache cache(config);
  EXPECT_THROW(cache.get(spec), Error);
  EXPECT_THROW(cache.get(spec), Error);
  EXPECT_EQ(cache.compile_count(), 0u);
}

TEST(JitCache, MissThenMemoryHitThenDiskHitInAFreshCache) {
  TempDir dir;
  const KernelSpec spec = small_spec();
  KernelCache first(disk_config(dir.path()));
  const CacheLookup miss = first.get(spec);
  EXPECT_EQ(miss.source, CacheSource::Compiled);
  const CacheLookup memory_hit = first.get(spec);
  EXPECT_EQ(memory_hit.source, CacheSource::Memory);
  EXPECT_EQ(memory_hit.kernel.get(), miss.kernel.get());
  EXPECT_EQ(first.compile_count(), 1u);
  ASSERT_EQ(entry_files(dir.path()).size(), 1u);
  EXPECT_EQ(entry_files(dir.path())[0].filename().string(), first.key(spec).hex() + ".qgk");

  KernelCache second(disk_config(dir.path()));
  const CacheLookup disk_hit = second.get(spec);
  EXPECT_EQ(disk_hit.source, CacheSource::Disk);
  EXPECT_EQ(second.compile_count(), 0u);
  EXPECT_EQ(disk_hit.kernel->cubin, miss.kernel->cubin);
  EXPECT_EQ(disk_hit.kernel->lowered_name, miss.kernel->lowered_name);
  EXPECT_EQ(disk_hit.kernel->resources.registers, miss.kernel->resources.registers);
  EXPECT_EQ(disk_hit.kernel->spec, spec);
  EXPECT_EQ(second.get(spec).source, CacheSource::Memory);

  const auto listed = list_disk_entries(dir.path());
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_TRUE(listed[0].valid) << listed[0].problem;
  EXPECT_EQ(listed[0].spec_text, to_string(spec));
  EXPECT_EQ(clear_disk_cache(dir.path()), 1u);
  EXPECT_TRUE(entry_files(dir.path()).empty());
}

TEST(JitCache, KeyIsContentOnlyAndChangesWithHeadersOptionsAndArch) {
  const KernelSpec spec = small_spec();
  TempDir dir_a, dir_b;
  // Same content, different directories and objects: the same key (no paths in the key).
  EXPECT_EQ(KernelCache(disk_config(dir_a.path())).key(spec),
            KernelCache(disk_config(dir_b.path())).key(spec));
  const Hash128 base = cache_key(spec, *HeaderSet::embedded(), CompileOptions{});

  for (const std::string& changed_path :
       {std::string("util/repack.cuh"), std::string("util/number_codec.cuh")}) {
    std::vector<EmbeddedHeader> headers = HeaderSet::embedded()->headers;
    bool found = false;
    for (auto& header : headers) {
      if (header.path == changed_path) {
        header.text += "\n// one more comment\n";
        found = true;
      }
    }
    ASSERT_TRUE(found) << changed_path;
    EXPECT_FALSE(cache_key(spec, HeaderSet::from(headers), CompileOptions{}) == base)
        << changed_path;
  }
  CompileOptions line_info;
  line_info.line_info = true;
  EXPECT_FALSE(cache_key(spec, *HeaderSet::embedded(), line_info) == base);
  EXPECT_FALSE(cache_key(small_spec(Arch::sm_86), *HeaderSet::embedded(), CompileOptions{}) ==
               base);
  EXPECT_FALSE(cache_key(repack_weight_spec(3, Arch::sm_80), *HeaderSet::embedded(),
                         CompileOptions{}) == base);
}

// Damages the one entry in `dir`, then checks that a fresh cache detects it, logs it, rebuilds
// it, and leaves a valid entry behind.
void expect_recovery(const fs::path& dir, const KernelSpec& spec,
                     const std::function<void(std::string&)>& damage) {
  const auto files = entry_files(dir);
  ASSERT_EQ(files.size(), 1u);
  std::string bytes = read_bytes(files[0]);
  const std::string original = bytes;
  damage(bytes);
  ASSERT_TRUE(bytes != original);
  write_bytes(files[0], bytes);

  KernelCache fresh(disk_config(dir));
  testing::internal::CaptureStderr();
  const CacheLookup lookup = fresh.get(spec);
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(lookup.source, CacheSource::Compiled);
  EXPECT_EQ(fresh.compile_count(), 1u);
  EXPECT_NE(log.find("corrupt"), std::string::npos) << log;
  EXPECT_NE(log.find(files[0].string()), std::string::npos) << log;
  const auto listed = list_disk_entries(dir);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_TRUE(listed[0].valid) << listed[0].problem;
  // The rebuilt entry serves the next fresh cache, with the cubin of the first compile (NVRTC
  // is deterministic).
  KernelCache next(disk_config(dir));
  const CacheLookup reread = next.get(spec);
  EXPECT_EQ(reread.source, CacheSource::Disk);
  EXPECT_TRUE(reread.kernel->cubin == lookup.kernel->cubin);
  EXPECT_TRUE(original.find(lookup.kernel->cubin) != std::string::npos);
}

TEST(JitCache, CorruptedEntriesAreDetectedLoggedAndRebuilt) {
  TempDir dir;
  const KernelSpec spec = small_spec();
  KernelCache(disk_config(dir.path())).get(spec);
  std::mt19937_64 random(std::random_device{}());
  expect_recovery(dir.path(), spec, [](std::string& bytes) { bytes.resize(bytes.size() / 2); });
  expect_recovery(dir.path(), spec, [&](std::string& bytes) {
    // A flipped bit somewhere in the cubin payload (past header and metadata).
    const std::size_t at = bytes.size() - 1 - random() % 1000;
    bytes[at] = static_cast<char>(bytes[at] ^ (1 << (random() % 8)));
  });
  expect_recovery(dir.path(), spec, [](std::string& bytes) { bytes[0] = 'X'; });    // magic
  expect_recovery(dir.path(), spec, [](std::string& bytes) { bytes.resize(10); });  // no header
  expect_recovery(dir.path(), spec, [](std::string& bytes) { bytes += "trailing"; });
}

// Found with the fuzz target tests/fuzz/fuzz_jit_cache.cpp (issue #19): an entry whose metadata
// held a resource count beyond an int (1e300) was read with json's get<int>(), undefined
// behaviour (UBSan: "outside the range of representable values of type 'int'"). Such an entry
// (checksum intact) is corrupt, and is rebuilt.
TEST(JitCache, MetadataCountsThatAreNotIntsMakeTheEntryCorrupt) {
  TempDir dir;
  const KernelSpec spec = small_spec();
  KernelCache(disk_config(dir.path())).get(spec);
  for (const nlohmann::json& bad : {nlohmann::json(1e300), nlohmann::json(-1e300),
                                    nlohmann::json(std::int64_t{1} << 40), nlohmann::json(2.5),
                                    nlohmann::json("32")}) {
    SCOPED_TRACE(bad.dump());
    expect_recovery(dir.path(), spec, [&](std::string& bytes) {
      // Rewrite the metadata and the framing around it: sizes and checksum stay consistent.
      std::uint32_t metadata_bytes = 0;
      std::memcpy(&metadata_bytes, bytes.data() + 12, sizeof metadata_bytes);
      auto metadata = nlohmann::json::parse(bytes.substr(64, metadata_bytes));
      metadata["resources"]["static_smem_bytes"] = bad;
      const std::string text = metadata.dump();
      bytes = bytes.substr(0, 64) + text + bytes.substr(64 + metadata_bytes);
      const auto size = static_cast<std::uint32_t>(text.size());
      std::memcpy(bytes.data() + 12, &size, sizeof size);
      const std::uint64_t checksum = hash64(std::string_view(bytes).substr(64));
      std::memcpy(bytes.data() + 24, &checksum, sizeof checksum);
    });
  }
}

TEST(JitCache, EightThreadsAskingAtOnceCompileOnce) {
  KernelCache cache(memory_config());
  const KernelSpec spec = repack_weight_spec(2, Arch::sm_90a);
  constexpr int kThreads = 8;
  std::barrier start(kThreads);
  std::vector<const CompiledKernel*> seen(kThreads, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      seen[t] = cache.get(spec).kernel.get();
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(cache.compile_count(), 1u);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_NE(seen[t], nullptr);
    EXPECT_EQ(seen[t], seen[0]) << "thread " << t;
  }
}

TEST(JitCache, TwoProcessesCompilingTheSameSpecBothSucceed) {
  TempDir dir;
  const std::string spec_text = "repack_weight<bits=3>[threads=256,smem=0]@sm_80";
  const std::string command = "QGEMM_CACHE_DIR='" + dir.path().string() +
                              "' '" QGEMM_CLI "' compile --json --spec '" + spec_text + "' 2>&1";
  FILE* first = ::popen(command.c_str(), "r");
  FILE* second = ::popen(command.c_str(), "r");
  ASSERT_TRUE(first && second);
  const auto drain = [](FILE* pipe) {
    std::string out;
    char buffer[4096];
    while (std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) out.append(buffer, n);
    return out;
  };
  const std::string out_first = drain(first), out_second = drain(second);
  EXPECT_EQ(::pclose(first), 0) << out_first;
  EXPECT_EQ(::pclose(second), 0) << out_second;
  EXPECT_NE(out_first.find(spec_text), std::string::npos) << out_first;
  EXPECT_NE(out_second.find(spec_text), std::string::npos) << out_second;
  const auto listed = list_disk_entries(dir.path());
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_TRUE(listed[0].valid) << listed[0].problem;
  for (const auto& item : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(item.path().extension(), ".qgk") << "left behind: " << item.path();
  }
  // A third run finds it on disk.
  FILE* third = ::popen(command.c_str(), "r");
  const std::string out_third = drain(third);
  EXPECT_EQ(::pclose(third), 0);
  EXPECT_NE(out_third.find("\"hit\""), std::string::npos) << out_third;
}

TEST(JitCache, UnwritableDirectoryDegradesToMemoryWithOneWarning) {
  TempDir dir;
  // A directory below a regular file can never be created (even by root).
  const fs::path blocker = dir.path() / "a-file";
  write_bytes(blocker, "not a directory");
  KernelCache cache(disk_config(blocker / "cache"));
  testing::internal::CaptureStderr();
  const auto first = cache.get(repack_weight_spec(2, Arch::sm_80));
  const auto second = cache.get(repack_weight_spec(8, Arch::sm_80));
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(first.kernel && second.kernel);
  EXPECT_FALSE(cache.disk_enabled());
  std::size_t warnings = 0;
  for (auto at = log.find("memory only"); at != std::string::npos;
       at = log.find("memory only", at + 1)) {
    ++warnings;
  }
  EXPECT_EQ(warnings, 1u) << log;
  EXPECT_EQ(cache.get(repack_weight_spec(2, Arch::sm_80)).source, CacheSource::Memory);
}

using test::ScopedEnv;

TEST(JitCache, DirectoryComesFromTheEnvironmentInOrder) {
  ScopedEnv home("HOME", "/home/someone");
  {
    ScopedEnv cache_dir("QGEMM_CACHE_DIR", nullptr);
    ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
    EXPECT_EQ(default_cache_dir(), fs::path("/home/someone/.cache/qgemm"));
  }
  {
    ScopedEnv cache_dir("QGEMM_CACHE_DIR", nullptr);
    ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
    EXPECT_EQ(default_cache_dir(), fs::path("/xdg/qgemm"));
  }
  {
    ScopedEnv cache_dir("QGEMM_CACHE_DIR", "/explicit");
    ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
    EXPECT_EQ(default_cache_dir(), fs::path("/explicit"));
    ScopedEnv disabled("QGEMM_DISABLE_DISK_CACHE", "1");
    EXPECT_TRUE(CacheConfig::from_environment().dir.empty());
  }
}

TEST(JitCompile, DumpSourceWritesTheGeneratedUnit) {
  TempDir dir;
  ScopedEnv dump("QGEMM_DUMP_SOURCE", dir.path().c_str());
  compile_kernel(small_spec(), *HeaderSet::embedded(), CompileOptions{});
  std::vector<fs::path> dumped;
  for (const auto& item : fs::directory_iterator(dir.path())) dumped.push_back(item.path());
  ASSERT_EQ(dumped.size(), 1u);
  EXPECT_NE(read_bytes(dumped[0]).find("#include \"util/repack.cuh\""), std::string::npos);
}

}  // namespace
}  // namespace qgemm::jit
