"""What an operation pushed to MXNet's engine holds is released on the Python thread that
pushes, never on an engine thread or on the thread that completed it (freeing arrays there
pushes engine work from inside the engine)."""
import threading
import time

import mxnet as mx

from kvstore_ext import engine


class Start:
    """An asynchronous operation's function that records the thread it is freed on."""

    def __init__(self, completed: threading.Event, go_on: threading.Event, freed: list):
        self.completed, self.go_on, self.freed = completed, go_on, freed

    def __call__(self, done):
        def complete():
            done()
            self.completed.set()
        threading.Thread(target=complete, name="completion").start()
        self.go_on.wait(10)     # the engine thread is still in here when the operation ends

    def __del__(self):
        self.freed.append(threading.current_thread().name)


def test_a_job_ended_by_another_thread_while_its_function_runs_is_freed_by_the_pusher():
    """The operation is completed from a second thread while its function is still running on
    the engine thread, and the pushing thread pushes again in between (which empties the list
    of ended jobs).  The job was then dropped by the engine thread when its function returned:
    its arrays were freed there."""
    a, b = mx.nd.zeros((4,)), mx.nd.zeros((4,))
    mx.nd.waitall()
    completed, go_on, freed = threading.Event(), threading.Event(), []
    start = Start(completed, go_on, freed)
    engine.push_async(start, [a])
    del start
    assert completed.wait(10)
    a.wait_to_read()                            # the operation has ended ...
    engine.run(lambda: None, [], [b])           # ... and the pusher empties the ended jobs
    b.wait_to_read()
    go_on.set()                                 # now the engine thread leaves the function
    deadline = time.monotonic() + 10
    while engine._jobs and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not engine._jobs
    assert freed == []                          # nobody but the pusher frees it ...
    engine.run(lambda: None, [], [b])
    b.wait_to_read()
    assert freed == [threading.main_thread().name]     # ... which does on its next push


def test_a_thread_that_must_not_push_is_refused_and_leaves_nothing_behind():
    """MXNet's engine queues an operation on its arrays one at a time: a push from a second
    thread on arrays the main thread's operations also use can deadlock the engine (a late
    block of dist_psp, written from the receiving thread, hung about one job in 15).  Our
    receiving threads are marked, and a push from one raises instead."""
    a, b = mx.nd.zeros((4,)), mx.nd.zeros((4,))
    mx.nd.waitall()
    jobs, writing, errors = dict(engine._jobs), dict(engine._writing), []

    def receiver():
        engine.never_push_here()
        for push in (lambda: engine.push(lambda: None, [a, b]),
                     lambda: engine.push_async(lambda done: done(), [a]),
                     lambda: engine.probe(lambda: None, [b])):
            try:
                push()
            except RuntimeError as exc:
                errors.append(str(exc))

    t = threading.Thread(target=receiver, name="kvstore_ext-link")
    t.start()
    t.join(10)
    assert len(errors) == 3 and all("'kvstore_ext-link'" in e for e in errors), errors
    assert engine._jobs == jobs and engine._writing == writing
    engine.push(lambda: None, [a, b])           # this thread still may
    mx.nd.waitall()
