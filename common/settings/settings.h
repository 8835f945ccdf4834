// A program's settings, each declared once (its name, where it lives, help, docs), from which
// the command-line flags, the YAML config file reader and the docs table are all made.
//
//   constexpr settings::Setting<SidecarConfig> kSettings[] = {
//       {.name = "port", .field = [](auto& c) -> settings::Field { return &c.port; },
//        .help = "gRPC port (0 picks a free one)"},
//       ...};
//   settings::CommandLine<SidecarConfig> command_line(&app, kSettings, {.config_file = true});
//   int exit_code = 0;
//   std::optional<SidecarConfig> config = command_line.Parse(argc, argv, &exit_code);
//   if (!config) return exit_code;
//
// A setting named "max-duration-ms" is the flag --max-duration-ms and the YAML key
// max_duration_ms; its default is the config struct's initial value. With a config file, the
// file's values come first and the flags given on the command line win over them.
#ifndef CLUSTERPROF_COMMON_SETTINGS_SETTINGS_H_
#define CLUSTERPROF_COMMON_SETTINGS_SETTINGS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace clusterprof::settings {

// A duration held in nanoseconds, set and shown in (fractional) seconds.
struct Seconds {
  int64_t* ns;
};

// Where one setting's value lives in one config instance.
using Field = std::variant<std::string*, bool*, int*, int64_t*, uint64_t*, double*,
                           std::vector<std::string>*, Seconds>;

struct Range {
  int64_t min;
  int64_t max;
};

template <typename Config>
struct Setting {
  // The flag without its dashes, in kebab-case ("max-duration-ms").
  std::string_view name;
  // Where the value lives: a captureless lambda, [](auto& c) -> Field { return &c.port; }.
  Field (*field)(Config&);
  // One sentence for --help.
  std::string_view help;
  // The docs table's "meaning" when it says more than `help` (Markdown); empty: `help`.
  std::string_view doc = {};
  // The docs table's default when the initial value does not tell it ("`$POD_NAME`, else the
  // host name").
  std::string_view default_text = {};
  // The YAML key when it is not `name` in snake_case (a list's plural: allowed_logdirs).
  std::string_view yaml_key = {};
  // A bool that --no-<name> turns off.
  bool negatable = false;
  // Integers only: the accepted values, checked for flags and YAML alike.
  std::optional<Range> range = std::nullopt;
};

// One setting bound to one config instance: what the non-template code works on.
struct Bound {
  std::string_view name;
  std::string_view help;
  std::string_view doc;
  std::string_view default_text;
  std::string yaml_key;
  bool negatable;
  std::optional<Range> range;
  Field field;
};

template <typename Config>
std::vector<Bound> Bind(std::span<const Setting<Config>> table, Config* config) {
  std::vector<Bound> bound;
  bound.reserve(table.size());
  for (const Setting<Config>& s : table) {
    std::string yaml_key(s.yaml_key.empty() ? s.name : s.yaml_key);
    if (s.yaml_key.empty()) {
      for (char& c : yaml_key) c = c == '-' ? '_' : c;
    }
    bound.push_back({s.name, s.help, s.doc, s.default_text, std::move(yaml_key), s.negatable,
                     s.range, s.field(*config)});
  }
  return bound;
}

// Reads a YAML mapping of `yaml_key: value` into the bound fields, keeping what the file does
// not set. Unknown keys, values of the wrong type and out-of-range values are errors that name
// the key, the file and the line.
absl::Status LoadYamlFile(const std::string& path, const std::vector<Bound>& settings);

// The docs table: | flag | YAML | default | meaning | (no YAML column when `yaml` is false).
// `defaults` is bound to a default-constructed config.
std::string MarkdownTable(const std::vector<Bound>& defaults, bool yaml);

struct CommandLineOptions {
  // Adds --config FILE: YAML with the same settings, under which the flags given win.
  bool config_file = false;
};

// The exit code of a program given flags or a config file it cannot use.
inline constexpr int kExitUsage = 2;

// The flags of one program on its CLI::App, before app.parse; Resolve after it. Also adds the
// hidden --settings-table, which prints MarkdownTable (scripts/settings-docs keeps the docs
// equal to it). Not thread-safe; the app must outlive it.
class CommandLineBase {
 public:
  // Its flags point at it: it stays where it was made.
  CommandLineBase(const CommandLineBase&) = delete;
  CommandLineBase& operator=(const CommandLineBase&) = delete;

  // app.parse, then --settings-table. False when the program is done: `exit_code` is 0 after
  // --help, --version or --settings-table (printed on stdout), kExitUsage after a bad flag (said
  // on stderr).
  bool ParseArgs(int argc, const char* const* argv, int* exit_code);

  // --settings-table was given: the table is in `table_markdown()`, and the program exits 0.
  bool table_requested() const { return table_requested_; }
  const std::string& table_markdown() const { return table_markdown_; }

 protected:
  // `defaults` is read here only (for the docs table).
  CommandLineBase(CLI::App* app, std::vector<Bound> flags, const std::vector<Bound>& defaults,
                  CommandLineOptions options);
  // The config file (when given) into `config`, then every flag given on the command line.
  absl::Status Resolve(const std::vector<Bound>& config) const;
  // Says `error` on stderr after the program's name; returns kExitUsage.
  int ReportUsageError(const absl::Status& error) const;

 private:
  CLI::App* app_;
  std::vector<Bound> flags_;
  std::vector<CLI::Option*> options_;
  std::string config_file_;
  bool table_requested_ = false;
  std::string table_markdown_;
};

template <typename Config>
class CommandLine : public CommandLineBase {
 public:
  CommandLine(CLI::App* app, std::span<const Setting<Config>> table,
              CommandLineOptions options = {})
      : CommandLine(app, table, options, std::make_unique<Config>(), Config{}) {}

  // ParseArgs, then Resolve. nullopt when the program is done: `exit_code` is as ParseArgs says,
  // or kExitUsage after a config file it cannot use (said on stderr, after the program's name).
  std::optional<Config> Parse(int argc, const char* const* argv, int* exit_code) {
    if (!ParseArgs(argc, argv, exit_code)) return std::nullopt;
    absl::StatusOr<Config> config = Resolve();
    if (!config.ok()) {
      *exit_code = ReportUsageError(config.status());
      return std::nullopt;
    }
    return *std::move(config);
  }

  // The settings: defaults, then the config file, then the flags given.
  absl::StatusOr<Config> Resolve() const {
    Config config;
    if (absl::Status status = CommandLineBase::Resolve(Bind(table_, &config)); !status.ok()) {
      return status;
    }
    return config;
  }

 private:
  CommandLine(CLI::App* app, std::span<const Setting<Config>> table, CommandLineOptions options,
              std::unique_ptr<Config> flags, Config defaults)
      : CommandLineBase(app, Bind(table, flags.get()), Bind(table, &defaults), options),
        table_(table),
        flag_values_(std::move(flags)) {}

  std::span<const Setting<Config>> table_;
  // What CLI11 parses into; only the flags given are copied out.
  std::unique_ptr<Config> flag_values_;
};

}  // namespace clusterprof::settings

#endif  // CLUSTERPROF_COMMON_SETTINGS_SETTINGS_H_
