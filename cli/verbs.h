// The verbs of the command line tool (and of the kubectl plugin), each declared once: its flags,
// its example, and the function from commands.h that runs it.
#ifndef CLUSTERPROF_CLI_VERBS_H_
#define CLUSTERPROF_CLI_VERBS_H_

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace clusterprof::cli {

// Not thread-safe; `app` must outlive it.
class Verbs {
 public:
  // Declares every verb on `app`: as `clusterprof`, or as `kubectl clusterprof` (`plugin`),
  // which has its own capture and report, on ProfileJobs, and leaves the local ones out.
  Verbs(CLI::App* app, bool plugin);
  ~Verbs();

  // `verb` is one of the tool's verbs: prints its help (as kubectl does for a verb given no
  // arguments) and returns true.
  bool PrintHelp(std::string_view verb, std::ostream& out) const;

  // Runs the verb that app.parse chose; its exit code.
  int Run(std::ostream& out, std::ostream& err) const;

 private:
  struct Verb {
    CLI::App* command;
    // Without the tool's name: "capture --service-addr ...".
    std::string example;
    std::function<int(std::ostream&, std::ostream&)> run;
    // The kubectl plugin's verbs on ProfileJobs (as `clusterprof kube VERB`).
    bool kube = false;
  };
  struct Options;

  // Each adds one verb under `parent` and returns it.
  Verb AddConvert(CLI::App* parent);
  Verb AddInspect(CLI::App* parent);
  Verb AddReport(CLI::App* parent);
  Verb AddCapture(CLI::App* parent);
  Verb AddKubeCapture(CLI::App* parent);
  Verb AddKubeReport(CLI::App* parent);
  Verb AddKubePull(CLI::App* parent);
  Verb AddCompletion(CLI::App* parent);
  Verb AddTop(CLI::App* parent);
  // One example per verb: in its help, and in the tool's.
  void AddExamples();

  CLI::App* app_;
  const bool plugin_;
  std::unique_ptr<CLI::App> detached_;  // the plugin's parent of the verbs it leaves out
  std::unique_ptr<Options> options_;
  std::vector<Verb> verbs_;
};

}  // namespace clusterprof::cli

#endif  // CLUSTERPROF_CLI_VERBS_H_
