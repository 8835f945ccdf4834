"""scripts/package-plugin: the krew archive and manifest, checked as krew checks them
(the manifest's shape, the sha256 of the archive, every `files` entry and `bin` present),
and the archived plugin runs as kubectl's plugin.

    package_plugin_test.py <source dir> <build dir>
"""
import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import unittest

import yaml

SOURCE_DIR, BUILD_DIR = sys.argv.pop(1), sys.argv.pop(1)


class PackagePluginTest(unittest.TestCase):
    def package(self, *extra):
        out = tempfile.mkdtemp(prefix="package-plugin-")
        self.addCleanup(subprocess.run, ["rm", "-rf", out])
        run = subprocess.run([os.path.join(SOURCE_DIR, "scripts", "package-plugin"),
                              "--build-dir", BUILD_DIR, "--out", out] + list(extra),
                             capture_output=True, text=True, timeout=120)
        self.assertEqual(run.returncode, 0, run.stderr)
        with open(os.path.join(out, "clusterprof.yaml")) as f:
            manifest = yaml.safe_load(f)
        return out, manifest, run.stdout

    def test_manifest_and_archive_are_what_krew_installs(self):
        out, manifest, stdout = self.package("--url-base", "https://example.org/releases/v9")
        self.assertEqual(manifest["apiVersion"], "krew.googlecontainertools.github.com/v1alpha2")
        self.assertEqual(manifest["kind"], "Plugin")
        self.assertEqual(manifest["metadata"]["name"], "clusterprof")
        spec = manifest["spec"]
        self.assertRegex(spec["version"], r"^v\d+\.\d+\.\d+$")
        self.assertLessEqual(len(spec["shortDescription"]), 50)
        self.assertNotIn("@", yaml.safe_dump(manifest), "a placeholder was left unfilled")
        [platform] = spec["platforms"]
        self.assertEqual(platform["selector"]["matchLabels"], {"os": "linux", "arch": "amd64"})
        self.assertEqual(platform["uri"],
                         "https://example.org/releases/v9/kubectl-clusterprof_linux_amd64.tar.gz")
        archive = os.path.join(out, "kubectl-clusterprof_linux_amd64.tar.gz")
        with open(archive, "rb") as f:
            self.assertEqual(platform["sha256"], hashlib.sha256(f.read()).hexdigest())
        self.assertIn(platform["sha256"], stdout)
        with tarfile.open(archive) as tar:
            members = {m.name: m for m in tar.getmembers()}
            for entry in platform["files"]:
                self.assertIn(entry["from"], members)
            self.assertIn(platform["bin"], [e["from"] for e in platform["files"]])
            self.assertTrue(members["kubectl-clusterprof"].mode & 0o111)
            self.assertTrue(members["kubectl_complete-clusterprof"].mode & 0o111)
            unpacked = tempfile.mkdtemp(prefix="plugin-")
            self.addCleanup(subprocess.run, ["rm", "-rf", unpacked])
            tar.extractall(unpacked)
        # As kubectl finds it on PATH: the plugin's help, and its completion helper.
        env = dict(os.environ, PATH=unpacked + ":" + os.environ["PATH"],
                   KUBECONFIG="/nonexistent")
        help_text = subprocess.run(["kubectl-clusterprof", "--help"], env=env,
                                   capture_output=True, text=True, check=True).stdout
        self.assertIn("Usage: kubectl clusterprof", help_text)
        completion = subprocess.run(["kubectl_complete-clusterprof", "pu"], env=env,
                                    capture_output=True, text=True, check=True).stdout
        self.assertEqual(completion, "pull\tCopy a ProfileJob's run directory here: every host "
                                     "file, the manifest, the report\n:4\n")

    def test_without_an_address_the_manifest_names_the_local_archive(self):
        out, manifest, _ = self.package()
        uri = manifest["spec"]["platforms"][0]["uri"]
        self.assertTrue(re.match(r"^file:///", uri), uri)
        self.assertTrue(os.path.exists(uri[len("file://"):]))

    def test_the_archive_is_reproducible(self):
        first, manifest_a, _ = self.package()
        second, manifest_b, _ = self.package()
        self.assertEqual(manifest_a["spec"]["platforms"][0]["sha256"],
                         manifest_b["spec"]["platforms"][0]["sha256"])

    def test_a_missing_build_is_named(self):
        run = subprocess.run([os.path.join(SOURCE_DIR, "scripts", "package-plugin"),
                              "--build-dir", "/nonexistent"], capture_output=True, text=True)
        self.assertEqual(run.returncode, 1)
        self.assertIn("/nonexistent/cli/clusterprof is not built", run.stderr)


if __name__ == "__main__":
    unittest.main()
