"""The simulated wire of the Horovod stores and of train_dcs3gd's emulated device: transfers
queue back to back, and the wire's own thread waking late (no free core, no GIL) does not
lengthen them."""
import sys
import threading
import time

import mxnet as mx

from kvstore_ext.engine import SimulatedLink


def test_queued_transfers_end_at_the_sum_of_their_times_when_the_link_wakes_late():
    """20 transfers of 10 ms ready at once take 0.2 s of wire.  A thread holding the GIL
    in pure Python makes the link's thread wait up to a switch interval (5 ms) for it after
    every sleep: counted from each wake-up, the queue took 0.34-0.38 s (0.21 now)."""
    arrays = [mx.nd.zeros((4,)) for _ in range(20)]
    mx.nd.waitall()
    link = SimulatedLink()
    stop = threading.Event()

    def hog():
        while not stop.is_set():
            sum(range(200))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    hogger = threading.Thread(target=hog, daemon=True)
    hogger.start()
    try:
        t0 = time.perf_counter()
        for a in arrays:
            link.hold(a, 0.01)
        for a in arrays:
            a.wait_to_read()
        elapsed = time.perf_counter() - t0
    finally:
        stop.set()
        hogger.join()
        sys.setswitchinterval(interval)
    assert 0.2 <= elapsed < 0.28, elapsed


def test_a_transfer_starts_when_its_array_is_ready_not_before():
    """An idle wire does not bank time: a transfer ready 0.1 s after the last one ended
    still takes its whole time."""
    link = SimulatedLink()
    a, b = mx.nd.zeros((4,)), mx.nd.ones((4,))
    link.hold(a, 0.05)
    a.wait_to_read()
    time.sleep(0.1)
    t0 = time.perf_counter()
    link.hold(b, 0.05)
    b.wait_to_read()
    assert time.perf_counter() - t0 >= 0.05
    assert b.asnumpy().tolist() == [1.0] * 4          # held, not written
