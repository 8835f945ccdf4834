#include "analysis/report_html.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <regex>
#include <string_view>
#include <utility>
#include <vector>

#include "common/base/json_writer.h"
#include "common/base/saturating.h"
#include "common/base/strings.h"

namespace clusterprof::analysis {
namespace {

// Times in the page's data are whole microseconds: fine for steps of a millisecond and up, and
// 64 hosts x 1,000 steps stay under 3 MB.
constexpr int64_t kUnitNs = 1000;
// The ops table shows the ops that differ most across hosts, this many at most.
constexpr size_t kMaxOpRows = 40;

// No request leaves the page: styles and scripts are inline, images only data: URLs (the
// favicon link keeps the browser from asking for /favicon.ico).
constexpr std::string_view kHead = R"(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
)";

constexpr std::string_view kStyle = R"(<style>
:root { --fg: #1d2330; --muted: #5b6475; --line: #dde1e8; --bad: #c62828; --bg-bad: #fdecea;
  --ok: #2e7d32; --bg-ok: #edf7ed; --input: #e6a23c; --compute: #3b7dd8; --gpu-idle: #9cc3f0;
  --host-idle: #c9ced6; --collective: #8e5cc2; }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 1280px; padding: 16px 24px 48px; color: var(--fg);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 6px; }
.meta, .explain { color: var(--muted); margin: 2px 0; }
.explain { max-width: 900px; }
ul { margin: 4px 0; padding-left: 20px; }
code { font-size: 12px; }
.callout { margin: 16px 0; padding: 12px 16px; border-radius: 6px; border-left: 6px solid; }
.callout h2 { margin: 0 0 6px; }
.callout.straggler { border-color: var(--bad); background: var(--bg-bad); }
.callout.no-straggler { border-color: var(--ok); background: var(--bg-ok); }
.callout.no-verdict { border-color: var(--muted); background: #f1f2f5; }
.callout .host { font-weight: 600; }
.cause { display: inline-block; padding: 0 6px; border-radius: 9px; background: var(--bad);
  color: #fff; font-size: 12px; font-weight: 600; }
.controls { margin: 6px 0; display: flex; gap: 16px; align-items: center; flex-wrap: wrap; }
.legend { display: flex; gap: 12px; align-items: center; flex-wrap: wrap; color: var(--muted);
  font-size: 12px; }
.swatch { display: inline-block; width: 12px; height: 12px; border-radius: 2px;
  vertical-align: -2px; margin-right: 4px; }
.scale { width: 220px; height: 12px; border-radius: 2px; }
.row { display: flex; align-items: center; gap: 8px; }
.label { flex: 0 0 190px; overflow: hidden; text-overflow: ellipsis; white-space: nowrap;
  text-align: right; font-size: 12px; }
.label.straggler, .slow.straggler { color: var(--bad); font-weight: 600; }
.value { flex: 0 0 70px; font-size: 12px; color: var(--muted); text-align: right; }
.hm-row canvas { flex: 1 1 auto; min-width: 0; display: block; }
.axis { position: relative; height: 16px; margin-left: 198px; margin-right: 78px; color: var(--muted);
  font-size: 11px; }
.axis span { position: absolute; transform: translateX(-50%); white-space: nowrap; }
.bar-area { flex: 1 1 auto; min-width: 0; }
.bar { display: flex; height: 14px; border-radius: 2px; overflow: hidden; }
.bar span { display: block; height: 100%; }
.lane { margin: 1px 0; }
.track { position: relative; flex: 1 1 auto; height: 14px; background: #f4f5f8; }
.track div { position: absolute; top: 0; height: 100%; }
.track .span { background: var(--host-idle); }
.track .entry { width: 2px; margin-left: -1px; background: #000; }
.track .none { position: static; color: var(--muted); font-size: 11px; }
.input { background: var(--input); } .compute { background: var(--compute); }
.gpu-idle { background: var(--gpu-idle); } .host-idle { background: var(--host-idle); }
.collective { background: var(--collective); } .missing { background: #ebecf0; }
table { border-collapse: collapse; font-size: 12px; width: 100%; }
th, td { padding: 3px 8px; border-bottom: 1px solid var(--line); text-align: left;
  vertical-align: middle; }
th { color: var(--muted); font-weight: 600; }
td.num { text-align: right; white-space: nowrap; }
td.op { max-width: 360px; overflow-wrap: anywhere; }
td.slow { background: var(--bg-bad); }
.strip { position: relative; width: 180px; height: 12px; background: #f4f5f8; }
.strip span { position: absolute; top: 2px; width: 3px; height: 8px; margin-left: -1px;
  background: #7a8599; }
.strip span.slowest { background: var(--bad); width: 4px; top: 0; height: 12px; }
#tip { position: fixed; pointer-events: none; background: #1d2330; color: #fff; padding: 4px 8px;
  border-radius: 4px; font-size: 12px; white-space: pre; z-index: 10; }
</style>
)";

// Draws the sections from the JSON element. Data reaches the page only through textContent and
// attributes, never as markup, so host and op names cannot inject anything.
constexpr std::string_view kScript = R"(<script>
(() => {
'use strict';
const data = JSON.parse(document.getElementById('report-data').textContent);
const hosts = data.hosts, steps = data.steps, n = hosts.length, m = steps.length;
const tip = document.getElementById('tip');

function fmt(us) {
  const a = Math.abs(us);
  if (a >= 1e6) return (us / 1e6).toFixed(a >= 1e7 ? 1 : 2) + ' s';
  if (a >= 1e3) return (us / 1e3).toFixed(a >= 1e4 ? 1 : 2) + ' ms';
  return Math.round(us) + ' \u00b5s';
}
function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}
function showTip(event, text) {
  tip.textContent = text;
  tip.hidden = false;
  tip.style.left = Math.min(event.clientX + 14, window.innerWidth - tip.offsetWidth - 4) + 'px';
  tip.style.top = (event.clientY + 14) + 'px';
}
function hideTip() { tip.hidden = true; }
function hostLabel(h) {
  return el('span', {class: 'label' + (hosts[h].straggler ? ' straggler' : ''), title: hosts[h].name},
            hosts[h].name);
}
function percent(part, whole) { return (whole > 0 ? 100 * part / whole : 0).toFixed(3) + '%'; }
function share(part, whole) { return (whole > 0 ? 100 * part / whole : 0).toFixed(1) + '%'; }

// Per host and step: start on the common clock, collective entry (NaN: none), lateness.
const start = hosts.map(h => h.s.map((s, j) => data.t[j] + s));
const entry = hosts.map((h, i) => h.e.map((e, j) => (h.d[j] < 0 || e < 0) ? NaN : start[i][j] + e));
const firstEntry = steps.map((_, j) => {
  let first = Infinity;
  for (let i = 0; i < n; ++i) if (entry[i][j] < first) first = entry[i][j];
  return first;
});
const lateness = entry.map(row => row.map((e, j) => e - firstEntry[j]));
const stepTime = hosts.map(h => h.d.map(d => d < 0 ? NaN : d));

// Heatmap: one canvas per host row, one pixel per step, scaled by CSS.
const SCALE = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
const LUT = Array.from({length: 256}, (_, k) => {
  const x = k / 255 * (SCALE.length - 1), i = Math.min(Math.floor(x), SCALE.length - 2), t = x - i;
  return SCALE[i].map((v, c) => Math.round(v + (SCALE[i + 1][c] - v) * t));
});
function domain(rows, fromZero) {
  const all = [];
  for (const row of rows) for (const v of row) if (!Number.isNaN(v)) all.push(v);
  if (!all.length) return [0, 1];
  all.sort((a, b) => a - b);
  // The 99th percentile, so that one slow first step does not wash out the rest.
  const lo = fromZero ? 0 : all[0], hi = all[Math.floor(0.99 * (all.length - 1))];
  return [lo, hi > lo ? hi : lo + 1];
}
function drawHeatmap(metric) {
  const rows = metric === 'lateness' ? lateness : stepTime;
  const [lo, hi] = domain(rows, metric === 'lateness');
  document.getElementById('heatmap-lo').textContent = fmt(lo);
  document.getElementById('heatmap-hi').textContent = '\u2265 ' + fmt(hi);
  document.querySelectorAll('#heatmap canvas').forEach((canvas, i) => {
    const ctx = canvas.getContext('2d'), img = ctx.createImageData(m, 1);
    for (let j = 0; j < m; ++j) {
      const v = rows[i][j];
      const rgb = Number.isNaN(v) ? [235, 236, 240]
                                  : LUT[Math.max(0, Math.min(255, Math.round(255 * (v - lo) / (hi - lo))))];
      img.data.set(rgb, 4 * j);
      img.data[4 * j + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
  });
}
function buildHeatmap() {
  const box = document.getElementById('heatmap');
  const rowHeight = Math.max(6, Math.min(18, Math.floor(640 / Math.max(n, 1))));
  for (let i = 0; i < n; ++i) {
    const row = el('div', {class: 'row hm-row', 'data-host': hosts[i].name,
                           'data-p50-ns': String(hosts[i].p50_ns)});
    const canvas = el('canvas', {width: String(Math.max(m, 1)), height: '1'});
    canvas.style.height = rowHeight + 'px';
    canvas.addEventListener('mousemove', event => {
      const j = Math.min(m - 1, Math.floor(event.offsetX / canvas.clientWidth * m));
      if (j < 0) return;
      const d = stepTime[i][j], late = lateness[i][j];
      showTip(event, `${hosts[i].name}\nstep ${steps[j]}\n` +
          (Number.isNaN(d) ? 'not recorded' : `step time ${fmt(d)}`) +
          (Number.isNaN(late) ? '' : `\nenters the collective ${fmt(late)} after the first host`));
    });
    canvas.addEventListener('mouseleave', hideTip);
    row.append(hostLabel(i), canvas,
               el('span', {class: 'value', title: 'step time p50'}, fmt(hosts[i].p50_ns / data.unit_ns)));
    box.append(row);
  }
  // Upscaled cells stay sharp; downscaled ones blend rather than drop steps.
  const first = box.querySelector('canvas'), wide = first ? first.clientWidth : 0;
  box.querySelectorAll('canvas').forEach(c => { c.style.imageRendering = m <= wide ? 'pixelated' : 'auto'; });
  const axis = document.getElementById('heatmap-axis');
  for (const f of [0, 0.25, 0.5, 0.75, 1]) {
    if (!m) break;
    const j = Math.round(f * (m - 1));
    const tick = el('span', {}, 'step ' + steps[j]);
    tick.style.left = ((j + 0.5) / m * 100) + '%';
    axis.append(tick);
  }
  const scale = document.getElementById('heatmap-scale');
  scale.style.background = 'linear-gradient(to right, ' +
      SCALE.map(c => `rgb(${c.join(',')})`).join(', ') + ')';
  const metric = document.getElementById('heatmap-metric');
  metric.addEventListener('change', () => drawHeatmap(metric.value));
  drawHeatmap(metric.value);
}

// Breakdown: per host, the compared steps' time split in five parts.
const PARTS = [['input', 'input wait'], ['compute', 'compute'],
               ['gpu-idle', 'GPU idle, host busy'], ['host-idle', 'host idle'],
               ['collective', 'collective (waiting included)']];
function legend(box) {
  for (const [cls, name] of PARTS) {
    const item = el('span', {});
    item.append(el('span', {class: 'swatch ' + cls}), name);
    box.append(item);
  }
}
function buildBreakdown() {
  legend(document.getElementById('breakdown-legend'));
  const box = document.getElementById('breakdown');
  const totals = hosts.map(h => h.parts.reduce((a, b) => a + b, 0));
  const longest = Math.max(1, ...totals);
  hosts.forEach((h, i) => {
    const bar = el('div', {class: 'bar'});
    bar.style.width = percent(totals[i], longest);
    h.parts.forEach((v, k) => {
      const part = el('span', {class: PARTS[k][0],
                               title: `${h.name}: ${PARTS[k][1]} ${fmt(v)} (${share(v, totals[i])})`});
      part.style.width = percent(v, totals[i]);
      bar.append(part);
    });
    const area = el('div', {class: 'bar-area'});
    area.append(bar);
    const row = el('div', {class: 'row', 'data-host': h.name});
    row.append(hostLabel(i), area, el('span', {class: 'value'}, fmt(totals[i])));
    box.append(row);
  });
}

// Swimlanes: one step of every host on the common clock. The span and the collective entry are
// where they happened; the parts are the step's sums laid end to end (the digest keeps sums).
function drawLanes(j) {
  const box = document.getElementById('swimlanes');
  box.replaceChildren();
  let lo = Infinity, hi = -Infinity;
  for (let i = 0; i < n; ++i) {
    if (hosts[i].d[j] < 0) continue;
    lo = Math.min(lo, start[i][j]);
    hi = Math.max(hi, start[i][j] + hosts[i].d[j]);
  }
  const width = Math.max(hi - lo, 1);
  const at = t => ((t - lo) / width * 100) + '%';
  const len = t => (t / width * 100) + '%';
  for (let i = 0; i < n; ++i) {
    const h = hosts[i], track = el('div', {class: 'track'});
    const lane = el('div', {class: 'row lane', 'data-host': h.name});
    lane.append(hostLabel(i), track, el('span', {class: 'value'}, h.d[j] < 0 ? '' : fmt(h.d[j])));
    box.append(lane);
    if (h.d[j] < 0) { track.append(el('div', {class: 'none'}, 'no such step on this host')); continue; }
    const s = start[i][j], d = h.d[j];
    const block = (cls, from, length) => {
      const b = el('div', {class: cls});
      b.style.left = at(from);
      b.style.width = len(Math.max(0, length));
      track.append(b);
    };
    block('span', s, d);
    let t = s;
    for (const [cls, v] of [['input', h.i[j]], ['compute', h.c[j]], ['gpu-idle', h.g[j]]]) {
      block(cls, t, v);
      t += v;
    }
    block('collective', s + d - h.k[j], h.k[j]);
    if (!Number.isNaN(entry[i][j])) {
      const mark = el('div', {class: 'entry'});
      mark.style.left = at(entry[i][j]);
      track.append(mark);
    }
    track.title = `${h.name}: starts at +${fmt(s - lo)}, lasts ${fmt(d)}` +
        (Number.isNaN(entry[i][j]) ? ', no collective'
            : `, enters the collective at +${fmt(entry[i][j] - lo)} (${fmt(lateness[i][j])} after the first host)`);
  }
  const axis = document.getElementById('swimlanes-axis');
  axis.replaceChildren();
  for (const f of [0, 0.25, 0.5, 0.75, 1]) {
    const tick = el('span', {}, (f ? '+' : '') + fmt(f * width));
    tick.style.left = (f * 100) + '%';
    axis.append(tick);
  }
}
function buildLanes() {
  legend(document.getElementById('swimlanes-legend'));
  const legendBox = document.getElementById('swimlanes-legend');
  const mark = el('span', {});
  const swatch = el('span', {class: 'swatch'});
  swatch.style.background = '#000';
  swatch.style.width = '3px';
  mark.append(swatch, 'collective entry');
  legendBox.append(mark);
  const select = document.getElementById('step-select');
  steps.forEach((step, j) => {
    const spread = Math.max(...lateness.map(row => row[j]).filter(v => !Number.isNaN(v)), -Infinity);
    const text = `step ${step}` + (spread > -Infinity ? ` \u2014 entries spread ${fmt(spread)}` : '') +
        (j === data.focus ? ' (largest spread)' : '');
    select.append(el('option', {value: String(j)}, text));
  });
  select.value = String(data.focus);
  select.addEventListener('change', () => drawLanes(Number(select.value)));
  if (m) drawLanes(data.focus);
}

// Ops: per-call mean on each host, the slowest highlighted.
function buildOps() {
  const body = document.querySelector('#ops tbody');
  if (!data.ops.length) {
    const row = el('tr', {});
    row.append(el('td', {colspan: '8'}, 'No op or kernel appears on two hosts or more.'));
    body.append(row);
    return;
  }
  for (const op of data.ops) {
    const present = op.mean_ns.map((v, i) => [v, i]).filter(([v]) => v >= 0);
    present.sort((a, b) => a[0] - b[0]);
    const [fast, fastHost] = present[0], [slow, slowHost] = present[present.length - 1];
    const median = present[Math.floor((present.length - 1) / 2)][0];
    const row = el('tr', {'data-op': op.name, 'data-slowest': hosts[slowHost].name});
    row.append(el('td', {class: 'op'}, op.name), el('td', {}, op.device ? 'device' : 'host'),
               el('td', {class: 'num'}, String(present.length)),
               el('td', {}, `${hosts[fastHost].name} ${fmt(fast / data.unit_ns)}`),
               el('td', {class: 'num'}, fmt(median / data.unit_ns)),
               el('td', {class: 'slow' + (hosts[slowHost].straggler ? ' straggler' : '')},
                  `${hosts[slowHost].name} ${fmt(slow / data.unit_ns)}`),
               el('td', {class: 'num'}, '\u00d7' + (slow / Math.max(fast, 1)).toFixed(2)));
    // From the fastest to the slowest or 25% slower, whichever is further: hosts a few percent
    // apart stay together.
    const span = Math.max(slow, 1.25 * fast) - fast || 1;
    const strip = el('div', {class: 'strip'});
    for (const [v, i] of present) {
      const dot = el('span', {class: i === slowHost ? 'slowest' : '',
                              title: `${hosts[i].name}: ${fmt(v / data.unit_ns)} per call`});
      dot.style.left = percent(v - fast, span);
      strip.append(dot);
    }
    const cell = el('td', {});
    cell.append(strip);
    row.append(cell);
    body.append(row);
  }
}

if (n && m) {
  buildHeatmap();
  buildBreakdown();
  buildLanes();
} else {
  for (const id of ['heatmap', 'breakdown', 'swimlanes']) {
    document.getElementById(id).append(el('p', {class: 'explain'}, 'No host has steps to show.'));
  }
}
buildOps();
})();
</script>
)";

void AppendHtmlEscaped(std::string_view text, std::string* out) {
  for (char c : text) {
    switch (c) {
      case '&':
        out->append("&amp;");
        break;
      case '<':
        out->append("&lt;");
        break;
      case '>':
        out->append("&gt;");
        break;
      case '"':
        out->append("&quot;");
        break;
      case '\'':
        out->append("&#39;");
        break;
      default:
        out->push_back(c);
    }
  }
}

std::string Html(std::string_view text) {
  std::string out;
  AppendHtmlEscaped(text, &out);
  return out;
}

int64_t Units(int64_t ns) {
  return ns >= 0 ? SaturatingAdd(ns, kUnitNs / 2) / kUnitNs
                 : -(SaturatingAdd(SaturatingSub(0, ns), kUnitNs / 2) / kUnitNs);
}

bool HasDevice(const HostDigest& digest) {
  for (const OpStat& op : digest.top_ops) {
    if (op.device) return true;
  }
  for (const StepDigest& step : digest.steps) {
    if (step.device_busy_ns > 0) return true;
  }
  return false;
}

// The hosts' steps as columns: every step number any host has, and per host its step in each
// column (null where it has none).
struct Columns {
  std::vector<int64_t> numbers;
  // Per column, the earliest start on the common clock.
  std::vector<int64_t> earliest_ns;
  std::vector<std::vector<const StepDigest*>> cells;  // [host][column]
};

Columns Layout(const std::vector<HostRun>& runs) {
  std::map<int64_t, size_t> index;
  for (const HostRun& run : runs) {
    for (const StepDigest& step : run.digest.steps) index.emplace(step.step, 0);
  }
  Columns columns;
  for (auto& [number, column] : index) {
    column = columns.numbers.size();
    columns.numbers.push_back(number);
  }
  columns.earliest_ns.assign(columns.numbers.size(), std::numeric_limits<int64_t>::max());
  for (const HostRun& run : runs) {
    std::vector<const StepDigest*>& row = columns.cells.emplace_back(columns.numbers.size());
    for (const StepDigest& step : run.digest.steps) {
      const size_t column = index[step.step];
      row[column] = &step;
      columns.earliest_ns[column] =
          std::min(columns.earliest_ns[column], SaturatingSub(step.start_ns, run.clock_offset_ns));
    }
  }
  return columns;
}

// The compared step whose collective entries are furthest apart on the common clock (the first
// column when none was compared).
size_t FocusColumn(const RunReport& report, const Columns& columns) {
  size_t focus = 0;
  int64_t widest = -1;
  for (int64_t number : report.analysis.compared_step_numbers) {
    const size_t column = static_cast<size_t>(
        std::lower_bound(columns.numbers.begin(), columns.numbers.end(), number) -
        columns.numbers.begin());
    int64_t first = std::numeric_limits<int64_t>::max();
    int64_t last = std::numeric_limits<int64_t>::min();
    for (size_t h = 0; h < report.runs.size(); ++h) {
      const StepDigest* step = columns.cells[h][column];
      const int64_t entry =
          SaturatingSub(step->collective_entry_ns, report.runs[h].clock_offset_ns);
      first = std::min(first, entry);
      last = std::max(last, entry);
    }
    if (SaturatingSub(last, first) > widest) {
      widest = SaturatingSub(last, first);
      focus = column;
    }
  }
  return focus;
}

// A host's breakdown summed over `numbers` (all its steps when empty), in the page's order:
// input, compute, GPU idle, host idle, collective.
std::vector<int64_t> BreakdownTotals(const HostDigest& digest, bool has_device,
                                     const std::vector<int64_t>& numbers) {
  std::vector<int64_t> totals(5, 0);
  for (const StepDigest& step : digest.steps) {
    if (!numbers.empty() && !std::binary_search(numbers.begin(), numbers.end(), step.step)) {
      continue;
    }
    const StepBreakdown parts = BreakDownStep(step, has_device);
    const int64_t values[] = {parts.input_ns, parts.compute_ns, parts.gpu_idle_ns,
                              parts.host_idle_ns, parts.collective_ns};
    for (size_t k = 0; k < totals.size(); ++k) totals[k] = SaturatingAdd(totals[k], values[k]);
  }
  for (int64_t& total : totals) total = Units(total);
  return totals;
}

std::optional<std::regex> CompileOrNothing(const std::string& pattern) {
  try {
    return std::regex(pattern, std::regex::ECMAScript | std::regex::icase);
  } catch (const std::regex_error&) {
    return std::nullopt;  // the digest already refused such a pattern
  }
}

struct OpRow {
  std::string name;
  bool device = false;
  std::vector<int64_t> mean_ns;  // per host; -1 where the host does not have it
  double ratio = 1;              // the slowest mean over the fastest
};

// Ops on two hosts or more, those whose per-call mean differs most across hosts first.
// Collectives and input waits are left out: their time is mostly waiting, on the other hosts
// or on the input pipeline, which the verdict measures directly.
std::vector<OpRow> OpSpread(const RunReport& report) {
  const std::optional<std::regex> collective = CompileOrNothing(report.options.collective_pattern);
  const std::optional<std::regex> input = CompileOrNothing(report.options.input_pattern);
  auto waits = [&](const std::string& name) {
    return (collective && std::regex_search(name, *collective)) ||
           (input && std::regex_search(name, *input));
  };
  std::map<std::pair<bool, std::string>, std::vector<int64_t>> means;
  const size_t hosts = report.runs.size();
  for (size_t h = 0; h < hosts; ++h) {
    for (const OpStat& op : report.runs[h].digest.top_ops) {
      if (op.count <= 0 || waits(op.name)) continue;
      std::vector<int64_t>& row = means[{op.device, op.name}];
      row.resize(hosts, -1);
      row[h] = op.total_ns / op.count;
    }
  }
  std::vector<OpRow> rows;
  for (auto& [key, mean] : means) {
    int present = 0;
    int64_t fastest = std::numeric_limits<int64_t>::max();
    int64_t slowest = 0;
    for (int64_t value : mean) {
      if (value < 0) continue;
      ++present;
      fastest = std::min(fastest, value);
      slowest = std::max(slowest, value);
    }
    if (present < 2) continue;
    const double ratio =
        static_cast<double>(slowest) / static_cast<double>(std::max<int64_t>(fastest, 1));
    rows.push_back({key.second, key.first, std::move(mean), ratio});
  }
  std::sort(rows.begin(), rows.end(), [](const OpRow& a, const OpRow& b) {
    return a.ratio != b.ratio ? a.ratio > b.ratio : a.name < b.name;
  });
  if (rows.size() > kMaxOpRows) rows.resize(kMaxOpRows);
  return rows;
}

void IntArray(JsonWriter& json, std::string_view key, const std::vector<int64_t>& values) {
  json.Key(key);
  json.Open('[');
  for (int64_t value : values) json.Int(value);
  json.Close(']');
}

// One host: its verdict, its steps by column (in units; a step it lacks has d = -1), and its
// breakdown totals.
void WriteHost(JsonWriter& json, const HostVerdict& verdict, const HostRun& run,
               const std::vector<const StepDigest*>& cells, const Columns& columns,
               const std::vector<int64_t>& breakdown_steps) {
  const bool has_device = HasDevice(run.digest);
  const size_t m = cells.size();
  std::vector<int64_t> s(m, 0), d(m, -1), e(m, -1), i(m, 0), c(m, 0), g(m, 0), k(m, 0);
  for (size_t j = 0; j < m; ++j) {
    const StepDigest* step = cells[j];
    if (step == nullptr) continue;
    s[j] = Units(
        SaturatingSub(SaturatingSub(step->start_ns, run.clock_offset_ns), columns.earliest_ns[j]));
    d[j] = Units(step->duration_ns());
    if (step->collective_entry_ns != 0) {
      e[j] = Units(SaturatingSub(step->collective_entry_ns, step->start_ns));
    }
    const StepBreakdown parts = BreakDownStep(*step, has_device);
    i[j] = Units(parts.input_ns);
    c[j] = Units(parts.compute_ns);
    g[j] = Units(parts.gpu_idle_ns);
    k[j] = Units(parts.collective_ns);
  }
  json.Open('{');
  json.Field("name", verdict.host);
  json.Field("p50_ns", verdict.step_p50_ns);
  json.Field("straggler", verdict.straggler);
  IntArray(json, "s", s);
  IntArray(json, "d", d);
  IntArray(json, "e", e);
  IntArray(json, "i", i);
  IntArray(json, "c", c);
  IntArray(json, "g", g);
  IntArray(json, "k", k);
  IntArray(json, "parts", BreakdownTotals(run.digest, has_device, breakdown_steps));
  json.Close('}');
}

// The page's data. `<` is written as \u003c: inside a script element, "</script" or "<!--"
// in a name would otherwise end the element or change how the browser reads it.
std::string DataJson(const RunReport& report) {
  const Columns columns = Layout(report.runs);
  int64_t base = std::numeric_limits<int64_t>::max();
  for (int64_t earliest : columns.earliest_ns) base = std::min(base, earliest);
  std::vector<int64_t> t;
  for (int64_t earliest : columns.earliest_ns) t.push_back(Units(SaturatingSub(earliest, base)));

  std::string out;
  JsonWriter json(&out);
  json.Open('{');
  json.Field("unit_ns", kUnitNs);
  IntArray(json, "steps", columns.numbers);
  IntArray(json, "t", t);
  json.Field("focus", static_cast<int64_t>(FocusColumn(report, columns)));
  json.Key("hosts");
  json.Open('[');
  for (size_t h = 0; h < report.runs.size(); ++h) {
    WriteHost(json, report.analysis.hosts[h], report.runs[h], columns.cells[h], columns,
              report.analysis.compared_step_numbers);
  }
  json.Close(']');
  json.Key("ops");
  json.Open('[');
  for (const OpRow& op : OpSpread(report)) {
    json.Open('{');
    json.Field("name", op.name);
    json.Field("device", op.device);
    IntArray(json, "mean_ns", op.mean_ns);
    json.Close('}');
  }
  json.Close(']');
  json.Close('}');

  std::string safe;
  safe.reserve(out.size());
  for (char ch : out) {
    if (ch == '<') {
      safe.append("\\u003c");
    } else {
      safe.push_back(ch);
    }
  }
  return safe;
}

void AppendHeader(const RunReport& report, std::string* out) {
  const Analysis& a = report.analysis;
  StrAppend(out, "<title>clusterprof report: ", Html(report.run), "</title>\n", kStyle,
            "</head>\n<body>\n<header>\n<h1>clusterprof report: ", Html(report.run),
            "</h1>\n<p class=\"meta\">", Html(report.run_dir), "</p>\n<p class=\"meta\">",
            a.hosts.size(), a.hosts.size() == 1 ? " host" : " hosts", " analyzed");
  if (a.steps > 0) {
    StrAppend(out, " &middot; steps ", a.first_step, "&ndash;", a.last_step, " in common (",
              a.steps, ") &middot; ", a.compared_steps, " compared");
  }
  if (!a.left_out.empty()) StrAppend(out, " &middot; ", a.left_out.size(), " left out");
  out->append("</p>\n");
  if (!a.notes.empty() || !a.left_out.empty()) {
    out->append("<ul class=\"notes\">\n");
    for (const std::string& note : a.notes) StrAppend(out, "<li>note: ", Html(note), "</li>\n");
    for (const std::string& left : a.left_out) {
      StrAppend(out, "<li>left out: ", Html(left), "</li>\n");
    }
    out->append("</ul>\n");
  }
  out->append("</header>\n");
}

void AppendCallout(const Analysis& a, std::string* out) {
  const std::vector<const HostVerdict*> stragglers = a.stragglers();
  if (stragglers.empty() && a.compared_steps > 0) {
    StrAppend(out,
              "<section id=\"straggler-callout\" class=\"callout no-straggler\">\n<h2>No "
              "straggler</h2>\n<p>No host entered the collectives late in half of the ",
              a.compared_steps, " steps compared.</p>\n");
  } else if (stragglers.empty()) {
    out->append(
        "<section id=\"straggler-callout\" class=\"callout no-verdict\">\n<h2>No "
        "verdict</h2>\n<p>No step could be compared across hosts, so no straggler can be named "
        "(see the notes above).</p>\n");
  } else {
    StrAppend(out, "<section id=\"straggler-callout\" class=\"callout straggler\">\n<h2>",
              stragglers.size() == 1 ? "Straggler" : "Stragglers", "</h2>\n<ul>\n");
    for (const HostVerdict* host : stragglers) {
      StrAppend(out, "<li data-host=\"", Html(host->host), "\"><span class=\"host\">",
                Html(host->host), "</span> <span class=\"cause\">", Html(CauseName(host->cause)),
                "</span> <span class=\"evidence\">", Html(host->evidence), "</span></li>\n");
    }
    out->append("</ul>\n");
  }
  if (!a.left_out.empty()) {
    out->append("<p>Not analyzed: ");
    for (size_t i = 0; i < a.left_out.size(); ++i) {
      const std::string_view left = a.left_out[i];
      StrAppend(out, i == 0 ? "" : "; ", Html(left.substr(0, left.find(':'))));
    }
    out->append(" (why: above).</p>\n");
  }
  out->append("</section>\n");
}

constexpr std::string_view kHeatmapSection =
    R"(<noscript><p>The charts below need JavaScript.</p></noscript>
<section>
<h2>Step time, host by step</h2>
<p class="explain">One row per host, one column per step. In a job whose hosts meet in collectives, step times are alike on every host; a slow host shows in its lateness into the collective (the other view).</p>
<div class="controls">
<label>Colour: <select id="heatmap-metric"><option value="time">step time</option><option value="lateness">lateness into the collective</option></select></label>
<span class="legend"><span id="heatmap-lo"></span><span class="scale" id="heatmap-scale"></span><span id="heatmap-hi"></span><span><span class="swatch missing"></span>no such step</span></span>
</div>
<div id="heatmap"></div>
<div class="axis" id="heatmap-axis"></div>
</section>
)";

constexpr std::string_view kStepAndOpsSections = R"(<section>
<h2>One step, every host on one clock</h2>
<p class="explain">The step's span and the collective entry (black mark) are where they happened, on the common clock; input, compute and GPU idle are the step's sums laid end to end from its start, and the collective ends with the step (the digest keeps sums, not positions).</p>
<div class="controls"><label>Step: <select id="step-select"></select></label></div>
<div class="legend" id="swimlanes-legend"></div>
<div id="swimlanes"></div>
<div class="axis" id="swimlanes-axis"></div>
</section>
<section>
<h2>Ops and kernels that differ across hosts</h2>
<p class="explain">Mean time per call on each host, for ops on two hosts or more (collectives and input waits left out: their time is mostly waiting). Largest slowest-to-fastest ratio first; the slowest host is highlighted.</p>
<table id="ops"><thead><tr><th>op</th><th>where</th><th>hosts</th><th>fastest</th><th>median</th><th>slowest</th><th>slowest &divide; fastest</th><th title="each host's mean per call, from the fastest (left) to the slowest or 25% slower, whichever is further">each host</th></tr></thead><tbody></tbody></table>
</section>
<div id="tip" hidden></div>
)";

void AppendBreakdownSection(const Analysis& a, std::string* out) {
  out->append("<section>\n<h2>Where each host's time went</h2>\n<p class=\"explain\">");
  if (a.compared_steps > 0) {
    StrAppend(out, "Totals over the ", a.compared_steps, " steps compared.");
  } else {
    out->append("Totals over each host's steps (none was compared).");
  }
  out->append(
      " Each step is split in this order, each part taking what the ones before it left: time "
      "inside collectives (waiting for the other hosts included), compute (device busy on a "
      "host with GPUs, host busy on one without), GPU idle while the host works (host busy "
      "beyond device busy), input wait, and host idle (the rest: nothing recorded explains "
      "it).</p>\n"
      "<div class=\"legend\" id=\"breakdown-legend\"></div>\n<div id=\"breakdown\"></div>\n"
      "</section>\n");
}

}  // namespace

StepBreakdown BreakDownStep(const StepDigest& step, bool has_device) {
  StepBreakdown parts;
  int64_t left = std::max<int64_t>(0, step.duration_ns());
  auto take = [&left](int64_t ns) {
    const int64_t taken = std::clamp<int64_t>(ns, 0, left);
    left -= taken;
    return taken;
  };
  parts.collective_ns = take(step.collective_ns);
  parts.compute_ns = take(has_device ? step.device_busy_ns : step.host_busy_ns);
  if (has_device) parts.gpu_idle_ns = take(SaturatingSub(step.host_busy_ns, step.device_busy_ns));
  // Input last of the kinds: it counts on every thread, so a batch prefetched in the background
  // while the host works would otherwise take the time of that work.
  parts.input_ns = take(step.input_ns);
  parts.host_idle_ns = left;
  return parts;
}

std::string ReportHtml(const RunReport& report) {
  std::string out(kHead);
  AppendHeader(report, &out);
  AppendCallout(report.analysis, &out);
  out.append(kHeatmapSection);
  AppendBreakdownSection(report.analysis, &out);
  out.append(kStepAndOpsSections);
  StrAppend(&out, "<script type=\"application/json\" id=\"report-data\">", DataJson(report),
            "</script>\n", kScript, "</body>\n</html>\n");
  return out;
}

}  // namespace clusterprof::analysis
