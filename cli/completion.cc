#include "cli/completion.h"

#include <map>
#include <optional>
#include <string_view>

#include "CLI/CLI.hpp"
#include "common/base/strings.h"

namespace clusterprof::cli {
namespace {

// The option of `command` that `word` names ("-n", "--namespace"), if any.
const CLI::Option* FindOption(const CLI::App& command, std::string_view word) {
  for (const CLI::Option* option : command.get_options()) {
    for (const std::string& name : option->get_lnames()) {
      if (word == "--" + name) return option;
    }
    for (const std::string& name : option->get_snames()) {
      if (word == "-" + name) return option;
    }
  }
  return nullptr;
}

bool HasName(const CLI::Option* option, std::string_view name) {
  for (const std::string& long_name : option->get_lnames()) {
    if (long_name == name) return true;
  }
  return false;
}

std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace

int Complete(const CLI::App& app, const std::vector<std::string>& words, std::ostream& out) {
  const std::string partial = words.empty() ? "" : words.back();
  // Walk the words: the verb, the flags given so far and their values.
  const CLI::App* command = &app;
  std::map<std::string, std::string> given;  // long flag name -> value
  size_t positionals = 0;
  const CLI::Option* pending = nullptr;  // a flag whose value is the next word
  for (size_t i = 0; i + 1 < words.size(); ++i) {
    const std::string& word = words[i];
    if (pending != nullptr) {
      if (!pending->get_lnames().empty()) given[pending->get_lnames().front()] = word;
      pending = nullptr;
      continue;
    }
    if (StartsWith(word, "-")) {
      const std::string name = word.substr(0, word.find('='));
      const CLI::Option* option = FindOption(*command, name);
      if (option != nullptr && option->get_type_size() != 0 &&
          word.find('=') == std::string::npos) {
        pending = option;
      } else if (option != nullptr && !option->get_lnames().empty() &&
                 word.find('=') != std::string::npos) {
        given[option->get_lnames().front()] = word.substr(word.find('=') + 1);
      }
      continue;
    }
    const auto subcommands =
        command->get_subcommands([](const CLI::App* sub) { return !sub->get_name().empty(); });
    const CLI::App* next = nullptr;
    for (const CLI::App* sub : subcommands) {
      if (sub->get_name() == word) next = sub;
    }
    if (next != nullptr && positionals == 0) {
      command = next;
    } else {
      ++positionals;
    }
  }
  const auto flag = [&](const char* name) {
    auto it = given.find(name);
    return it == given.end() ? std::string() : it->second;
  };
  int directive = kCompleteNoFiles;
  if (pending != nullptr) {
    // A flag's value.
    if (HasName(pending, "namespace")) {
      for (const std::string& name :
           ClusterNames("namespaces", flag("kubeconfig"), flag("context"), "")) {
        if (StartsWith(name, partial)) out << name << "\n";
      }
    } else if (HasName(pending, "output")) {
      directive = kCompleteDirectories;
    } else if (HasName(pending, "kubeconfig") || HasName(pending, "logdir") ||
               HasName(pending, "json") || HasName(pending, "html")) {
      directive = 0;  // files
    }
    out << ":" << directive << "\n";
    return 0;
  }
  if (StartsWith(partial, "-")) {
    for (const CLI::Option* option : command->get_options()) {
      for (const std::string& name : option->get_lnames()) {
        if (StartsWith("--" + name, partial)) {
          out << "--" << name << "\t" << FirstLine(option->get_description()) << "\n";
        }
      }
    }
    out << ":" << directive << "\n";
    return 0;
  }
  const auto subcommands =
      command->get_subcommands([](const CLI::App* sub) { return !sub->get_name().empty(); });
  if (!subcommands.empty() && positionals == 0) {
    for (const CLI::App* sub : subcommands) {
      if (sub->get_name().substr(0, 2) == "__") continue;
      if (StartsWith(sub->get_name(), partial)) {
        out << sub->get_name() << "\t" << FirstLine(sub->get_description()) << "\n";
      }
    }
    out << ":" << directive << "\n";
    return 0;
  }
  // A positional: a ProfileJob for report and pull, a shell for completion, else files.
  const std::string verb = command->get_name();
  if ((verb == "report" || verb == "pull") && command->get_option_no_throw("profilejob")) {
    for (const std::string& name :
         ClusterNames("profilejobs", flag("kubeconfig"), flag("context"), flag("namespace"))) {
      if (StartsWith(name, partial)) out << name << "\n";
    }
  } else if (verb == "completion") {
    for (const char* shell : {"bash", "zsh"}) {
      if (StartsWith(shell, partial)) out << shell << "\n";
    }
  } else {
    directive = 0;
  }
  out << ":" << directive << "\n";
  return 0;
}

std::string CompletionScript(const std::string& shell, const std::string& tool) {
  std::string function = "_" + tool;
  for (char& c : function) {
    if (c == '-') c = '_';
  }
  // Bash's completion function; zsh runs it through bashcompinit.
  std::string script = StrCat(R"(# )", tool, R"( completion. Load it with:
#   source <()",
                              tool, " completion ", shell, R"()
)",
                              function, R"(() {
  local cur="${COMP_WORDS[COMP_CWORD]}" out directive
  out=$("${COMP_WORDS[0]}" __complete "${COMP_WORDS[@]:1:COMP_CWORD-1}" "$cur" 2>/dev/null)
  directive=${out##*:}
  out=${out%:*}
  if (( directive & 16 )); then
    COMPREPLY=($(compgen -d -- "$cur"))
    return
  fi
  local IFS=$'\n'
  COMPREPLY=($(printf '%s\n' "$out" | cut -f1 | grep -v '^$'))
  if (( ${#COMPREPLY[@]} == 0 && ! (directive & 4) )); then
    COMPREPLY=($(compgen -f -- "$cur"))
  fi
}
)");
  if (shell == "bash") return StrCat(script, "complete -o default -F ", function, " ", tool, "\n");
  if (shell == "zsh") {
    return StrCat("autoload -U +X bashcompinit && bashcompinit\n", script,
                  "complete -o default -F ", function, " ", tool, "\n");
  }
  return "";
}

}  // namespace clusterprof::cli
