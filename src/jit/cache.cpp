#include "jit/cache.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <utility>

#include "common/log.hpp"
#include "qgemm/error.hpp"

namespace qgemm::jit {
namespace {

constexpr char kMagic[8] = {'Q', 'G', 'E', 'M', 'M', 'J', 'I', 'T'};
constexpr std::uint32_t kEntryVersion = 1;
constexpr std::size_t kHeaderBytes = 64;
constexpr const char* kEntrySuffix = ".qgk";
constexpr const char* kTempPrefix = ".tmp-";

template <typename T>
void put(std::string& out, std::size_t offset, T value) {
  std::memcpy(out.data() + offset, &value, sizeof value);
}
template <typename T>
T get(std::string_view in, std::size_t offset) {
  T value;
  std::memcpy(&value, in.data() + offset, sizeof value);
  return value;
}

std::string serialize_entry(const CompiledKernel& kernel, const std::vector<std::string>& options) {
  nlohmann::json metadata = {
      {"spec", kernel.spec_text},
      {"key", kernel.key.hex()},
      {"lowered_name", kernel.lowered_name},
      {"nvrtc", nvrtc_version_text()},
      {"options", options},
      {"compile_ms", kernel.compile_ms},
      {"resources",
       {{"registers", kernel.resources.registers},
        {"spill_store_bytes", kernel.resources.spill_store_bytes},
        {"spill_load_bytes", kernel.resources.spill_load_bytes},
        {"stack_frame_bytes", kernel.resources.stack_frame_bytes},
        {"static_smem_bytes", kernel.resources.static_smem_bytes},
        {"wgmma_serializations", kernel.resources.wgmma_serializations}}},
  };
  const std::string metadata_text = metadata.dump();
  std::string out(kHeaderBytes, '\0');
  out += metadata_text;
  out += kernel.cubin;
  std::memcpy(out.data(), kMagic, sizeof kMagic);
  put<std::uint32_t>(out, 8, kEntryVersion);
  put<std::uint32_t>(out, 12, static_cast<std::uint32_t>(metadata_text.size()));
  put<std::uint64_t>(out, 16, kernel.cubin.size());
  put<std::uint64_t>(out, 24, hash64(std::string_view(out).substr(kHeaderBytes)));
  put<std::uint64_t>(out, 32, kernel.key.low);
  put<std::uint64_t>(out, 40, kernel.key.high);
  return out;
}

// Checks an entry's framing and checksum; on success fills key, metadata and payload views.
bool check_entry(std::string_view bytes, Hash128& key, std::string_view& metadata,
                 std::string_view& payload, std::string& problem) {
  if (bytes.size() < kHeaderBytes) {
    problem = fmt::format("{} bytes, shorter than the {}-byte header", bytes.size(), kHeaderBytes);
    return false;
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
    problem = "bad magic";
    return false;
  }
  const auto version = get<std::uint32_t>(bytes, 8);
  if (version != kEntryVersion) {
    problem = fmt::format("entry version {}, expected {}", version, kEntryVersion);
    return false;
  }
  const auto metadata_bytes = get<std::uint32_t>(bytes, 12);
  const auto payload_bytes = get<std::uint64_t>(bytes, 16);
  if (kHeaderBytes + metadata_bytes + payload_bytes != bytes.size()) {
    problem = fmt::format("size {} != header + metadata {} + payload {} (truncated?)", bytes.size(),
                          metadata_bytes, payload_bytes);
    return false;
  }
  const auto checksum = get<std::uint64_t>(bytes, 24);
  if (hash64(bytes.substr(kHeaderBytes)) != checksum) {
    problem = "checksum mismatch";
    return false;
  }
  key = Hash128{get<std::uint64_t>(bytes, 32), get<std::uint64_t>(bytes, 40)};
  metadata = bytes.substr(kHeaderBytes, metadata_bytes);
  payload = bytes.substr(kHeaderBytes + metadata_bytes);
  return true;
}

bool read_file(const std::filesystem::path& path, std::string& bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream buffer;
  buffer << in.rdbuf();
  bytes = std::move(buffer).str();
  return true;
}

// A count of the metadata (registers, bytes): an integer that fits an int, else nullopt. (json's
// get<int>() of 1e300 is undefined behaviour; the writer stores integers only.)
std::optional<int> metadata_int(const nlohmann::json& value) {
  if (!value.is_number_integer()) return std::nullopt;
  const auto wide = value.get<std::int64_t>();
  if (wide < std::numeric_limits<int>::min() || wide > std::numeric_limits<int>::max())
    return std::nullopt;
  return static_cast<int>(wide);
}

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

}  // namespace

const char* cache_source_name(CacheSource source) {
  switch (source) {
    case CacheSource::Memory: return "memory";
    case CacheSource::Disk: return "disk";
    case CacheSource::Compiled: return "compiled";
  }
  return "?";
}

std::filesystem::path default_cache_dir() {
  if (const std::string dir = env("QGEMM_CACHE_DIR"); !dir.empty()) return dir;
  if (const std::string xdg = env("XDG_CACHE_HOME"); !xdg.empty()) {
    return std::filesystem::path(xdg) / "qgemm";
  }
  if (const std::string home = env("HOME"); !home.empty()) {
    return std::filesystem::path(home) / ".cache" / "qgemm";
  }
  return {};
}

bool disk_cache_disabled_by_environment() {
  const std::string value = env("QGEMM_DISABLE_DISK_CACHE");
  return !value.empty() && value != "0";
}

CacheConfig CacheConfig::from_environment() {
  CacheConfig config;
  if (!disk_cache_disabled_by_environment()) config.dir = default_cache_dir();
  return config;
}

Hash128 cache_key(const KernelSpec& spec, const HeaderSet& headers, const CompileOptions& options) {
  Hasher128 hasher;
  hasher.add("qgemm-jit-key-v1").add(to_string(spec)).add(headers.hash.hex());
  hasher.add(nvrtc_version_text()).add(arch_name(spec.arch));
  for (const auto& option : compile_options(spec, options)) hasher.add(option);
  return hasher.finish();
}

// One per spec identity: the first caller builds, the others wait on the same future.
struct KernelCache::Slot {
  std::shared_future<std::shared_ptr<const CompiledKernel>> result;
};

KernelCache::KernelCache(CacheConfig config) : config_(std::move(config)) {
  if (!config_.headers) config_.headers = HeaderSet::embedded();
}

KernelCache& KernelCache::global() {
  static KernelCache cache;
  return cache;
}

Hash128 KernelCache::key(const KernelSpec& spec) const {
  return cache_key(spec, *config_.headers, config_.options);
}

CacheLookup KernelCache::get(const KernelSpec& spec) {
  // Within one cache the headers and options are fixed, so the spec's identity alone selects
  // the slot; the full content key is needed only on the way to disk.
  const Hash128 identity = spec_hash(spec);
  {
    std::shared_lock lock(mutex_);
    const auto found = slots_.find(identity);
    if (found != slots_.end()) {
      const auto& result = found->second->result;
      lock.unlock();
      return CacheLookup{result.get(), CacheSource::Memory};
    }
  }
  std::promise<std::shared_ptr<const CompiledKernel>> promise;
  std::shared_ptr<Slot> slot;
  {
    std::unique_lock lock(mutex_);
    auto& entry = slots_[identity];
    if (entry) {
      slot = entry;
    } else {
      entry = std::make_shared<Slot>();
      entry->result = promise.get_future().share();
    }
  }
  if (slot) return CacheLookup{slot->result.get(), CacheSource::Memory};

  CacheSource source = CacheSource::Compiled;
  try {
    auto kernel = build(spec, source);
    promise.set_value(kernel);
    return CacheLookup{std::move(kernel), source};
  } catch (...) {
    promise.set_exception(std::current_exception());
    std::unique_lock lock(mutex_);
    slots_.erase(identity);  // a later call retries
    throw;
  }
}

std::shared_ptr<const CompiledKernel> KernelCache::build(const KernelSpec& spec,
                                                         CacheSource& source) {
  validate(spec);
  const Hash128 content_key = key(spec);
  if (disk_enabled()) {
    if (auto kernel = read_disk(spec, content_key)) {
      ++disk_hits_;
      source = CacheSource::Disk;
      return kernel;
    }
  }
  auto kernel =
      std::make_shared<CompiledKernel>(compile_kernel(spec, *config_.headers, config_.options));
  kernel->key = content_key;
  ++compiles_;
  source = CacheSource::Compiled;
  if (disk_enabled()) write_disk(*kernel);
  return kernel;
}

std::shared_ptr<const CompiledKernel> KernelCache::read_disk(const KernelSpec& spec,
                                                             const Hash128& key) {
  const auto path = config_.dir / (key.hex() + kEntrySuffix);
  std::string bytes;
  if (!read_file(path, bytes)) return nullptr;  // absent: an ordinary miss
  const std::string spec_text = to_string(spec);
  Hash128 stored_key;
  std::string_view metadata_text, payload;
  std::string problem;
  if (check_entry(bytes, stored_key, metadata_text, payload, problem)) {
    if (!(stored_key == key)) problem = "the header's key is not the file's";
  }
  auto kernel = std::make_shared<CompiledKernel>();
  if (problem.empty()) {
    try {
      const auto metadata = nlohmann::json::parse(metadata_text);
      if (metadata.at("spec").get<std::string>() != spec_text) {
        problem = fmt::format("entry holds {}", metadata.at("spec").get<std::string>());
      } else {
        kernel->lowered_name = metadata.at("lowered_name").get<std::string>();
        kernel->compile_ms = metadata.at("compile_ms").get<double>();
        const auto& resources = metadata.at("resources");
        ResourceUsage& usage = kernel->resources;
        for (const auto& [name, field] : {std::pair{"registers", &usage.registers},
                                          std::pair{"spill_store_bytes", &usage.spill_store_bytes},
                                          std::pair{"spill_load_bytes", &usage.spill_load_bytes},
                                          std::pair{"stack_frame_bytes", &usage.stack_frame_bytes},
                                          std::pair{"static_smem_bytes", &usage.static_smem_bytes}}) {
          const std::optional<int> value = metadata_int(resources.at(name));
          if (!value) {
            problem = fmt::format("metadata: resources.{} is {}, not an int", name,
                                  resources.at(name).dump());
            break;
          }
          *field = *value;
        }
        // Entries written before the field existed have none: 0.
        if (problem.empty() && resources.contains("wgmma_serializations")) {
          const std::optional<int> value = metadata_int(resources.at("wgmma_serializations"));
          if (value)
            usage.wgmma_serializations = *value;
          else
            problem = fmt::format("metadata: resources.wgmma_serializations is {}, not an int",
                                  resources.at("wgmma_serializations").dump());
        }
      }
    } catch (const nlohmann::json::exception& error) {
      problem = fmt::format("metadata: {}", error.what());
    }
  }
  if (!problem.empty()) {
    log(LogLevel::Warning, "kernel cache: entry {} for {} is corrupt ({}); rebuilding it",
        path.string(), spec_text, problem);
    return nullptr;
  }
  kernel->spec = spec;
  kernel->spec_text = spec_text;
  kernel->cubin = std::string(payload);
  kernel->key = key;
  return kernel;
}

void KernelCache::write_disk(const CompiledKernel& kernel) {
  std::error_code error;
  std::filesystem::create_directories(config_.dir, error);
  if (error)
    return disable_disk(fmt::format("cannot create {}: {}", config_.dir.string(), error.message()));
  // A name no other thread or process uses; rename() then replaces atomically, so a reader
  // sees either no entry or a whole one, and two writers of the same key both succeed.
  static std::atomic<std::uint64_t> counter{0};
  const auto temp = config_.dir / fmt::format("{}{}-{}-{}-{}", kTempPrefix, kernel.key.hex(),
                                              ::getpid(), std::random_device{}(), ++counter);
  const std::string bytes = serialize_entry(kernel, compile_options(kernel.spec, config_.options));
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      std::filesystem::remove(temp, error);
      return disable_disk(fmt::format("cannot write {}", temp.string()));
    }
  }
  std::filesystem::rename(temp, config_.dir / (kernel.key.hex() + kEntrySuffix), error);
  if (error) {
    std::filesystem::remove(temp, error);
    disable_disk(fmt::format("cannot rename into {}: {}", config_.dir.string(), error.message()));
  }
}

void KernelCache::disable_disk(const std::string& why) {
  if (!disk_failed_.exchange(true)) {
    log(LogLevel::Warning, "kernel cache: {}; caching in memory only from now on", why);
  }
}

std::vector<DiskEntry> list_disk_entries(const std::filesystem::path& dir) {
  std::vector<DiskEntry> entries;
  std::error_code error;
  if (!std::filesystem::is_directory(dir, error)) return entries;
  for (const auto& item : std::filesystem::directory_iterator(dir, error)) {
    if (!item.is_regular_file() || item.path().extension() != kEntrySuffix) continue;
    DiskEntry entry;
    entry.path = item.path();
    entry.bytes = item.file_size(error);
    std::string bytes;
    Hash128 key;
    std::string_view metadata, payload;
    if (!read_file(entry.path, bytes)) {
      entry.problem = "unreadable";
    } else if (check_entry(bytes, key, metadata, payload, entry.problem)) {
      if (key.hex() != entry.path.stem().string()) {
        entry.problem = "the header's key is not the file's";
      } else {
        entry.metadata = std::string(metadata);
        try {
          entry.spec_text = nlohmann::json::parse(metadata).at("spec").get<std::string>();
          entry.valid = true;
        } catch (const nlohmann::json::exception& json_error) {
          entry.problem = json_error.what();
        }
      }
    }
    entries.push_back(std::move(entry));
  }
  std::sort(entries.begin(), entries.end(),
            [](const DiskEntry& a, const DiskEntry& b) { return a.spec_text < b.spec_text; });
  return entries;
}

std::size_t clear_disk_cache(const std::filesystem::path& dir) {
  std::size_t removed = 0;
  std::error_code error;
  if (!std::filesystem::is_directory(dir, error)) return 0;
  std::vector<std::filesystem::path> doomed;
  for (const auto& item : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = item.path().filename().string();
    if (item.path().extension() == kEntrySuffix || name.rfind(kTempPrefix, 0) == 0) {
      doomed.push_back(item.path());
    }
  }
  for (const auto& path : doomed) removed += std::filesystem::remove(path, error) ? 1 : 0;
  return removed;
}

}  // namespace qgemm::jit
