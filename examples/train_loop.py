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

With --sync-dir, --world and --rank several processes train in lockstep (allreduce is a barrier
over files in --sync-dir, the same protocol as train_loop.cc's), and --straggle-ms makes this
rank compute longer each step: a straggler that holds the others back.

The clusterprof module is imported from sdk/python of this checkout when it is not on
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
                                    "sdk", "python"))
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


class FileBarrier:
    """Rank r writes the step it finished to <dir>/rank-<r> (a rename) and waits until every
    rank's file says at least that step."""

    def __init__(self, directory, rank, world):
        self.directory, self.rank, self.world = directory, rank, world
        os.makedirs(directory, exist_ok=True)

    def _slowest(self):
        slowest = None
        for r in range(self.world):
            try:
                with open(os.path.join(self.directory, "rank-%d" % r)) as f:
                    step = int(f.read().strip() or -1)
            except (OSError, ValueError):
                return -1
            slowest = step if slowest is None else min(slowest, step)
        return slowest

    def arrive(self, step, patience_s=10.0):
        """False when a rank has not moved for patience_s, or the process is stopping."""
        path = os.path.join(self.directory, "rank-%d" % self.rank)
        with open(path + ".tmp", "w") as f:
            f.write("%d\n" % step)
        os.replace(path + ".tmp", path)
        give_up = time.monotonic() + patience_s
        while not _stop.is_set() and time.monotonic() < give_up:
            if self._slowest() >= step:
                return True
            time.sleep(0.0002)
        return False


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=0,
                        help="stop after this long (0: run until killed)")
    parser.add_argument("--step-ms", type=float, default=30, help="duration of one step")
    parser.add_argument("--busy-percent", type=float, default=50,
                        help="CPU busy share of each step, loader included")
    parser.add_argument("--sync-dir", default="",
                        help="train in lockstep with the other ranks that share this directory")
    parser.add_argument("--rank", type=int, default=0, help="this process's rank")
    parser.add_argument("--world", type=int, default=1, help="how many ranks train together")
    parser.add_argument("--straggle-ms", type=float, default=0,
                        help="extra compute in each step (a slow worker)")
    parser.add_argument("--straggle-from-step", type=int, default=0,
                        help="add --straggle-ms only from this step on (degrades mid-run)")
    parser.add_argument("--straggle-after-seconds", type=float, default=0,
                        help="add --straggle-ms only once this long has passed")
    args = parser.parse_args()
    if not 0 <= args.rank < args.world:
        parser.error("--rank %d is not in [0, --world %d)" % (args.rank, args.world))

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
    barrier = FileBarrier(args.sync_dir, args.rank, args.world) if args.sync_dir else None
    # In lockstep, the rest of the nominal step is spent "communicating" once all have arrived.
    communicate_s = max(0.0, step_s - ops_s)

    batches = queue.Queue(maxsize=2)
    loader = threading.Thread(target=loader_loop, args=(batches, load_s), daemon=True)
    loader.start()

    clusterprof.set_thread_name("trainer")
    start = time.monotonic()
    deadline = start + args.seconds if args.seconds > 0 else float("inf")
    step = 0
    straggling = False
    while not _stop.is_set() and time.monotonic() < deadline:
        step_start = time.monotonic()
        slow = (args.straggle_ms > 0 and step >= args.straggle_from_step and
                step_start - start >= args.straggle_after_seconds)
        if slow and not straggling:
            straggling = True
            print("train_loop.py: rank %d slows down by %g ms per step from step %d" %
                  (args.rank, args.straggle_ms, step), flush=True)
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
                burn(forward_s + (args.straggle_ms / 1000.0 if slow else 0.0))
            with clusterprof.Trace("backward", clusterprof.INFO):
                burn(backward_s)
            with clusterprof.Trace("optimizer", clusterprof.INFO) as trace:
                burn(optimizer_s)
                trace.set_metadata(lr=0.001)
            # Waiting for the other workers' gradients: the rest of the step, idle.
            with clusterprof.Trace("allreduce", clusterprof.INFO):
                if barrier is None:
                    _stop.wait(max(0.0, step_start + step_s - time.monotonic()))
                elif barrier.arrive(step):
                    _stop.wait(communicate_s)
                elif not _stop.is_set():
                    print("train_loop.py: the other ranks stopped; ending", file=sys.stderr)
                    break
        step += 1
    _stop.set()
    loader.join()
    print("train_loop.py: %d steps in %.1f s" % (step, time.monotonic() - start), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
