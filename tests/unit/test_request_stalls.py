"""The parameter-server stores' stall check on hand-set times: the oldest awaited request is
reported once past the bound, one report per bound whatever is in flight, and a request that
is answered, or a partial pull that went on, is not reported; and what waits on an answer is
called once it comes."""
import threading

from hypothesis import given, settings, strategies as st

import pytest

from kvstore_ext.ps.link import (EngineWaits, Ticket, UnansweredRequests, describe_call,
                                 describe_request, overdue, what_else, when_answered)
from kvstore_ext.stalls import PEER_HUNG, POOL_WAIT, shutdown_seconds


def ticket(since, seq=1, op="pushpull", keys=(0,), server=0):
    items = [[k, 0, "<f4", 10] for k in keys]
    return Ticket(40, since, server, {"op": op, "items": items, "seq": seq})


def test_the_oldest_awaited_request_is_reported_once_past_the_bound():
    watch = UnansweredRequests(10.0)
    old, new = ticket(100.0, seq=7, keys=(3, 1, 3)), ticket(105.0, seq=8)
    assert watch.due([new, old], 109.9) is None          # 9.9 s: under the bound
    assert watch.due([new, old], 110.0) is old
    assert describe_request(old) == "a pushpull of keys 1, 3 sent to server 0 (request 7)"
    assert watch.due([new, old], 130.0) is None          # once per request: not old again,
    assert watch.answered() is None                       # and new is the same stall
    old.event.set()
    assert watch.answered() is old and watch.answered() is None
    assert watch.due([new, old], 131.0) is new            # a bound after the first report


def test_one_report_per_bound_however_many_requests_wait():
    watch = UnansweredRequests(5.0)
    tickets = [ticket(0.0, seq=i) for i in range(65)]     # a step's per-key calls
    reported = []
    for tick in range(0, 200):                            # looks every 0.1 s for 20 s
        now = tick / 10
        found = watch.due(tickets, now)
        if found is not None:
            reported.append(now)
            found.event.set()                             # answered: the next is the oldest
    assert reported == [5.0, 10.0, 15.0]


def test_answered_requests_and_pulls_that_went_on_are_not_awaited():
    watch = UnansweredRequests(1.0)
    answered, went_on = ticket(0.0), ticket(0.0)
    answered.event.set()
    went_on.abandoned = True
    assert watch.due([answered, went_on], 100.0) is None


def test_a_bound_of_zero_turns_the_reports_off():
    assert UnansweredRequests(0.0).due([ticket(0.0)], 1e9) is None


def test_the_oldest_awaited_request_past_the_shutdown_bound_stops_the_call():
    """``KVX_STALL_SHUTDOWN_S``: the oldest awaited request that has waited the bound, a
    barrier too; never one answered, one a pull went on without, or a data request a worker
    pool may hold; and never at all with the bound at 0, its default."""
    old, new = ticket(100.0, seq=7), ticket(105.0, seq=8)
    assert overdue([new, old], 102.9, 3.0, pooled=False) is None
    assert overdue([new, old], 103.0, 3.0, pooled=False) is old
    assert overdue([new, old], 1e9, 0.0, pooled=False) is None
    old.event.set()
    assert overdue([new, old], 200.0, 3.0, pooled=False) is new
    new.abandoned = True
    assert overdue([new, old], 200.0, 3.0, pooled=False) is None
    barrier = Ticket(1, 0.0, None, {"op": "barrier", "seq": 3})
    held = ticket(0.0, op="pull")
    assert overdue([held, barrier], 10.0, 3.0, pooled=True) is barrier
    assert overdue([held], 10.0, 3.0, pooled=True) is None
    assert overdue([held], 10.0, 3.0, pooled=False) is held


def test_the_shutdown_bound_is_off_by_default_and_a_bad_one_is_named():
    assert shutdown_seconds({}) == 0.0 and shutdown_seconds({"KVX_STALL_SHUTDOWN_S": " "}) == 0
    assert shutdown_seconds({"KVX_STALL_SHUTDOWN_S": "2.5"}) == 2.5
    for bad in ("soon", "-1", "inf", "nan"):
        with pytest.raises(ValueError, match=f"KVX_STALL_SHUTDOWN_S='{bad}': expected seconds"):
            shutdown_seconds({"KVX_STALL_SHUTDOWN_S": bad})


def test_requests_without_keys_and_the_schedulers_are_named():
    assert describe_request(Ticket(0, 0.0, 2, {"op": "stats", "seq": 4})) == \
        "a stats sent to server 2 (request 4)"
    assert describe_request(Ticket(0, 0.0, None, {"op": "barrier"})) == \
        "a barrier sent to the scheduler"
    many = ticket(0.0, keys=range(20))
    assert describe_request(many).startswith("a pushpull of keys 0, 1, 2, 3, 4, 5, 6, 7, ...")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.booleans()), min_size=1, max_size=20),
       st.floats(0.5, 50), st.lists(st.floats(0, 300), min_size=1, max_size=30))
def test_a_report_is_always_of_the_oldest_awaited_request_past_the_bound(sent, after_s, looks):
    tickets = []
    for i, (since, answered) in enumerate(sent):
        t = ticket(since, seq=i)
        if answered:
            t.event.set()
        tickets.append(t)
    watch = UnansweredRequests(after_s)
    times = []
    for now in sorted(looks):
        found = watch.due(tickets, now)
        if found is None:
            continue
        awaited = [t for t in tickets if not t.event.is_set()]
        assert found in awaited and found.since == min(t.since for t in awaited)
        assert now - found.since >= after_s
        times.append(now)
    assert all(b - a >= after_s for a, b in zip(times, times[1:]))
    assert len(times) <= 1     # nothing is answered meanwhile: one report for the one stall


def test_a_callback_runs_once_when_every_ticket_is_answered_on_the_thread_that_answers():
    calls = []
    tickets = [Ticket(), Ticket(), Ticket()]
    assert when_answered(tickets, lambda: calls.append(threading.current_thread().name))
    tickets[0].fulfil({"ok": True}, [])
    tickets[2].fail("server 2 is gone")
    assert calls == []
    last = threading.Thread(target=tickets[1].fulfil, args=({"ok": True}, []), name="link")
    last.start()
    last.join()
    assert calls == ["link"]
    tickets[1].fulfil({"ok": True}, [])          # a second answer (a duplicate) calls nothing
    tickets[2].fail("again")
    assert calls == ["link"]
    when_answered(tickets, lambda: calls.append("now"))   # all answered: at once, here
    when_answered([], lambda: calls.append("none"))
    assert calls == ["link", "now", "none"]


def test_a_callback_is_never_lost_to_an_answer_that_races_it():
    """Registering and answering from two threads at once, many times: every callback runs
    exactly once (the answer and the registration are ordered by one lock)."""
    for _ in range(300):
        ticket, calls = Ticket(), []
        answer = threading.Thread(target=ticket.fulfil, args=({"ok": True}, []))
        answer.start()
        when_answered([ticket], lambda: calls.append(1))
        answer.join()
        assert calls == [1]


def test_a_wait_for_the_engine_is_reported_once_past_the_bound_and_said_to_end():
    engine = EngineWaits(10.0)
    wait = (100.0, "pushpull", [(3, None), (1, None), (3, None)])
    assert not engine.due(None, 1e9) and engine.ended(None) is None
    assert not engine.due(wait, 109.9)
    assert engine.due(wait, 110.0) and not engine.due(wait, 200.0)    # once per wait
    assert engine.ended(wait) is None                                  # still waiting
    assert engine.ended(None) is wait and engine.ended(None) is None   # over: said once
    later = (300.0, "pushpull", [(0, None)])
    assert engine.due(later, 310.0)                                    # a new wait
    assert not EngineWaits(0.0).due(wait, 1e9)                         # 0: reports off
    assert describe_call("pushpull", (k for k, _ in wait[2])) == "a pushpull of keys 1, 3"


def test_a_pooled_stores_data_request_may_be_held_by_the_pool_and_the_report_says_so():
    """On ``dist_pool`` a worker outside the pool waits for OK at its pull, for as long as the
    pool keeps it out (a fixed pool: until a lower rank leaves): its report said only that a
    peer or the link was hung, which is not true of such a wait."""
    for op in ("pull", "pushpull", "push"):
        assert what_else(ticket(0.0, op=op), pooled=True) == POOL_WAIT
        assert what_else(ticket(0.0, op=op), pooled=False) == PEER_HUNG
    assert what_else(ticket(0.0, op="stats", keys=()), pooled=True) == PEER_HUNG
    barrier = Ticket(1, 0.0, None, {"op": "barrier", "seq": 3})
    assert what_else(barrier, pooled=True) == PEER_HUNG


def test_a_report_names_the_workers_idle_for_half_its_wait_and_nothing_else():
    """The scheduler's list of quiet workers, as a stall report puts it: aged since it was
    heard, only those idle at least half as long as the reported wait, never this worker, and
    a list that is not pairs of a rank and a duration gives no sentence (a report must not
    fail on it)."""
    from kvstore_ext.ps.link import describe_quiet, quiet_workers
    heard = (100.0, quiet_workers([[1, 9.0], [0, 30.0], [2, 1.0]]))
    text = describe_quiet(heard, 0, 101.0, 12.0)
    assert text == (" Workers that have made no kvstore call for a while, as the scheduler last "
                    "heard: worker 1 for 10 s (their own code runs, or their host is stopped; "
                    "a push or barrier this waits for may be theirs).")
    assert describe_quiet(heard, 0, 101.0, 25.0) == ""
    for bad in (None, "x", [[1]], [["1", 2.0]], [[1, "2"]], [[1, float("nan")]], {"1": 2}):
        assert quiet_workers(bad) == []
    assert len(quiet_workers([[r, 5.0] for r in range(100)])) == 8
