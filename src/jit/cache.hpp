// The kernel cache: memory first, then disk, then NVRTC.
//
//   get(spec) ─► memory map (spec identity -> slot; shared lock; a hit costs a hash + lookup)
//                 └─ miss: the first caller owns the slot, the others wait on its future
//                      ─► disk entry <dir>/<key>.qgk (read, verify checksum, key, spec)
//                           └─ absent/corrupt ─► compile ─► write temp file + rename
//
// Key = XXH3-128 of (spec text, hash of every embedded header, NVRTC version, options): content
// only, never paths or file times. Entry file:
//
//   [64-byte header: magic "QGEMMJIT", u32 version, u32 metadata bytes, u64 payload bytes,
//    u64 XXH3-64 of metadata+payload, u64 key low, u64 key high, 16 zero bytes]
//   [metadata JSON: spec, key, lowered name, nvrtc, options, resources, compile_ms]
//   [payload: the cubin]
//
// Directory: $QGEMM_CACHE_DIR, else $XDG_CACHE_HOME/qgemm, else ~/.cache/qgemm.
// QGEMM_DISABLE_DISK_CACHE=1 keeps everything in memory; so does an unwritable directory (with
// one warning).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "jit/compiler.hpp"

namespace qgemm::jit {

enum class CacheSource { Memory, Disk, Compiled };
const char* cache_source_name(CacheSource source);  // "memory" "disk" "compiled"

struct CacheLookup {
  std::shared_ptr<const CompiledKernel> kernel;
  CacheSource source = CacheSource::Compiled;
};

struct CacheConfig {
  std::filesystem::path dir;  // empty: memory only
  CompileOptions options;
  std::shared_ptr<const HeaderSet> headers;  // null: the embedded headers

  // Reads QGEMM_CACHE_DIR / XDG_CACHE_HOME / HOME and QGEMM_DISABLE_DISK_CACHE.
  static CacheConfig from_environment();
};

// The directory the environment selects (whether or not disk caching is disabled).
std::filesystem::path default_cache_dir();
bool disk_cache_disabled_by_environment();

// The cache key of a spec compiled with `headers` and `options` (see the header comment).
Hash128 cache_key(const KernelSpec& spec, const HeaderSet& headers, const CompileOptions& options);

class KernelCache {
 public:
  explicit KernelCache(CacheConfig config = CacheConfig::from_environment());
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  // Thread-safe; one compile per spec per process however many threads ask at once.
  // Throws Error(CompileFailed) (a later call retries).
  CacheLookup get(const KernelSpec& spec);
  Hash128 key(const KernelSpec& spec) const;

  const std::filesystem::path& dir() const { return config_.dir; }
  bool disk_enabled() const { return !config_.dir.empty() && !disk_failed_.load(); }
  const HeaderSet& headers() const { return *config_.headers; }

  std::uint64_t compile_count() const { return compiles_.load(); }
  std::uint64_t disk_hit_count() const { return disk_hits_.load(); }

  // The process-wide cache (configured from the environment at first use).
  static KernelCache& global();

 private:
  struct Slot;
  std::shared_ptr<const CompiledKernel> build(const KernelSpec& spec, CacheSource& source);
  std::shared_ptr<const CompiledKernel> read_disk(const KernelSpec& spec, const Hash128& key);
  void write_disk(const CompiledKernel& kernel);
  void disable_disk(const std::string& why);

  CacheConfig config_;
  mutable std::shared_mutex mutex_;
  std::unordered_map<Hash128, std::shared_ptr<Slot>, Hash128Hasher> slots_;
  std::atomic<bool> disk_failed_{false};
  std::atomic<std::uint64_t> compiles_{0}, disk_hits_{0};
};

// Entries on disk, for `qgemm cache list|info|clear`.
struct DiskEntry {
  std::filesystem::path path;
  std::uintmax_t bytes = 0;
  bool valid = false;
  std::string problem;    // why not valid
  std::string spec_text;  // from the metadata (when readable)
  std::string metadata;   // the JSON text
};
std::vector<DiskEntry> list_disk_entries(const std::filesystem::path& dir);
// Removes qgemm's entries and stray temporary files; returns how many files were removed.
std::size_t clear_disk_cache(const std::filesystem::path& dir);

}  // namespace qgemm::jit
