// A Profile as Chrome trace-event JSON, a text summary and a self-contained HTML page.
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "core/errors.h"
#include "kiln/profiler.h"

namespace kiln {

namespace {
std::string json_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size() + 2);
  for (char c : s) {
    switch (c) {
      case '"':
        o += "\\\"";
        break;
      case '\\':
        o += "\\\\";
        break;
      case '\n':
        o += "\\n";
        break;
      case '\t':
        o += "\\t";
        break;
      case '\r':
        o += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          o += fmt::format("\\u{:04x}", c);
        else
          o += c;
    }
  }
  return o;
}

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '&':
        o += "&amp;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

bool is_device_process(const std::string& p) { return p != "host" && p != "cpu"; }

std::string bytes_str(double b) {
  if (b >= 1 << 30) return fmt::format("{:.2f} GiB", b / (1 << 30));
  if (b >= 1 << 20) return fmt::format("{:.2f} MiB", b / (1 << 20));
  if (b >= 1 << 10) return fmt::format("{:.1f} KiB", b / (1 << 10));
  return fmt::format("{} B", static_cast<int64_t>(b));
}

// Process ids: the host first, then devices in order of appearance; track ids within each.
struct Ids {
  std::map<std::string, int> pid;
  std::map<std::pair<std::string, std::string>, int> tid;
  std::vector<std::string> process_order;
  explicit Ids(const std::vector<ProfileSpan>& spans) {
    pid["host"] = 1;
    process_order.push_back("host");
    for (auto& s : spans) {
      if (!pid.count(s.process)) {
        pid[s.process] = static_cast<int>(pid.size()) + 1;
        process_order.push_back(s.process);
      }
      auto key = std::make_pair(s.process, s.track);
      if (!tid.count(key)) {
        int n = 1;
        for (auto& [k, v] : tid) n += k.first == s.process;
        tid[key] = n;
      }
    }
  }
};
}  // namespace

std::string Profile::chrome_trace() const {
  Ids ids(spans);
  std::string o =
      "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"generator\":\"kiln\"},\"traceEvents\":[\n";
  bool first = true;
  auto sep = [&] {
    if (!first) o += ",\n";
    first = false;
  };
  for (size_t i = 0; i < ids.process_order.size(); ++i) {
    const std::string& p = ids.process_order[i];
    sep();
    o +=
        fmt::format(R"({{"ph":"M","name":"process_name","pid":{},"tid":0,"args":{{"name":"{}"}}}})",
                    ids.pid[p], json_escape(p));
    sep();
    o += fmt::format(
        R"({{"ph":"M","name":"process_sort_index","pid":{},"tid":0,"args":{{"sort_index":{}}}}})",
        ids.pid[p], i);
  }
  for (auto& [key, t] : ids.tid) {
    sep();
    o +=
        fmt::format(R"({{"ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":"{}"}}}})",
                    ids.pid[key.first], t, json_escape(key.second));
  }
  for (auto& s : spans) {
    sep();
    const bool instant = s.kind == SpanKind::alloc || s.kind == SpanKind::signal;
    std::string args;
    if (s.run >= 0) args += fmt::format(R"("run":{},)", s.run);
    if (s.step >= 0) args += fmt::format(R"("step":{},)", s.step);
    if (s.node >= 0) args += fmt::format(R"("node":{},)", s.node);
    if (s.bytes) args += fmt::format(R"("bytes":{},)", s.bytes);
    if (!s.detail.empty()) args += fmt::format(R"("detail":"{}",)", json_escape(s.detail));
    if (!args.empty()) args.pop_back();
    const int pid = ids.pid[s.process], tid = ids.tid[{s.process, s.track}];
    if (instant)
      o += fmt::format(
          R"({{"ph":"i","s":"t","name":"{}","cat":"{}","pid":{},"tid":{},"ts":{:.3f},"args":{{{}}}}})",
          json_escape(s.name), span_kind_name(s.kind), pid, tid, s.start_us, args);
    else
      o += fmt::format(
          R"({{"ph":"X","name":"{}","cat":"{}","pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f},"args":{{{}}}}})",
          json_escape(s.name), span_kind_name(s.kind), pid, tid, s.start_us, s.dur_us, args);
  }
  o += "\n]}\n";
  return o;
}

std::vector<IdleGap> Profile::idle_gaps(double gap_us) const {
  // device spans and fallbacks by run
  std::map<std::tuple<std::string, std::string, int64_t>, std::vector<const ProfileSpan*>> tracks;
  std::map<int64_t, std::vector<const ProfileSpan*>> fallbacks;
  std::map<std::pair<int64_t, int32_t>, const ProfileSpan*> ops;  // device ops by (run, step)
  for (auto& s : spans) {
    if (s.run < 0) continue;
    if (s.kind == SpanKind::fallback) fallbacks[s.run].push_back(&s);
    if ((s.kind == SpanKind::op || s.kind == SpanKind::copy) && is_device_process(s.process))
      tracks[{s.process, s.track, s.run}].push_back(&s);
  }
  std::vector<IdleGap> gaps;
  for (auto& [key, list] : tracks) {
    std::stable_sort(list.begin(), list.end(),
                     [](auto* a, auto* b) { return a->start_us < b->start_us; });
    double end = list[0]->start_us + list[0]->dur_us;
    int32_t prev_step = list[0]->step;
    for (size_t i = 1; i < list.size(); ++i) {
      const ProfileSpan& s = *list[i];
      if (s.start_us - end >= gap_us) {
        IdleGap g{std::get<0>(key), std::get<1>(key), end, s.start_us - end, std::get<2>(key), {}};
        // a gap that ends at a fallback's own download is the host's latency before the
        // fallback started, not time the device waited for the fallback's result
        const bool before_download =
            s.kind == SpanKind::copy && s.detail == "D2H" && s.step > prev_step;
        for (auto* f : fallbacks[g.run])
          if (f->step >= prev_step && f->step <= s.step && !(before_download && f->step == s.step)) {
            g.cause = fmt::format("{} %{} on the cpu ({})", f->name, f->node, f->detail);
            break;
          }
        if (g.cause.empty())
          g.cause = fmt::format("waiting for the host to enqueue {} %{}", s.name, s.node);
        gaps.push_back(std::move(g));
      }
      end = std::max(end, s.start_us + s.dur_us);
      prev_step = s.step;
    }
  }
  std::sort(gaps.begin(), gaps.end(),
            [](const IdleGap& a, const IdleGap& b) { return a.dur_us > b.dur_us; });
  return gaps;
}

std::string Profile::summary(double gap_us) const {
  std::set<int64_t> runs;
  double first = 0, last = 0;
  bool any = false;
  struct OpRow {
    double us = 0;
    int64_t calls = 0;
    std::string where;
  };
  std::map<std::string, OpRow> ops;
  struct CopyRow {
    int64_t count = 0, bytes = 0;
    double us = 0;
  };
  std::map<std::string, CopyRow> copies;
  struct FallbackRow {
    std::string op, reason;
    int32_t node;
    int64_t count = 0;
    double us = 0;
  };
  std::map<std::pair<int32_t, std::string>, FallbackRow> fallbacks;
  double compile_us = 0, search_us = 0;
  int64_t allocs = 0, alloc_bytes = 0;
  for (auto& s : spans) {
    if (s.run >= 0) runs.insert(s.run);
    first = any ? std::min(first, s.start_us) : s.start_us;
    last = any ? std::max(last, s.start_us + s.dur_us) : s.start_us + s.dur_us;
    any = true;
    switch (s.kind) {
      case SpanKind::op: {
        auto& r = ops[s.name];
        r.us += s.dur_us;
        ++r.calls;
        r.where = s.process;
        break;
      }
      case SpanKind::copy: {
        auto& r = copies[s.detail];
        ++r.count;
        r.bytes += s.bytes;
        r.us += s.dur_us;
        break;
      }
      case SpanKind::fallback: {
        auto& op = ops[s.name + " [cpu fallback]"];
        op.us += s.dur_us;
        ++op.calls;
        op.where = "host";
        auto& r = fallbacks[{s.node, s.name}];
        r.op = s.name;
        r.reason = s.detail;
        r.node = s.node;
        ++r.count;
        r.us += s.dur_us;
        break;
      }
      case SpanKind::compile:
        if (s.name.rfind("compile", 0) == 0) compile_us += s.dur_us;
        if (s.name == "algorithm search") search_us += s.dur_us;
        break;
      case SpanKind::alloc:
        ++allocs;
        alloc_bytes += s.bytes;
        break;
      default:
        break;
    }
  }
  std::string o = fmt::format("kiln profile: {} runs, {:.3f} ms from first to last span",
                              runs.size(), (last - first) / 1000.0);
  if (compile_us > 0) o += fmt::format(", {:.3f} ms compiling", compile_us / 1000.0);
  if (search_us > 0) o += fmt::format(", {:.3f} ms searching algorithms", search_us / 1000.0);
  o += "\n\ntop ops by total time (device time on a GPU, host time on the CPU and of fallbacks):\n";
  std::vector<std::pair<double, std::string>> rows;
  for (auto& [name, r] : ops) rows.emplace_back(r.us, name);
  std::sort(rows.rbegin(), rows.rend());
  o += fmt::format("  {:>12} {:>8} {:>10}  {}\n", "total ms", "calls", "mean us", "op");
  for (size_t i = 0; i < rows.size() && i < 20; ++i) {
    const auto& r = ops[rows[i].second];
    o += fmt::format("  {:>12.3f} {:>8} {:>10.2f}  {} ({})\n", r.us / 1000.0, r.calls,
                     r.us / static_cast<double>(r.calls), rows[i].second, r.where);
  }
  if (rows.size() > 20) o += fmt::format("  ... {} more ops\n", rows.size() - 20);
  o += "\ncopies between host and device:\n";
  if (copies.empty()) o += "  none\n";
  for (auto& [dir, r] : copies)
    o += fmt::format("  {:<4} {:>6} copies {:>12} {:>10.3f} ms\n", dir, r.count, bytes_str(r.bytes),
                     r.us / 1000.0);
  o += "\ncpu fallbacks:\n";
  if (fallbacks.empty()) o += "  none\n";
  for (auto& [key, r] : fallbacks)
    o += fmt::format("  {} %{}: {} runs, {:.3f} ms on the host; {}\n", r.op, r.node, r.count,
                     r.us / 1000.0, r.reason);
  if (allocs)
    o += fmt::format("\ndevice memory reserved: {} allocations, {}\n", allocs,
                     bytes_str(alloc_bytes));
  const auto gaps = idle_gaps(gap_us);
  double gap_total = 0;
  for (auto& g : gaps) gap_total += g.dur_us;
  o += fmt::format("\nGPU idle gaps >= {} us within runs: {}, {:.3f} ms in all\n", gap_us,
                   gaps.size(), gap_total / 1000.0);
  for (size_t i = 0; i < gaps.size() && i < 15; ++i)
    o += fmt::format("  {:>10.2f} us at {:>12.3f} ms on {} {} (run {}): {}\n", gaps[i].dur_us,
                     gaps[i].start_us / 1000.0, gaps[i].process, gaps[i].track, gaps[i].run,
                     gaps[i].cause);
  if (gaps.size() > 15) o += fmt::format("  ... {} more gaps\n", gaps.size() - 15);
  return o;
}

namespace {
constexpr const char* kHtmlHead = R"HTML(<!doctype html>
<html><head><meta charset="utf-8"><title>kiln profile</title>
<style>
body { font: 12px sans-serif; margin: 10px; }
#timeline { overflow-x: auto; border: 1px solid #ccc; }
.span { stroke: #222; stroke-width: 0.3; }
.gap { fill: none; stroke: #d00; stroke-dasharray: 3 2; }
.label { font-size: 10px; pointer-events: none; fill: #000; }
.track { font-size: 11px; fill: #333; }
pre { background: #f5f5f5; padding: 6px; }
</style></head><body>
<h2>kiln profile</h2>
<div>zoom <input id="zoom" type="range" min="0" max="10" step="0.1" value="0">
 <span id="info"></span></div>
<div id="timeline"></div>
<pre id="summary">)HTML";

// the page's script: groups spans by process and track, stacks nested spans, draws SVG
constexpr const char* kHtmlScript = R"HTML(
<script>
(function () {
  var data = JSON.parse(document.getElementById('profile-data').textContent);
  var colors = {op: '#4e79a7', encode: '#a0cbe8', copy: '#f28e2b', fallback: '#e15759',
                compile: '#76b7b2', alloc: '#59a14f', wait: '#edc948', signal: '#b07aa1',
                run: '#dddddd'};
  var NS = 'http://www.w3.org/2000/svg';
  var tracks = [], byKey = {}, end = 0;
  data.spans.forEach(function (s) {
    var key = s.process + '\u0000' + s.track;
    if (!byKey[key]) { byKey[key] = {process: s.process, track: s.track, spans: []}; tracks.push(byKey[key]); }
    byKey[key].spans.push(s);
    end = Math.max(end, s.start + s.dur);
  });
  tracks.sort(function (a, b) {
    var ha = a.process === 'host' ? 0 : 1, hb = b.process === 'host' ? 0 : 1;
    return ha - hb || (a.process < b.process ? -1 : a.process > b.process ? 1 : 0) ||
           (a.track < b.track ? -1 : a.track > b.track ? 1 : 0);
  });
  tracks.forEach(function (t) {  // nesting depth of each span on its track
    t.spans.sort(function (a, b) { return a.start - b.start || b.dur - a.dur; });
    var stack = [];
    t.depth = 1;
    t.spans.forEach(function (s) {
      while (stack.length && stack[stack.length - 1] <= s.start) stack.pop();
      s.depth = stack.length;
      stack.push(s.start + s.dur);
      t.depth = Math.max(t.depth, stack.length);
    });
  });
  function el(name, attrs, text) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function draw(zoom) {
    var box = document.getElementById('timeline');
    box.innerHTML = '';
    var left = 170, rowH = 16, width = 1100 * Math.pow(2, zoom);
    var scale = end > 0 ? width / end : 1;
    var height = 24;
    tracks.forEach(function (t) { height += t.depth * rowH + 8; });
    var svg = el('svg', {width: left + width + 20, height: height, id: 'timeline-svg'});
    for (var ms = 0; ms <= end / 1000; ms += Math.max(0.001, Math.pow(10, Math.floor(Math.log10(Math.max(end / 1000, 0.001)))) / 2)) {
      var x = left + ms * 1000 * scale;
      svg.appendChild(el('line', {x1: x, x2: x, y1: 12, y2: height, stroke: '#eee'}));
      svg.appendChild(el('text', {x: x + 2, y: 10, 'class': 'track'}, (+ms.toFixed(3)) + ' ms'));
    }
    var y = 20;
    tracks.forEach(function (t) {
      svg.appendChild(el('text', {x: 2, y: y + 12, 'class': 'track'}, t.process + ' / ' + t.track));
      t.spans.forEach(function (s) {
        var x = left + s.start * scale, w = Math.max(1, s.dur * scale), sy = y + s.depth * rowH;
        var g = el('g', {'class': 'span-group', 'data-kind': s.kind, 'data-name': s.name});
        var r = el('rect', {x: x, y: sy, width: s.dur > 0 ? w : 2, height: rowH - 2,
                            fill: colors[s.kind] || '#999', 'class': 'span'});
        var tip = s.name + ' [' + s.kind + '] ' + s.dur.toFixed(2) + ' us';
        if (s.node >= 0) tip += ' node %' + s.node;
        if (s.bytes) tip += ' ' + s.bytes + ' bytes';
        if (s.detail) tip += ' (' + s.detail + ')';
        r.appendChild(el('title', {}, tip));
        g.appendChild(r);
        var label = el('text', {x: x + 2, y: sy + rowH - 5, 'class': 'label'}, s.name);
        if (w < s.name.length * 6) label.setAttribute('visibility', 'hidden');
        g.appendChild(label);
        svg.appendChild(g);
      });
      t.y = y;
      y += t.depth * rowH + 8;
    });
    data.gaps.forEach(function (gp) {
      var t = byKey[gp.process + '\u0000' + gp.track];
      if (!t) return;
      var r = el('rect', {x: left + gp.start * scale, y: t.y, width: Math.max(1, gp.dur * scale),
                          height: rowH - 2, 'class': 'gap'});
      r.appendChild(el('title', {}, 'idle ' + gp.dur.toFixed(2) + ' us: ' + gp.cause));
      svg.appendChild(r);
    });
    box.appendChild(svg);
    document.getElementById('info').textContent = data.spans.length + ' spans on ' +
        tracks.length + ' tracks, ' + (end / 1000).toFixed(3) + ' ms';
  }
  document.getElementById('zoom').addEventListener('input', function (e) { draw(+e.target.value); });
  draw(0);
})();
</script>
</body></html>
)HTML";
}  // namespace

std::string Profile::html() const {
  std::string data = "{\"spans\":[";
  for (size_t i = 0; i < spans.size(); ++i) {
    const auto& s = spans[i];
    data += fmt::format(
        R"({}{{"kind":"{}","name":"{}","process":"{}","track":"{}","start":{:.3f},"dur":{:.3f},"node":{},"bytes":{},"detail":"{}"}})",
        i ? ",\n" : "", span_kind_name(s.kind), json_escape(s.name), json_escape(s.process),
        json_escape(s.track), s.start_us, s.dur_us, s.node, s.bytes, json_escape(s.detail));
  }
  data += "],\"gaps\":[";
  const auto gaps = idle_gaps();
  for (size_t i = 0; i < gaps.size(); ++i)
    data +=
        fmt::format(R"({}{{"process":"{}","track":"{}","start":{:.3f},"dur":{:.3f},"cause":"{}"}})",
                    i ? "," : "", json_escape(gaps[i].process), json_escape(gaps[i].track),
                    gaps[i].start_us, gaps[i].dur_us, json_escape(gaps[i].cause));
  data += "]}";
  // inside <script>, "</" would end the element
  for (size_t p = 0; (p = data.find("</", p)) != std::string::npos; p += 3)
    data.replace(p, 2, "<\\/");
  std::string o = kHtmlHead;
  o += html_escape(summary());
  o += "</pre>\n<script id=\"profile-data\" type=\"application/json\">";
  o += data;
  o += "</script>";
  o += kHtmlScript;
  return o;
}

void Profile::save(const std::string& path) const {
  const bool as_html = path.size() >= 5 && path.compare(path.size() - 5, 5, ".html") == 0;
  std::ofstream f(path, std::ios::binary);
  if (!f) fail<IoError>("[profiler] cannot write '{}'", path);
  const std::string text = as_html ? html() : chrome_trace();
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!f) fail<IoError>("[profiler] writing '{}' failed", path);
}

}  // namespace kiln
