#include "analysis/report_html.h"

#include <algorithm>
#include <cmath>
#include <iterator>
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
.label.band { color: var(--muted); font-style: italic; }
.track .entry-band, .swatch.entry-band { background: rgba(0, 0, 0, 0.28); }
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
// The hosts without a row of their own (a run of many hosts), as percentile bands; null when
// every host has its row.
const rest = data.rest;
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
function bandLabel(text) { return el('span', {class: 'label band', title: text}, text); }
function percent(part, whole) { return (whole > 0 ? 100 * part / whole : 0).toFixed(3) + '%'; }
function share(part, whole) { return (whole > 0 ? 100 * part / whole : 0).toFixed(1) + '%'; }
function num(v) { return v === null || v === undefined ? NaN : v; }
function lateText(late) {
  return late >= 0 ? `enters the collective ${fmt(late)} after the median host`
                   : `enters the collective ${fmt(-late)} before the median host`;
}
const others = rest ? `${rest.count.toLocaleString('en-US')} other hosts` : '';

// Per host and step: start on the common clock, collective entry (NaN: none), lateness (from
// the median host's entry, as the verdict measures it), step time.
const start = hosts.map(h => h.s.map((s, j) => data.t[j] + s));
const entry = hosts.map((h, i) => h.e.map((e, j) => (h.d[j] < 0 || e < 0) ? NaN : start[i][j] + e));
const lateness = hosts.map(h => h.l.map(num));
const stepTime = hosts.map(h => h.d.map(d => d < 0 ? NaN : d));

// The heatmap's rows: each host shown, then the bands of the others.
const rows = hosts.map((h, i) => ({name: h.name, time: stepTime[i], late: lateness[i]}));
if (rest) {
  for (const b of rest.bands) {
    rows.push({name: `${b.label} of ${others}`, band: b.label, time: b.d.map(num), late: b.l.map(num)});
  }
}

// Heatmap: one canvas per row, one pixel per step, scaled by CSS.
const SCALE = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
const LUT = Array.from({length: 256}, (_, k) => {
  const x = k / 255 * (SCALE.length - 1), i = Math.min(Math.floor(x), SCALE.length - 2), t = x - i;
  return SCALE[i].map((v, c) => Math.round(v + (SCALE[i + 1][c] - v) * t));
});
function domain(metric) {
  const all = [];
  for (const row of rows) for (const v of row[metric]) if (!Number.isNaN(v)) all.push(v);
  if (!all.length) return [0, 1];
  all.sort((a, b) => a - b);
  // The 99th percentile, so that one slow first step does not wash out the rest.
  const lo = metric === 'late' ? 0 : all[0], hi = all[Math.floor(0.99 * (all.length - 1))];
  return [lo, hi > lo ? hi : lo + 1];
}
function drawHeatmap(choice) {
  const metric = choice === 'lateness' ? 'late' : 'time';
  const [lo, hi] = domain(metric);
  document.getElementById('heatmap-lo').textContent = fmt(lo);
  document.getElementById('heatmap-hi').textContent = '\u2265 ' + fmt(hi);
  document.querySelectorAll('#heatmap canvas').forEach((canvas, i) => {
    const values = rows[i][metric];
    const ctx = canvas.getContext('2d'), img = ctx.createImageData(m, 1);
    for (let j = 0; j < m; ++j) {
      const v = values[j];
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
  const rowHeight = Math.max(6, Math.min(18, Math.floor(640 / Math.max(rows.length, 1))));
  rows.forEach((r, i) => {
    const row = r.band === undefined
        ? el('div', {class: 'row hm-row', 'data-host': hosts[i].name,
                     'data-p50-ns': String(hosts[i].p50_ns)})
        : el('div', {class: 'row hm-row hm-band', 'data-band': r.band});
    const canvas = el('canvas', {width: String(Math.max(m, 1)), height: '1'});
    canvas.style.height = rowHeight + 'px';
    canvas.addEventListener('mousemove', event => {
      const j = Math.min(m - 1, Math.floor(event.offsetX / canvas.clientWidth * m));
      if (j < 0) return;
      const d = r.time[j], late = r.late[j];
      showTip(event, `${r.name}\nstep ${steps[j]}\n` +
          (Number.isNaN(d) ? 'not recorded' : `step time ${fmt(d)}`) +
          (Number.isNaN(late) ? '' : '\n' + lateText(late)));
    });
    canvas.addEventListener('mouseleave', hideTip);
    if (r.band === undefined) {
      row.append(hostLabel(i), canvas,
                 el('span', {class: 'value', title: 'step time p50'}, fmt(hosts[i].p50_ns / data.unit_ns)));
    } else {
      row.append(bandLabel(r.name), canvas, el('span', {class: 'value'}, ''));
    }
    box.append(row);
  });
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
  metric.value = data.default_metric;
  metric.addEventListener('change', () => drawHeatmap(metric.value));
  drawHeatmap(metric.value);
}

// Breakdown: per host, the compared steps' time split in five parts; the others' mean.
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
  const bars = hosts.map(h => ({name: h.name, parts: h.parts}));
  if (rest) bars.push({name: `mean of ${others}`, parts: rest.parts, band: true});
  const totals = bars.map(b => b.parts.reduce((a, v) => a + v, 0));
  const longest = Math.max(1, ...totals);
  bars.forEach((b, i) => {
    const bar = el('div', {class: 'bar'});
    bar.style.width = percent(totals[i], longest);
    b.parts.forEach((v, k) => {
      const part = el('span', {class: PARTS[k][0],
                               title: `${b.name}: ${PARTS[k][1]} ${fmt(v)} (${share(v, totals[i])})`});
      part.style.width = percent(v, totals[i]);
      bar.append(part);
    });
    const area = el('div', {class: 'bar-area'});
    area.append(bar);
    const row = b.band ? el('div', {class: 'row band', 'data-band': 'mean'})
                       : el('div', {class: 'row', 'data-host': b.name});
    row.append(b.band ? bandLabel(b.name) : hostLabel(i), area, el('span', {class: 'value'}, fmt(totals[i])));
    box.append(row);
  });
}

// Swimlanes: one step of every host shown on the common clock, and the others as one lane. The
// span and the collective entry are where they happened; the parts are the step's sums laid end
// to end (the digest keeps sums).
function drawLanes(j) {
  const box = document.getElementById('swimlanes');
  box.replaceChildren();
  let lo = Infinity, hi = -Infinity;
  for (let i = 0; i < n; ++i) {
    if (hosts[i].d[j] < 0) continue;
    lo = Math.min(lo, start[i][j]);
    hi = Math.max(hi, start[i][j] + hosts[i].d[j]);
  }
  if (rest && rest.start[j] !== null) {
    lo = Math.min(lo, data.t[j] + rest.start[j]);
    hi = Math.max(hi, data.t[j] + rest.end[j]);
  }
  const width = Math.max(hi - lo, 1);
  const at = t => ((t - lo) / width * 100) + '%';
  const len = t => (t / width * 100) + '%';
  const block = (track, cls, from, length) => {
    const b = el('div', {class: cls});
    b.style.left = at(from);
    b.style.width = len(Math.max(0, length));
    track.append(b);
  };
  const mark = (track, t) => {
    const b = el('div', {class: 'entry'});
    b.style.left = at(t);
    track.append(b);
  };
  for (let i = 0; i < n; ++i) {
    const h = hosts[i], track = el('div', {class: 'track'});
    const lane = el('div', {class: 'row lane', 'data-host': h.name});
    lane.append(hostLabel(i), track, el('span', {class: 'value'}, h.d[j] < 0 ? '' : fmt(h.d[j])));
    box.append(lane);
    if (h.d[j] < 0) { track.append(el('div', {class: 'none'}, 'no such step on this host')); continue; }
    const s = start[i][j], d = h.d[j];
    block(track, 'span', s, d);
    let t = s;
    for (const [cls, v] of [['input', h.i[j]], ['compute', h.c[j]], ['gpu-idle', h.g[j]]]) {
      block(track, cls, t, v);
      t += v;
    }
    block(track, 'collective', s + d - h.k[j], h.k[j]);
    if (!Number.isNaN(entry[i][j])) mark(track, entry[i][j]);
    track.title = `${h.name}: starts at +${fmt(s - lo)}, lasts ${fmt(d)}` +
        (Number.isNaN(entry[i][j]) ? ', no collective'
            : `, enters the collective at +${fmt(entry[i][j] - lo)} (${lateText(lateness[i][j])})`);
  }
  if (rest) {
    const track = el('div', {class: 'track'});
    const lane = el('div', {class: 'row lane band', 'data-band': 'others'});
    lane.append(bandLabel(others), track, el('span', {class: 'value'}, ''));
    box.append(lane);
    if (rest.start[j] === null) {
      track.append(el('div', {class: 'none'}, 'no such step on these hosts'));
    } else {
      const t0 = data.t[j];
      block(track, 'span', t0 + rest.start[j], rest.end[j] - rest.start[j]);
      if (rest.entry_p10[j] !== null) {
        block(track, 'entry-band', t0 + rest.entry_p10[j], rest.entry_p90[j] - rest.entry_p10[j]);
        mark(track, t0 + rest.entry_p50[j]);
      }
      track.title = `${others}: from the first start to the last end; the box holds the middle 80% ` +
          'of their collective entries (p10 to p90), the mark their median';
    }
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
  if (rest) {
    const band = el('span', {});
    band.append(el('span', {class: 'swatch entry-band'}), 'p10\u2013p90 of the others\u2019 entries');
    legendBox.append(band);
  }
  const select = document.getElementById('step-select');
  const options = document.createDocumentFragment();
  steps.forEach((step, j) => {
    const spread = data.spread[j];
    const text = `step ${step}` + (spread >= 0 ? ` \u2014 entries spread ${fmt(spread)}` : '') +
        (j === data.focus ? ' (largest spread)' : '');
    options.append(el('option', {value: String(j)}, text));
  });
  select.append(options);
  select.value = String(data.focus);
  select.addEventListener('change', () => drawLanes(Number(select.value)));
  if (m) drawLanes(data.focus);
}

// Ops: per-call mean on each host, the slowest highlighted. With many hosts the strip shows
// the means' percentiles (every fifth), not every host.
function buildOps() {
  const body = document.querySelector('#ops tbody');
  if (!data.ops.length) {
    const row = el('tr', {});
    row.append(el('td', {colspan: '8'}, 'No op or kernel appears on two hosts or more.'));
    body.append(row);
    return;
  }
  for (const op of data.ops) {
    const fast = op.fast_ns, slow = op.slow_ns;
    const row = el('tr', {'data-op': op.name, 'data-slowest': op.slow_host});
    row.append(el('td', {class: 'op'}, op.name), el('td', {}, op.device ? 'device' : 'host'),
               el('td', {class: 'num'}, op.hosts.toLocaleString('en-US')),
               el('td', {}, `${op.fast_host} ${fmt(fast / data.unit_ns)}`),
               el('td', {class: 'num'}, fmt(op.median_ns / data.unit_ns)),
               el('td', {class: 'slow' + (op.slow_straggler ? ' straggler' : '')},
                  `${op.slow_host} ${fmt(slow / data.unit_ns)}`),
               el('td', {class: 'num'}, '\u00d7' + (slow / Math.max(fast, 1)).toFixed(2)));
    // From the fastest to the slowest or 25% slower, whichever is further: hosts a few percent
    // apart stay together.
    const span = Math.max(slow, 1.25 * fast) - fast || 1;
    const strip = el('div', {class: 'strip'});
    op.points.forEach((v, k) => {
      const last = k === op.points.length - 1;
      const who = op.point_hosts ? op.point_hosts[k] : `p${Math.round(100 * k / (op.points.length - 1))} of ${op.hosts} hosts`;
      const dot = el('span', {class: last ? 'slowest' : '', title: `${who}: ${fmt(v / data.unit_ns)} per call`});
      dot.style.left = percent(v - fast, span);
      strip.append(dot);
    });
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

// Where a host has no value (no such step, no collective entry).
constexpr int64_t kNone = std::numeric_limits<int64_t>::min();

// The value at `fraction` of `sorted` (0: the smallest, 1: the largest); kNone when empty.
int64_t At(const std::vector<int64_t>& sorted, double fraction) {
  if (sorted.empty()) return kNone;
  const size_t index =
      static_cast<size_t>(std::lround(fraction * static_cast<double>(sorted.size() - 1)));
  return sorted[std::min(index, sorted.size() - 1)];
}

// The bands that stand for the hosts without a row of their own, per step, top to bottom.
struct BandSpec {
  const char* label;
  double fraction;
};
constexpr BandSpec kBands[] = {{"max", 1.0}, {"p99", 0.99}, {"p90", 0.9},
                               {"p50", 0.5}, {"p10", 0.1},  {"min", 0.0}};

// What the page shows, worked out from the packed hosts a few at a time: at no point more than
// one host's steps and a number or two per host and step.
struct Page {
  // Every step number any host has (the columns), and per column the earliest start on the
  // common clock, the median host's collective entry and the entries' spread (kNone, -1: none).
  std::vector<int64_t> numbers;
  std::vector<int64_t> earliest_ns;
  std::vector<int64_t> median_entry_ns;
  std::vector<int64_t> spread_ns;
  size_t focus = 0;
  // Hosts with a row of their own (indexes into report.runs), in the order shown.
  std::vector<size_t> shown;
  // The others: how many, and per band and column their step time and lateness.
  size_t others = 0;
  std::vector<std::vector<int64_t>> band_time_ns, band_lateness_ns;  // [band][column]
  // Per column, the others' first start, last end, and collective entries' p10, p50, p90.
  std::vector<int64_t> others_start_ns, others_end_ns, others_entry_p10_ns, others_entry_p50_ns,
      others_entry_p90_ns;
  std::vector<int64_t> others_parts;  // their mean breakdown, in units
  // Lateness as the default view: steps were compared and step times are alike on every host.
  bool lateness_first = false;
};

size_t ColumnOf(const std::vector<int64_t>& numbers, int64_t step) {
  return static_cast<size_t>(std::lower_bound(numbers.begin(), numbers.end(), step) -
                             numbers.begin());
}

// A host's breakdown summed over `numbers` (all its steps when empty), in the page's order:
// input, compute, GPU idle, host idle, collective. In ns.
std::vector<int64_t> BreakdownTotals(const std::vector<StepDigest>& steps, bool has_device,
                                     const std::vector<int64_t>& numbers) {
  std::vector<int64_t> totals(5, 0);
  for (const StepDigest& step : steps) {
    if (!numbers.empty() && !std::binary_search(numbers.begin(), numbers.end(), step.step)) {
      continue;
    }
    const StepBreakdown parts = BreakDownStep(step, has_device);
    const int64_t values[] = {parts.input_ns, parts.compute_ns, parts.gpu_idle_ns,
                              parts.host_idle_ns, parts.collective_ns};
    for (size_t k = 0; k < totals.size(); ++k) totals[k] = SaturatingAdd(totals[k], values[k]);
  }
  return totals;
}

// The hosts shown: every one in a small run, in the report's order (natural order of names);
// else the worst, worst first.
void ChooseHosts(const RunReport& report, Page& page) {
  const size_t hosts = report.runs.size();
  if (hosts <= kPageAllHostsUpTo) {
    for (size_t h = 0; h < hosts; ++h) page.shown.push_back(h);
    return;
  }
  const std::vector<size_t> worst = HostsWorstFirst(report.analysis);
  page.shown.assign(worst.begin(), worst.begin() + static_cast<ptrdiff_t>(kPageWorstHosts));
  page.others = hosts - kPageWorstHosts;
}

// The columns: the union of the hosts' step numbers.
void SetColumns(const std::vector<ReportHost>& hosts, Page& page) {
  std::vector<StepDigest> steps;
  std::vector<int64_t> numbers, both;
  for (const ReportHost& host : hosts) {
    host.steps.Unpack(&steps);
    numbers.clear();
    for (const StepDigest& step : steps) numbers.push_back(step.step);
    std::sort(numbers.begin(), numbers.end());
    both.clear();
    std::set_union(page.numbers.begin(), page.numbers.end(), numbers.begin(), numbers.end(),
                   std::back_inserter(both));
    both.erase(std::unique(both.begin(), both.end()), both.end());
    page.numbers.swap(both);
  }
}

// Per column, the samples the page's figures come from.
struct ColumnSamples {
  std::vector<std::vector<int64_t>> others_entries;  // collective entries, common clock
  std::vector<std::vector<int64_t>> shown_entries;
  std::vector<std::vector<int64_t>> others_times;  // step times
};

// Per column: every host's collective entry on the common clock (the shown hosts' apart), the
// others' step times, the earliest start and the others' span; and the others' mean breakdown.
ColumnSamples CollectColumns(const RunReport& report, const std::vector<bool>& is_shown,
                             Page& page) {
  const std::vector<ReportHost>& hosts = report.runs;
  const size_t m = page.numbers.size();
  ColumnSamples samples{std::vector<std::vector<int64_t>>(m), std::vector<std::vector<int64_t>>(m),
                        std::vector<std::vector<int64_t>>(m)};
  page.earliest_ns.assign(m, std::numeric_limits<int64_t>::max());
  page.others_start_ns.assign(m, kNone);
  page.others_end_ns.assign(m, kNone);
  std::vector<double> parts_sum(5, 0);
  std::vector<StepDigest> steps;
  for (size_t h = 0; h < hosts.size(); ++h) {
    const ReportHost& host = hosts[h];
    host.steps.Unpack(&steps);
    for (const StepDigest& step : steps) {
      const size_t column = ColumnOf(page.numbers, step.step);
      const int64_t start = SaturatingSub(step.start_ns, host.clock_offset_ns);
      page.earliest_ns[column] = std::min(page.earliest_ns[column], start);
      const int64_t entry = step.collective_entry_ns == 0
                                ? kNone
                                : SaturatingSub(step.collective_entry_ns, host.clock_offset_ns);
      if (is_shown[h]) {
        if (entry != kNone) samples.shown_entries[column].push_back(entry);
        continue;
      }
      if (entry != kNone) samples.others_entries[column].push_back(entry);
      samples.others_times[column].push_back(step.duration_ns());
      const int64_t end = SaturatingSub(step.end_ns, host.clock_offset_ns);
      int64_t& first = page.others_start_ns[column];
      int64_t& last = page.others_end_ns[column];
      first = first == kNone ? start : std::min(first, start);
      last = last == kNone ? end : std::max(last, end);
    }
    if (!is_shown[h]) {
      const std::vector<int64_t> totals =
          BreakdownTotals(steps, host.has_device, report.analysis.compared_step_numbers);
      for (size_t k = 0; k < totals.size(); ++k) parts_sum[k] += static_cast<double>(totals[k]);
    }
  }
  for (double sum : parts_sum) {
    page.others_parts.push_back(
        page.others > 0 ? Units(static_cast<int64_t>(sum / static_cast<double>(page.others))) : 0);
  }
  return samples;
}

// Per column: the median entry (lateness is measured from it, as in the verdict), the spread,
// and the others' bands. The samples are let go column by column.
void SummarizeColumns(ColumnSamples& samples, Page& page) {
  const size_t m = page.numbers.size();
  page.median_entry_ns.assign(m, kNone);
  page.spread_ns.assign(m, -1);
  page.band_time_ns.assign(std::size(kBands), std::vector<int64_t>(m, kNone));
  page.band_lateness_ns.assign(std::size(kBands), std::vector<int64_t>(m, kNone));
  page.others_entry_p10_ns.assign(m, kNone);
  page.others_entry_p50_ns.assign(m, kNone);
  page.others_entry_p90_ns.assign(m, kNone);
  std::vector<int64_t> all;
  for (size_t j = 0; j < m; ++j) {
    std::vector<int64_t>& entries = samples.others_entries[j];
    std::vector<int64_t>& times = samples.others_times[j];
    std::sort(entries.begin(), entries.end());
    all = entries;
    all.insert(all.end(), samples.shown_entries[j].begin(), samples.shown_entries[j].end());
    if (!all.empty()) {
      const size_t middle = (all.size() - 1) / 2;
      std::nth_element(all.begin(), all.begin() + static_cast<ptrdiff_t>(middle), all.end());
      page.median_entry_ns[j] = all[middle];
      const auto [first, last] = std::minmax_element(all.begin(), all.end());
      page.spread_ns[j] = SaturatingSub(*last, *first);
    }
    std::sort(times.begin(), times.end());
    for (size_t b = 0; b < std::size(kBands); ++b) {
      page.band_time_ns[b][j] = At(times, kBands[b].fraction);
      const int64_t entry = At(entries, kBands[b].fraction);
      if (entry != kNone) {
        page.band_lateness_ns[b][j] = SaturatingSub(entry, page.median_entry_ns[j]);
      }
    }
    page.others_entry_p10_ns[j] = At(entries, 0.1);
    page.others_entry_p50_ns[j] = At(entries, 0.5);
    page.others_entry_p90_ns[j] = At(entries, 0.9);
    std::vector<int64_t>().swap(entries);
    std::vector<int64_t>().swap(times);
  }
}

// The focus: the compared step whose entries are furthest apart (the first column when none was
// compared); and whether the hosts' step times are alike (their medians within the rule's share
// of each other), so that lateness is shown first.
void SetFocus(const Analysis& a, Page& page) {
  int64_t widest = -1;
  for (int64_t number : a.compared_step_numbers) {
    const size_t column = ColumnOf(page.numbers, number);
    if (column < page.numbers.size() && page.spread_ns[column] > widest) {
      widest = page.spread_ns[column];
      page.focus = column;
    }
  }
  if (a.compared_steps > 0 && !a.hosts.empty()) {
    int64_t low = std::numeric_limits<int64_t>::max();
    int64_t high = 0;
    for (const HostVerdict& verdict : a.hosts) {
      low = std::min(low, verdict.step_p50_ns);
      high = std::max(high, verdict.step_p50_ns);
    }
    page.lateness_first =
        static_cast<double>(high - low) <=
        StragglerRule().step_fraction * static_cast<double>(std::max<int64_t>(low, 1));
  }
}

Page Lay(const RunReport& report) {
  Page page;
  ChooseHosts(report, page);
  std::vector<bool> is_shown(report.runs.size(), false);
  for (size_t h : page.shown) is_shown[h] = true;
  SetColumns(report.runs, page);
  ColumnSamples samples = CollectColumns(report, is_shown, page);
  SummarizeColumns(samples, page);
  SetFocus(report.analysis, page);
  return page;
}

std::optional<std::regex> CompileOrNothing(const std::string& pattern) {
  try {
    return std::regex(pattern, std::regex::ECMAScript | std::regex::icase);
  } catch (const std::regex_error&) {
    return std::nullopt;  // the digest already refused such a pattern
  }
}

struct OpRow {
  uint32_t name = 0;
  bool device = false;
  std::vector<std::pair<int64_t, size_t>> means;  // (mean ns per call, host), ascending
  double ratio = 1;                               // the slowest mean over the fastest
};

// Ops on two hosts or more, those whose per-call mean differs most across hosts first.
// Collectives and input waits are left out: their time is mostly waiting, on the other hosts
// or on the input pipeline, which the verdict measures directly.
std::vector<OpRow> OpSpread(const RunReport& report) {
  const std::optional<std::regex> collective = CompileOrNothing(report.options.collective_pattern);
  const std::optional<std::regex> input = CompileOrNothing(report.options.input_pattern);
  // Each name is matched once, however many hosts have it.
  std::vector<int8_t> waits(report.op_names.size(), -1);
  auto is_wait = [&](uint32_t name) {
    if (waits[name] < 0) {
      const std::string& text = report.op_names[name];
      waits[name] = (collective && std::regex_search(text, *collective)) ||
                    (input && std::regex_search(text, *input));
    }
    return waits[name] == 1;
  };
  std::map<std::pair<bool, uint32_t>, std::vector<std::pair<int64_t, size_t>>> means;
  for (size_t h = 0; h < report.runs.size(); ++h) {
    for (const ReportOp& op : report.runs[h].top_ops) {
      if (op.count <= 0 || is_wait(op.name)) continue;
      means[{op.device, op.name}].push_back({op.total_ns / op.count, h});
    }
  }
  std::vector<OpRow> rows;
  for (auto& [key, mean] : means) {
    if (mean.size() < 2) continue;
    std::sort(mean.begin(), mean.end());
    const double ratio = static_cast<double>(mean.back().first) /
                         static_cast<double>(std::max<int64_t>(mean.front().first, 1));
    rows.push_back({key.second, key.first, std::move(mean), ratio});
  }
  std::sort(rows.begin(), rows.end(), [&](const OpRow& a, const OpRow& b) {
    return a.ratio != b.ratio ? a.ratio > b.ratio
                              : report.op_names[a.name] < report.op_names[b.name];
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
// In units, null where there is no value; each measured from origins[j] when given (its column's
// earliest start).
void UnitsArray(JsonWriter& json, std::string_view key, const std::vector<int64_t>& values,
                const std::vector<int64_t>* origins = nullptr) {
  json.Key(key);
  json.Open('[');
  for (size_t j = 0; j < values.size(); ++j) {
    if (values[j] == kNone) {
      json.Null();
    } else {
      json.Int(Units(origins == nullptr ? values[j] : SaturatingSub(values[j], (*origins)[j])));
    }
  }
  json.Close(']');
}

// One host shown: its verdict, its steps by column (in units; a step it lacks has d = -1, a step
// without a collective e = -1 and l = null), and its breakdown totals.
void WriteHost(JsonWriter& json, const HostVerdict& verdict, const ReportHost& host,
               const Page& page, const std::vector<int64_t>& breakdown_steps) {
  std::vector<StepDigest> steps = host.steps.Unpack();
  const size_t m = page.numbers.size();
  std::vector<int64_t> s(m, 0), d(m, -1), e(m, -1), l(m, kNone), i(m, 0), c(m, 0), g(m, 0), k(m, 0);
  for (const StepDigest& step : steps) {
    const size_t j = ColumnOf(page.numbers, step.step);
    s[j] = Units(
        SaturatingSub(SaturatingSub(step.start_ns, host.clock_offset_ns), page.earliest_ns[j]));
    d[j] = Units(step.duration_ns());
    if (step.collective_entry_ns != 0) {
      e[j] = Units(SaturatingSub(step.collective_entry_ns, step.start_ns));
      l[j] = SaturatingSub(SaturatingSub(step.collective_entry_ns, host.clock_offset_ns),
                           page.median_entry_ns[j]);
    }
    const StepBreakdown parts = BreakDownStep(step, host.has_device);
    i[j] = Units(parts.input_ns);
    c[j] = Units(parts.compute_ns);
    g[j] = Units(parts.gpu_idle_ns);
    k[j] = Units(parts.collective_ns);
  }
  std::vector<int64_t> totals = BreakdownTotals(steps, host.has_device, breakdown_steps);
  for (int64_t& total : totals) total = Units(total);
  json.Open('{');
  json.Field("name", verdict.host);
  json.Field("p50_ns", verdict.step_p50_ns);
  json.Field("straggler", verdict.straggler);
  IntArray(json, "s", s);
  IntArray(json, "d", d);
  IntArray(json, "e", e);
  UnitsArray(json, "l", l);
  IntArray(json, "i", i);
  IntArray(json, "c", c);
  IntArray(json, "g", g);
  IntArray(json, "k", k);
  IntArray(json, "parts", totals);
  json.Close('}');
}

void WriteOthers(JsonWriter& json, const Page& page) {
  json.Open('{');
  json.Field("count", static_cast<int64_t>(page.others));
  json.Key("bands");
  json.Open('[');
  for (size_t b = 0; b < std::size(kBands); ++b) {
    json.Open('{');
    json.Field("label", std::string_view(kBands[b].label));
    UnitsArray(json, "d", page.band_time_ns[b]);
    UnitsArray(json, "l", page.band_lateness_ns[b]);
    json.Close('}');
  }
  json.Close(']');
  UnitsArray(json, "start", page.others_start_ns, &page.earliest_ns);
  UnitsArray(json, "end", page.others_end_ns, &page.earliest_ns);
  UnitsArray(json, "entry_p10", page.others_entry_p10_ns, &page.earliest_ns);
  UnitsArray(json, "entry_p50", page.others_entry_p50_ns, &page.earliest_ns);
  UnitsArray(json, "entry_p90", page.others_entry_p90_ns, &page.earliest_ns);
  IntArray(json, "parts", page.others_parts);
  json.Close('}');
}

// The page's data. `<` is written as \u003c: inside a script element, "</script" or "<!--"
// in a name would otherwise end the element or change how the browser reads it.
std::string DataJson(const RunReport& report) {
  const Page page = Lay(report);
  int64_t base = std::numeric_limits<int64_t>::max();
  for (int64_t earliest : page.earliest_ns) base = std::min(base, earliest);
  std::vector<int64_t> t;
  for (int64_t earliest : page.earliest_ns) t.push_back(Units(SaturatingSub(earliest, base)));
  std::vector<int64_t> spread;
  for (int64_t ns : page.spread_ns) spread.push_back(ns < 0 ? -1 : Units(ns));

  std::string out;
  JsonWriter json(&out);
  json.Open('{');
  json.Field("unit_ns", kUnitNs);
  IntArray(json, "steps", page.numbers);
  IntArray(json, "t", t);
  IntArray(json, "spread", spread);
  json.Field("focus", static_cast<int64_t>(page.focus));
  json.Field("default_metric", std::string_view(page.lateness_first ? "lateness" : "time"));
  json.Field("hosts_total", static_cast<int64_t>(report.runs.size()));
  json.Key("hosts");
  json.Open('[');
  for (size_t h : page.shown) {
    WriteHost(json, report.analysis.hosts[h], report.runs[h], page,
              report.analysis.compared_step_numbers);
  }
  json.Close(']');
  json.Key("rest");
  if (page.others > 0) {
    WriteOthers(json, page);
  } else {
    json.Null();
  }
  json.Key("ops");
  json.Open('[');
  const bool every_host = page.others == 0;
  for (const OpRow& op : OpSpread(report)) {
    const auto& [fast_ns, fast_host] = op.means.front();
    const auto& [slow_ns, slow_host] = op.means.back();
    json.Open('{');
    json.Field("name", report.op_names[op.name]);
    json.Field("device", op.device);
    json.Field("hosts", static_cast<int64_t>(op.means.size()));
    json.Field("fast_host", report.runs[fast_host].host);
    json.Field("fast_ns", fast_ns);
    json.Field("median_ns", op.means[(op.means.size() - 1) / 2].first);
    json.Field("slow_host", report.runs[slow_host].host);
    json.Field("slow_ns", slow_ns);
    json.Field("slow_straggler", report.analysis.hosts[slow_host].straggler);
    // The strip: every host's mean in a small run; else the means' percentiles, every fifth.
    std::vector<int64_t> points;
    if (every_host) {
      for (const auto& [mean, host] : op.means) points.push_back(mean);
    } else {
      std::vector<int64_t> sorted;
      for (const auto& [mean, host] : op.means) sorted.push_back(mean);
      for (int p = 0; p <= 100; p += 5) points.push_back(At(sorted, p / 100.0));
    }
    IntArray(json, "points", points);
    if (every_host) {
      json.Key("point_hosts");
      json.Open('[');
      for (const auto& [mean, host] : op.means) json.String(report.runs[host].host);
      json.Close(']');
    }
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
    for (size_t i = 0; i < a.left_out.size() && i < kPageListed; ++i) {
      StrAppend(out, "<li>left out: ", Html(a.left_out[i]), "</li>\n");
    }
    if (a.left_out.size() > kPageListed) {
      StrAppend(out, "<li>left out: ", a.left_out.size() - kPageListed,
                " more (the JSON report lists them)</li>\n");
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
    for (size_t i = 0; i < stragglers.size() && i < kPageListed; ++i) {
      const HostVerdict* host = stragglers[i];
      StrAppend(out, "<li data-host=\"", Html(host->host), "\"><span class=\"host\">",
                Html(host->host), "</span> <span class=\"cause\">", Html(CauseName(host->cause)),
                "</span> <span class=\"evidence\">", Html(host->evidence), "</span></li>\n");
    }
    if (stragglers.size() > kPageListed) {
      StrAppend(out, "<li>and ", stragglers.size() - kPageListed,
                " more (the JSON report lists them)</li>\n");
    }
    out->append("</ul>\n");
  }
  if (!a.left_out.empty()) {
    out->append("<p>Not analyzed: ");
    for (size_t i = 0; i < a.left_out.size() && i < kPageListed; ++i) {
      const std::string_view left = a.left_out[i];
      StrAppend(out, i == 0 ? "" : "; ", Html(left.substr(0, left.find(':'))));
    }
    if (a.left_out.size() > kPageListed) {
      StrAppend(out, " and ", a.left_out.size() - kPageListed, " more");
    }
    out->append(" (why: above).</p>\n");
  }
  out->append("</section>\n");
}

constexpr std::string_view kHeatmapSection =
    R"(<noscript><p>The charts below need JavaScript.</p></noscript>
<section>
<h2>Step time, host by step</h2>
<p class="explain">One row per host, one column per step; with many hosts, the worst (by lateness) and then, as bands, the others' maximum, percentiles and minimum per step. In a job whose hosts meet in collectives, step times are alike on every host; a slow host shows in its lateness into the collective: its entry minus the median host's, as the verdict measures it (the default view when step times are alike).</p>
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
