"""A Python gRPC client of clusterprof-sidecar, as TensorFlow, JAX or XProf would be.

Driven by python_interop_integration_test.cc. The stubs come from grpc_tools.protoc run on the
repository's .proto files; their directory is the first argument (--stubs). Results are printed
as `key=value` lines. A failed RPC is a result, not an error: it prints `code=<StatusCode>` and
`details=...` and the script exits 0. The exit code is non-zero only when the script itself
fails (bad arguments, an exception).

  grpc_client.py --stubs DIR [--target HOST:PORT] COMMAND [options]

Commands:
  profile        one Profile RPC (options below)
  terminate      a Profile in a thread; Terminate once the session is capturing
  monitor        one Monitor RPC
  info           Sidecar.GetInfo, bracketed by time.time_ns()
  session ID     Sidecar.GetSession
  xplane FILE    parse an .xplane.pb file
  trace-json FILE  parse a .trace.json.gz file
  http-get URL   one HTTP GET (the sidecar's /healthz, /readyz, /metrics)
"""

import argparse
import gzip
import json
import sys
import threading
import time
import urllib.error
import urllib.request

# Checked between polls of a session's state; generous so slow machines still pass.
POLL_DEADLINE_S = 30.0
RPC_TIMEOUT_S = 60.0


def emit(key, value):
    """Prints one result line; values stay on one line."""
    text = str(value).replace("\n", "\\n")
    print(f"{key}={text}", flush=True)


def import_stubs(stubs_dir):
    sys.path.insert(0, stubs_dir)
    # Imported here: the directory is known only once the arguments are parsed.
    global grpc, profiler_service_pb2, profiler_service_pb2_grpc, xplane_pb2
    global sidecar_pb2, sidecar_pb2_grpc
    import grpc
    from clusterprof.v1alpha1 import sidecar_pb2, sidecar_pb2_grpc
    from tsl.profiler.protos import (profiler_service_pb2, profiler_service_pb2_grpc,
                                     xplane_pb2)


def make_channel(target):
    # Loopback only: a proxy from the environment must not be used.
    options = [
        ("grpc.enable_http_proxy", 0),
        ("grpc.max_receive_message_length", 2**31 - 1),
    ]
    return grpc.insecure_channel(target, options=options)


def emit_rpc_error(error, prefix=""):
    emit(prefix + "code", error.code().name)
    emit(prefix + "details", error.details())


def describe_xspace(space, prefix):
    """Prints what the test checks of an XSpace."""
    emit(prefix + "hostnames", ",".join(space.hostnames))
    emit(prefix + "planes", "|".join(plane.name for plane in space.planes))
    emit(prefix + "warnings", "|".join(space.warnings))
    emit(prefix + "events",
         sum(len(line.events) for plane in space.planes for line in plane.lines))
    for plane in space.planes:
        if plane.name != "Task Environment":
            continue
        emit(prefix + "task_environment", 1)
        for stat in plane.stats:
            name = plane.stat_metadata[stat.metadata_id].name
            kind = stat.WhichOneof("value")
            value = getattr(stat, kind) if kind is not None else ""
            if kind == "ref_value":
                value = plane.stat_metadata[stat.ref_value].name
            emit(prefix + name, value)


def build_profile_request(args):
    request = profiler_service_pb2.ProfileRequest()
    if args.version is not None:
        request.opts.version = args.version
    if args.duration_ms is not None:
        request.opts.duration_ms = args.duration_ms
    if args.request_duration_ms is not None:
        request.duration_ms = args.request_duration_ms
    if args.repository_root is not None:
        request.repository_root = args.repository_root
    if args.session_id is not None:
        request.session_id = args.session_id
    if args.opts_session_id is not None:
        request.opts.session_id = args.opts_session_id
    if args.host_name is not None:
        request.host_name = args.host_name
    if args.override_hostname is not None:
        request.opts.override_hostname = args.override_hostname
    if args.version:
        # What upstream clients send with version 1.
        request.opts.host_tracer_level = 2
        request.opts.device_tracer_level = 1
        request.opts.python_tracer_level = 0
    request.emit_xspace = args.emit_xspace
    return request


def profile(stub, request):
    """One Profile RPC; returns (response or None, error or None, seconds)."""
    start = time.monotonic()
    try:
        response = stub.Profile(request, timeout=RPC_TIMEOUT_S)
        return response, None, time.monotonic() - start
    except grpc.RpcError as error:
        return None, error, time.monotonic() - start


def emit_profile_result(response, error, seconds):
    emit("profile_seconds", f"{seconds:.3f}")
    if error is not None:
        emit_rpc_error(error)
        return
    emit("code", "OK")
    emit("empty_trace", int(response.empty_trace))
    emit("tool_data", len(response.tool_data))
    emit("has_xspace", int(response.HasField("xspace")))
    if response.HasField("xspace"):
        describe_xspace(response.xspace, "xspace.")


def command_profile(args, channel):
    stub = profiler_service_pb2_grpc.ProfilerServiceStub(channel)
    emit_profile_result(*profile(stub, build_profile_request(args)))


def command_terminate(args, channel):
    """Starts a Profile in a thread, waits until its session captures, then terminates it."""
    stub = profiler_service_pb2_grpc.ProfilerServiceStub(channel)
    sidecar = sidecar_pb2_grpc.SidecarStub(channel)
    request = build_profile_request(args)
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(result=profile(stub, request)))
    thread.start()
    deadline = time.monotonic() + POLL_DEADLINE_S
    state = "unknown"
    while time.monotonic() < deadline and thread.is_alive():
        try:
            reply = sidecar.GetSession(
                sidecar_pb2.GetSessionRequest(session_id=args.session_id), timeout=RPC_TIMEOUT_S)
            state = sidecar_pb2.SessionState.Name(reply.state)
            if reply.state == sidecar_pb2.SESSION_STATE_CAPTURING:
                break
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.NOT_FOUND:
                raise
        time.sleep(0.02)
    emit("state_before_terminate", state)
    time.sleep(args.terminate_after_s)
    try:
        stub.Terminate(
            profiler_service_pb2.TerminateRequest(session_id=args.session_id),
            timeout=RPC_TIMEOUT_S)
        emit("terminate_code", "OK")
    except grpc.RpcError as error:
        emit_rpc_error(error, "terminate_")
    thread.join(RPC_TIMEOUT_S + 10)
    if thread.is_alive():
        raise RuntimeError("the Profile RPC did not return")
    emit_profile_result(*outcome["result"])


def command_monitor(args, channel):
    stub = profiler_service_pb2_grpc.ProfilerServiceStub(channel)
    try:
        reply = stub.Monitor(
            profiler_service_pb2.MonitorRequest(duration_ms=100), timeout=RPC_TIMEOUT_S)
        emit("code", "OK")
        emit("data", reply.data)
    except grpc.RpcError as error:
        emit_rpc_error(error)


def command_info(args, channel):
    sidecar = sidecar_pb2_grpc.SidecarStub(channel)
    before = time.time_ns()
    try:
        reply = sidecar.GetInfo(sidecar_pb2.GetInfoRequest(), timeout=RPC_TIMEOUT_S)
    except grpc.RpcError as error:
        emit_rpc_error(error)
        return
    after = time.time_ns()
    emit("code", "OK")
    emit("python_before_ns", before)
    emit("python_after_ns", after)
    emit("wall_time_ns", reply.wall_time_ns)
    emit("monotonic_time_ns", reply.monotonic_time_ns)
    emit("version", reply.version)
    emit("host_name", reply.host_name)
    emit("tracers", ",".join(f"{t.name}:{int(t.ready)}" for t in reply.tracers))
    emit("active_session_id", reply.active_session_id)


def command_session(args, channel):
    sidecar = sidecar_pb2_grpc.SidecarStub(channel)
    try:
        reply = sidecar.GetSession(
            sidecar_pb2.GetSessionRequest(session_id=args.id), timeout=RPC_TIMEOUT_S)
    except grpc.RpcError as error:
        emit_rpc_error(error)
        return
    emit("code", "OK")
    emit("session_id", reply.session_id)
    emit("state", sidecar_pb2.SessionState.Name(reply.state))
    emit("start_time_ns", reply.start_time_ns)
    emit("stop_time_ns", reply.stop_time_ns)
    emit("empty_trace", int(reply.empty_trace))
    emit("error", reply.error)
    emit("files", "|".join(f.uri for f in reply.files))
    emit("file_bytes", "|".join(str(f.bytes) for f in reply.files))
    emit("upload_states", "|".join(sidecar_pb2.UploadState.Name(f.upload_state)
                                   for f in reply.files))


def command_xplane(args, channel):
    space = xplane_pb2.XSpace()
    with open(args.file, "rb") as f:
        space.ParseFromString(f.read())
    describe_xspace(space, "")


def command_trace_json(args, channel):
    with gzip.open(args.file, "rt", encoding="utf-8") as f:
        trace = json.load(f)
    emit("display_time_unit", trace["displayTimeUnit"])
    emit("trace_events", len(trace["traceEvents"]))


def command_http_get(args, channel):
    # Loopback only: a proxy from the environment must not be used.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(args.url, timeout=RPC_TIMEOUT_S) as reply:
            status, body = reply.status, reply.read()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read()
    emit("status", status)
    for number, line in enumerate(body.decode("utf-8").splitlines()):
        emit(f"body.{number}", line)


def add_profile_options(parser):
    parser.add_argument("--version", type=int)
    parser.add_argument("--duration-ms", type=int, help="opts.duration_ms")
    parser.add_argument("--request-duration-ms", type=int, help="ProfileRequest.duration_ms")
    parser.add_argument("--repository-root")
    parser.add_argument("--session-id", help="ProfileRequest.session_id")
    parser.add_argument("--opts-session-id", help="ProfileOptions.session_id")
    parser.add_argument("--host-name")
    parser.add_argument("--override-hostname", help="ProfileOptions.override_hostname")
    parser.add_argument("--emit-xspace", action="store_true")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stubs", required=True, help="directory of the generated stubs")
    parser.add_argument("--target", default="", help="HOST:PORT of the sidecar")
    commands = parser.add_subparsers(dest="command", required=True)
    add_profile_options(commands.add_parser("profile"))
    terminate = commands.add_parser("terminate")
    add_profile_options(terminate)
    terminate.add_argument("--terminate-after-s", type=float, default=0.5)
    commands.add_parser("monitor")
    commands.add_parser("info")
    commands.add_parser("session").add_argument("id")
    commands.add_parser("xplane").add_argument("file")
    commands.add_parser("trace-json").add_argument("file")
    commands.add_parser("http-get").add_argument("url")
    args = parser.parse_args()

    import_stubs(args.stubs)
    handlers = {
        "profile": command_profile,
        "terminate": command_terminate,
        "monitor": command_monitor,
        "info": command_info,
        "session": command_session,
        "xplane": command_xplane,
        "trace-json": command_trace_json,
        "http-get": command_http_get,
    }
    if args.command in ("xplane", "trace-json", "http-get"):
        handlers[args.command](args, None)
    else:
        if not args.target:
            parser.error(f"{args.command} needs --target")
        with make_channel(args.target) as channel:
            handlers[args.command](args, channel)
    emit("done", 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
