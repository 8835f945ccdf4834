"""Run by python_annotate_integration_test.cc: annotates a few training steps through the
clusterprof module, on two threads, and prints what the module reports as `key=value` lines.

The test arms (or not) a control page in $CLUSTERPROF_DIR first, then drains the ring file this
process leaves behind and checks every event.
"""

import os
import sys
import threading

import clusterprof


def main():
    print("pid=%d" % os.getpid())
    print("library=%s" % clusterprof.library_path())
    print("enabled=%d" % clusterprof.tracing_enabled(clusterprof.INFO))
    print("verbose_enabled=%d" % clusterprof.tracing_enabled(clusterprof.VERBOSE))

    clusterprof.set_thread_name("py_main")
    for step in range(3):
        with clusterprof.Trace("train", step_num=step, _r=1) as trace:
            with clusterprof.Trace("forward", clusterprof.INFO, layer="dense#1", training=True):
                pass
            with clusterprof.Trace("backward"):
                clusterprof.set_metadata(grad_norm=0.5)  # the innermost Trace: backward
            trace.set_metadata(in_cache=step % 2 == 0)
            with clusterprof.Trace("verbose_op", clusterprof.VERBOSE):
                pass

    @clusterprof.Trace("optimizer", lr=0.25)
    def optimize(value):
        return value * 2

    assert optimize(21) == 42
    assert optimize.__name__ == "optimize"

    with clusterprof.Trace("keyword_level", level=3):  # a keyword `level` is metadata
        pass

    def load():
        clusterprof.set_thread_name("py_loader")
        for batch in range(2):
            with clusterprof.Trace("load_batch", batch=batch):
                pass
            clusterprof.async_begin("batch_in_queue", 100 + batch)

    loader = threading.Thread(target=load)
    loader.start()
    loader.join()
    for batch in range(2):
        clusterprof.async_end(100 + batch)

    try:
        with clusterprof.Trace("raises"):
            raise ValueError("expected")
    except ValueError:
        print("exception=propagated")

    clusterprof.set_metadata(outside="any trace")  # no Trace open: nothing to do
    stats = clusterprof.stats()
    print("attached=%d" % stats["attached"])
    print("dropped_strings=%d" % stats["dropped_strings"])
    print("ring_path=%s" % stats["ring_path"])
    print("done=1")


if __name__ == "__main__":
    sys.exit(main())
