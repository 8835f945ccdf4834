// The HTML report: a page that fetches nothing, escapes the names it shows, carries data that
// parses back, and names the straggler. tests/analysis/report_html_browser_integration_test.sh
// opens it in a real browser.
#include "analysis/report_html.h"

#include <cstdlib>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "analysis/digest.h"
#include "analysis/report.h"
#include "cpprest/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/analysis/synthetic_run.h"

namespace clusterprof::analysis {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// The report of a synthetic run, its hosts named by `names` (host-N where empty), each with
// `extra_op` among its top ops when given.
RunReport ReportOf(const testing::RunSpec& spec, std::vector<std::string> names = {},
                   const std::optional<OpStat>& extra_op = std::nullopt) {
  const std::vector<tensorflow::profiler::XSpace> spaces = testing::MakeRun(spec);
  std::vector<HostRun> runs;
  for (size_t h = 0; h < spaces.size(); ++h) {
    const std::string name = h < names.size() ? names[h] : StrCat("host-", h);
    absl::StatusOr<HostDigest> digest = DigestXSpace(spaces[h], name);
    EXPECT_TRUE(digest.ok()) << digest.status();
    if (extra_op) digest->top_ops.push_back(*extra_op);
    runs.push_back({*std::move(digest), spec.hosts[h].clock_offset_ns});
  }
  return MakeRunReport("/logs/plugins/profile/run-1", {}, std::move(runs), {}, true);
}

testing::RunSpec SixHostsOneSlower(double scale) {
  testing::RunSpec spec;
  spec.hosts.resize(6);
  spec.hosts[4].compute_scale = scale;
  for (size_t h = 0; h < spec.hosts.size(); ++h) {
    spec.hosts[h].clock_offset_ns = (h % 2 == 0 ? 3 : -3) * 1'000'000;
  }
  return spec;
}

// The page's JSON element, parsed.
web::json::value Data(const std::string& html) {
  const std::string open = "<script type=\"application/json\" id=\"report-data\">";
  const size_t start = html.find(open);
  EXPECT_NE(start, std::string::npos);
  const size_t end = html.find("</script>", start);
  EXPECT_NE(end, std::string::npos);
  return web::json::value::parse(html.substr(start + open.size(), end - start - open.size()));
}

// The element with id="straggler-callout", as markup.
std::string Callout(const std::string& html) {
  const size_t start = html.find("id=\"straggler-callout\"");
  EXPECT_NE(start, std::string::npos);
  return html.substr(start, html.find("</section>", start) - start);
}

TEST(ReportHtmlTest, FetchesNothing) {
  const std::string html = ReportHtml(ReportOf(SixHostsOneSlower(1.3)));
  EXPECT_THAT(html, Not(HasSubstr("http://")));
  EXPECT_THAT(html, Not(HasSubstr("https://")));
  EXPECT_THAT(html, Not(HasSubstr("url(")));
  EXPECT_THAT(html, Not(HasSubstr("@import")));
  EXPECT_THAT(html, HasSubstr("<link rel=\"icon\" href=\"data:,\">"));
  EXPECT_THAT(html, HasSubstr("Content-Security-Policy\" content=\"default-src 'none'"));
  const std::regex link(R"re(\b(src|href)\s*=\s*["']?([^"'\s>]*))re", std::regex::icase);
  int links = 0;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), link); it != std::sregex_iterator();
       ++it) {
    ++links;
    const std::string target = (*it)[2];
    EXPECT_TRUE(target.starts_with("data:") || target.starts_with("#")) << it->str();
  }
  EXPECT_EQ(links, 1) << "the favicon only";
}

TEST(ReportHtmlTest, TheCalloutNamesTheStragglerWithItsCauseAndEvidence) {
  const RunReport report = ReportOf(SixHostsOneSlower(1.3));
  ASSERT_EQ(report.analysis.stragglers().size(), 1u);
  const std::string callout = Callout(ReportHtml(report));
  EXPECT_THAT(callout, HasSubstr("class=\"callout straggler\""));
  EXPECT_THAT(callout, HasSubstr("<span class=\"host\">host-4</span>"));
  EXPECT_THAT(callout, HasSubstr("<span class=\"cause\">compute</span>"));
  EXPECT_THAT(callout, HasSubstr(report.analysis.hosts[4].evidence));
  EXPECT_THAT(callout, Not(HasSubstr("host-3")));
}

TEST(ReportHtmlTest, WithoutAStragglerTheCalloutSaysSoAndListsTheHostsLeftOut) {
  testing::RunSpec spec;
  spec.hosts.resize(4);
  RunReport report = ReportOf(spec);
  report.analysis.left_out.push_back("host-9: unreadable: truncated file");
  const std::string html = ReportHtml(report);
  const std::string callout = Callout(html);
  EXPECT_THAT(callout, HasSubstr("class=\"callout no-straggler\""));
  EXPECT_THAT(callout, HasSubstr("No straggler"));
  EXPECT_THAT(callout, HasSubstr("in half of the 50 steps compared"));
  EXPECT_THAT(callout, HasSubstr("Not analyzed: host-9"));
  EXPECT_THAT(html, HasSubstr("<li>left out: host-9: unreadable: truncated file</li>"));
  EXPECT_THAT(html, HasSubstr("4 hosts analyzed &middot; steps 100&ndash;149 in common (50)"));
}

TEST(ReportHtmlTest, WithNothingComparedTheCalloutGivesNoVerdict) {
  testing::RunSpec spec;
  spec.hosts.resize(1);
  const std::string callout = Callout(ReportHtml(ReportOf(spec)));
  EXPECT_THAT(callout, HasSubstr("class=\"callout no-verdict\""));
  EXPECT_THAT(callout, HasSubstr("no straggler can be named"));
}

TEST(ReportHtmlTest, NamesCannotInjectMarkup) {
  testing::RunSpec spec = SixHostsOneSlower(1.3);
  const std::string evil_host = "<script>alert(1)</script>";
  const std::string evil_op = "</script><!--<script>op\" onload='x'";
  const RunReport report = ReportOf(spec, {"host-0", "host-1", "host-2", "host-3", evil_host},
                                    OpStat{evil_op, true, 10, 10'000'000});
  const std::string html = ReportHtml(report);
  EXPECT_THAT(html, Not(HasSubstr("<script>alert")));
  EXPECT_THAT(html, Not(HasSubstr("<!--")));
  EXPECT_THAT(html, HasSubstr("<span class=\"host\">&lt;script&gt;alert(1)&lt;/script&gt;</span>"));
  // Two script elements, both ours: the data and the code.
  size_t scripts = 0;
  for (size_t at = html.find("<script"); at != std::string::npos;
       at = html.find("<script", at + 1)) {
    ++scripts;
  }
  EXPECT_EQ(scripts, 2u);
  const web::json::value data = Data(html);
  // In natural order of names, '<' before 'h'.
  EXPECT_EQ(data.at("hosts").at(0).at("name").as_string(), evil_host);
  bool found = false;
  for (const web::json::value& op : data.at("ops").as_array()) {
    found = found || op.at("name").as_string() == evil_op;
  }
  EXPECT_TRUE(found);
}

TEST(ReportHtmlTest, TheDataParsesBackWithEveryHostAndStep) {
  const RunReport report = ReportOf(SixHostsOneSlower(1.3));
  const web::json::value data = Data(ReportHtml(report));
  EXPECT_EQ(data.at("unit_ns").as_integer(), 1000);
  const web::json::array& steps = data.at("steps").as_array();
  ASSERT_EQ(steps.size(), 50u);
  EXPECT_EQ(steps.at(0).as_integer(), 100);
  const web::json::array& hosts = data.at("hosts").as_array();
  ASSERT_EQ(hosts.size(), 6u);
  for (size_t h = 0; h < hosts.size(); ++h) {
    const web::json::value& host = hosts.at(h);
    EXPECT_EQ(host.at("name").as_string(), report.analysis.hosts[h].host);
    EXPECT_EQ(host.at("p50_ns").as_number().to_int64(), report.analysis.hosts[h].step_p50_ns);
    EXPECT_EQ(host.at("straggler").as_bool(), h == 4);
    EXPECT_EQ(host.at("d").size(), 50u);
    // Step durations in microseconds; the entry inside the step.
    const StepDigest first = report.runs[h].steps.Unpack()[0];
    EXPECT_EQ(host.at("d").at(0).as_integer(), (first.duration_ns() + 500) / 1000);
    EXPECT_GT(host.at("e").at(0).as_integer(), 0);
    EXPECT_LT(host.at("e").at(0).as_integer(), host.at("d").at(0).as_integer());
    EXPECT_EQ(host.at("parts").size(), 5u);
  }
  const int focus = data.at("focus").as_integer();
  EXPECT_GE(focus, 0);
  EXPECT_LT(focus, 50);
}

TEST(ReportHtmlTest, OpsRankTheHostWithSlowerKernelsSlowest) {
  const web::json::value data = Data(ReportHtml(ReportOf(SixHostsOneSlower(1.15))));
  const web::json::array& ops = data.at("ops").as_array();
  std::vector<std::string> names;
  for (const web::json::value& op : ops) {
    names.push_back(op.at("name").as_string());
    // Every host's mean, fastest to slowest, in a small run.
    ASSERT_EQ(op.at("points").size(), 6u);
    ASSERT_EQ(op.at("point_hosts").size(), 6u);
    EXPECT_EQ(op.at("slow_host").as_string(), "host-4") << op.at("name").as_string();
    EXPECT_EQ(op.at("point_hosts").at(5).as_string(), "host-4");
    EXPECT_TRUE(op.at("slow_straggler").as_bool());
  }
  // Collectives and input waits are left out: their time is mostly waiting.
  EXPECT_THAT(names,
              ::testing::UnorderedElementsAre("volta_sgemm_128x64_nn", "forward", "backward"));
}

// `hosts` hosts w-N in lockstep (100 ms steps, 50 ms of compute jittered by up to 2 ms);
// w-`slow` computes 30 ms longer every step.
RunReport ManyHosts(int hosts, int steps, int slow) {
  constexpr int64_t kMs = 1'000'000;
  std::vector<HostRun> runs;
  for (int h = 0; h < hosts; ++h) {
    HostRun run;
    run.digest.host = StrCat("w-", h);
    run.digest.top_ops = {{"gemm", true, steps, steps * (h == slow ? 80 : 50) * kMs}};
    for (int s = 0; s < steps; ++s) {
      const int64_t start = 1'800'000'000'000'000'000 + s * 100 * kMs;
      const int64_t compute =
          50 * kMs + ((h * 7919 + s * 104729) % 2000) * 1000 + (h == slow ? 30 * kMs : 0);
      run.digest.steps.push_back({.step = s,
                                  .start_ns = start,
                                  .end_ns = start + 100 * kMs,
                                  .collective_entry_ns = start + compute,
                                  .collective_ns = 100 * kMs - compute,
                                  .device_busy_ns = compute});
    }
    runs.push_back(std::move(run));
  }
  return MakeRunReport("/logs/plugins/profile/big", {}, std::move(runs), {}, true);
}

TEST(ReportHtmlTest, ManyHostsShowTheWorstThenPercentileBandsOfTheOthers) {
  const RunReport report = ManyHosts(1000, 30, 617);
  const std::string html = ReportHtml(report);
  const web::json::value data = Data(html);
  EXPECT_EQ(data.at("hosts_total").as_integer(), 1000);
  const web::json::array& hosts = data.at("hosts").as_array();
  ASSERT_EQ(hosts.size(), kPageWorstHosts);
  EXPECT_EQ(hosts.at(0).at("name").as_string(), "w-617") << "worst first";
  EXPECT_TRUE(hosts.at(0).at("straggler").as_bool());
  EXPECT_EQ(hosts.at(0).at("l").size(), 30u);
  EXPECT_GT(hosts.at(0).at("l").at(0).as_integer(), 25'000) << "about 30 ms late, in us";
  const web::json::value& rest = data.at("rest");
  EXPECT_EQ(rest.at("count").as_integer(), 1000 - static_cast<int>(kPageWorstHosts));
  const web::json::array& bands = rest.at("bands").as_array();
  ASSERT_EQ(bands.size(), 6u);
  EXPECT_EQ(bands.at(0).at("label").as_string(), "max");
  EXPECT_EQ(bands.at(5).at("label").as_string(), "min");
  for (const web::json::value& band : bands) {
    ASSERT_EQ(band.at("d").size(), 30u);
    EXPECT_EQ(band.at("d").at(0).as_integer(), 100'000) << "every step 100 ms";
    // The others are within the jitter of the median host.
    EXPECT_LT(std::abs(band.at("l").at(0).as_integer()), 2'100);
  }
  EXPECT_EQ(rest.at("parts").size(), 5u);
  EXPECT_EQ(rest.at("entry_p50").size(), 30u);
  // Step times alike: lateness is the view as loaded.
  EXPECT_EQ(data.at("default_metric").as_string(), "lateness");
  // The ops' strips hold percentiles, not a dot per host; the slowest is named.
  const web::json::value& op = data.at("ops").at(0);
  EXPECT_EQ(op.at("hosts").as_integer(), 1000);
  EXPECT_EQ(op.at("points").size(), 21u);
  EXPECT_FALSE(op.has_field("point_hosts"));
  EXPECT_EQ(op.at("slow_host").as_string(), "w-617");
  // A page of 24 hosts' steps, whatever the number of hosts.
  EXPECT_LT(html.size(), 300'000u);
}

TEST(ReportHtmlTest, SmallRunsShowEveryHostInNaturalOrderWithoutBands) {
  const RunReport report = ManyHosts(12, 30, 3);
  const web::json::value data = Data(ReportHtml(report));
  EXPECT_TRUE(data.at("rest").is_null());
  const web::json::array& hosts = data.at("hosts").as_array();
  ASSERT_EQ(hosts.size(), 12u);
  for (size_t h = 0; h < hosts.size(); ++h) {
    EXPECT_EQ(hosts.at(h).at("name").as_string(), StrCat("w-", h)) << "w-2 before w-10";
  }
  EXPECT_EQ(data.at("ops").at(0).at("point_hosts").size(), 12u);
}

TEST(ReportHtmlTest, DifferentStepTimesShowStepTimeFirst) {
  testing::RunSpec spec = SixHostsOneSlower(1.3);
  spec.hosts[4].compute_scale = 1.0;
  const web::json::value data = Data(ReportHtml(ReportOf(spec)));
  EXPECT_EQ(data.at("default_metric").as_string(), "lateness") << "a synchronized job";
  RunReport report = ReportOf(spec);
  report.analysis.hosts[0].step_p50_ns *= 2;  // as if host-0's steps were twice as long
  EXPECT_EQ(Data(ReportHtml(report)).at("default_metric").as_string(), "time");
}

TEST(ReportHtmlTest, AStepBreaksDownIntoPartsThatAddUpToIt) {
  StepDigest step;
  step.start_ns = 0;
  step.end_ns = 27'000'000;
  step.collective_ns = 5'000'000;
  step.input_ns = 2'000'000;
  step.host_busy_ns = 20'000'000;
  step.device_busy_ns = 15'000'000;
  const StepBreakdown gpu = BreakDownStep(step, /*has_device=*/true);
  EXPECT_EQ(gpu.collective_ns, 5'000'000);
  EXPECT_EQ(gpu.compute_ns, 15'000'000);
  EXPECT_EQ(gpu.gpu_idle_ns, 5'000'000);
  EXPECT_EQ(gpu.input_ns, 2'000'000);
  EXPECT_EQ(gpu.host_idle_ns, 0);
  const StepBreakdown cpu = BreakDownStep(step, /*has_device=*/false);
  EXPECT_EQ(cpu.compute_ns, 20'000'000);
  EXPECT_EQ(cpu.gpu_idle_ns, 0);
  EXPECT_EQ(cpu.host_idle_ns, 0);
  // Input in the background while the host works does not count twice.
  step.input_ns = 30'000'000;
  const StepBreakdown prefetch = BreakDownStep(step, true);
  EXPECT_EQ(prefetch.input_ns, 2'000'000);
  EXPECT_EQ(prefetch.collective_ns + prefetch.compute_ns + prefetch.gpu_idle_ns +
                prefetch.input_ns + prefetch.host_idle_ns,
            step.duration_ns());
}

}  // namespace
}  // namespace clusterprof::analysis
