"""The Python SDK's wheel (scripts/build-wheel): a valid wheel whose RECORD matches its files,
tagged py3-none-manylinux_2_28_<arch>, the whole clusterprof package and the stripped library
inside, reproducible, refused when the library needs a glibc newer than 2.28; and, installed by
this interpreter's pip with --target, a module that loads the bundled library and records.

    python3 python_wheel_test.py BUILD_WHEEL BUILD_DIR LIBRARY CC
BUILD_WHEEL is scripts/build-wheel, LIBRARY the build tree's libclusterprof_annotate.so, CC a C
compiler (for a library that needs GLIBC_2.33).
"""

import base64
import email.parser
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
import zipfile

BUILD_WHEEL, BUILD_DIR, LIBRARY, CC = sys.argv[1:5]
SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(BUILD_WHEEL)))
PACKAGE_DIR = os.path.join(SOURCE_DIR, "sdk", "python", "clusterprof")
CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "wheel_record_check.py")


def run(command, **kwargs):
    return subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, **kwargs)


def build_wheel(*args):
    """Runs build-wheel; returns (the wheel's path from its stdout, its output)."""
    result = subprocess.run([BUILD_WHEEL] + list(args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, universal_newlines=True)
    assert result.returncode == 0, result.stdout + result.stderr
    path, size = result.stdout.split()
    assert os.path.getsize(path) == int(size), (path, size)
    return path, result.stderr


def newest_glibc(library):
    versions = re.findall(r"\bGLIBC_([0-9]+)\.([0-9]+)", run(["objdump", "-T", library]).stdout)
    return max((int(major), int(minor)) for major, minor in versions)


class WheelTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="clusterprof-wheel-test-")
        cls.wheel, _ = build_wheel("--build-dir", BUILD_DIR, "--out", os.path.join(cls.tmp, "a"))
        with open(os.path.join(SOURCE_DIR, "CMakeLists.txt")) as f:
            cls.version = re.search(r"project\(clusterprof VERSION (\S+)", f.read()).group(1)
        cls.arch = {"x86_64": "x86_64", "aarch64": "aarch64"}[os.uname().machine]
        cls.dist_info = "clusterprof-%s.dist-info" % cls.version
        cls.zip = zipfile.ZipFile(cls.wheel)

    @classmethod
    def tearDownClass(cls):
        cls.zip.close()
        shutil.rmtree(cls.tmp)

    def read(self, name):
        return self.zip.read(name)

    def test_name_and_wheel_file(self):
        tag = "py3-none-manylinux_2_28_%s" % self.arch
        self.assertEqual(os.path.basename(self.wheel),
                         "clusterprof-%s-%s.whl" % (self.version, tag))
        wheel = email.parser.Parser().parsestr(self.read(self.dist_info + "/WHEEL").decode())
        self.assertEqual(wheel["Wheel-Version"], "1.0")
        self.assertEqual(wheel["Root-Is-Purelib"], "false")
        self.assertEqual(wheel.get_all("Tag"), [tag])

    def test_valid_zip_and_record_matches_every_file(self):
        self.assertIsNone(self.zip.testzip())
        names = self.zip.namelist()
        self.assertEqual(len(names), len(set(names)), "duplicate entries")
        self.assertEqual(names[-1], self.dist_info + "/RECORD", "RECORD comes last")
        record = {}
        for line in self.read(self.dist_info + "/RECORD").decode().splitlines():
            path, digest, size = line.rsplit(",", 2)
            self.assertNotIn(path, record)
            record[path] = (digest, size)
        self.assertEqual(sorted(record), sorted(names))
        self.assertEqual(record.pop(self.dist_info + "/RECORD"), ("", ""))
        for path, (digest, size) in record.items():
            data = self.read(path)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            self.assertEqual(digest, "sha256=" + expected.decode(), path)
            self.assertEqual(int(size), len(data), path)

    def test_metadata(self):
        metadata = email.parser.Parser().parsestr(self.read(self.dist_info + "/METADATA").decode())
        self.assertEqual(metadata["Metadata-Version"], "2.1")
        self.assertEqual(metadata["Name"], "clusterprof")
        self.assertEqual(metadata["Version"], self.version)
        self.assertEqual(metadata["Requires-Python"], ">=3.8")
        self.assertEqual(self.read(self.dist_info + "/top_level.txt"), b"clusterprof\n")

    def test_holds_the_whole_package_directory(self):
        expected = {}
        for directory, subdirs, files in os.walk(PACKAGE_DIR):
            subdirs[:] = [d for d in subdirs if d != "__pycache__"]
            for name in files:
                if not name.endswith((".pyc", ".so")) and not name.startswith("."):
                    path = os.path.join(directory, name)
                    with open(path, "rb") as f:
                        expected[os.path.relpath(path, os.path.dirname(PACKAGE_DIR))] = f.read()
        self.assertIn("clusterprof/__init__.py", expected)
        packaged = {n: self.read(n) for n in self.zip.namelist()
                    if n.startswith("clusterprof/") and not n.endswith(".so")}
        self.assertEqual(packaged, expected)
        for name in self.zip.namelist():
            self.assertTrue(name.startswith(("clusterprof/", self.dist_info + "/")), name)

    def test_library_is_the_builds_stripped_and_needs_glibc_2_28_at_most(self):
        name = "clusterprof/libclusterprof_annotate.so"
        info = self.zip.getinfo(name)
        self.assertEqual(info.external_attr >> 16, 0o100755)
        library = self.zip.extract(name, os.path.join(self.tmp, "extracted"))
        sections = run(["objdump", "-h", library]).stdout
        self.assertIn(".text", sections)
        self.assertNotIn(".debug_", sections)
        stripped = os.path.join(self.tmp, "stripped.so")
        subprocess.check_call(["objcopy", "--strip-debug", LIBRARY, stripped])
        with open(stripped, "rb") as a, open(library, "rb") as b:
            self.assertEqual(a.read(), b.read(), "not the build's library, stripped")
        self.assertLessEqual(newest_glibc(library), (2, 28))
        self.assertRegex(run(["objdump", "-T", library]).stdout, r"\sclusterprof_abi_version\n")

    def test_reproducible(self):
        again, _ = build_wheel("--library", LIBRARY, "--out", os.path.join(self.tmp, "b"))
        with open(self.wheel, "rb") as a, open(again, "rb") as b:
            self.assertEqual(hashlib.sha256(a.read()).digest(), hashlib.sha256(b.read()).digest())
        for info in self.zip.infolist():
            self.assertEqual(info.date_time, (1980, 1, 1, 0, 0, 0), info.filename)

    def test_refuses_a_library_that_needs_a_newer_glibc(self):
        source = os.path.join(self.tmp, "newer.c")
        library = os.path.join(self.tmp, "libnewer.so")
        with open(source, "w") as f:
            # stat@GLIBC_2.33, when linked against glibc 2.33 or newer (as on Debian 12).
            f.write("#include <sys/stat.h>\n"
                    "int clusterprof_abi_version(void) {\n"
                    "  struct stat s;\n"
                    "  return stat(\"/\", &s);\n"
                    "}\n")
        subprocess.check_call([CC, "-shared", "-fPIC", "-o", library, source])
        if newest_glibc(library) <= (2, 28):
            self.skipTest("this C library binds stat to a version 2.28 has")
        out = os.path.join(self.tmp, "refused")
        result = run([BUILD_WHEEL, "--library", library, "--out", out])
        self.assertEqual(result.returncode, 1, result.stdout)
        self.assertIn("newer than GLIBC_2.28", result.stdout)
        self.assertRegex(result.stdout, r"\(GLIBC_2\.3[3-9]\) stat")
        self.assertFalse(os.path.exists(out) and os.listdir(out), "no wheel may be written")

    def test_bad_inputs_are_named(self):
        result = run([BUILD_WHEEL, "--library", os.path.join(self.tmp, "none.so")])
        self.assertEqual(result.returncode, 1)
        self.assertIn("none.so: no such file", result.stdout)
        result = run([BUILD_WHEEL, "--build-dir", self.tmp])
        self.assertEqual(result.returncode, 1)
        self.assertIn("not a configured Ninja build tree", result.stdout)
        result = run([BUILD_WHEEL, "--library", CHECK, "--out", os.path.join(self.tmp, "x")])
        self.assertEqual(result.returncode, 1)
        self.assertIn("not an ELF file", result.stdout)

    def test_pip_install_then_import_finds_the_bundled_library_and_records(self):
        target = os.path.join(self.tmp, "site")
        result = run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps",
                      "--no-cache-dir", "--disable-pip-version-check", "--no-input",
                      "--target", target, self.wheel])
        self.assertEqual(result.returncode, 0, result.stdout)
        self.assertTrue(os.path.isfile(os.path.join(target, "clusterprof",
                                                    "libclusterprof_annotate.so")))
        self.assertTrue(os.path.isfile(os.path.join(target, self.dist_info, "RECORD")))
        shm = os.path.join(self.tmp, "shm")
        os.mkdir(shm)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CLUSTERPROF_", "PYTHON"))}
        env.update(PYTHONPATH=target, CLUSTERPROF_DIR=shm)
        # -s: no user site-packages; the working directory holds no clusterprof package.
        result = run([sys.executable, "-B", "-s", CHECK, target], env=env, cwd=shm)
        self.assertEqual(result.returncode, 0, result.stdout)
        self.assertIn("ok: ", result.stdout)
        self.assertTrue([f for f in os.listdir(shm) if f.startswith("ring-")], os.listdir(shm))


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
