// The HTML report drawn by headless Chromium, `kiln profile`, and KILN_PROFILE.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "kiln/kiln.h"
#include "profiler/trace_check.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;
namespace fs = std::filesystem;

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// A fresh directory, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("kiln_profiler_" + std::to_string(std::rand()) + "_" +
            std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// Runs `cmd` through the shell; its exit status.
int shell(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return rc == -1 ? -1 : WEXITSTATUS(rc);
}

TEST(ProfilerReport, ChromiumDrawsEveryOp) {
  if (shell("command -v chromium >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "chromium is not installed (scripts/setup.sh installs it)";
  TempDir dir;
  Graph g;
  auto x = g.placeholder({64, 32}, f32, "x");
  auto w = g.variable(random_array({32, 32}, f32), "w");
  auto out = sigmoid(matmul(x, w));
  auto exe =
      g.compile(Device::cpu(), {}, {out}, CompileOptions{.optimize = false});  // one kernel per op
  Profiler::start();
  exe.run({{x, random_array({64, 32}, f32)}});
  Profile p = Profiler::stop();
  const size_t cpu_spans = p.spans.size();
  // and a device run whose stream idles between the copies around a fallback
  auto add = [&](SpanKind kind, const char* name, const char* process, double start, double dur) {
    ProfileSpan s;
    s.kind = kind;
    s.name = name;
    s.process = process;
    s.track = process == std::string("host") ? "thread 9" : "stream 1";
    s.start_us = start;
    s.dur_us = dur;
    s.run = 99;
    s.step = 0;
    s.node = 5;
    p.spans.push_back(s);
  };
  add(SpanKind::copy, "D2H", "cuda:0", 10, 5);
  add(SpanKind::fallback, "softshrink", "host", 12, 200);
  add(SpanKind::copy, "H2D", "cuda:0", 215, 5);
  ASSERT_EQ(p.idle_gaps().size(), 1u);
  const fs::path html = dir.path / "report.html", dom = dir.path / "dom.html";
  p.save(html.string());
  // a profile directory of its own: chromium hands a page to a running (or stale-locked) default
  // profile and exits with nothing dumped. Shared memory in a temporary file, not /dev/shm (small
  // in containers, where the renderer dies for lack of it). Up to three tries for a browser slow
  // to start on a busy machine; its messages are kept for the report.
  std::string text, log;
  for (int attempt = 0; attempt < 3 && text.find("id=\"timeline-svg\"") == std::string::npos;
       ++attempt) {
    const fs::path err = dir.path / ("chromium-" + std::to_string(attempt) + ".log");
    const int rc = shell("chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage "
                         "--no-first-run --disable-background-networking --user-data-dir='" +
                         (dir.path / ("chromium-profile-" + std::to_string(attempt))).string() +
                         "' --dump-dom '" + html.string() + "' > '" + dom.string() + "' 2>'" +
                         err.string() + "'");
    text = read_file(dom);
    log += "attempt " + std::to_string(attempt) + ": exit " + std::to_string(rc) + ", " +
           std::to_string(text.size()) + " bytes\n" + read_file(err).substr(0, 4000);
  }
  // a browser that drew no page at all cannot judge the report: skipped, with its messages
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    GTEST_SKIP() << "chromium dumped no page in three tries:\n" << log;
  // the script's SVG: one group per span, labelled with the op's name
  ASSERT_NE(text.find("id=\"timeline-svg\""), std::string::npos) << text.substr(0, 2000) << "\n"
                                                                 << log;
  const std::regex group("<g class=\"span-group\" data-kind=\"(\\w+)\" data-name=\"([^\"]*)\"");
  std::multiset<std::string> drawn_ops;
  size_t groups = 0;
  for (std::sregex_iterator it(text.begin(), text.end(), group), end; it != end; ++it) {
    ++groups;
    if ((*it)[1] == "op") drawn_ops.insert((*it)[2]);
  }
  EXPECT_EQ(groups, cpu_spans + 3);
  EXPECT_NE(text.find("class=\"gap\""), std::string::npos);
  EXPECT_NE(text.find("softshrink %5 on the cpu"), std::string::npos);
  std::multiset<std::string> want;
  for (auto& s : exe.placement()) want.insert(s.op);
  EXPECT_EQ(drawn_ops, want);
  EXPECT_NE(text.find(">matmul</text>"), std::string::npos);
  EXPECT_NE(text.find(">sigmoid</text>"), std::string::npos);
}

#ifdef KILN_CLI
const std::string kModel =
    std::string(KILN_TEST_DATA_DIR) + "/onnx_models/resnet_small_torchscript/model.onnx";

#define REQUIRE_CLI() \
  if (!fs::exists(KILN_CLI)) GTEST_SKIP() << KILN_CLI << " is not there (a copied test binary)"

TEST(ProfilerReport, ProfileCommandWritesTraceAndReport) {
  REQUIRE_CLI();
  TempDir dir;
  const fs::path trace = dir.path / "t.json", html = dir.path / "t.html", log = dir.path / "log";
  ASSERT_EQ(
      shell(std::string(KILN_CLI) + " profile '" + kModel + "' --device cpu --runs 2 --trace '" +
            trace.string() + "' --html '" + html.string() + "' > '" + log.string() + "' 2>&1"),
      0)
      << read_file(log);
  const std::string out = read_file(log);
  for (const char* part :
       {"top ops by total time", "conv (cpu)", "cpu fallbacks:", "GPU idle gaps"})
    EXPECT_NE(out.find(part), std::string::npos) << part << "\n" << out;
  auto j = check_trace(read_file(trace));
  std::set<int64_t> runs;
  for (auto& e : events_of(j, "op")) runs.insert(e["args"]["run"].get<int64_t>());
  EXPECT_EQ(runs, (std::set<int64_t>{0, 1}));  // the warmup run is dropped
  EXPECT_FALSE(events_of(j, "compile").empty());
  EXPECT_EQ(read_file(html).rfind("<!doctype html>", 0), 0u);
  // bad options are errors naming the option
  EXPECT_NE(shell(std::string(KILN_CLI) + " profile '" + kModel +
                  "' --device cpu --cpu-op nope > '" + log.string() + "' 2>&1"),
            0);
  EXPECT_NE(read_file(log).find("--cpu-op: no op named 'nope'"), std::string::npos)
      << read_file(log);
}

TEST(ProfilerReport, EnvironmentVariableProfilesTheProcess) {
  REQUIRE_CLI();
  TempDir dir;
  const fs::path trace = dir.path / "env.json", log = dir.path / "log";
  ASSERT_EQ(
      shell("KILN_PROFILE='" + trace.string() + "' " + std::string(KILN_CLI) + " run '" + kModel +
            "' --device cpu -o '" + dir.path.string() + "' > '" + log.string() + "' 2>&1"),
      0)
      << read_file(log);
  EXPECT_NE(read_file(log).find("[profile] wrote"), std::string::npos) << read_file(log);
  auto j = check_trace(read_file(trace));
  EXPECT_FALSE(events_of(j, "op").empty());
  EXPECT_FALSE(events_of(j, "compile").empty());
}
#endif

}  // namespace
}  // namespace kiln
