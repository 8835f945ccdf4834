#!/usr/bin/env python3
"""A sample training loop annotated with the clusterprof Python module, for demos: run it in a
pod (or beside a local sidecar) and capture it. The twin of train_loop.cc.

    CLUSTERPROF_DIR=/tmp/clusterprof python3 examples/train_loop.py --seconds 60

The main thread records each step as Trace("train", step_num=N, _r=1) with the ops inside it
(data_load, forward, backward, optimizer, allreduce); a data loader thread prepares batches
(load_batch) and hands them over through a small queue, each batch's wait in the queue an async
event (batch_in_queue) that begins on the loader and ends on the trainer. The ops burn CPU for
their share of the step and allreduce sleeps the rest, so the process uses about --busy-percent
of one core. Runs until --seconds have passed, or until SIGINT/SIGTERM.

The clusterprof module is imported from sidecar/sdk/python of this checkout when it is not on
the path already; it finds libclusterprof_annotate.so as its documentation says (in a checkout:
the build tree), and without it the loop still runs, unrecorded.
"""

import argparse
import os
import queue
import signal
import sys
import threading
import time

try:
    import clusterprof
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                                    "sidecar", "sdk", "python"))
    import clusterprof

_stop = threading.Event()


def burn(seconds):
    """Keeps the CPU busy for `seconds`."""
    until = time.perf_counter() + seconds
    x = 1
    while time.perf_counter() < until:
        for _ in range(200):
            x = (x * 1103515245 + 12345) & 0xFFFFFFFF
    return x


def loader_loop(batches, load_seconds):
    clusterprof.set_thread_name("data_loader")
    batch = 0
    while not _stop.is_set():
        with clusterprof.Trace("load_batch", batch=batch):
            burn(load_seconds)
        clusterprof.async_begin("batch_in_queue", batch)
        while not _stop.is_set():
            try:
                batches.put(batch, timeout=0.1)
                break
            except queue.Full:
                pass
        batch += 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=0,
                        help="stop after this long (0: run until killed)")
    parser.add_argument("--step-ms", type=float, default=30, help="duration of one step")
    parser.add_argument("--busy-percent", type=float, default=50,
                        help="CPU busy share of each step, loader included")
    args = parser.parse_args()

    signal.signal(signal.SIGINT, lambda *_: _stop.set())
    signal.signal(signal.SIGTERM, lambda *_: _stop.set())
    print("train_loop.py: pid %d, CLUSTERPROF_DIR=%s" %
          (os.getpid(), os.environ.get("CLUSTERPROF_DIR") or "/var/run/clusterprof (default)"),
          flush=True)

    step_s = args.step_ms / 1000.0
    busy_s = step_s * min(max(args.busy_percent, 0.0), 100.0) / 100.0
    load_s = busy_s * 0.15
    ops_s = busy_s - load_s
    forward_s, backward_s, optimizer_s = ops_s * 0.35, ops_s * 0.5, ops_s * 0.15

    batches = queue.Queue(maxsize=2)
    loader = threading.Thread(target=loader_loop, args=(batches, load_s), daemon=True)
    loader.start()

    clusterprof.set_thread_name("trainer")
    start = time.monotonic()
    deadline = start + args.seconds if args.seconds > 0 else float("inf")
    step = 0
    while not _stop.is_set() and time.monotonic() < deadline:
        step_start = time.monotonic()
        with clusterprof.Trace("train", step_num=step, _r=1):
            with clusterprof.Trace("data_load", clusterprof.INFO):
                batch = None
                while batch is None and not _stop.is_set():
                    try:
                        batch = batches.get(timeout=0.1)
                    except queue.Empty:
                        pass
                if batch is None:
                    break
                clusterprof.async_end(batch)
            with clusterprof.Trace("forward", clusterprof.INFO, batch=batch):
                burn(forward_s)
            with clusterprof.Trace("backward", clusterprof.INFO):
                burn(backward_s)
            with clusterprof.Trace("optimizer", clusterprof.INFO) as trace:
                burn(optimizer_s)
                trace.set_metadata(lr=0.001)
            # Waiting for the other workers' gradients: the rest of the step, idle.
            with clusterprof.Trace("allreduce", clusterprof.INFO):
                _stop.wait(max(0.0, step_start + step_s - time.monotonic()))
        step += 1
    _stop.set()
    loader.join()
    print("train_loop.py: %d steps in %.1f s" % (step, time.monotonic() - start), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
