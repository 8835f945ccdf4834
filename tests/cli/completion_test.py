"""Shell completion of clusterprof and of the kubectl plugin: the __complete protocol (Cobra's,
which kubectl uses for plugins through kubectl_complete-clusterprof) and the bash script of
`completion bash`, run in a real bash.

    completion_test.py <build dir>/cli
"""
import os
import shutil
import subprocess
import sys
import unittest

CLI_DIR = sys.argv.pop(1) if len(sys.argv) > 1 else "build/cli"
# No cluster: names that come from the API are simply left out.
ENV = dict(os.environ, KUBECONFIG="/nonexistent/kubeconfig", HOME="/nonexistent")


def complete(tool, *words):
    out = subprocess.run([os.path.join(CLI_DIR, tool)] + list(words), env=ENV,
                         capture_output=True, text=True, timeout=30, check=True).stdout
    lines = out.rstrip("\n").split("\n")
    directive = lines[-1]
    assert directive.startswith(":"), out
    return [line.split("\t")[0] for line in lines[:-1]], int(directive[1:])


class CompletionTest(unittest.TestCase):
    def test_verbs_of_each_tool(self):
        verbs, directive = complete("clusterprof", "__complete", "")
        self.assertEqual(directive, 4)
        for verb in ("capture", "convert", "inspect", "report", "top", "kube", "completion"):
            self.assertIn(verb, verbs)
        verbs, _ = complete("kubectl-clusterprof", "__complete", "")
        self.assertEqual(sorted(verbs),
                         ["capture", "completion", "convert", "inspect", "pull", "report"])
        # What kubectl runs for `kubectl clusterprof re<TAB>`.
        verbs, _ = complete("kubectl_complete-clusterprof", "re")
        self.assertEqual(verbs, ["report"])

    def test_flags_of_a_verb(self):
        flags, directive = complete("kubectl-clusterprof", "__complete", "capture", "--d")
        self.assertEqual(sorted(flags), ["--delay", "--device-tracer-level", "--duration"])
        self.assertEqual(directive, 4)
        flags, _ = complete("kubectl-clusterprof", "__complete", "capture", "-n", "ml", "--")
        self.assertIn("--selector", flags)
        self.assertIn("--kubeconfig", flags)

    def test_flag_values(self):
        # -o takes a directory; --logdir a path; -n a namespace (none without a cluster).
        self.assertEqual(complete("kubectl-clusterprof", "__complete", "pull", "job", "-o", ""),
                         ([], 16))
        self.assertEqual(complete("kubectl-clusterprof", "__complete", "capture", "--logdir", ""),
                         ([], 0))
        self.assertEqual(complete("kubectl-clusterprof", "__complete", "capture", "-n", ""),
                         ([], 4))
        self.assertEqual(complete("kubectl-clusterprof", "__complete", "completion", ""),
                         (["bash", "zsh"], 4))
        # Files for convert's input.
        self.assertEqual(complete("clusterprof", "__complete", "convert", "")[1], 0)

    def test_kubectl_completes_the_plugin_through_its_helper(self):
        kubectl = shutil.which("kubectl")
        if not kubectl:
            self.skipTest("no kubectl")
        env = dict(ENV, PATH=os.path.abspath(CLI_DIR) + os.pathsep + os.environ["PATH"])
        out = subprocess.run([kubectl, "__complete", "clusterprof", "ca"], env=env,
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual([l.split("\t")[0] for l in out.stdout.splitlines()], ["capture", ":4"])
        # And runs the plugin as `kubectl clusterprof`.
        help_text = subprocess.run([kubectl, "clusterprof", "--help"], env=env,
                                   capture_output=True, text=True, timeout=30).stdout
        self.assertIn("Usage: kubectl clusterprof", help_text)

    def test_the_bash_script_completes_in_bash(self):
        script = subprocess.run([os.path.join(CLI_DIR, "clusterprof"), "completion", "bash"],
                                capture_output=True, text=True, check=True).stdout
        self.assertIn("complete -o default -F _clusterprof clusterprof", script)
        probe = script + """
COMP_WORDS=(%s con); COMP_CWORD=1; _clusterprof; echo "1:${COMPREPLY[*]}"
COMP_WORDS=(%s convert --f); COMP_CWORD=2; _clusterprof; echo "2:${COMPREPLY[*]}"
""" % ((os.path.join(CLI_DIR, "clusterprof"),) * 2)
        out = subprocess.run(["bash", "-c", probe], env=ENV, capture_output=True, text=True,
                             timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("1:convert\n", out.stdout)
        self.assertIn("2:--format", out.stdout)
        zsh = subprocess.run([os.path.join(CLI_DIR, "kubectl-clusterprof"), "completion", "zsh"],
                             capture_output=True, text=True, check=True).stdout
        self.assertTrue(zsh.startswith("autoload -U +X bashcompinit && bashcompinit"))
        self.assertIn("-F _kubectl_clusterprof kubectl-clusterprof", zsh)
        bad = subprocess.run([os.path.join(CLI_DIR, "clusterprof"), "completion", "fish"],
                             capture_output=True, text=True)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("fish", bad.stderr)


if __name__ == "__main__":
    unittest.main()
