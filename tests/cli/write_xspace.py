"""Writes an XSpace with Python's pure-Python protobuf implementation.

Used by cli_integration_test to prove that `clusterprof convert` and `inspect` read files that a
different protobuf implementation wrote (as TensorFlow and JAX do). Usage:
  PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python python3 write_xspace.py <pb2 dir> <out file>
"""
import sys

sys.path.insert(0, sys.argv[1])
from google.protobuf.internal import api_implementation  # noqa: E402
from tsl.profiler.protos import xplane_pb2  # noqa: E402

BASE_NS = 1_767_225_600_000_000_000

space = xplane_pb2.XSpace()
space.hostnames.append("py-writer")
plane = space.planes.add()
plane.id = 0
plane.name = "/host:CPU"
plane.event_metadata[1].id = 1
plane.event_metadata[1].name = "python_step"
plane.event_metadata[2].id = 2
plane.event_metadata[2].name = "python_op"
plane.stat_metadata[1].id = 1
plane.stat_metadata[1].name = "step_num"
line = plane.lines.add()
line.id = 77
line.display_id = 77
line.name = "MainThread"
line.timestamp_ns = BASE_NS
for i in range(10):
    step = line.events.add()
    step.metadata_id = 1
    step.offset_ps = i * 10_000_000
    step.duration_ps = 9_000_000
    stat = step.stats.add()
    stat.metadata_id = 1
    stat.int64_value = i
    op = line.events.add()
    op.metadata_id = 2
    op.offset_ps = i * 10_000_000 + 1_000_000
    op.duration_ps = 2_000_000
with open(sys.argv[2], "wb") as f:
    f.write(space.SerializeToString())
print("implementation=" + api_implementation.Type())
