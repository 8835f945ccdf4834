// The process environment, read one way everywhere. A variable that is set but empty reads as
// unset, as client-go and the Google Cloud libraries treat KUBECONFIG="" or
// STORAGE_EMULATOR_HOST="". Code that tests inject an environment into takes a GetEnvFn.
#ifndef CLUSTERPROF_COMMON_BASE_ENV_H_
#define CLUSTERPROF_COMMON_BASE_ENV_H_

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace clusterprof {

using GetEnvFn = std::function<std::optional<std::string>(std::string_view name)>;

// $name, or nullopt when it is unset or empty. Thread-safe while nothing calls setenv.
std::optional<std::string> GetEnv(std::string_view name);

}  // namespace clusterprof

#endif  // CLUSTERPROF_COMMON_BASE_ENV_H_
