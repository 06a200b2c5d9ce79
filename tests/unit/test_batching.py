"""How per-key calls are gathered into batches (pure logic; the send is recorded)."""
import threading
import time

from kvstore_ext.ps.batching import QUIET, Coalescer


def plan(key, server=0):
    return {server: ([[key, 0, "<f4", 1]], [b"x"], [key])}


def make(**options):
    sent = []
    def send(messages):   # what would go to each server: record the op and the keys
        header, _ = messages[0]
        sent.append((header["op"], [item[0] for item in header["items"]]))
        return {0: len(sent)}
    return Coalescer(send, **options), sent


def test_first_step_is_sent_when_calls_stop_then_steps_go_out_at_their_last_key():
    c, sent = make()
    batches = [c.add("pushpull", k, plan(k)) for k in (0, 1, 2)]
    assert sent == [] and batches[0] is batches[2]
    c.wait_sent(batches[0])                 # the calls stopped: the waiting operation sends it
    assert sent == [("pushpull", [0, 1, 2])]
    for k in (0, 1, 2):                     # second step: cycle learned, sent at key 2 at once
        b = c.add("pushpull", k, plan(k))
    assert sent[-1] == ("pushpull", [0, 1, 2]) and b.sent.is_set()
    assert c.cycle_end == 2


def test_a_repeated_key_starts_a_new_batch():
    c, sent = make()
    c.add("pushpull", 5, plan(5))
    c.add("pushpull", 6, plan(6))
    c.add("pushpull", 5, plan(5))           # 5 again: [5, 6] goes, 6 ends the cycle from now on
    assert sent == [("pushpull", [5, 6])] and c.cycle_end == 6
    c.add("pushpull", 6, plan(6))
    assert sent[-1] == ("pushpull", [5, 6])


def test_calls_still_coming_keep_the_batch_open():
    """The burst's calls come closer together than QUIET on the coalescer's clock (a clock the
    test moves, so that a slow machine cannot stretch the gaps): the waiting operation does not
    send the batch early, and sends it once the calls have stopped for QUIET."""
    now = [0.0]
    c, sent = make(clock=lambda: now[0])
    b = c.add("pushpull", 0, plan(0))
    waiter = threading.Thread(target=c.wait_sent, args=(b,))
    waiter.start()
    for k in range(1, 20):                  # a burst faster than QUIET
        time.sleep(QUIET)                   # the waiter looks again in real time...
        now[0] += QUIET / 4                 # ...but on the store's clock the calls keep coming
        c.add("pushpull", k, plan(k))
    assert sent == [] and waiter.is_alive()
    now[0] += QUIET                         # the calls stop
    waiter.join(timeout=5)
    assert not waiter.is_alive()
    assert sent[0][1] == list(range(20))


def test_a_failed_send_releases_every_waiting_call():
    def broken(messages):
        raise ConnectionError("server gone")
    c = Coalescer(broken)
    b = c.add("pushpull", 0, plan(0))
    c.flush()
    assert b.sent.is_set() and isinstance(b.error, ConnectionError)
