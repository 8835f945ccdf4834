#include "proto/profile_options.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace clusterprof::proto {

tensorflow::ProfileOptions DefaultProfileOptions() {
  tensorflow::ProfileOptions options;
  options.set_version(1);
  options.set_host_tracer_level(2);
  options.set_device_tracer_level(1);
  options.set_python_tracer_level(0);
  options.set_enable_hlo_proto(true);
  options.set_include_dataset_ops(true);
  return options;
}

absl::Status SetAdvancedOption(std::string_view key_equals_value,
                               tensorflow::ProfileOptions* options) {
  const size_t eq = key_equals_value.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", std::string(key_equals_value),
                     "' is not KEY=VALUE (for example gpu_max_activity_api_events=4194304)"));
  }
  const std::string key(key_equals_value.substr(0, eq));
  const std::string text(key_equals_value.substr(eq + 1));
  tensorflow::ProfileOptions::AdvancedConfigValue& value =
      (*options->mutable_advanced_configuration())[key];
  int64_t number = 0;
  if (text == "true" || text == "false") {
    value.set_bool_value(text == "true");
  } else if (!text.empty() && absl::SimpleAtoi(text, &number)) {
    value.set_int64_value(number);
  } else {
    value.set_string_value(text);
  }
  return absl::OkStatus();
}

}  // namespace clusterprof::proto
