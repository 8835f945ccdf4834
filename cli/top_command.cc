// clusterprof top: the live steps of many sidecars as one table (docs/triggers.md), followed
// directly (--service-addr) or as the operator follows a ProfileTrigger's pods (--operator-addr).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/commands.h"
#include "cli/top_table.h"
#include "common/base/clock.h"
#include "common/base/strings.h"
#include "common/base/token_file.h"
#include "coordinator/coordinator.h"
#include "coordinator/step_watcher.h"
#include "cpprest/http_client.h"
#include "fmt/format.h"

namespace clusterprof::cli {
namespace {

std::atomic<bool> g_interrupted{false};

void OnInterrupt(int) { g_interrupted.store(true); }

// The operator's view of a trigger's pods, fetched on each call.
class OperatorView final : public coordinator::StepSource {
 public:
  OperatorView(const std::string& address, const std::string& trigger)
      : url_(StrCat("http://", address, "/triggers/", trigger)) {}
  void SetTargets(const std::vector<std::string>&) override {}
  std::vector<coordinator::WatchedSidecar> Snapshot() const override {
    try {
      web::http::client::http_client_config config;
      config.set_timeout(std::chrono::seconds(5));
      web::http::client::http_client client(url_, config);
      const web::http::http_response response = client.request(web::http::methods::GET).get();
      const std::string body = response.extract_utf8string(true).get();
      if (response.status_code() != 200) {
        error_ = StrCat("GET ", url_, ": HTTP ", response.status_code(), ": ",
                        StripAsciiWhitespace(body));
        return {};
      }
      absl::StatusOr<std::vector<coordinator::WatchedSidecar>> parsed = ParseOperatorView(body);
      if (!parsed.ok()) {
        error_ = StrCat("GET ", url_, ": ", parsed.status().message());
        return {};
      }
      error_.clear();
      return *std::move(parsed);
    } catch (const std::exception& e) {
      error_ = StrCat("GET ", url_, ": ", e.what());
      return {};
    }
  }
  const std::string& error() const { return error_; }

 private:
  const std::string url_;
  mutable std::string error_;
};

}  // namespace

int RunTop(const TopOptions& options, std::ostream& out, std::ostream& err) {
  if (options.steps < 2 || options.steps > 1000) {
    err << "clusterprof top: --steps " << options.steps << " is out of range: give 2 to 1000\n";
    return kExitUsage;
  }
  const bool through_operator = !options.operator_addr.empty() || !options.profile_trigger.empty();
  if (through_operator == !options.service_addr.empty()) {
    err << "clusterprof top: give either --service-addr (the sidecars) or --operator-addr with "
           "--profiletrigger NAMESPACE/NAME (a ProfileTrigger's pods, as the operator follows "
           "them)\n";
    return kExitUsage;
  }
  std::unique_ptr<coordinator::StepWatcher> watcher;
  std::unique_ptr<OperatorView> view;
  if (through_operator) {
    if (options.operator_addr.empty() ||
        std::count(options.profile_trigger.begin(), options.profile_trigger.end(), '/') != 1) {
      err << "clusterprof top: --operator-addr needs --profiletrigger NAMESPACE/NAME, and the "
             "other way round (the operator's health port, e.g. through kubectl port-forward "
             "to the leading replica's port 8081)\n";
      return kExitUsage;
    }
    view = std::make_unique<OperatorView>(options.operator_addr, options.profile_trigger);
  } else {
    absl::StatusOr<std::vector<coordinator::Target>> targets =
        coordinator::ParseServiceAddresses(options.service_addr);
    if (!targets.ok()) {
      err << "clusterprof top: --service-addr: " << targets.status().message() << "\n";
      return kExitUsage;
    }
    coordinator::StepWatcher::Options watch;
    if (!options.token_file.empty()) {
      absl::StatusOr<std::string> token = ReadTokenFile(options.token_file);
      if (!token.ok()) {
        err << "clusterprof top: --token-file: " << token.status().message() << "\n";
        return kExitUsage;
      }
      watch.auth_token = *token;
    }
    watch.history = std::max(options.steps * 2, 64);
    std::vector<std::string> addresses;
    for (const coordinator::Target& target : *targets) addresses.push_back(target.address);
    absl::StatusOr<std::shared_ptr<const tls::ChannelSecurity>> security =
        ChooseTransport(options.transport, addresses);
    if (!security.ok()) {
      err << "clusterprof top: " << security.status().message() << "\n";
      return kExitUsage;
    }
    watch.security = *std::move(security);
    watcher = std::make_unique<coordinator::StepWatcher>(watch);
    watcher->SetTargets(addresses);
  }

  Clock& clock = SystemClock();
  const bool terminal = !options.once && isatty(STDOUT_FILENO) == 1;
  g_interrupted.store(false);
  auto previous = std::signal(SIGINT, OnInterrupt);
  const int64_t started = clock.MonotonicNs();
  uint64_t seen = 0;
  int exit_code = kExitOk;
  while (!g_interrupted.load()) {
    const int64_t elapsed_ms = (clock.MonotonicNs() - started) / kNanosPerMilli;
    const std::vector<coordinator::WatchedSidecar> sidecars =
        watcher != nullptr ? watcher->Snapshot() : view->Snapshot();
    if (options.once) {
      const bool all =
          !sidecars.empty() && std::all_of(sidecars.begin(), sidecars.end(),
                                           [](const auto& s) { return !s.steps.empty(); });
      if (!all && elapsed_ms < options.timeout_ms) {
        if (watcher != nullptr) {
          seen = watcher->WaitForUpdate(seen, absl::Milliseconds(100));
        } else {
          absl::SleepFor(absl::Milliseconds(200));
        }
        continue;
      }
    }
    const TopTable table = BuildTopTable(sidecars, options.steps, clock.WallNs());
    if (terminal) out << "\x1b[H\x1b[J";  // draw over the previous table
    out << FormatTopTable(table, options.steps, clock.WallNs());
    if (view != nullptr && !view->error().empty()) out << "  " << view->error() << "\n";
    out.flush();
    if (options.once) {
      // Exit 1 when a sidecar (or the operator) could not be reached, as capture does for a
      // failed host.
      const bool failed = table.unreachable > 0 || (view != nullptr && !view->error().empty());
      exit_code = failed ? kExitFailure : kExitOk;
      break;
    }
    if (options.seconds > 0 && elapsed_ms >= options.seconds * 1000) break;
    if (!terminal) out << "\n";
    absl::SleepFor(absl::Milliseconds(options.interval_ms));
  }
  std::signal(SIGINT, previous);
  return exit_code;
}

}  // namespace clusterprof::cli
