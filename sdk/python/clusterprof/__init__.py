"""clusterprof annotations for Python: what tf.profiler.experimental.Trace is, for clusterprof.

    import clusterprof

    for step in range(steps):
        with clusterprof.Trace("train", step_num=step, _r=1) as trace:
            ...
            trace.set_metadata(loss=loss)

    @clusterprof.Trace("load_batch")
    def load_batch(): ...

    clusterprof.set_thread_name("data_loader")
    clusterprof.async_begin("prefetch", batch_id)   # on one thread
    clusterprof.async_end(batch_id)                 # on any other

Events go to the pod's clusterprof sidecar through shared memory, by way of the C ABI in
libclusterprof_annotate.so (clusterprof_annotate.h), loaded with ctypes. Pure Python, standard
library only, Python 3.8+.

Names are TraceMe-encoded as upstream's Trace encodes them: `name#key=value,...#`, each value
written with str() and booleans as 1 and 0; '#' inside a name, key or value becomes '_'.
Levels are TraceMe's (CRITICAL 1, INFO 2, VERBOSE 3); as with tf.profiler.experimental.Trace,
Trace records at level 1 unless given another level: `Trace("op", clusterprof.VERBOSE)`.

While no capture is armed, entering and leaving a Trace costs one call into the library and
nothing else: no clock read, no string built.

The library is looked for in this order: the path in $CLUSTERPROF_ANNOTATE_LIB, this package's
directory and its parent, the build trees of a clusterprof checkout this package sits in, then
the system's library path (ctypes.util.find_library). Without it the module still works and
records nothing, after one warning on the "clusterprof" logger: a workload never fails because
the profiler is missing.
"""

import ctypes
import ctypes.util
import functools
import glob
import logging
import os
import threading

__all__ = [
    "CRITICAL",
    "INFO",
    "VERBOSE",
    "Trace",
    "async_begin",
    "async_end",
    "library_path",
    "now_ns",
    "set_metadata",
    "set_thread_name",
    "stats",
    "tracing_enabled",
]

CRITICAL = 1
INFO = 2
VERBOSE = 3

# The ABI version (clusterprof_annotate.h) whose functions this module calls.
_ABI_VERSION = 1
_LIB_ENV = "CLUSTERPROF_ANNOTATE_LIB"
_LIB_FILE = "libclusterprof_annotate.so"

_logger = logging.getLogger("clusterprof")


def _candidates():
    env = os.environ.get(_LIB_ENV)
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, _LIB_FILE)
    yield os.path.join(os.path.dirname(here), _LIB_FILE)
    # In a checkout: <root>/sdk/python/clusterprof/, built into <root>/build*/sdk/.
    root = os.path.abspath(os.path.join(here, os.pardir, os.pardir, os.pardir))
    if os.path.isfile(os.path.join(root, "sdk", "clusterprof_annotate.h")):
        builds = [os.path.join(root, "build")]
        builds += sorted(set(glob.glob(os.path.join(root, "build*"))) - set(builds))
        for build in builds:
            yield os.path.join(build, "sdk", _LIB_FILE)
    found = ctypes.util.find_library("clusterprof_annotate")
    if found:
        yield found


def _bind(lib):
    """Declares the C signatures; raises AttributeError when a function is missing."""
    c_int, c_int64, c_uint64 = ctypes.c_int, ctypes.c_int64, ctypes.c_uint64
    c_size_t, c_char_p = ctypes.c_size_t, ctypes.c_char_p
    signatures = {
        "clusterprof_abi_version": (c_int, []),
        "clusterprof_tracing_enabled": (c_int, [c_int]),
        "clusterprof_now_ns": (c_int64, []),
        "clusterprof_record_complete": (c_int, [c_char_p, c_size_t, c_int64, c_int64, c_int]),
        "clusterprof_set_thread_name": (None, [c_char_p, c_size_t]),
        "clusterprof_async_begin": (c_int, [c_char_p, c_size_t, c_uint64, c_int]),
        "clusterprof_async_end": (c_int, [c_uint64, c_int]),
        "clusterprof_attached": (c_int, []),
        "clusterprof_dropped_strings": (c_uint64, []),
        "clusterprof_ring_path": (c_size_t, [c_char_p, c_size_t]),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes


def _load():
    """Returns (library, path), or (None, None) after logging why no library could be used."""
    failures = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            failures.append("%s: no such file" % path)
            continue
        try:
            # PyDLL keeps the GIL during calls: they are short and never wait on Python, and
            # releasing and taking the GIL would cost more than the calls themselves.
            lib = ctypes.PyDLL(path)
            _bind(lib)
            version = lib.clusterprof_abi_version()
            if version < _ABI_VERSION:
                failures.append(
                    "%s: ABI version %d, this module needs %d" % (path, version, _ABI_VERSION))
                continue
        except Exception as e:  # OSError; AttributeError for a missing function; anything else
            failures.append("%s: %s" % (path, e))
            continue
        env = os.environ.get(_LIB_ENV)
        if env and path != env:
            _logger.warning("clusterprof: cannot use %s=%s (%s); using %s", _LIB_ENV, env,
                            failures[0] if failures else "not loaded", path)
        return lib, path
    _logger.warning(
        "clusterprof: no usable %s, so annotations are not recorded (set %s to its path). "
        "Tried: %s", _LIB_FILE, _LIB_ENV, "; ".join(failures) if failures else "nothing")
    return None, None


_lib, _lib_path = _load()

if _lib is not None:
    _enabled = _lib.clusterprof_tracing_enabled
    _now = _lib.clusterprof_now_ns
    _record = _lib.clusterprof_record_complete
    _set_thread_name = _lib.clusterprof_set_thread_name
    _async_begin = _lib.clusterprof_async_begin
    _async_end = _lib.clusterprof_async_end
else:

    def _enabled(level):
        return 0

    def _now():
        return 0

    def _record(name, size, start_ns, end_ns, level):
        return 0

    def _set_thread_name(name, size):
        return None

    def _async_begin(name, size, id, level):
        return 0

    def _async_end(id, level):
        return 0


def _utf8(text):
    return text.encode("utf-8", "replace")


def _pairs(kwargs):
    """`k1=v1,k2=v2`: values with str(), booleans as 1/0, '#' replaced by '_'."""
    parts = []
    for key, value in kwargs.items():
        cls = value.__class__
        if cls is int:
            text = str(value)  # the common case (step numbers), and never holds a '#'
        elif cls is bool:
            text = "1" if value else "0"
        else:
            text = str(value)
            if "#" in text:
                text = text.replace("#", "_")
        if "#" in key:
            key = key.replace("#", "_")
        parts.append(key + "=" + text)
    return ",".join(parts)


def _encode(name, kwargs):
    """`name#k=v,...#`, as the C++ encoder writes it; the name unchanged without kwargs."""
    if not kwargs:
        return name
    return "%s#%s#" % (name.replace("#", "_"), _pairs(kwargs))


def _append_metadata(encoded, kwargs):
    """Adds pairs to an encoded name: a trailing '#' becomes ','; a plain name gains metadata."""
    if not kwargs:
        return encoded
    if encoded.endswith("#"):
        return "%s,%s#" % (encoded[:-1], _pairs(kwargs))
    return "%s#%s#" % (encoded.replace("#", "_"), _pairs(kwargs))


# The Traces being recorded on each thread, innermost last, for the module-level set_metadata.
_active = threading.local()


class Trace(object):
    """A scoped annotation, recorded as one event on the calling thread when the scope closes.

    Trace(name, level=CRITICAL, /, **kwargs): `kwargs` are the event's metadata; `level` is only
    taken positionally, so a keyword named `level` is metadata, as upstream. Use it with `with`
    (one scope at a time per object), or as a decorator: each call of the function is then an
    event. Metadata values are read (str()) when the scope opens and when set_metadata is called.
    """

    __slots__ = ("_name", "_level", "_kwargs", "_start", "_encoded")

    def __init__(self, name, level=CRITICAL, /, **kwargs):
        self._name = name
        self._level = level
        self._kwargs = kwargs
        self._start = 0

    def __enter__(self):
        if _enabled(self._level):
            self._encoded = _encode(str(self._name), self._kwargs)
            stack = getattr(_active, "stack", None)
            if stack is None:
                stack = _active.stack = []
            stack.append(self)
            self._start = _now()
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        if self._start:
            end = _now()
            name = _utf8(self._encoded)
            _record(name, len(name), self._start, end, self._level)
            self._start = 0
            stack = getattr(_active, "stack", None)
            if not stack:
                pass  # left on another thread than it entered on
            elif stack[-1] is self:
                stack.pop()
            elif self in stack:
                stack.remove(self)
        return False

    def set_metadata(self, **kwargs):
        """Adds metadata to the event, as tf.profiler.experimental.Trace.set_metadata does."""
        if self._start and kwargs:
            self._encoded = _append_metadata(self._encoded, kwargs)

    def __call__(self, function):
        name, level, kwargs = self._name, self._level, self._kwargs

        @functools.wraps(function)
        def traced(*args, **kw):
            with Trace(name, level, **kwargs):
                return function(*args, **kw)

        return traced


def set_metadata(**kwargs):
    """Adds metadata to the innermost Trace being recorded on this thread, if any."""
    stack = getattr(_active, "stack", None)
    if stack:
        stack[-1].set_metadata(**kwargs)


def tracing_enabled(level=CRITICAL):
    """Whether annotations at `level` are being recorded now."""
    return bool(_enabled(level))


def now_ns():
    """The clock events are recorded with (wall clock, ns since the Unix epoch); 0 without the
    library."""
    return _now()


def set_thread_name(name):
    """Names the calling thread in traces."""
    data = _utf8(str(name))
    _set_thread_name(data, len(data))


def async_begin(name, id, level=CRITICAL):
    """Begins an event that ends with async_end(id), on any thread. `id` is an unsigned 64-bit
    integer."""
    if _enabled(level):
        data = _utf8(str(name))
        _async_begin(data, len(data), id & 0xFFFFFFFFFFFFFFFF, level)


def async_end(id, level=CRITICAL):
    """Ends the event async_begin(name, id) began."""
    if _enabled(level):
        _async_end(id & 0xFFFFFFFFFFFFFFFF, level)


def library_path():
    """The path of the loaded libclusterprof_annotate.so, or None when none was found."""
    return _lib_path


def stats():
    """The SDK's state in this process: attached (the sidecar's control page is mapped),
    dropped_strings, ring_path (empty until the first recorded event), library."""
    if _lib is None:
        return {"attached": False, "dropped_strings": 0, "ring_path": "", "library": None}
    size = _lib.clusterprof_ring_path(None, 0)
    buffer = ctypes.create_string_buffer(size + 1)
    _lib.clusterprof_ring_path(buffer, size + 1)
    return {
        "attached": bool(_lib.clusterprof_attached()),
        "dropped_strings": _lib.clusterprof_dropped_strings(),
        "ring_path": buffer.value.decode("utf-8", "replace"),
        "library": _lib_path,
    }
