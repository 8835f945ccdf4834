#include "common/settings/settings.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "CLI/CLI.hpp"
#include "common/base/strings.h"

namespace clusterprof::settings {
namespace {

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};

// The value a field holds, as a number when it is an integer (for range checks).
std::optional<int64_t> IntegerValue(const Field& field) {
  if (const int* const* v = std::get_if<int*>(&field)) return **v;
  if (const int64_t* const* v = std::get_if<int64_t*>(&field)) return **v;
  if (const uint64_t* const* v = std::get_if<uint64_t*>(&field)) {
    return **v > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(**v);
  }
  return std::nullopt;
}

std::string SecondsText(int64_t ns) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", static_cast<double>(ns) / 1e9);
  return text;
}

// Sizes in bytes read better as MiB or GiB when they are whole ones.
std::string IntegerText(uint64_t value, std::string_view name) {
  if (EndsWith(name, "-bytes") && value >= (uint64_t{1} << 20)) {
    if (value % (uint64_t{1} << 30) == 0) return StrCat(value >> 30, " GiB");
    if (value % (uint64_t{1} << 20) == 0) return StrCat(value >> 20, " MiB");
  }
  return StrCat(value);
}

std::string DefaultText(const Bound& s) {
  if (!s.default_text.empty()) return std::string(s.default_text);
  return std::visit(
      Overloaded{
          [](const std::string* v) {
            return v->empty() ? std::string("none") : StrCat("`", *v, "`");
          },
          [](const bool* v) { return std::string(*v ? "on" : "off"); },
          [&s](const int* v) { return *v < 0 ? StrCat(*v) : IntegerText(*v, s.name); },
          [&s](const int64_t* v) { return *v < 0 ? StrCat(*v) : IntegerText(*v, s.name); },
          [&s](const uint64_t* v) { return IntegerText(*v, s.name); },
          [](const double* v) {
            char text[32];
            std::snprintf(text, sizeof(text), "%g", *v);
            return std::string(text);
          },
          [](const std::vector<std::string>* v) {
            std::string text;
            for (const std::string& item : *v)
              StrAppend(&text, text.empty() ? "" : ", ", "`", item, "`");
            return text.empty() ? std::string("none") : text;
          },
          [](const Seconds& v) { return SecondsText(*v.ns); },
      },
      s.field);
}

bool IsList(const Bound& s) { return std::holds_alternative<std::vector<std::string>*>(s.field); }

// Copies one field's value to the same field of another instance (same alternative).
void CopyValue(const Field& from, const Field& to) {
  std::visit(
      [&to](const auto& source) {
        using T = std::decay_t<decltype(source)>;
        if constexpr (std::is_same_v<T, Seconds>) {
          *std::get<Seconds>(to).ns = *source.ns;
        } else {
          *std::get<T>(to) = *source;
        }
      },
      from);
}

// Sets a field from a YAML node; throws YAML::Exception on a value of the wrong type.
void SetFromYaml(const YAML::Node& node, const Field& field) {
  std::visit(Overloaded{
                 [&node](std::vector<std::string>* v) {
                   *v = node.IsSequence() ? node.as<std::vector<std::string>>()
                                          : std::vector<std::string>{node.as<std::string>()};
                 },
                 [&node](const Seconds& v) {
                   *v.ns = static_cast<int64_t>(std::llround(node.as<double>() * 1e9));
                 },
                 [&node](auto* v) { *v = node.as<std::remove_pointer_t<decltype(v)>>(); },
             },
             field);
}

absl::Status CheckRange(const Bound& s, std::string_view written_as) {
  if (!s.range) return absl::OkStatus();
  std::optional<int64_t> value = IntegerValue(s.field);
  if (!value || (*value >= s.range->min && *value <= s.range->max)) return absl::OkStatus();
  return absl::InvalidArgumentError(StrCat(written_as, " is ", *value, "; it must be between ",
                                           s.range->min, " and ", s.range->max));
}

}  // namespace

absl::Status LoadYamlFile(const std::string& path, const std::vector<Bound>& settings) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return absl::NotFoundError(StrCat("cannot read the config file ", path));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        StrCat("config file ", path, " is not valid YAML: ", e.what()));
  }
  if (root.IsNull()) return absl::OkStatus();  // an empty file sets nothing
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        StrCat("config file ", path, " must be a YAML mapping of setting: value"));
  }
  for (const auto& entry : root) {
    if (!entry.first.IsScalar()) {
      return absl::InvalidArgumentError(StrCat("config file ", path, ": line ",
                                               entry.first.Mark().line + 1,
                                               ": a key must be a setting name, not a list or "
                                               "mapping"));
    }
    const std::string key = entry.first.Scalar();
    const Bound* setting = nullptr;
    for (const Bound& s : settings) {
      if (s.yaml_key == key) setting = &s;
    }
    if (setting == nullptr) {
      std::string known;
      for (const Bound& s : settings) StrAppend(&known, known.empty() ? "" : ", ", s.yaml_key);
      return absl::InvalidArgumentError(
          StrCat("config file ", path, ": unknown setting '", key, "' (known: ", known, ")"));
    }
    try {
      SetFromYaml(entry.second, setting->field);
    } catch (const YAML::Exception&) {
      return absl::InvalidArgumentError(StrCat("config file ", path, ": setting '", key,
                                               "' has a value of the wrong type (line ",
                                               entry.second.Mark().line + 1, ")"));
    }
    if (absl::Status range = CheckRange(*setting, StrCat("config file ", path, ": ", key));
        !range.ok()) {
      return range;
    }
  }
  return absl::OkStatus();
}

std::string MarkdownTable(const std::vector<Bound>& defaults, bool yaml) {
  std::string table = yaml ? "| flag | YAML | default | meaning |\n|---|---|---|---|\n"
                           : "| flag | default | meaning |\n|---|---|---|\n";
  if (yaml) {
    StrAppend(&table,
              "| `--config` | | none | a YAML file of these settings (the YAML column); the "
              "flags given on the command line win over it |\n");
  }
  for (const Bound& s : defaults) {
    std::string flag = StrCat("`--", s.name, "`");
    if (s.negatable) StrAppend(&flag, " / `--no-", s.name, "`");
    if (IsList(s)) StrAppend(&flag, " (repeatable)");
    std::string meaning(s.doc.empty() ? s.help : s.doc);
    // --help's "Longest capture accepted" reads as "longest capture accepted" in a table's cell;
    // names such as NVML or ProfileJob stay as they are.
    const std::string_view first_word = std::string_view(meaning).substr(0, meaning.find(' '));
    if (s.doc.empty() && first_word.size() > 1 && std::isupper(first_word[0]) &&
        std::none_of(first_word.begin() + 1, first_word.end(),
                     [](char c) { return std::isupper(c) || std::isdigit(c); })) {
      meaning[0] = static_cast<char>(std::tolower(meaning[0]));
    }
    if (s.range) StrAppend(&meaning, " (", s.range->min, "-", s.range->max, ")");
    StrAppend(&table, "| ", flag, " | ");
    if (yaml) StrAppend(&table, "`", s.yaml_key, "`", IsList(s) ? " (list)" : "", " | ");
    StrAppend(&table, DefaultText(s), " | ", meaning, " |\n");
  }
  return table;
}

CommandLineBase::CommandLineBase(CLI::App* app, std::vector<Bound> flags,
                                 const std::vector<Bound>& defaults, CommandLineOptions options)
    : app_(app), flags_(std::move(flags)) {
  table_markdown_ = MarkdownTable(defaults, options.config_file);
  if (options.config_file) {
    app_->add_option("--config", config_file_,
                     "YAML file with these settings in snake_case (flags given here win)");
  }
  for (const Bound& s : flags_) {
    const std::string flag = StrCat("--", s.name);
    const std::string help(s.help);
    CLI::Option* option = nullptr;
    std::visit(Overloaded{
                   [&](bool* v) {
                     option = app_->add_flag(s.negatable ? StrCat(flag, ",!--no-", s.name) : flag,
                                             *v, help);
                   },
                   [&](std::vector<std::string>* v) {
                     option = app_->add_option(flag, *v, help)->take_all();
                   },
                   [&](const Seconds& v) {
                     int64_t* ns = v.ns;
                     option = app_->add_option_function<double>(
                                      flag,
                                      [ns](double seconds) {
                                        *ns = static_cast<int64_t>(std::llround(seconds * 1e9));
                                      },
                                      help)
                                  ->default_str(SecondsText(*ns));
                   },
                   [&](auto* v) { option = app_->add_option(flag, *v, help); },
               },
               s.field);
    if (s.range) option->check(CLI::Range(s.range->min, s.range->max));
    // Shown in --help where the initial value says something ("[8466]").
    if (s.default_text.empty() && !IsList(s) && !std::holds_alternative<Seconds>(s.field)) {
      const auto* text = std::get_if<std::string*>(&s.field);
      if (text == nullptr || !(*text)->empty()) option->capture_default_str();
    }
    options_.push_back(option);
  }
  app_->add_flag_callback(
          "--settings-table", [this] { table_requested_ = true; },
          "Print the settings as the docs' Markdown table")
      ->group("");
}

bool CommandLineBase::ParseArgs(int argc, const char* const* argv, int* exit_code) {
  try {
    app_->parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every other flag error is a usage error.
    *exit_code = app_->exit(e) == 0 ? 0 : kExitUsage;
    return false;
  }
  if (table_requested_) {
    std::cout << table_markdown_;
    *exit_code = 0;
    return false;
  }
  return true;
}

int CommandLineBase::ReportUsageError(const absl::Status& error) const {
  std::cerr << app_->get_name() << ": " << error.message() << "\n";
  return kExitUsage;
}

absl::Status CommandLineBase::Resolve(const std::vector<Bound>& config) const {
  if (!config_file_.empty()) {
    if (absl::Status status = LoadYamlFile(config_file_, config); !status.ok()) return status;
  }
  for (size_t i = 0; i < flags_.size(); ++i) {
    if (options_[i]->count() > 0) CopyValue(flags_[i].field, config[i].field);
  }
  // Ranges were checked where the values came in: LoadYamlFile's, and CLI11's for flags.
  return absl::OkStatus();
}

}  // namespace clusterprof::settings
