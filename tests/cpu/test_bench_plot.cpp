// Tests of bench/plot.py on a synthetic result document (built as the CLI builds it). They need
// python3, and the drawing test matplotlib; each skips, saying so, when that is missing.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "bench/results.hpp"
#include "cpu/bench_test_support.hpp"

namespace qgemm::bench {
namespace {

const std::string kPlotScript = std::string(QGEMM_SOURCE_DIR) + "/bench/plot.py";

struct CommandResult {
  int status = -1;
  std::string output;
};

CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return result;
  std::array<char, 4096> buffer;
  while (std::fgets(buffer.data(), buffer.size(), pipe)) result.output += buffer.data();
  const int status = ::pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

bool python_has(const std::string& module) {
  return run_command("python3 -c 'import " + module + "'").status == 0;
}

std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::path(testing::TempDir()) /
                   (name + "-" + std::to_string(std::random_device{}()));
  std::filesystem::create_directories(dir);
  return dir;
}

std::filesystem::path write_synthetic_results(const std::filesystem::path& dir) {
  const Recipe recipe = load_recipe(test::kRecipeDir + "quickstart.yaml");
  const auto path = dir / "results.json";
  std::ofstream(path) << to_json_text(test::synthetic_document(recipe, 11));
  return path;
}

bool is_png(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  in.read(magic, 8);
  return in && std::string(magic + 1, 3) == "PNG" && std::filesystem::file_size(path) > 2000;
}

TEST(BenchPlot, DrawsTheSpeedupAndRooflinePngs) {
  if (!python_has("matplotlib")) GTEST_SKIP() << "python3 with matplotlib is not available";
  const auto dir = fresh_dir("qgemm_plot");
  const auto json = write_synthetic_results(dir);
  const CommandResult r = run_command("python3 '" + kPlotScript + "' '" + json.string() + "' '" +
                                      (dir / "quick.png").string() + "'");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(is_png(dir / "quick.png"));
  EXPECT_TRUE(is_png(dir / "quick_roofline.png"));
  std::filesystem::remove_all(dir);
}

TEST(BenchPlot, MissingMatplotlibExits3WithAnInstallHint) {
  if (!python_has("json")) GTEST_SKIP() << "python3 is not available";
  // A matplotlib package that fails to import stands in for a missing one.
  const auto dir = fresh_dir("qgemm_plot_nompl");
  std::filesystem::create_directories(dir / "shadow" / "matplotlib");
  std::ofstream(dir / "shadow" / "matplotlib" / "__init__.py")
      << "raise ImportError('no matplotlib here')\n";
  const auto json = write_synthetic_results(dir);
  const CommandResult r =
      run_command("PYTHONPATH='" + (dir / "shadow").string() + "' python3 '" + kPlotScript + "' '" +
                  json.string() + "' '" + (dir / "out.png").string() + "'");
  EXPECT_EQ(r.status, 3) << r.output;
  EXPECT_NE(r.output.find("matplotlib is not installed"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("pip install matplotlib"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "out.png"));
  std::filesystem::remove_all(dir);
}

TEST(BenchPlot, WrongArgumentsExit2) {
  if (!python_has("json")) GTEST_SKIP() << "python3 is not available";
  const CommandResult r = run_command("python3 '" + kPlotScript + "' only-one-argument");
  EXPECT_EQ(r.status, 2) << r.output;
}

}  // namespace
}  // namespace qgemm::bench
