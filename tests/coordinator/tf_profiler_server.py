"""A stand-in for the profiler server of TensorFlow and JAX.

`tf.profiler.experimental.server.start(port)` and `jax.profiler.start_server(port)` serve only
`tensorflow.ProfilerService`; this script does the same, behaving as docs/protocol.md ("How the
upstream server behaves") describes, so that tf_server_integration_test.cc can drive it with the
coordinator without installing TensorFlow. Like upstream, it does NOT serve
`clusterprof.v1alpha1.Sidecar`: Sidecar.GetInfo answers UNIMPLEMENTED.

  tf_profiler_server.py --stubs DIR --port-file FILE [--record FILE]

The stubs come from grpc_tools.protoc run on the repository's .proto files (DIR). The server
listens on 127.0.0.1, on a port the system picks; it prints `port=<port>` and writes
`grpc=<port>` to FILE (complete once it exists). With --record, every Profile call appends
`key=value` lines (space-separated, one event per line) to that file:

  event=received session_id=S start_timestamp_ns=N version=V received_ns=N
  event=refused session_id=S code=INTERNAL
  event=started session_id=S start_timestamp_ns=N actual_start_ns=N
  event=finished session_id=S stop_ns=N host=H file=PATH|-
  event=cancelled session_id=S
  event=failed session_id=S code=INTERNAL

What it does per Profile, as upstream does:
  - version 0 in opts means "defaults": every option is discarded (start_timestamp_ns
    included) except include_dataset_ops, and version=1, host 2, device 1, python 0,
    enable_hlo_proto are used;
  - one capture at a time: a second Profile while one runs is INTERNAL "Another profiling
    session active." (not retried by upstream clients);
  - wait until opts.start_timestamp_ns (wall clock), starting at once if it has passed;
  - record for opts.duration_ms (else request.duration_ms); Terminate(session_id) ends it early
    and keeps the data; a cancelled RPC returns CANCELLED and loses it;
  - unless emit_xspace, write <repository_root>/<session_id>/<host>.xplane.pb, host =
    opts.override_hostname, else advanced_configuration["override_hostname"], else
    request.host_name, with ':' replaced by '_'; a write failure is INTERNAL;
  - the XSpace holds hostnames=[host], a `/host:CPU` plane with one thread line and a few
    events, and a `Task Environment` plane (profile_start_time, profile_stop_time,
    profile_options); empty_trace is False.
"""

import argparse
import os
import signal
import sys
import threading
import time
from concurrent import futures

POLL_S = 0.01
ANOTHER_SESSION = "Another profiling session active."


def import_stubs(stubs_dir):
    sys.path.insert(0, stubs_dir)
    # Imported here: the directory is known only once the arguments are parsed.
    global grpc, text_format, profiler_options_pb2, profiler_service_pb2
    global profiler_service_pb2_grpc, xplane_pb2
    import grpc
    from google.protobuf import text_format
    from tsl.profiler.protos import (profiler_options_pb2, profiler_service_pb2,
                                     profiler_service_pb2_grpc, xplane_pb2)


def effective_options(opts):
    """Upstream's GetOptions: version 0 means the defaults, whatever else was sent."""
    if opts.version:
        result = profiler_options_pb2.ProfileOptions()
        result.CopyFrom(opts)
        return result
    result = profiler_options_pb2.ProfileOptions()
    result.version = 1
    result.host_tracer_level = 2
    result.device_tracer_level = 1
    result.python_tracer_level = 0
    result.enable_hlo_proto = True
    result.include_dataset_ops = True
    return result


def host_name(request, opts):
    name = opts.override_hostname
    if not name and "override_hostname" in opts.advanced_configuration:
        name = opts.advanced_configuration["override_hostname"].string_value
    if not name:
        name = request.host_name
    return name.replace(":", "_")


def build_xspace(host, opts, start_ns, stop_ns):
    space = xplane_pb2.XSpace()
    space.hostnames.append(host)

    cpu = space.planes.add()
    cpu.id = 0
    cpu.name = "/host:CPU"
    names = {1: "train", 2: "forward", 3: "backward"}
    for metadata_id, name in names.items():
        cpu.event_metadata[metadata_id].id = metadata_id
        cpu.event_metadata[metadata_id].name = name
    cpu.stat_metadata[1].id = 1
    cpu.stat_metadata[1].name = "step_num"
    line = cpu.lines.add()
    line.id = 4242
    line.display_id = 4242
    line.name = "python-main"
    line.timestamp_ns = start_ns
    line.duration_ps = max(0, stop_ns - start_ns) * 1000
    # A step with two nested ops, twice; well inside the capture window.
    for step in range(2):
        base_ps = step * 1_000_000_000  # 1 ms apart
        train = line.events.add()
        train.metadata_id = 1
        train.offset_ps = base_ps
        train.duration_ps = 800_000_000
        stat = train.stats.add()
        stat.metadata_id = 1
        stat.int64_value = step
        for metadata_id, offset_ps in ((2, 100_000_000), (3, 450_000_000)):
            event = line.events.add()
            event.metadata_id = metadata_id
            event.offset_ps = base_ps + offset_ps
            event.duration_ps = 300_000_000

    env = space.planes.add()
    env.id = 1
    env.name = "Task Environment"
    for metadata_id, name in ((1, "profile_start_time"), (2, "profile_stop_time"),
                              (3, "profile_options")):
        env.stat_metadata[metadata_id].id = metadata_id
        env.stat_metadata[metadata_id].name = name
    stat = env.stats.add()
    stat.metadata_id = 1
    stat.uint64_value = start_ns
    stat = env.stats.add()
    stat.metadata_id = 2
    stat.uint64_value = stop_ns
    stat = env.stats.add()
    stat.metadata_id = 3
    stat.str_value = text_format.MessageToString(opts)
    return space


def empty_trace(space):
    return not any(line.events for plane in space.planes for line in plane.lines)


class Recorder:
    """Appends one `key=value ...` line per event to a file (or nowhere)."""

    def __init__(self, path):
        self._path = path
        self._lock = threading.Lock()

    def __call__(self, **fields):
        text = " ".join(f"{key}={value}" for key, value in fields.items()) + "\n"
        sys.stdout.write(text)
        sys.stdout.flush()
        if self._path is None:
            return
        with self._lock, open(self._path, "a", encoding="utf-8") as out:
            out.write(text)
            out.flush()


class ProfilerServicer:
    """tensorflow.ProfilerService as upstream's ProfilerServiceImpl behaves."""

    def __init__(self, record):
        self._record = record
        self._lock = threading.Lock()
        self._active = None  # the running session's id
        self._stopped = set()  # session ids Terminate was called for

    def Profile(self, request, context):
        received_ns = time.time_ns()
        opts = effective_options(request.opts)
        session_id = request.session_id
        self._record(event="received", session_id=session_id or "-",
                     start_timestamp_ns=request.opts.start_timestamp_ns,
                     version=request.opts.version, received_ns=received_ns)
        with self._lock:
            if self._active is not None:
                busy = True
            else:
                busy = False
                self._active = session_id
                self._stopped.discard(session_id)
        if busy:
            self._record(event="refused", session_id=session_id or "-", code="INTERNAL")
            context.abort(grpc.StatusCode.INTERNAL, ANOTHER_SESSION)
        try:
            return self._capture(request, opts, context)
        finally:
            with self._lock:
                self._active = None
                self._stopped.discard(session_id)

    def _wait(self, until_ns, session_id, context):
        """Sleeps until the wall clock reaches until_ns; False if the RPC went away first."""
        while time.time_ns() < until_ns:
            if not context.is_active():
                return False
            with self._lock:
                if session_id in self._stopped:
                    return True
            time.sleep(min(POLL_S, max(0, until_ns - time.time_ns()) / 1e9))
        return True

    def _capture(self, request, opts, context):
        session_id = request.session_id
        if opts.start_timestamp_ns > 0 and opts.start_timestamp_ns > time.time_ns():
            if not self._wait(opts.start_timestamp_ns, session_id, context):
                self._record(event="cancelled", session_id=session_id or "-")
                context.abort(grpc.StatusCode.CANCELLED, "the client went away")
        # (A start in the past starts at once; upstream logs a warning.)
        start_ns = time.time_ns()
        self._record(event="started", session_id=session_id or "-",
                     start_timestamp_ns=opts.start_timestamp_ns, actual_start_ns=start_ns)
        duration_ms = opts.duration_ms or request.duration_ms
        if not self._wait(start_ns + duration_ms * 1_000_000, session_id, context):
            self._record(event="cancelled", session_id=session_id or "-")
            context.abort(grpc.StatusCode.CANCELLED, "the client went away")
        stop_ns = time.time_ns()

        host = host_name(request, opts)
        space = build_xspace(host, opts, start_ns, stop_ns)
        response = profiler_service_pb2.ProfileResponse()
        response.empty_trace = empty_trace(space)
        path = "-"
        if request.emit_xspace:
            response.xspace.CopyFrom(space)
        else:
            directory = os.path.join(request.repository_root, session_id)
            path = os.path.join(directory, host + ".xplane.pb")
            try:
                os.makedirs(directory, exist_ok=True)
                with open(path, "wb") as out:
                    out.write(space.SerializeToString())
            except OSError as error:
                self._record(event="failed", session_id=session_id or "-", code="INTERNAL")
                context.abort(grpc.StatusCode.INTERNAL, f"cannot write {path}: {error}")
        self._record(event="finished", session_id=session_id or "-", stop_ns=stop_ns, host=host,
                     file=path)
        return response

    def Terminate(self, request, context):
        with self._lock:
            self._stopped.add(request.session_id)
        return profiler_service_pb2.TerminateResponse()

    def Monitor(self, request, context):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "Monitor is not implemented")


def write_port_file(path, port):
    # Written to a temporary name and renamed: once the file exists, it is whole.
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as out:
        out.write(f"grpc={port}\n")
    os.rename(temporary, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stubs", required=True, help="directory of the generated stubs")
    parser.add_argument("--port-file", required=True, help="where to write grpc=<port>")
    parser.add_argument("--record", help="file to append one line per Profile event to")
    args = parser.parse_args()
    import_stubs(args.stubs)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8),
                         options=[("grpc.max_send_message_length", 2**31 - 1)])
    servicer = ProfilerServicer(Recorder(args.record))
    # Only the profiler service, as TensorFlow and JAX register it; nothing else.
    profiler_service_pb2_grpc.add_ProfilerServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    if port == 0:
        print("cannot bind 127.0.0.1", file=sys.stderr)
        return 1
    server.start()
    print(f"port={port}", flush=True)
    write_port_file(args.port_file, port)

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    while not done.wait(0.5):
        pass
    server.stop(grace=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
