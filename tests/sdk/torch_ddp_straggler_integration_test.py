"""A PyTorch DDP job whose rank 1 is slow, captured by three clusterprof sidecars, and the
straggler verdict that names it.

Three ranks train a tiny model with DistributedDataParallel over gloo on this machine (a file
store, loopback only), each with `clusterprof.torch.mark_steps(optimizer)` and
`clusterprof.torch.annotate_collectives(ddp_model)` and nothing else from clusterprof. Each rank
has a clusterprof-sidecar of its own (its own shared-memory directory through CLUSTERPROF_DIR,
ports chosen by the kernel), standing in for one host; rank 1 waits 30 ms more than the others
before each forward pass. `clusterprof capture` captures the three at one instant, then
`clusterprof report --json` must name rank 1's host, and only it, as the straggler; so must the
report the capture itself wrote from the sidecars' digests.

    python3 torch_ddp_straggler_integration_test.py --sidecar PATH --cli PATH \
        --annotate-lib PATH --package-dir DIR

Exits 77 (skipped) when torch, torch.distributed or its gloo backend is missing.
"""
import argparse
import datetime
import faulthandler
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

WORLD = 3
SLOW_RANK = 1
BASE_WAIT_S = 0.01  # every rank, each step: keeps the ranks from spinning the shared CPUs
EXTRA_WAIT_S = 0.03  # the slow rank, each step, before its forward pass
DEADLINE_S = 240  # the most any wait of this test lasts; the ctest TIMEOUT is above it


def host(rank):
    return "rank-%d" % rank


# ---------------------------------------------------------------------------------------------
# A rank of the job (run as a subprocess of the test).


def worker(args):
    # The test asks a rank that does not stop for its threads' stacks, to say where it waits.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import clusterprof
    import clusterprof.torch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + args.store, rank=args.rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    # The one line each of a job's steps and collectives needs:
    clusterprof.torch.mark_steps(optimizer)
    collectives = clusterprof.torch.annotate_collectives(model)
    assert collectives.comm_hook, "the DDP communication hook was not registered"
    clusterprof.set_thread_name("trainer")

    data = torch.randn(16, 32)
    target = torch.randn(16, 1)
    stop_at = None
    step = 0
    while stop_at is None or step <= stop_at:
        time.sleep(BASE_WAIT_S + (EXTRA_WAIT_S if args.rank == SLOW_RANK else 0.0))
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(data), target)
        loss.backward()  # DDP all-reduces the gradients here, through the hook
        optimizer.step()
        if args.rank == 0:
            write_atomically(args.progress, str(step))
        # Every rank stops after the same step, which the test names once all are running: the
        # ranks run in lockstep, so none has passed it.
        if stop_at is None and os.path.exists(args.stop):
            with open(args.stop) as f:
                stop_at = int(f.read())
        step += 1
    # Free DDP (its reducer holds the process group) while the group is still registered, so
    # that the group is destroyed by destroy_process_group, which releases the GIL, and not by
    # the reducer, which in torch 1.13 holds it while gloo's threads may still need it
    # (docs/pytorch.md, "Limits").
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()
    print("rank %d: %d steps, library %s" % (args.rank, step, clusterprof.library_path()))


def write_atomically(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


# ---------------------------------------------------------------------------------------------
# The test.


class Failure(Exception):
    pass


def wait_for(what, predicate, processes):
    """Polls `predicate` until it holds; fails when a process of the job exits first."""
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        for name, process in processes:
            if process.poll() is not None:
                raise Failure("%s exited (%s) while waiting for %s" %
                              (name, process.returncode, what))
        if time.monotonic() > deadline:
            raise Failure("timed out waiting for %s" % what)
        time.sleep(0.05)


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def run(command, **kwargs):
    print("$ " + " ".join(command), flush=True)
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            universal_newlines=True, timeout=DEADLINE_S, **kwargs)
    print(result.stdout, flush=True)
    if result.returncode != 0:
        raise Failure("exit status %d: %s" % (result.returncode, " ".join(command)))
    return result.stdout


def check_report(report, where):
    """The verdict: rank 1's host, and no other, straggles, over steps all three compared."""
    hosts = {h["host"]: h for h in report["hosts"]}
    if sorted(hosts) != sorted(host(r) for r in range(WORLD)):
        raise Failure("%s: hosts %s, left out %s" % (where, sorted(hosts), report["left_out"]))
    compared = report["steps"]["compared"]
    if compared < 5:
        raise Failure("%s: only %d steps compared (notes: %s)" % (where, compared,
                                                                   report["notes"]))
    if report["stragglers"] != [host(SLOW_RANK)]:
        raise Failure("%s: stragglers %s, expected [%s]" %
                      (where, report["stragglers"], host(SLOW_RANK)))
    for name, h in hosts.items():
        if h["straggler"] != (name == host(SLOW_RANK)):
            raise Failure("%s: %s straggler=%s" % (where, name, h["straggler"]))
    slow = hosts[host(SLOW_RANK)]
    if slow["late_steps"] * 2 < compared or slow["others_wait_ns"] <= 0:
        raise Failure("%s: %s late in %d of %d steps, others' wait %d ns" %
                      (where, host(SLOW_RANK), slow["late_steps"], compared,
                       slow["others_wait_ns"]))
    print("%s: straggler %s, late in %d of %d compared steps, median lateness %.1f ms, "
          "cause %s" % (where, slow["host"], slow["late_steps"], compared,
                        slow["median_lateness_ns"] / 1e6, slow["cause"]))


def main(args):
    try:
        import torch.distributed as dist
    except ImportError as e:
        print("SKIP: torch is not importable: %s" % e)
        return 77
    if not dist.is_available() or not dist.is_gloo_available():
        print("SKIP: torch.distributed with gloo is not available")
        return 77

    shm_parent = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    work = tempfile.mkdtemp(prefix="clusterprof-torch-ddp.", dir=shm_parent)
    logdir = os.path.join(work, "logdir")
    os.makedirs(logdir)
    processes = []
    logs = []
    try:
        addresses = []
        for rank in range(WORLD):
            base = os.path.join(work, host(rank))
            shm = os.path.join(base, "shm")
            os.makedirs(shm)
            log = open(os.path.join(base, "sidecar.log"), "w")
            logs.append((host(rank) + " sidecar", log.name))
            process = subprocess.Popen([
                args.sidecar, "--port", "0", "--http-port", "0", "--host-name", host(rank),
                "--shm-dir", shm, "--allowed-logdir", logdir, "--spool-dir",
                os.path.join(base, "spool"), "--port-file", os.path.join(base, "ports")
            ], stdout=log, stderr=subprocess.STDOUT)
            processes.append((host(rank) + " sidecar", process))
        for rank in range(WORLD):
            ports = os.path.join(work, host(rank), "ports")
            wait_for("the port file of " + host(rank), lambda: "grpc=" in read(ports),
                     processes)
            grpc = [line for line in read(ports).split() if line.startswith("grpc=")][0]
            addresses.append("127.0.0.1:" + grpc.split("=", 1)[1])

        store = os.path.join(work, "store")
        progress = os.path.join(work, "progress")
        stop = os.path.join(work, "stop")
        for rank in range(WORLD):
            base = os.path.join(work, host(rank))
            env = dict(os.environ, CLUSTERPROF_DIR=os.path.join(base, "shm"),
                       CLUSTERPROF_ANNOTATE_LIB=args.annotate_lib, PYTHONPATH=args.package_dir,
                       GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
            log = open(os.path.join(base, "worker.log"), "w")
            logs.append((host(rank) + " worker", log.name))
            process = subprocess.Popen([
                sys.executable, os.path.abspath(__file__), "--worker", "--rank", str(rank),
                "--store", store, "--progress", progress, "--stop", stop
            ], env=env, stdout=log, stderr=subprocess.STDOUT)
            processes.append((host(rank) + " worker", process))
        # Steps under way on every rank (they run in lockstep) before the capture starts.
        wait_for("the job's first steps", lambda: read(progress).strip().isdigit() and int(
            read(progress)) >= 5, processes)

        run_name = "torch_ddp"
        run([
            args.cli, "capture", "--service-addr", ",".join(addresses), "--logdir", logdir,
            "--duration-ms", "3000", "--delay-ms", "500", "--run", run_name,
            "--device-tracer-level", "0", "--no-progress"
        ])
        # Let every rank stop after one step that none has reached yet.
        write_atomically(stop, str(int(read(progress)) + 20))
        workers = [(name, p) for name, p in processes if name.endswith("worker")]
        try:
            wait_for("the job to stop", lambda: all(p.poll() is not None for _, p in workers),
                     [])
        except Failure:
            for _, process in workers:
                if process.poll() is None:
                    process.send_signal(signal.SIGUSR1)
            time.sleep(1)
            raise
        for name, process in workers:
            if process.returncode != 0:
                raise Failure("%s exited with %d" % (name, process.returncode))

        run_dir = os.path.join(logdir, "plugins", "profile", run_name)
        report_json = os.path.join(work, "report.json")
        run([args.cli, "report", "--no-progress", run_dir, "--json", report_json])
        with open(report_json) as f:
            check_report(json.load(f), "clusterprof report")
        # The report the capture wrote from the sidecars' own digests says the same.
        with open(os.path.join(run_dir, "clusterprof_report.json")) as f:
            check_report(json.load(f), "the capture's report")
        print("PASS")
        return 0
    except Failure as e:
        print("FAIL: %s" % e)
        for name, path in logs:
            print("---- %s (%s), last lines:" % (name, path))
            print("\n".join(read(path).splitlines()[-60:]))
        return 1
    finally:
        for _, process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for _, process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if os.environ.get("CLUSTERPROF_KEEP_TEST_DIR"):
            print("kept " + work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--rank", type=int)
    parser.add_argument("--store")
    parser.add_argument("--progress")
    parser.add_argument("--stop")
    parser.add_argument("--sidecar")
    parser.add_argument("--cli")
    parser.add_argument("--annotate-lib")
    parser.add_argument("--package-dir")
    parsed = parser.parse_args()
    if parsed.worker:
        worker(parsed)
        sys.exit(0)
    sys.exit(main(parsed))
