"""Run by the wheel tests (python_wheel_test.py, old_glibc_wheel_integration_test.sh) with the
interpreter a wheel was installed for. Arms annotations as a sidecar would, with a control page
in $CLUSTERPROF_DIR (docs/shm-format.md); imports clusterprof and checks that it is the installed
package and that it loaded the library bundled in it; records a Trace on a named thread; then
reads the process's ring file and finds that event in it.

    wheel_record_check.py INSTALL_DIR
Prints `ok: ...` and exits 0, or fails with an AssertionError saying what differs.
Python 3.8+ (it also runs in old Debian releases), standard library only.
"""

import mmap
import os
import struct
import sys
import threading

# sdk/shm_format.h
CONTROL_MAGIC = b"CPCTRL01"
RING_MAGIC = b"CPRING01"
CONTROL_PAGE_SIZE = 128  # sizeof(ControlPage)
LEVEL_INFO = 2
KIND_COMPLETE = 1
ARG_INT64 = 1


def arm(directory):
    """Writes the control page with host_level INFO and one armed session, as the sidecar does:
    under a temporary name, renamed into place."""
    page = struct.pack("<8sIIIIQqq", CONTROL_MAGIC, 1, CONTROL_PAGE_SIZE, LEVEL_INFO, 0, 1, 0, 0)
    path = os.path.join(directory, "control")
    with open(path + ".tmp", "wb") as f:
        f.write(page.ljust(4096, b"\0"))
    os.rename(path + ".tmp", path)


def string_at(data, strings_offset, string_id):
    """The string table entry `string_id` (its offset + 1): a u32 length + 1, then the bytes."""
    assert string_id > 0, "no string id"
    at = strings_offset + string_id - 1
    (length_plus_one,) = struct.unpack_from("<I", data, at)
    return data[at + 4:at + 4 + length_plus_one - 1].decode("utf-8")


def events(ring_path):
    """(thread name, tid, record name, kind, start, end, [(key, type, value)]) for every record
    in the ring file."""
    # Mapped, not read: the file is sparse and large (256 MiB at the default ring size).
    with open(ring_path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    magic, version, _, pid, max_threads = struct.unpack_from("<8sIIII", data, 0)
    assert magic == RING_MAGIC and version == 1, "%s: not a version 1 ring" % ring_path
    assert pid == os.getpid(), "%s: pid %d, this process is %d" % (ring_path, pid, os.getpid())
    slots_per_thread, record_size = struct.unpack_from("<II", data, 32)
    slots_offset, records_offset, strings_offset = struct.unpack_from("<QQQ", data, 40)
    assert record_size == 64, "record size %d" % record_size
    found = []
    for thread in range(max_threads):
        slot = slots_offset + 64 * thread
        write_index, _, _, tid, name_id = struct.unpack_from("<QQQII", data, slot)
        if tid == 0:
            continue
        thread_name = string_at(data, strings_offset, name_id) if name_id else ""
        for i in range(min(write_index, slots_per_thread)):
            at = records_offset + (thread * slots_per_thread + i) * record_size
            start, end, name_id, kind, num_args = struct.unpack_from("<qqIHB", data, at)
            args = []
            for a in range(num_args):
                key_id, arg_type, value = struct.unpack_from("<IIq", data, at + 32 + 16 * a)
                args.append((string_at(data, strings_offset, key_id), arg_type, value))
            found.append((thread_name, tid, string_at(data, strings_offset, name_id), kind,
                          start, end, args))
    return found


def main():
    install_dir = os.path.realpath(sys.argv[1])
    directory = os.environ["CLUSTERPROF_DIR"]
    assert "CLUSTERPROF_ANNOTATE_LIB" not in os.environ, "the library must be found unaided"
    arm(directory)

    import clusterprof

    package_dir = os.path.dirname(os.path.realpath(clusterprof.__file__))
    assert package_dir.startswith(install_dir + os.sep), (
        "imported %s, not the package installed under %s" % (package_dir, install_dir))
    bundled = os.path.join(package_dir, "libclusterprof_annotate.so")
    assert clusterprof.library_path() == bundled, (
        "loaded %s, not the bundled %s" % (clusterprof.library_path(), bundled))
    assert clusterprof.tracing_enabled(clusterprof.INFO), "the control page did not arm tracing"

    clusterprof.set_thread_name("wheel_main")
    with clusterprof.Trace("wheel_step", step_num=7):
        pass
    stats = clusterprof.stats()
    assert stats["attached"], stats
    ring = stats["ring_path"]
    assert os.path.dirname(ring) == directory.rstrip("/"), "ring %r outside %s" % (ring, directory)

    expected = ("wheel_main", threading.get_native_id(), "wheel_step", KIND_COMPLETE)
    recorded = events(ring)
    matches = [e for e in recorded if e[:4] == expected]
    assert len(matches) == 1, "expected one %s in %s, found %s" % (expected, ring, recorded)
    _, _, _, _, start, end, args = matches[0]
    assert 0 < start <= end, (start, end)
    assert args == [("step_num", ARG_INT64, 7)], args
    print("ok: python %s imported %s, loaded %s, recorded wheel_step{step_num=7} in %s" % (
        sys.version.split()[0], package_dir, bundled, ring))


if __name__ == "__main__":
    main()
