#!/usr/bin/env python3
"""Opens an HTML report of `clusterprof report --html` in headless Chromium and checks it.

Chromium is driven over the DevTools protocol on a pipe (--remote-debugging-pipe: no port, no
third-party module). The page is loaded from its file; every console message, uncaught exception,
browser log entry and network request is recorded while it loads and draws. It fails when there
is a console error, an exception, or any request other than the page's own file, and when an
--expect-* check does not hold. It prints one JSON line with what it saw, including the paint
timings (first contentful paint; the first frame after the load event, when every chart is drawn)
that bench/report_html.sh reports.

  report_html_browser.py report.html --expect-straggler host-4 --expect-rows 6 \\
      --expect-slowest host-4 --screenshot report.png

Exit status: 0 when every check holds, 1 when one does not, 77 when no Chromium is installed
(scripts/install-deps installs Debian's chromium), 2 on a usage error.
"""

import argparse
import base64
import fcntl
import json
import os
import pathlib
import select
import shutil
import subprocess
import sys
import tempfile
import time

SKIP = 77
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# What the page shows, read from its DOM once it is drawn.
FACTS = """(() => {
  const callout = document.getElementById('straggler-callout');
  const rows = [...document.querySelectorAll('#heatmap .hm-row[data-host]')];
  const op = document.querySelector('#ops tbody tr[data-slowest]');
  return {
    callout_class: callout ? callout.className : null,
    callout_text: callout ? callout.textContent.replace(/\\s+/g, ' ').trim() : null,
    heatmap_rows: rows.map(r => ({host: r.dataset.host, p50_ns: Number(r.dataset.p50Ns)})),
    heatmap_bands: [...document.querySelectorAll('#heatmap .hm-band')].map(r => r.dataset.band),
    heatmap_metric: (document.getElementById('heatmap-metric') || {}).value || null,
    breakdown_rows: document.querySelectorAll('#breakdown .row[data-host]').length,
    breakdown_bands: document.querySelectorAll('#breakdown .row[data-band]').length,
    swimlanes: document.querySelectorAll('#swimlanes .lane[data-host]').length,
    swimlane_bands: document.querySelectorAll('#swimlanes .lane[data-band]').length,
    top_op: op ? {name: op.dataset.op, slowest: op.dataset.slowest} : null,
    ops: document.querySelectorAll('#ops tbody tr[data-op]').length,
    height: document.documentElement.scrollHeight,
  };
})()"""

# Installed before the page loads: the time of the second frame after the load event (the page's
# script has drawn every chart by then: it runs before the load event), on the page's clock.
MARK_DRAWN = """addEventListener('load', () => requestAnimationFrame(() => requestAnimationFrame(() => {
  window.__clusterprofDrawnMs = performance.now();
})));"""

# Paint timings arrive a little after the frame they describe: wait for them (10 s at most).
TIMINGS = """new Promise(done => {
  const asked = performance.now();
  (function poll() {
    const fcp = performance.getEntriesByName('first-contentful-paint')[0];
    const drawn = window.__clusterprofDrawnMs;
    if ((fcp && drawn !== undefined) || performance.now() - asked > 10000) {
      const nav = performance.getEntriesByType('navigation')[0];
      done({first_contentful_paint_ms: fcp ? fcp.startTime : null,
            dom_content_loaded_ms: nav ? nav.domContentLoadedEventEnd : null,
            load_event_end_ms: nav ? nav.loadEventEnd : null,
            drawn_frame_ms: drawn === undefined ? null : drawn});
    } else {
      setTimeout(poll, 10);
    }
  })();
})"""


class DevTools:
    """A DevTools protocol client over Chromium's pipe: fd 3 carries commands to the browser,
    fd 4 its answers and events, each message JSON ended by a NUL byte."""

    def __init__(self, browser, work_dir):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def wire_fds():
            # Through fds above 4 first: either pipe end may itself be fd 3 or 4, and dup2 of
            # an fd onto itself would leave it close-on-exec.
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser_r, from_browser_w)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        args = [browser, "--headless=new", "--remote-debugging-pipe",
                f"--user-data-dir={work_dir}/profile", "--no-first-run",
                "--no-default-browser-check", "--disable-gpu", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-default-apps", "--hide-scrollbars",
                "--mute-audio", "about:blank",
                # The page is our own file; the sandbox refuses root, and containers often lack
                # the namespaces it needs.
                "--no-sandbox"]
        # Its log goes to a file: a pipe nobody reads while it talks could fill and stall it.
        self._log = pathlib.Path(work_dir, "chromium.log")
        with self._log.open("wb") as log:
            self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=log, preexec_fn=wire_fds, close_fds=False)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events = []

    def call(self, method, params=None, session=None, timeout=60):
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_for(self, method, timeout=60):
        for event in self.events:
            if event["method"] == method:
                return event
        deadline = time.monotonic() + timeout
        while True:
            event = self._read(deadline)
            if "method" in event:
                self.events.append(event)
                if event["method"] == method:
                    return event

    def _read(self, deadline):
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium exited: " +
                                   self._log.read_text(errors="replace")[-2000:])
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self):
        try:
            self.call("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)


def evaluate(devtools, session, expression):
    result = devtools.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True}, session)
    if "exceptionDetails" in result:
        raise RuntimeError(f"evaluating a check threw: {result['exceptionDetails']}")
    return result["result"]["value"]


def open_page(browser, page, width, screenshot):
    """Loads `page` and returns what was seen: problems, requests, timings, DOM facts."""
    url = page.resolve().as_uri()
    with tempfile.TemporaryDirectory() as work_dir:
        devtools = DevTools(browser, work_dir)
        try:
            target = devtools.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = devtools.call("Target.attachToTarget",
                                    {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                devtools.call(f"{domain}.enable", session=session)
            devtools.call("Emulation.setDeviceMetricsOverride",
                          {"width": width, "height": 900, "deviceScaleFactor": 1,
                           "mobile": False}, session)
            devtools.call("Page.addScriptToEvaluateOnNewDocument", {"source": MARK_DRAWN},
                          session)
            devtools.call("Page.navigate", {"url": url}, session)
            devtools.wait_for("Page.loadEventFired")
            timings = evaluate(devtools, session, TIMINGS)
            facts = evaluate(devtools, session, FACTS)
            if screenshot:
                devtools.call("Emulation.setDeviceMetricsOverride",
                              {"width": width, "height": facts["height"],
                               "deviceScaleFactor": 1, "mobile": False}, session)
                png = devtools.call("Page.captureScreenshot", {"format": "png"}, session)
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                screenshot.write_bytes(base64.b64decode(png["data"]))
        finally:
            devtools.close()
    problems, requests = [], []
    for event in devtools.events:
        method, params = event["method"], event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert",
                                                                       "warning"):
            problems.append("console " + params["type"] + ": " + " ".join(
                str(arg.get("value", arg.get("description", ""))) for arg in params["args"]))
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            problems.append("exception: " + details.get("exception", {}).get(
                "description", details.get("text", "")))
        elif method == "Log.entryAdded" and params["entry"]["level"] in ("error", "warning"):
            problems.append("log " + params["entry"]["level"] + ": " + params["entry"]["text"])
        elif method == "Network.requestWillBeSent":
            requests.append(params["request"]["url"])
    foreign = [r for r in requests if r != url and not r.startswith("data:")]
    return {"page": str(page), "bytes": page.stat().st_size, "problems": problems,
            "requests": requests, "foreign_requests": foreign, "timings": timings,
            "facts": facts}


def check(seen, args):
    """The failed checks, in words."""
    failed = list(seen["problems"])
    failed += [f"network request: {r}" for r in seen["foreign_requests"]]
    facts = seen["facts"]
    rows = facts["heatmap_rows"]
    if args.expect_rows is not None:
        for what in ("heatmap_rows", "breakdown_rows", "swimlanes"):
            count = len(rows) if what == "heatmap_rows" else facts[what]
            if count != args.expect_rows:
                failed.append(f"{what}: {count}, expected {args.expect_rows}")
    if any(not r["host"] or not r["p50_ns"] > 0 for r in rows):
        failed.append("a heatmap row without its host or p50")
    if args.expect_bands is not None:
        bands = len(facts["heatmap_bands"])
        if bands != args.expect_bands:
            failed.append(f"heatmap bands: {bands}, expected {args.expect_bands}")
        others = 1 if args.expect_bands else 0
        for what in ("breakdown_bands", "swimlane_bands"):
            if facts[what] != others:
                failed.append(f"{what}: {facts[what]}, expected {others}")
    if args.expect_first_row and (not rows or rows[0]["host"] != args.expect_first_row):
        failed.append(f"the heatmap's first row is {rows[0]['host'] if rows else None}, "
                      f"expected {args.expect_first_row}")
    if args.expect_metric and facts["heatmap_metric"] != args.expect_metric:
        failed.append(f"the heatmap shows {facts['heatmap_metric']}, expected {args.expect_metric}")
    if args.expect_straggler:
        if "straggler" not in (facts["callout_class"] or "").split() or \
                args.expect_straggler not in (facts["callout_text"] or ""):
            failed.append(f"the callout does not name {args.expect_straggler}: "
                          f"{facts['callout_text']!r}")
    if args.expect_slowest:
        top = facts["top_op"] or {}
        if top.get("slowest") != args.expect_slowest:
            failed.append(f"the top op's slowest host is {top.get('slowest')}, expected "
                          f"{args.expect_slowest}")
    return failed


def find_browser():
    named = os.environ.get("CLUSTERPROF_CHROMIUM")
    if named:
        return named
    for name in BROWSERS:
        if shutil.which(name):
            return shutil.which(name)
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("page", type=pathlib.Path, help="the HTML report")
    parser.add_argument("--screenshot", type=pathlib.Path, help="save the whole page as PNG")
    parser.add_argument("--width", type=int, default=1400, help="viewport width in CSS pixels")
    parser.add_argument("--expect-straggler", help="a host the callout must name")
    parser.add_argument("--expect-rows", type=int,
                        help="host rows of the heatmap, breakdown and swimlanes (bands apart)")
    parser.add_argument("--expect-slowest", help="the top op's slowest host")
    parser.add_argument("--expect-bands", type=int,
                        help="percentile bands of the heatmap (0: every host has its row); with "
                             "bands, one row for the others in the breakdown and the swimlanes")
    parser.add_argument("--expect-first-row", help="the host of the heatmap's first row")
    parser.add_argument("--expect-metric", help="the heatmap's view as loaded (time, lateness)")
    args = parser.parse_args()
    browser = find_browser()
    if not browser:
        print("SKIP: no Chromium (chromium, google-chrome) on PATH and CLUSTERPROF_CHROMIUM "
              "unset; scripts/install-deps installs Debian's chromium", file=sys.stderr)
        return SKIP
    if not args.page.is_file():
        print(f"report_html_browser.py: no such file: {args.page}", file=sys.stderr)
        return 2
    seen = open_page(browser, args.page, args.width, args.screenshot)
    facts = seen["facts"]
    print(json.dumps({**seen, "facts": {**facts, "heatmap_rows": len(facts["heatmap_rows"]),
                                        "first_row": (facts["heatmap_rows"] or [{}])[0].get("host")}}))
    failed = check(seen, args)
    for failure in failed:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
