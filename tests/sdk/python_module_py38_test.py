"""The Python package stays within Python 3.8: each module's grammar parses as 3.8's, and none
calls the library functions and methods that 3.9 and later added. (Debian has no 3.8 interpreter
to run it under; old_glibc_load_integration_test runs it under bullseye's 3.9.)

    python3 python_module_py38_test.py MODULE.py|PACKAGE_DIR ...

A directory stands for every .py file in it (the package's modules).
"""
import ast
import glob
import os
import sys

# Attributes and functions added in 3.9 and later that code like this module's would reach for.
NEWER = {
    "removeprefix", "removesuffix",                       # str, 3.9
    "cache",                                              # functools.cache, 3.9
    "randbytes",                                          # random, 3.9
    "waitstatus_to_exitcode", "pidfd_open",               # os, 3.9
    "is_relative_to", "readlink", "hardlink_to",          # pathlib, 3.9/3.10
    "pairwise", "batched",                                # itertools, 3.10/3.12
    "aiter", "anext",                                     # builtins, 3.10
    "getLevelNamesMapping",                               # logging, 3.11
}


def check(path):
    """The problems of one module, as lines."""
    with open(path) as f:
        source = f.read()
    try:
        tree = ast.parse(source, filename=path, feature_version=(3, 8))
    except SyntaxError as e:
        return ["%s: line %s: %s (not Python 3.8 grammar)" % (path, e.lineno, e.msg)]
    found = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, ast.Match if hasattr(ast, "Match") else ()):
            found.append("%s: line %d: match statement (3.10)" % (path, node.lineno))
        if name in NEWER:
            found.append("%s: line %d: %s (after 3.8)" % (path, node.lineno, name))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and (
                isinstance(node.left, ast.Dict) or isinstance(node.right, ast.Dict)):
            found.append("%s: line %d: dict union (3.9)" % (path, node.lineno))
    return found


paths = []
for argument in sys.argv[1:]:
    if os.path.isdir(argument):
        paths += sorted(glob.glob(os.path.join(argument, "*.py")))
    else:
        paths.append(argument)
if not paths:
    print("no modules to check in %s" % " ".join(sys.argv[1:]))
    sys.exit(1)
found = []
for path in paths:
    found += check(path)
if found:
    print("\n".join(found))
    sys.exit(1)
for path in paths:
    print("ok: %s parses as Python 3.8 and uses nothing newer" % path)
