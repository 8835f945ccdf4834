"""The Python module stays within Python 3.8: its grammar parses as 3.8's, and it calls none of
the library functions and methods that 3.9 and later added. (Debian has no 3.8 interpreter to run
it under; old_glibc_load_integration_test runs it under bullseye's 3.9.)

    python3 python_module_py38_test.py MODULE.py
"""
import ast
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

source = open(sys.argv[1]).read()
tree = ast.parse(source, filename=sys.argv[1], feature_version=(3, 8))
found = []
for node in ast.walk(tree):
    name = None
    if isinstance(node, ast.Attribute):
        name = node.attr
    elif isinstance(node, ast.Name):
        name = node.id
    elif isinstance(node, ast.Match if hasattr(ast, "Match") else ()):
        found.append("line %d: match statement (3.10)" % node.lineno)
    if name in NEWER:
        found.append("line %d: %s (after 3.8)" % (node.lineno, name))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and (
            isinstance(node.left, ast.Dict) or isinstance(node.right, ast.Dict)):
        found.append("line %d: dict union (3.9)" % node.lineno)
if found:
    print("\n".join(found))
    sys.exit(1)
print("ok: %s parses as Python 3.8 and uses nothing newer" % sys.argv[1])
