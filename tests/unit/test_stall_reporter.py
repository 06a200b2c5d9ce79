"""The Horovod stores' stall reporter on a hand-driven clock: one allreduce watched at a time,
the newest; one report when the watched one has run past the bound; nothing when it ends."""
import io
import time

import pytest

from kvstore_ext.horovod.stall import StallReporter
from kvstore_ext.stalls import DEFAULT_AFTER_S, STALL_ENV, after_seconds


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def reporter(after_s=10.0):
    clock, watched, out = Clock(), [], io.StringIO()
    r = StallReporter(after_s, lambda: "dist_ssgd worker 0",
                      lambda fn, arrays: watched.append((fn, arrays)), out=out, clock=clock)
    return r, clock, watched, out


def test_the_watched_allreduce_is_reported_once_past_the_bound_and_names_key_and_step():
    r, clock, watched, out = reporter()
    assert not r.look() and not watched          # nothing started: nothing to watch
    r.started(3, 7, "array-3-7")
    clock.t += 1
    assert not r.look()                          # the look that starts watching it
    assert [a for _, a in watched] == [["array-3-7"]]
    clock.t += 8.9
    assert not r.look() and r.reports == 0       # 9.9 s: under the bound
    clock.t += 0.2
    assert r.look() and r.reports == 1
    text = out.getvalue()
    assert "kvstore_ext dist_ssgd worker 0: an allreduce of key 7 (step 3 or later) has not " \
           "ended after 10 s" in text and STALL_ENV in text
    clock.t += 100
    assert not r.look() and r.reports == 1       # once per allreduce
    assert len(watched) == 1                     # and it is not watched twice


def test_an_allreduce_that_ends_is_never_reported_and_the_newest_is_watched_next():
    r, clock, watched, out = reporter()
    r.started(0, 0, "a0")
    r.look()
    for step in (1, 2, 3):                       # started while a0 is watched: only the newest
        r.started(step, 0, f"a{step}")           # counts
    clock.t += 50
    watched[0][0]()                              # a0 ended (the probe's callback)
    assert not r.look()                          # watches a3, the newest, from its start
    assert [a for _, a in watched] == [["a0"], ["a3"]]
    assert r.look() and "(step 3 or later)" in out.getvalue()   # a3 started 50 s ago
    watched[1][0]()
    clock.t += 1000
    assert not r.look() and len(watched) == 2 and r.reports == 1   # nothing newer: quiet


def test_a_late_callback_of_an_earlier_allreduce_does_not_end_the_watch():
    r, clock, watched, _ = reporter()
    r.started(0, 0, "a0")
    r.look()
    watched[0][0]()
    r.started(1, 0, "a1")
    r.look()
    watched[0][0]()                              # a0's callback again: a1 is still watched
    clock.t += 11
    assert r.look()


def test_off_at_zero_and_a_failing_watch_stops_the_reporter():
    r, clock, watched, _ = reporter(after_s=0)
    r.started(0, 0, "a0")
    assert not r.look() and not watched
    assert r.start()._thread is None

    def broken(fn, arrays):
        raise RuntimeError("the engine is gone")
    r = StallReporter(1.0, lambda: "w", broken, out=io.StringIO())
    r.started(0, 0, "a0")
    assert not r.look() and r._stop.is_set()


def test_the_thread_reports_an_allreduce_that_never_ends():
    out = io.StringIO()
    r = StallReporter(0.2, lambda: "dist_dcs3gd worker 1", lambda fn, arrays: None, out=out)
    r.started(5, "conv0_weight", object())
    r.start()
    try:
        deadline = time.monotonic() + 5
        while r.reports == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        r.stop()
    assert r.reports == 1, out.getvalue()
    assert "key 'conv0_weight' (step 5 or later)" in out.getvalue()


@pytest.mark.parametrize("raw,value", [("", DEFAULT_AFTER_S), ("  ", DEFAULT_AFTER_S),
                                       ("30", 30.0), ("0", 0.0), ("2.5", 2.5)])
def test_the_bound_comes_from_the_environment(raw, value):
    assert after_seconds({STALL_ENV: raw}) == value
    assert after_seconds({}) == DEFAULT_AFTER_S


@pytest.mark.parametrize("raw", ["abc", "-1", "nan", "inf"])
def test_a_bad_bound_is_an_error_naming_the_variable_and_value(raw):
    with pytest.raises(ValueError, match=f"{STALL_ENV}='{raw}': expected seconds"):
        after_seconds({STALL_ENV: raw})
