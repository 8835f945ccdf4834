// The HTML report: a page that fetches nothing, escapes the names it shows, carries data that
// parses back, and names the straggler. tests/analysis/report_html_browser_integration_test.sh
// opens it in a real browser.
#include "analysis/report_html.h"

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

// The report of a synthetic run, its hosts named by `names` (host-N where empty).
RunReport ReportOf(const testing::RunSpec& spec, std::vector<std::string> names = {}) {
  const std::vector<tensorflow::profiler::XSpace> spaces = testing::MakeRun(spec);
  std::vector<HostRun> runs;
  for (size_t h = 0; h < spaces.size(); ++h) {
    const std::string name = h < names.size() ? names[h] : StrCat("host-", h);
    absl::StatusOr<HostDigest> digest = DigestXSpace(spaces[h], name);
    EXPECT_TRUE(digest.ok()) << digest.status();
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
  RunReport report = ReportOf(spec, {"host-0", "host-1", "host-2", "host-3", evil_host});
  for (HostRun& run : report.runs) {
    run.digest.top_ops.push_back({evil_op, true, 10, 10'000'000});
  }
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
  EXPECT_EQ(data.at("hosts").at(4).at("name").as_string(), evil_host);
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
    const StepDigest& first = report.runs[h].digest.steps[0];
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
    const web::json::array& means = op.at("mean_ns").as_array();
    ASSERT_EQ(means.size(), 6u);
    size_t slowest = 0;
    for (size_t h = 1; h < means.size(); ++h) {
      if (means.at(h).as_number().to_int64() > means.at(slowest).as_number().to_int64()) {
        slowest = h;
      }
    }
    EXPECT_EQ(slowest, 4u) << op.at("name").as_string();
  }
  // Collectives and input waits are left out: their time is mostly waiting.
  EXPECT_THAT(names,
              ::testing::UnorderedElementsAre("volta_sgemm_128x64_nn", "forward", "backward"));
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
