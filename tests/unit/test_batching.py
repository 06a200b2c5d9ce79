"""How per-key calls are gathered into batches (pure logic; the send is recorded)."""
import threading
import time

from kvstore_ext.ps.batching import HOLD_AT_MOST, QUIET, CallerProbe, Coalescer


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


def test_a_caller_still_at_work_keeps_its_batch_open_until_it_blocks():
    """A caller that stops calling but keeps running (what a thread preempted in the middle of
    a step looks like from the waiter: not blocked) keeps its batch open well past QUIET; once
    it blocks, the batch goes within a few looks.  Real threads, the real probe (/proc)."""
    c, sent = make()
    stop_spinning, blocked = threading.Event(), threading.Event()
    batch = []

    def caller():
        batch.append(c.add("pushpull", 0, plan(0)))
        c.add("pushpull", 1, plan(1))
        while not stop_spinning.is_set():   # at work, no calls
            sum(range(1000))
        blocked.set()
        batch[0].sent.wait(10)               # blocked on the values, as the engine would be

    t = threading.Thread(target=caller)
    t.start()
    while not batch:
        time.sleep(0.001)
    waiter = threading.Thread(target=c.wait_sent, args=(batch[0],))
    waiter.start()
    time.sleep(HOLD_AT_MOST / 2)
    assert sent == [] and waiter.is_alive()   # the caller is at work: no cut batch
    stop_spinning.set()
    blocked.wait(5)
    t0 = time.monotonic()
    waiter.join(timeout=5)
    t.join(timeout=5)
    assert not waiter.is_alive() and sent == [("pushpull", [0, 1])]
    assert time.monotonic() - t0 < 0.5


def test_the_probe_counts_the_waiting_thread_and_a_gone_thread_as_stopped():
    probe = CallerProbe()
    assert not probe.at_work()                # no call yet
    probe.called()
    assert not probe.at_work()                # the caller is the thread that waits
    done = threading.Event()
    t = threading.Thread(target=lambda: (probe.called(), done.set()))
    t.start()
    t.join()
    deadline = time.monotonic() + 2           # the OS thread may still be on its way out
    while probe.at_work() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done.is_set() and not probe.at_work()   # the caller's thread has ended


def test_a_caller_that_never_stops_cannot_hold_its_batch_for_ever():
    c, sent = make()
    stop = threading.Event()
    batch = []

    def caller():
        batch.append(c.add("pushpull", 0, plan(0)))
        while not stop.is_set():             # at work, and never blocks
            sum(range(1000))

    t = threading.Thread(target=caller)
    t0 = time.monotonic()                     # before the call: the hold counts from it
    t.start()
    while not batch:
        time.sleep(0.001)
    c.wait_sent(batch[0])
    waited = time.monotonic() - t0
    stop.set()
    t.join(timeout=5)
    assert sent == [("pushpull", [0])] and HOLD_AT_MOST <= waited < HOLD_AT_MOST + 1.0


def test_a_blocked_caller_counts_as_stopped_only_after_it_has_not_run_for_a_while():
    """Waiting for the GIL looks like being blocked: the probe waits ``stopped_after`` from
    the last time it saw the thread run (the clock is the test's; the thread and /proc real)."""
    now = [0.0]
    probe = CallerProbe(stopped_after=0.01, clock=lambda: now[0])
    release, ready = threading.Event(), threading.Event()

    def caller():
        probe.called()
        ready.set()
        release.wait(10)                      # blocked

    t = threading.Thread(target=caller)
    t.start()
    ready.wait(5)
    time.sleep(0.05)                          # let it reach the wait
    assert probe.at_work()                    # first look: it ran just now, as far as it knows
    now[0] += 0.005
    assert probe.at_work()                    # not run since, but not for long
    now[0] += 0.006
    assert not probe.at_work()                # 11 ms without running: stopped
    release.set()
    t.join(timeout=5)
