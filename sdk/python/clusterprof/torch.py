"""PyTorch steps and collectives for clusterprof: what the cross-host straggler verdict needs.

    import clusterprof.torch

    steps = clusterprof.torch.mark_steps(optimizer)      # one step marker per optimizer.step()
    clusterprof.torch.annotate_collectives(ddp_model)    # torch.distributed calls, DDP buckets

A PyTorch job's CUDA kernels are traced with no code change (docs/gpu.md), but the analysis
(`clusterprof report`, docs/analysis.md) compares hosts step by step, on when each host enters
the step's first collective. This module records both, through the annotation SDK of the
`clusterprof` package:

- mark_steps(optimizer): one step marker `train#step_num=N,_r=1#` (level 1) per iteration,
  counted from optimizer.step() as PyTorch's own profiler counts them. Step N spans from the end
  of the previous optimizer.step() to the end of this one, so it holds the forward and backward
  passes, the gradient all-reduces that run during the backward pass, and the optimizer. The
  optimizer.step() call itself is an `optimizer_step` event (level 2).
- step(n): the same marker as a context manager, for loops without an optimizer.
- annotate_collectives(model): each torch.distributed collective called from Python is an event
  named `torch.distributed.<function>`; given a DistributedDataParallel model, a communication
  hook also records each gradient bucket's all-reduce (`ddp_all_reduce`), which DDP otherwise
  issues from C++. Names with all_reduce, all_gather, reduce_scatter or all_to_all in them are
  collectives for the analysis' default pattern; COLLECTIVE_PATTERN covers the rest (broadcast,
  barrier, ...).
- nvtx_steps(): torch.cuda.nvtx ranges whose message looks like a step ("step 12") also become
  step markers.

torch is imported only by these functions, never when this module or `clusterprof` is imported.
Nothing here raises into the training loop: without libclusterprof_annotate.so, without a
sidecar, or without torch.distributed, the hooks and wrappers count steps and call through,
recording nothing; a failure inside them is logged once on the "clusterprof" logger and the
training goes on.

Thread-safety: a StepMarker is driven by the thread that calls optimizer.step(); the collective
wrappers and the communication hook may run on any thread.
"""

import functools
import itertools
import logging
import re
import threading
import types

import clusterprof
from clusterprof import _async_begin, _async_end, _enabled, _encode, _now, _record, _utf8

__all__ = [
    "COLLECTIVE_FUNCTIONS",
    "COLLECTIVE_PATTERN",
    "CollectiveAnnotations",
    "NvtxSteps",
    "StepMarker",
    "annotate_collectives",
    "mark_steps",
    "nvtx_steps",
    "step",
]

# The torch.distributed functions annotate_collectives wraps, where the installed torch has them.
# Point-to-point calls (send, recv, isend, irecv) are left out: they are not collectives, and a
# pipeline stage's wait on its neighbour is not a straggler's signal.
COLLECTIVE_FUNCTIONS = (
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather",
    "all_gather_into_tensor",
    "_all_gather_base",
    "all_gather_object",
    "all_gather_coalesced",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "reduce",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
)

# The events of this module's collectives, and NCCL's kernels, for `clusterprof report
# --collective-pattern` or the capture option `clusterprof_collective_pattern`: the analysis'
# default pattern already matches every name that holds all_reduce, all_gather, reduce_scatter
# or all_to_all, but not broadcast, barrier, reduce, gather or scatter.
COLLECTIVE_PATTERN = r"^torch\.distributed\.|^ddp_all_reduce|ncclKernel_|ncclDevKernel_"

_DDP_EVENT = "ddp_all_reduce"
_OPTIMIZER_EVENT = "optimizer_step"

_logger = logging.getLogger("clusterprof")
_warned = set()
_warned_lock = threading.Lock()

# Async event ids of this module: a tag in the top byte keeps them apart from the application's
# own clusterprof.async_begin ids. next() on itertools.count is atomic under the GIL.
_ASYNC_TAG = 0xC7 << 56
_async_ids = itertools.count(1)


def _warn(message, *args):
    """A problem of a setup call (once per call)."""
    _logger.warning("clusterprof.torch: " + message, *args)


def _warn_once(key, message, *args):
    """A problem on a per-step path: logged the first time only."""
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    _logger.warning("clusterprof.torch: " + message, *args)


def _step_name(name, step_num):
    return _encode(str(name), {"step_num": int(step_num), "_r": 1})


def _record_span(encoded, start_ns, end_ns, level):
    """Records one event with the caller's times, when `level` is being recorded."""
    if start_ns and _enabled(level):
        data = _utf8(encoded)
        _record(data, len(data), start_ns, end_ns, level)


class StepMarker(object):
    """Counts steps and records each as a step marker, from one step end to the next.

    mark_steps(optimizer) returns one driven by the optimizer; StepMarker() alone is driven by
    end_step(), for loops without an optimizer. `step` is the number of the step in progress.
    A step is recorded when it ends, at level 1, as `<name>#step_num=<step>,_r=1#`; its start is
    the previous step's end (for the first, when the marker was made).
    """

    def __init__(self, name="train", start=0):
        self.name = str(name)
        self.step = int(start)
        self._begin_ns = _now()
        self._optimizer_ns = 0
        self._active = True
        self._removers = []

    def end_step(self):
        """Ends the step in progress (recording it) and begins the next one."""
        if not self._active:
            return
        try:
            end = _now()
            _record_span(_step_name(self.name, self.step), self._begin_ns, end,
                         clusterprof.CRITICAL)
            self._begin_ns = end
        except Exception as e:  # never into the training loop
            _warn_once("end_step", "step marker not recorded: %s", e)
        self.step += 1

    def remove(self):
        """Stops counting and recording; detaches from the optimizer when attached."""
        self._active = False
        for remover in self._removers:
            try:
                remover()
            except Exception as e:
                _warn_once("remove", "could not detach from the optimizer: %s", e)
        self._removers = []

    # Optimizer hooks: (optimizer, args, kwargs), the signature of
    # Optimizer.register_step_pre_hook and register_step_post_hook.
    def _before_optimizer(self, optimizer, args, kwargs):
        if self._active:
            self._optimizer_ns = _now() if _enabled(clusterprof.INFO) else 0

    def _after_optimizer(self, optimizer, args, kwargs):
        if not self._active:
            return
        if self._optimizer_ns:
            try:
                _record_span(_OPTIMIZER_EVENT, self._optimizer_ns, _now(), clusterprof.INFO)
            except Exception as e:
                _warn_once("optimizer", "optimizer event not recorded: %s", e)
            self._optimizer_ns = 0
        self.end_step()

    def _attach(self, optimizer):
        pre = getattr(optimizer, "register_step_pre_hook", None)
        post = getattr(optimizer, "register_step_post_hook", None)
        if callable(pre) and callable(post):  # torch >= 2.0
            handles = [pre(self._before_optimizer), post(self._after_optimizer)]
            self._removers = [handle.remove for handle in handles]
        else:
            self._removers = [_wrap_step(optimizer, self)]


def _wrap_step(optimizer, marker):
    """Wraps the instance's step() (torch < 2.0); returns a function that undoes it.

    The wrapper is a bound method, as torch.optim.lr_scheduler expects to find (it wraps
    optimizer.step again, through its __func__). An exception from the optimizer propagates, and
    that step is not counted, as with a post hook that does not run.
    """
    original = optimizer.step
    own = optimizer.__dict__.get("step")

    def step(self, *args, **kwargs):
        if not marker._active:
            return original(*args, **kwargs)
        marker._before_optimizer(self, args, kwargs)
        result = original(*args, **kwargs)
        marker._after_optimizer(self, args, kwargs)
        return result

    functools.update_wrapper(step, getattr(original, "__func__", original))
    wrapper = types.MethodType(step, optimizer)
    optimizer.step = wrapper

    def undo():
        if optimizer.__dict__.get("step") is wrapper:
            if own is None:
                del optimizer.step
            else:
                optimizer.step = own
        # Otherwise something wrapped it after us (an LR scheduler): the wrapper stays in its
        # chain and calls straight through, as marker._active is now False.

    return undo


def mark_steps(optimizer, name="train", start=0):
    """Records each iteration of `optimizer` as a step: `name#step_num=N,_r=1#`.

    Steps are counted from optimizer.step(), as PyTorch's profiler counts them: the first step
    that ends is `start`. Step N spans from the end of step N-1's optimizer.step() to the end of
    its own, so it holds the forward and backward passes and the collectives they run, and the
    analysis finds each step's first collective inside its span. An optimizer.step() that raises
    (or that GradScaler skips) ends no step.

    Uses Optimizer.register_step_pre_hook/register_step_post_hook where torch has them (2.0 and
    later), and wraps the instance's step() otherwise. Every rank of a job must start counting
    at the same iteration so that its step numbers agree with the others'.

    Returns the StepMarker; its remove() detaches it. Never raises: with an object that cannot be
    hooked, the marker is returned detached, after a warning.
    """
    marker = StepMarker(name, start)
    try:
        marker._attach(optimizer)
    except Exception as e:
        _warn("cannot mark the steps of %r: %s", type(optimizer).__name__, e)
    return marker


def step(step_num, name="train"):
    """One step as a context manager: `with clusterprof.torch.step(n): ...` records the block
    as `name#step_num=n,_r=1#`. For loops without an optimizer; a StepMarker and end_step() do
    the same where the step's boundaries are not one block."""
    return clusterprof.Trace(name, step_num=int(step_num), _r=1)


class _Patches(object):
    """Functions replaced in torch, each with how to put it back. remove() restores them all and
    turns the handle off, so that a wrapper still referenced elsewhere records nothing."""

    def __init__(self):
        self._active = True
        self._restores = []

    def remove(self):
        self._active = False
        for restore in self._restores:
            restore()
        self._restores = []


class CollectiveAnnotations(_Patches):
    """What annotate_collectives did: `wrapped` (the torch.distributed functions) and
    `comm_hook` (whether a DDP communication hook was registered). remove() restores the
    functions; a communication hook cannot be unregistered in torch, so the hook stays and
    records nothing after remove()."""

    def __init__(self):
        super(CollectiveAnnotations, self).__init__()
        self.wrapped = []
        self.comm_hook = False


# Collectives in progress on each thread: one that calls another (all_gather_object calls
# all_gather; the DDP hook calls all_reduce) is recorded once, as the outermost.
_depth = threading.local()


def _new_async_id():
    return _ASYNC_TAG | (next(_async_ids) & 0xFFFFFFFFFFFFFF)


def _begin_async(encoded):
    """Begins an async event and returns its id, or 0 when it is not recorded."""
    if not _enabled(clusterprof.CRITICAL):
        return 0
    event_id = _new_async_id()
    data = _utf8(encoded)
    _async_begin(data, len(data), event_id, clusterprof.CRITICAL)
    return event_id


def _end_async(event_id):
    if event_id:
        _async_end(event_id, clusterprof.CRITICAL)


def _end_when_done(work, event_id):
    """Ends the async event when `work` (a torch.distributed Work) completes; at once when its
    completion cannot be observed (a backend without futures)."""
    try:
        future = work.get_future()
        if hasattr(future, "add_done_callback"):  # torch >= 1.10
            future.add_done_callback(lambda done: _end_async(event_id))
        else:
            future.then(lambda done: _end_async(event_id))
    except Exception:
        _end_async(event_id)


def _wants_async(function, args, kwargs):
    """Whether the call passes async_op=True (by keyword or position)."""
    if "async_op" in kwargs:
        return bool(kwargs["async_op"])
    position = _async_op_position(function)
    return position is not None and len(args) > position and bool(args[position])


@functools.lru_cache(maxsize=None)
def _async_op_position(function):
    try:
        import inspect

        names = list(inspect.signature(function).parameters)
        return names.index("async_op") if "async_op" in names else None
    except (TypeError, ValueError):
        return None


def _wrap_collective(function, event, handle):
    encoded = str(event)

    @functools.wraps(function)
    def collective(*args, **kwargs):
        if not handle._active or getattr(_depth, "n", 0) or not _enabled(clusterprof.CRITICAL):
            return function(*args, **kwargs)
        try:
            asynchronous = _wants_async(function, args, kwargs)
            event_id = _begin_async(encoded) if asynchronous else 0
            start = 0 if asynchronous else _now()
        except Exception as e:
            _warn_once("collective", "collective not recorded: %s", e)
            return function(*args, **kwargs)
        _depth.n = 1
        try:
            result = function(*args, **kwargs)
        except BaseException:
            _end_async(event_id)
            raise
        finally:
            _depth.n = 0  # only the outermost call gets here
        try:
            if asynchronous:
                if result is None:
                    _end_async(event_id)
                else:
                    _end_when_done(result, event_id)
            else:
                _record_span(encoded, start, _now(), clusterprof.CRITICAL)
        except Exception as e:
            _warn_once("collective", "collective not recorded: %s", e)
        return result

    collective._clusterprof_original = function
    return collective


def _wrap_functions(names, handle):
    import torch.distributed as dist

    modules = [dist]
    c10d = getattr(dist, "distributed_c10d", None)
    if c10d is not None:
        modules.append(c10d)
    for name in names:
        function = getattr(dist, name, None)
        if function is None or not callable(function):
            continue
        if hasattr(function, "_clusterprof_original"):
            continue  # already annotated by an earlier call that is still in place
        wrapper = _wrap_collective(function, "torch.distributed." + name, handle)
        for module in modules:
            if getattr(module, name, None) is function:
                setattr(module, name, wrapper)

                def restore(module=module, name=name, wrapper=wrapper, function=function):
                    if getattr(module, name, None) is wrapper:
                        setattr(module, name, function)

                handle._restores.append(restore)
        handle.wrapped.append(name)


def _ddp_hook(inner, handle):
    """A DDP communication hook that records each bucket's all-reduce around `inner` (the
    default allreduce_hook unless given): it begins when DDP hands the bucket over, during the
    backward pass, and ends when the bucket's future completes."""

    def hook(state, bucket):
        event_id = 0
        if handle._active:
            try:
                index = bucket.index() if hasattr(bucket, "index") else -1
                event_id = _begin_async(_encode(_DDP_EVENT, {"bucket": index}))
            except Exception as e:
                _warn_once("bucket", "DDP bucket not recorded: %s", e)
        depth = getattr(_depth, "n", 0)
        _depth.n = depth + 1
        try:
            future = inner(state, bucket)
        except BaseException:
            _end_async(event_id)
            raise
        finally:
            _depth.n = depth
        if not event_id:
            return future

        def done(completed):
            _end_async(event_id)
            return completed.value()

        return future.then(done)

    return hook


def annotate_collectives(model=None, comm_hook=None, comm_state=None,
                         functions=COLLECTIVE_FUNCTIONS):
    """Records torch.distributed collectives as events the analysis takes for collectives.

    Each function of `functions` (COLLECTIVE_FUNCTIONS: those the installed torch has) is
    replaced in torch.distributed and torch.distributed.distributed_c10d by a wrapper that
    records the call as `torch.distributed.<name>` (level 1): a synchronous call from entry to
    return, an async_op=True call from entry until its Work completes. Code that bound a
    function before this call (`from torch.distributed import all_reduce`) keeps the original.

    `model`, a DistributedDataParallel module: DDP all-reduces its gradient buckets from C++,
    where no Python wrapper sees them, so a communication hook is registered that records each
    bucket's all-reduce, `ddp_all_reduce#bucket=<i>#`, from when DDP hands the bucket over to
    when it is reduced, and runs `comm_hook` (default: DDP's own allreduce_hook, which reduces as
    DDP does without a hook) with `comm_state` (default: the model's process group). DDP takes
    one hook, registered before the first backward pass: call this before training, and pass
    a hook of your own (fp16 compression, PowerSGD) as `comm_hook` rather than registering it.
    A hook cannot be unregistered; after remove() it only calls `comm_hook`. Other models
    (FSDP) need no hook: their collectives are Python calls that the wrappers see. In torch 1.13
    a DDP model with any Python hook must be freed before dist.destroy_process_group(), or its
    reducer can deadlock destroying the group (docs/pytorch.md, "Limits").

    With torch.compile, pass functions=() if the wrappers break graphs that call collectives.

    Returns a CollectiveAnnotations; remove() restores the functions. Never raises: without
    torch.distributed, or when the hook cannot be registered, it does what it can and logs why.
    """
    handle = CollectiveAnnotations()
    try:
        import torch.distributed as dist

        if not dist.is_available():
            _warn("torch.distributed is not available; collectives not annotated")
            return handle
    except Exception as e:
        _warn("torch.distributed cannot be imported (%s); collectives not annotated", e)
        return handle
    try:
        _wrap_functions(functions, handle)
    except Exception as e:
        _warn("torch.distributed functions not annotated: %s", e)
    if model is not None:
        try:
            _register_ddp_hook(model, comm_hook, comm_state, handle)
        except Exception as e:
            _warn("DDP communication hook not registered (%s); its gradient all-reduces are "
                  "not annotated", e)
    return handle


def _register_ddp_hook(model, comm_hook, comm_state, handle):
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        _logger.info("clusterprof.torch: %s is not DistributedDataParallel; no communication "
                     "hook (its collectives are annotated where it calls torch.distributed)",
                     type(model).__name__)
        return
    if comm_hook is None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        comm_hook = default_hooks.allreduce_hook
    if comm_state is None:
        comm_state = getattr(model, "process_group", None)
    model.register_comm_hook(comm_state, _ddp_hook(comm_hook, handle))
    handle.comm_hook = True


class NvtxSteps(_Patches):
    """What nvtx_steps installed; remove() restores torch.cuda.nvtx.range_push/range_pop."""

    def __init__(self, pattern, name):
        super(NvtxSteps, self).__init__()
        self.pattern = pattern
        self.name = name
        self._count = 0
        self._stacks = threading.local()

    def _pushed(self, message):
        stack = getattr(self._stacks, "stack", None)
        if stack is None:
            stack = self._stacks.stack = []
        match = self.pattern.search(message) if self._active else None
        if match is None:
            stack.append(None)
            return
        number = None
        if match.groups() and match.group(1) is not None:
            try:
                number = int(match.group(1))
            except ValueError:
                number = None
        if number is None:
            number = self._count
        self._count = number + 1
        stack.append((number, _now()))

    def _popped(self):
        stack = getattr(self._stacks, "stack", None)
        if not stack:
            return
        entry = stack.pop()
        if entry is not None and self._active:
            number, start = entry
            _record_span(_step_name(self.name, number), start, _now(), clusterprof.CRITICAL)


def nvtx_steps(pattern=r"step[\s_#:=-]*(\d+)", name="train"):
    """Records torch.cuda.nvtx ranges whose message matches `pattern` as step markers.

    `torch.cuda.nvtx.range_push("step 12")` ... `range_pop()` (or `with
    torch.cuda.nvtx.range("step {}", 12)`) then also records `name#step_num=12,_r=1#` on the
    host plane, where the analysis finds steps by their step_num with no option, and with no
    CUPTI at all. The pattern is searched in each message (Python `re`); its first group, when
    it has one that holds an integer, is the step number; otherwise matching ranges are
    numbered in the order they are pushed, from 0. Ranges pushed with range_start/range_end,
    and by C++ code, are not seen.

    Returns an NvtxSteps whose remove() restores the functions. Never raises: without
    torch.cuda.nvtx, it returns a handle that does nothing, after a warning.
    """
    if isinstance(pattern, str):
        pattern = re.compile(pattern, re.IGNORECASE)
    handle = NvtxSteps(pattern, name)
    try:
        import torch.cuda.nvtx as nvtx
    except Exception as e:
        _warn("torch.cuda.nvtx cannot be imported (%s); NVTX steps not marked", e)
        return handle
    push, pop = nvtx.range_push, nvtx.range_pop

    @functools.wraps(push)
    def range_push(msg):
        depth = push(msg)
        try:
            handle._pushed(str(msg))
        except Exception as e:
            _warn_once("nvtx", "NVTX step not marked: %s", e)
        return depth

    @functools.wraps(pop)
    def range_pop():
        depth = pop()
        try:
            handle._popped()
        except Exception as e:
            _warn_once("nvtx", "NVTX step not marked: %s", e)
        return depth

    nvtx.range_push, nvtx.range_pop = range_push, range_pop

    def restore():
        if nvtx.range_push is range_push:
            nvtx.range_push = push
        if nvtx.range_pop is range_pop:
            nvtx.range_pop = pop

    handle._restores.append(restore)
    return handle
