// Shell completion, the way kubectl's own works (Cobra's protocol): the shell, or kubectl for a
// plugin (kubectl_complete-clusterprof on PATH), runs `<tool> __complete <words...> <partial>`
// and the tool prints one candidate per line ("name<TAB>description"), then ":<directive>"
// (bits: 1 error, 2 no space, 4 no file completion, 16 directories only). Verbs and flags come
// from the CLI11 definition itself; ProfileJob and namespace names from the cluster.
#ifndef CLUSTERPROF_CLI_COMPLETION_H_
#define CLUSTERPROF_CLI_COMPLETION_H_

#include <ostream>
#include <string>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace clusterprof::cli {

inline constexpr int kCompleteNoFiles = 4;
inline constexpr int kCompleteDirectories = 16;

// Prints the candidates for `words` (the words after the tool's name; the last is the partial
// word being completed, possibly empty) and the directive. Returns the exit code (0).
int Complete(const CLI::App& app, const std::vector<std::string>& words, std::ostream& out);

// The script that `<tool> completion bash|zsh` prints; empty for another shell.
std::string CompletionScript(const std::string& shell, const std::string& tool);

// Names of ProfileJobs or namespaces ("profilejobs", "namespaces") in the user's cluster, for
// completion: empty when the cluster cannot be reached. `kubeconfig`, `context` and `ns` as the
// words being completed give them (empty: kubectl's defaults).
std::vector<std::string> ClusterNames(const std::string& kind, const std::string& kubeconfig,
                                      const std::string& context, const std::string& ns);

}  // namespace clusterprof::cli

#endif  // CLUSTERPROF_CLI_COMPLETION_H_
