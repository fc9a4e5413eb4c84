// Checks of the Chrome trace-event format shared by the profiler tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace kiln::test {

/// Parses `text` and checks the trace-event format: a traceEvents array whose events have a
/// phase, a name, pid and tid; complete ("X") events a non-negative ts and dur; instants ("i") a
/// scope; metadata ("M") events name every process and thread that events use. Complete events
/// on one track either nest or follow each other.
inline nlohmann::json check_trace(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text);  // throws on malformed JSON
  EXPECT_TRUE(j.is_object());
  EXPECT_TRUE(j.contains("traceEvents"));
  const auto& events = j["traceEvents"];
  EXPECT_TRUE(events.is_array());
  std::map<int, std::string> processes;
  std::map<std::pair<int, int>, std::string> threads;
  std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> tracks;
  for (const auto& e : events) {
    EXPECT_TRUE(e.contains("ph") && e["ph"].is_string()) << e.dump();
    EXPECT_TRUE(e.contains("name") && e["name"].is_string()) << e.dump();
    EXPECT_TRUE(e.contains("pid") && e["pid"].is_number_integer()) << e.dump();
    EXPECT_TRUE(e.contains("tid") && e["tid"].is_number_integer()) << e.dump();
    const std::string ph = e["ph"];
    const int pid = e["pid"], tid = e["tid"];
    if (ph == "M") {
      if (e["name"] == "process_name") processes[pid] = e["args"]["name"];
      if (e["name"] == "thread_name") threads[{pid, tid}] = e["args"]["name"];
      continue;
    }
    EXPECT_TRUE(ph == "X" || ph == "i") << e.dump();
    EXPECT_TRUE(e.contains("ts") && e["ts"].is_number()) << e.dump();
    EXPECT_TRUE(e.contains("cat") && e["cat"].is_string()) << e.dump();
    const double ts = e["ts"];
    EXPECT_GE(ts, 0) << e.dump();
    if (ph == "X") {
      EXPECT_TRUE(e.contains("dur") && e["dur"].is_number()) << e.dump();
      const double dur = e["dur"];
      EXPECT_GE(dur, 0) << e.dump();
      tracks[{pid, tid}].emplace_back(ts, ts + dur);
    } else {
      EXPECT_EQ(e["s"], "t") << e.dump();
    }
  }
  for (auto& [track, spans] : tracks) {
    EXPECT_TRUE(processes.count(track.first)) << "pid " << track.first << " has no name";
    EXPECT_TRUE(threads.count(track)) << "tid " << track.second << " has no name";
    // sorted by start, longer first: each span ends inside the spans still open or after them
    std::sort(spans.begin(), spans.end(), [](auto& a, auto& b) {
      return a.first < b.first || (a.first == b.first && a.second > b.second);
    });
    std::vector<double> open;
    constexpr double kSlack = 0.002;  // the JSON's 3 decimals
    for (auto& [b, e] : spans) {
      while (!open.empty() && open.back() <= b + kSlack) open.pop_back();
      if (!open.empty())
        EXPECT_LE(e, open.back() + kSlack)
            << "span [" << b << ", " << e << "] on " << processes[track.first] << " / "
            << threads[track] << " overlaps one ending at " << open.back();
      open.push_back(e);
    }
  }
  return j;
}

/// The complete events of `j` of category `cat`.
inline std::vector<nlohmann::json> events_of(const nlohmann::json& j, const std::string& cat) {
  std::vector<nlohmann::json> r;
  for (const auto& e : j["traceEvents"])
    if (e.value("cat", "") == cat) r.push_back(e);
  return r;
}

}  // namespace kiln::test
