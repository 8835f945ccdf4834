// cli::Verbs: every verb's flags are in docs/cli.md, each verb has its example, and the plugin
// keeps only the verbs it should.
#include "cli/verbs.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "CLI/CLI.hpp"

namespace clusterprof::cli {
namespace {

using ::testing::HasSubstr;

std::string ReadDocs() {
  std::ifstream in(std::string(CLUSTERPROF_SOURCE_DIR) + "/docs/cli.md");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Every option of `command` and of the commands below it, as "verb sub: --flag".
void CollectFlags(const CLI::App& command, const std::string& path,
                  std::vector<std::pair<std::string, const CLI::Option*>>* out) {
  for (const CLI::Option* option : command.get_options()) {
    if (option->get_group().empty()) continue;  // hidden (old spellings)
    out->emplace_back(path, option);
  }
  for (const CLI::App* sub : command.get_subcommands({})) {
    CollectFlags(*sub, path.empty() ? sub->get_name() : path + " " + sub->get_name(), out);
  }
}

TEST(VerbsTest, EveryFlagOfEveryVerbIsInTheDocs) {
  const std::string docs = ReadDocs();
  ASSERT_FALSE(docs.empty()) << "docs/cli.md not found";
  for (const bool plugin : {false, true}) {
    CLI::App app{"test"};
    const Verbs verbs(&app, plugin);
    std::vector<std::pair<std::string, const CLI::Option*>> flags;
    CollectFlags(app, "", &flags);
    ASSERT_GT(flags.size(), 40u);
    for (const auto& [verb, option] : flags) {
      if (option->get_name() == "--help" || option->get_name() == "-h") continue;
      bool named = false;
      for (const std::string& name : option->get_lnames()) {
        named = named || docs.find("--" + name) != std::string::npos;
      }
      for (const std::string& name : option->get_snames()) {
        named = named || docs.find("-" + name + " ") != std::string::npos;
      }
      // Positional arguments are named in the verb's synopsis.
      if (option->get_lnames().empty() && option->get_snames().empty()) named = true;
      EXPECT_TRUE(named) << (plugin ? "kubectl clusterprof " : "clusterprof ") << verb << ": "
                         << option->get_name() << " is not in docs/cli.md";
    }
  }
}

TEST(VerbsTest, EachVerbShowsItsExampleAndBareVerbsPrintTheirHelp) {
  CLI::App app{"test"};
  app.name("clusterprof");
  const Verbs verbs(&app, /*plugin=*/false);
  EXPECT_THAT(app.get_footer(), HasSubstr("clusterprof capture --service-addr"));
  EXPECT_THAT(app.get_footer(), HasSubstr("clusterprof report logs/"));
  // The kubectl plugin's verbs sit under `kube` here, with their examples in their own help.
  EXPECT_THAT(app.get_footer(), ::testing::Not(HasSubstr("clusterprof kube")));
  EXPECT_THAT(app.get_subcommand("kube")->get_subcommand("pull")->get_footer(),
              HasSubstr("clusterprof kube pull capture-x7k2p -o runs"));
  std::ostringstream help;
  EXPECT_TRUE(verbs.PrintHelp("capture", help));
  EXPECT_THAT(help.str(), HasSubstr("--service-addr"));
  std::ostringstream none;
  EXPECT_FALSE(verbs.PrintHelp("completion", none)) << "it takes an argument: no bare help";
  EXPECT_FALSE(verbs.PrintHelp("nonsense", none));
}

TEST(VerbsTest, ThePluginHasItsOwnCaptureAndLeavesTheLocalVerbsOut) {
  CLI::App app{"test"};
  app.name("kubectl clusterprof");
  const Verbs verbs(&app, /*plugin=*/true);
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("convert", "inspect", "capture", "report",
                                                     "pull", "completion"));
  // capture is the ProfileJob one: it takes a selector, not service addresses.
  const CLI::App* capture = app.get_subcommand("capture");
  EXPECT_NO_THROW((void)capture->get_option("--selector"));
  EXPECT_THROW((void)capture->get_option("--service-addr"), CLI::OptionNotFound);
  EXPECT_THAT(app.get_footer(), HasSubstr("kubectl clusterprof capture -n training"));
  EXPECT_THAT(app.get_footer(), HasSubstr("kubectl clusterprof inspect"));
  EXPECT_THAT(app.get_footer(), ::testing::Not(HasSubstr("kubectl clusterprof top")));
}

}  // namespace
}  // namespace clusterprof::cli
