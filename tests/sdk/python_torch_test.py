"""Tests of clusterprof.torch with the installed PyTorch (CPU; Debian's 1.13.1 in the tests).

The SDK calls that clusterprof.torch makes (tracing_enabled, now, record_complete, async_begin,
async_end) are replaced by a recorder, so each test sees exactly the events the module records
without a sidecar. torch.distributed runs for real: a one-process gloo group over a file store.
A last test imports the package with no library at all and checks that everything runs through.

    python3 python_torch_test.py PACKAGE_DIR

Exits 77 (skipped) when torch cannot be imported.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import unittest

PACKAGE_DIR = os.path.abspath(sys.argv.pop(1)) if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, os.pardir, "sidecar",
    "sdk", "python")
sys.path.insert(0, PACKAGE_DIR)

import clusterprof  # noqa: E402

# clusterprof alone, and clusterprof.torch, must not import torch.
assert "torch" not in sys.modules, "import clusterprof imported torch"
import clusterprof.torch as ct  # noqa: E402

assert "torch" not in sys.modules, "import clusterprof.torch imported torch"

try:
    import torch
    import torch.distributed as dist
except ImportError as e:
    print("SKIP: torch is not importable: %s" % e)
    sys.exit(77)


class Recorder(object):
    """Stands in for libclusterprof_annotate: a clock that ticks 10 ns per read, a level, and
    the events recorded, as (kind, name, start, end, level) / (kind, name_or_id, id, level)."""

    def __init__(self, level=2):
        self.level = level
        self.clock = 1000
        self.events = []
        self.lock = threading.Lock()
        self.ended = threading.Condition(self.lock)

    def enabled(self, level):
        return 1 if level <= self.level else 0

    def now(self):
        with self.lock:
            self.clock += 10
            return self.clock

    def record(self, name, size, start, end, level):
        assert size == len(name)
        if level > self.level:
            return 0
        with self.lock:
            self.events.append(("complete", name.decode(), start, end, level))
        return 1

    def async_begin(self, name, size, event_id, level):
        with self.lock:
            self.events.append(("begin", name.decode(), event_id, level))
        return 1

    def async_end(self, event_id, level):
        with self.lock:
            self.events.append(("end", None, event_id, level))
            self.ended.notify_all()
        return 1

    def complete(self, prefix=""):
        with self.lock:
            return [e for e in self.events if e[0] == "complete" and e[1].startswith(prefix)]

    def wait_for_ends(self, count, timeout=30):
        """Waits until `count` async events have ended (their futures complete on gloo's
        threads)."""
        with self.ended:
            return self.ended.wait_for(
                lambda: sum(1 for e in self.events if e[0] == "end") >= count, timeout)


class RecorderTest(unittest.TestCase):
    """Puts a Recorder in place of the library in clusterprof and clusterprof.torch."""

    NAMES = ("_enabled", "_now", "_record", "_async_begin", "_async_end")

    def setUp(self):
        self.recorder = Recorder()
        functions = (self.recorder.enabled, self.recorder.now, self.recorder.record,
                     self.recorder.async_begin, self.recorder.async_end)
        self.saved = []
        for module in (clusterprof, ct):
            for name, function in zip(self.NAMES, functions):
                self.saved.append((module, name, getattr(module, name)))
                setattr(module, name, function)

    def tearDown(self):
        for module, name, function in self.saved:
            setattr(module, name, function)


def tiny_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def train(model, optimizer, steps, scheduler=None):
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()


class StepsTest(RecorderTest):

    def assert_steps(self, numbers, name="train"):
        """The recorded step markers have these numbers, each from the previous one's end."""
        steps = self.recorder.complete(name + "#")
        self.assertEqual([s[1] for s in steps],
                         ["%s#step_num=%d,_r=1#" % (name, n) for n in numbers])
        for previous, current in zip(steps, steps[1:]):
            self.assertEqual(current[2], previous[3])  # contiguous: no gap between steps
        for s in steps:
            self.assertLess(s[2], s[3])
            self.assertEqual(s[4], clusterprof.CRITICAL)
        return steps

    def test_counts_optimizer_steps(self):
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        marker = ct.mark_steps(optimizer, start=5)
        train(model, optimizer, 3)
        self.assertEqual(marker.step, 8)
        steps = self.assert_steps([5, 6, 7])
        # Each optimizer.step() call is an event inside its step, ending where the step ends.
        optimizer_events = self.recorder.complete("optimizer_step")
        self.assertEqual(len(optimizer_events), 3)
        for event, s in zip(optimizer_events, steps):
            self.assertEqual(event[4], clusterprof.INFO)
            self.assertGreater(event[2], s[2])
            self.assertLessEqual(event[3], s[3])

    def test_steps_hold_what_runs_before_the_optimizer(self):
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        ct.mark_steps(optimizer)
        inside = []
        for _ in range(2):
            with clusterprof.Trace("forward", clusterprof.INFO):
                loss = model(torch.ones(2, 4)).sum()
            inside.append(self.recorder.complete("forward")[-1])
            loss.backward()
            optimizer.step()
        steps = self.assert_steps([0, 1])
        for event, s in zip(inside, steps):
            self.assertTrue(s[2] <= event[2] < event[3] <= s[3], (event, s))

    def test_fallback_on_this_torch_wraps_the_instance(self):
        if hasattr(torch.optim.Optimizer, "register_step_post_hook"):
            self.skipTest("this torch has optimizer step hooks; the fallback is not used")
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        before = [p.detach().clone() for p in model.parameters()]
        marker = ct.mark_steps(optimizer)
        self.assertIn("step", optimizer.__dict__)
        self.assertIs(optimizer.step.__self__, optimizer)  # a bound method, as schedulers expect
        train(model, optimizer, 2)
        self.assert_steps([0, 1])
        # The optimizer still optimizes.
        self.assertFalse(all(torch.equal(b, p) for b, p in zip(before, model.parameters())))
        marker.remove()
        self.assertNotIn("step", optimizer.__dict__)
        train(model, optimizer, 1)
        self.assertEqual(marker.step, 2)
        self.assertEqual(len(self.recorder.complete("train#")), 2)

    def assert_scheduler_counted(self, optimizer, steps):
        """The LR scheduler saw each optimizer step: torch before 2.0 counts them on the
        optimizer (_step_count), later versions only flag that one happened."""
        if hasattr(optimizer, "_step_count"):
            self.assertEqual(optimizer._step_count, steps)
        else:
            self.assertTrue(getattr(optimizer, "_opt_called", False))

    def test_lr_scheduler_made_after_keeps_counting(self):
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        marker = ct.mark_steps(optimizer)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        import warnings

        with warnings.catch_warnings():
            # "lr_scheduler.step() before optimizer.step()" would mean the scheduler lost count.
            warnings.simplefilter("error")
            train(model, optimizer, 3, scheduler)
        self.assert_scheduler_counted(optimizer, 3)
        self.assertAlmostEqual(optimizer.param_groups[0]["lr"], 0.125)
        self.assert_steps([0, 1, 2])
        # The scheduler's wrapper sits on top: remove() stops the marker inside it.
        marker.remove()
        train(model, optimizer, 1, scheduler)
        self.assert_scheduler_counted(optimizer, 4)
        self.assertAlmostEqual(optimizer.param_groups[0]["lr"], 0.0625)
        self.assertEqual(len(self.recorder.complete("train#")), 3)

    def test_lr_scheduler_made_before(self):
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        marker = ct.mark_steps(optimizer)
        train(model, optimizer, 2, scheduler)
        self.assert_scheduler_counted(optimizer, 2)
        self.assertAlmostEqual(optimizer.param_groups[0]["lr"], 0.25)
        self.assert_steps([0, 1])
        own = optimizer.__dict__.get("step")
        marker.remove()
        if not hasattr(torch.optim.Optimizer, "register_step_post_hook"):
            # The fallback wrapped the scheduler's wrapper; remove() puts that one back.
            self.assertIsNot(optimizer.__dict__.get("step"), own)
        train(model, optimizer, 1, scheduler)
        self.assert_scheduler_counted(optimizer, 3)
        self.assertAlmostEqual(optimizer.param_groups[0]["lr"], 0.125)

    def test_a_failing_step_is_not_counted_and_propagates(self):
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        marker = ct.mark_steps(optimizer)

        def closure():
            raise ValueError("from the closure")

        with self.assertRaises(ValueError):
            optimizer.step(closure)
        self.assertEqual(marker.step, 0)
        train(model, optimizer, 1)
        self.assert_steps([0])

    def test_hooks_where_the_optimizer_has_them(self):

        class HookedOptimizer(object):
            """The step-hook API of torch >= 2.0's Optimizer."""

            def __init__(self):
                self.pre, self.post, self.calls = {}, {}, 0

            def _register(self, hooks, hook):
                key = object()
                hooks[key] = hook
                handle = type("Handle", (), {})()
                handle.remove = lambda: hooks.pop(key, None)
                return handle

            def register_step_pre_hook(self, hook):
                return self._register(self.pre, hook)

            def register_step_post_hook(self, hook):
                return self._register(self.post, hook)

            def step(self):
                for hook in list(self.pre.values()):
                    hook(self, (), {})
                self.calls += 1
                for hook in list(self.post.values()):
                    hook(self, (), {})

        optimizer = HookedOptimizer()
        marker = ct.mark_steps(optimizer, name="fit")
        self.assertNotIn("step", optimizer.__dict__)  # hooked, not wrapped
        self.assertEqual((len(optimizer.pre), len(optimizer.post)), (1, 1))
        optimizer.step()
        optimizer.step()
        self.assert_steps([0, 1], name="fit")
        self.assertEqual(len(self.recorder.complete("optimizer_step")), 2)
        marker.remove()
        self.assertEqual((len(optimizer.pre), len(optimizer.post)), (0, 0))
        optimizer.step()
        self.assertEqual(optimizer.calls, 3)
        self.assertEqual(len(self.recorder.complete("fit#")), 2)

    def test_not_an_optimizer(self):
        marker = ct.mark_steps(object())
        marker.end_step()  # a detached marker is still a manual one
        self.assert_steps([0])

    def test_manual_marker_and_step_context(self):
        marker = ct.StepMarker("loop", start=3)
        marker.end_step()
        marker.end_step()
        self.assert_steps([3, 4], name="loop")
        with ct.step(9, name="serve"):
            pass
        self.assert_steps([9], name="serve")

    def test_nothing_recorded_below_the_step_level(self):
        self.recorder.level = 0
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        marker = ct.mark_steps(optimizer)
        train(model, optimizer, 2)
        self.assertEqual(marker.step, 2)
        self.assertEqual(self.recorder.events, [])

    def test_level_one_records_steps_not_the_optimizer(self):
        self.recorder.level = 1
        model = tiny_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        ct.mark_steps(optimizer)
        train(model, optimizer, 2)
        self.assert_steps([0, 1])
        self.assertEqual(self.recorder.complete("optimizer_step"), [])


class FakeNvtx(object):
    """torch._C._nvtx's push/pop, for a torch built without CUDA."""

    def __init__(self):
        self.depth = 0

    def rangePushA(self, msg):
        self.depth += 1
        return self.depth - 1

    def rangePop(self):
        self.depth -= 1
        return self.depth

    def markA(self, msg):
        pass


class NvtxStepsTest(RecorderTest):

    def setUp(self):
        super().setUp()
        import torch.cuda.nvtx as nvtx

        self.nvtx = nvtx
        self.saved_nvtx = nvtx._nvtx
        nvtx._nvtx = FakeNvtx()

    def tearDown(self):
        self.nvtx._nvtx = self.saved_nvtx
        super().tearDown()

    def test_ranges_named_as_steps(self):
        handle = ct.nvtx_steps()
        nvtx = self.nvtx
        self.assertEqual(nvtx.range_push("step 12"), 0)
        self.assertEqual(nvtx.range_push("forward"), 1)
        nvtx.range_pop()
        self.assertEqual(nvtx.range_pop(), 0)
        with nvtx.range("Step_{}", 13):
            with nvtx.range("backward"):
                pass
        names = [e[1] for e in self.recorder.complete()]
        self.assertEqual(names, ["train#step_num=12,_r=1#", "train#step_num=13,_r=1#"])
        handle.remove()
        nvtx.range_push("step 14")
        nvtx.range_pop()
        self.assertEqual(len(self.recorder.complete()), 2)

    def test_pattern_without_a_number_counts(self):
        handle = ct.nvtx_steps(r"^iteration$", name="it")
        for _ in range(3):
            self.nvtx.range_push("iteration")
            self.nvtx.range_pop()
        self.assertEqual([e[1] for e in self.recorder.complete()],
                         ["it#step_num=%d,_r=1#" % n for n in range(3)])
        handle.remove()

    def test_a_failing_push_changes_nothing(self):
        class Failing(FakeNvtx):
            def rangePushA(self, msg):
                raise RuntimeError("NVTX functions not installed")

        self.nvtx._nvtx = Failing()
        handle = ct.nvtx_steps()
        with self.assertRaises(RuntimeError):
            self.nvtx.range_push("step 1")
        self.assertEqual(self.recorder.complete(), [])
        handle.remove()


class CollectivesTest(RecorderTest):
    """A one-process gloo group: every collective completes at once, through the real code."""

    @classmethod
    def setUpClass(cls):
        cls.store_dir = tempfile.mkdtemp(prefix="clusterprof-torch-test.")
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method="file://" + os.path.join(cls.store_dir,
                                                                            "store"),
                                rank=0, world_size=1)

    @classmethod
    def tearDownClass(cls):
        dist.destroy_process_group()
        shutil.rmtree(cls.store_dir, ignore_errors=True)

    def setUp(self):
        super().setUp()
        self.handle = ct.annotate_collectives()
        self.addCleanup(self.handle.remove)

    def test_wraps_and_restores(self):
        from torch.distributed import distributed_c10d

        self.assertIn("all_reduce", self.handle.wrapped)
        self.assertIn("barrier", self.handle.wrapped)
        self.assertIs(dist.all_reduce, distributed_c10d.all_reduce)
        self.assertTrue(hasattr(dist.all_reduce, "_clusterprof_original"))
        self.assertEqual(dist.all_reduce.__name__, "all_reduce")
        self.handle.remove()
        self.assertFalse(hasattr(dist.all_reduce, "_clusterprof_original"))
        self.assertFalse(hasattr(distributed_c10d.all_gather, "_clusterprof_original"))
        t = torch.ones(3)
        dist.all_reduce(t)
        self.assertEqual(self.recorder.events, [])

    def test_a_second_call_does_not_wrap_twice(self):
        second = ct.annotate_collectives()
        self.addCleanup(second.remove)
        self.assertEqual(second.wrapped, [])
        dist.barrier()
        self.assertEqual(len(self.recorder.complete()), 1)

    def test_synchronous_collectives(self):
        t = torch.ones(3)
        dist.all_reduce(t)
        self.assertTrue(torch.equal(t, torch.ones(3)))
        dist.barrier()
        out = [torch.zeros(3)]
        dist.all_gather(out, torch.full((3,), 2.0))
        self.assertTrue(torch.equal(out[0], torch.full((3,), 2.0)))
        events = self.recorder.complete()
        self.assertEqual([e[1] for e in events], [
            "torch.distributed.all_reduce", "torch.distributed.barrier",
            "torch.distributed.all_gather"
        ])
        for e in events:
            self.assertLess(e[2], e[3])
            self.assertEqual(e[4], clusterprof.CRITICAL)

    def test_nested_collectives_are_one_event(self):
        objects = [None]
        dist.all_gather_object(objects, {"a": 1})  # calls all_gather (and more) inside
        self.assertEqual(objects, [{"a": 1}])
        self.assertEqual([e[1] for e in self.recorder.complete()],
                         ["torch.distributed.all_gather_object"])

    def test_async_collective_ends_when_its_work_completes(self):
        t = torch.ones(3)
        work = dist.all_reduce(t, async_op=True)
        work.get_future().wait()
        self.assertTrue(self.recorder.wait_for_ends(1))
        kinds = [(e[0], e[1]) for e in self.recorder.events]
        self.assertEqual(kinds, [("begin", "torch.distributed.all_reduce"), ("end", None)])
        self.assertEqual(self.recorder.events[0][2], self.recorder.events[1][2])
        self.assertNotEqual(self.recorder.events[0][2], 0)
        # Positionally, too: broadcast(tensor, src, group, async_op).
        work = dist.broadcast(t, 0, None, True)
        work.wait()
        self.assertTrue(self.recorder.wait_for_ends(2))
        self.assertEqual(self.recorder.events[2][:2], ("begin", "torch.distributed.broadcast"))

    def test_a_failing_collective_raises_as_before(self):
        with self.assertRaises(Exception):
            dist.all_reduce(torch.ones(3), op="not an op")
        self.assertEqual(self.recorder.complete(), [])

    def test_ddp_buckets(self):
        from torch.nn.parallel import DistributedDataParallel

        model = tiny_model()
        reference = tiny_model()
        ddp = DistributedDataParallel(model)
        handle = ct.annotate_collectives(ddp)
        self.addCleanup(handle.remove)
        self.assertTrue(handle.comm_hook)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        ct.mark_steps(optimizer)
        train(ddp, optimizer, 2)
        self.assertTrue(self.recorder.wait_for_ends(2))
        # The gradients are reduced as without a hook (one rank: unchanged).
        reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
        train(reference, reference_optimizer, 2)
        for a, b in zip(model.parameters(), reference.parameters()):
            self.assertTrue(torch.allclose(a, b))
        events = self.recorder.events
        begins = [e for e in events if e[0] == "begin"]
        self.assertEqual([e[1] for e in begins], ["ddp_all_reduce#bucket=0#"] * 2)
        # No nested torch.distributed.all_reduce event for the hook's own all-reduce.
        self.assertEqual(self.recorder.complete("torch.distributed"), [])
        # Each bucket's all-reduce begins inside its step (steps are recorded when they end).
        steps = self.recorder.complete("train#")
        self.assertEqual(len(steps), 2)
        for begin, s in zip(begins, steps):
            self.assertLess(events.index(begin), events.index(s))
        # DDP takes one hook: another annotate_collectives(ddp) logs, wraps, and does not raise.
        again = ct.annotate_collectives(ddp)
        self.addCleanup(again.remove)
        self.assertFalse(again.comm_hook)

    def test_a_model_that_is_not_ddp(self):
        handle = ct.annotate_collectives(tiny_model())
        self.addCleanup(handle.remove)
        self.assertFalse(handle.comm_hook)


class WithoutLibraryTest(unittest.TestCase):
    """The package alone (out of the checkout, so its build tree is not found), no library:
    everything calls through and records nothing."""

    def test_runs_through(self):
        work = tempfile.mkdtemp(prefix="clusterprof-torch-nolib.")
        self.addCleanup(shutil.rmtree, work, True)
        shutil.copytree(os.path.join(PACKAGE_DIR, "clusterprof"),
                        os.path.join(work, "clusterprof"))
        script = textwrap.dedent("""
            import os, sys, warnings
            warnings.simplefilter("error")
            import clusterprof, clusterprof.torch as ct
            assert clusterprof.library_path() is None
            import torch, torch.distributed as dist
            model = torch.nn.Linear(4, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            marker = ct.mark_steps(optimizer)
            handle = ct.annotate_collectives(model)   # not DDP, not initialized
            nvtx = ct.nvtx_steps()
            for n in range(3):
                with ct.step(n, name="inner"):
                    optimizer.zero_grad()
                    model(torch.ones(2, 4)).sum().backward()
                    optimizer.step()
            assert marker.step == 3, marker.step
            dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0,
                                    world_size=1)
            t = torch.ones(2)
            dist.all_reduce(t)
            dist.all_reduce(t, async_op=True).wait()
            ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
            ddp_handle = ct.annotate_collectives(ddp)
            assert ddp_handle.comm_hook
            ddp(torch.ones(2, 4)).sum().backward()
            for h in (marker, handle, nvtx, ddp_handle):
                h.remove()
            del ddp, ddp_handle   # before the group goes: docs/pytorch.md, "Limits"
            import gc
            gc.collect()
            dist.destroy_process_group()
            print("ran through")
        """)
        env = dict(os.environ, CLUSTERPROF_ANNOTATE_LIB=os.path.join(work, "missing.so"),
                   PYTHONPATH=work, GLOO_SOCKET_IFNAME="lo")
        result = subprocess.run([sys.executable, "-c", script, os.path.join(work, "store")],
                                env=env, cwd=work, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, universal_newlines=True, timeout=120)
        self.assertEqual(result.returncode, 0, result.stdout)
        self.assertIn("ran through", result.stdout)
        self.assertIn("no usable libclusterprof_annotate.so", result.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
