"""fastdata.background, the one background-thread primitive: each clause of its written invariant (owner, exit,
errors, bound, order and nothing lost, ending, accounts), for `Background` and `Ahead`, with loops, sources and work
that wait for each other (events) rather than for the clock. `wait_until` only looks again until a state the
thread reaches by itself is reached; its deadline fails a broken primitive instead of hanging the suite."""

from __future__ import annotations

import re
import signal
import threading
import time
from pathlib import Path

import pytest

from fastdata.background import Ahead, Background

WAIT_S = 120  # only a broken primitive waits this long: the test then fails


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


class Boom(Exception):
    pass


# ---------------------------------------------------------------------------------------------- Background


def test_a_loop_runs_on_a_daemon_thread_without_ctrl_c_until_its_owner_closes_it():
    seen = {}
    running = threading.Event()

    def loop(stopping):
        me = threading.current_thread()
        seen.update(name=me.name, daemon=me.daemon,
                    sigint_blocked=signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))
        running.set()
        stopping.wait()
        seen["stopped"] = True

    thread = Background(loop, "test-background").start()
    assert running.wait(WAIT_S)
    assert thread.alive and "stopped" not in seen
    thread.close()
    assert not thread.alive and seen == {"name": "test-background", "daemon": True, "sigint_blocked": True,
                                         "stopped": True}
    thread.close()  # idempotent


def test_a_loops_error_is_raised_by_the_owners_close_once_with_its_traceback():
    def failing_loop(stopping):
        raise Boom("from the loop")

    thread = Background(failing_loop, "test-background").start()
    with pytest.raises(Boom, match="from the loop") as caught:
        thread.close()
    assert any(frame.name == "failing_loop" for frame in caught.traceback)
    thread.close()  # raised once


def test_a_background_is_a_context_manager_and_close_on_its_own_thread_only_asks():
    holder: list[Background] = []
    closed_itself = threading.Event()

    def loop(stopping):
        holder[0].close()  # would deadlock if it joined itself
        closed_itself.set()
        stopping.wait()

    thread = Background(loop, "test-background")
    holder.append(thread)
    with thread:
        assert closed_itself.wait(WAIT_S)
        wait_until(lambda: not thread.alive, "the loop did not end after closing itself")
    assert thread.stopping.is_set()


def test_close_before_start_returns():
    Background(lambda stopping: None, "test-background").close()
    Ahead([1], lambda x: x, depth=1, name="test-ahead").close()


# ---------------------------------------------------------------------------------------------- Ahead


def test_results_come_in_order_each_once():
    ahead = Ahead(range(50), lambda x: x * x, depth=2, name="test-ahead").start()
    assert list(ahead) == [x * x for x in range(50)]
    ahead.close()
    assert not ahead.alive


@pytest.mark.parametrize("where", ["source", "work"])
def test_an_error_comes_after_the_results_before_it_with_its_type_and_ends_the_iteration(where):
    def source():
        yield from range(3)
        if where == "source":
            raise Boom("from the source")
        yield 3

    def work(x):
        if where == "work" and x == 3:
            raise Boom("from the work")
        return x

    ahead = Ahead(source(), work, depth=2, name="test-ahead").start()
    got = []
    with pytest.raises(Boom, match=f"from the {where}") as caught:
        for x in ahead:
            got.append(x)
    assert got == [0, 1, 2]
    assert any(frame.name == ("source" if where == "source" else "work") for frame in caught.traceback)
    assert list(ahead) == []  # ended
    ahead.close()


def test_at_most_depth_results_wait_and_the_thread_then_waits_for_room():
    made = []
    ahead = Ahead(range(100), lambda x: made.append(x) or x, depth=3, name="test-ahead").start()
    # 3 waiting, the 4th in hand: the thread cannot go on until one is taken
    wait_until(lambda: ahead.waiting == 3 and len(made) == 4, "the thread never filled its queue")
    assert ahead.state == "room" and len(made) == 4
    assert next(ahead) == 0
    wait_until(lambda: ahead.waiting == 3 and len(made) == 5, "the thread did not make the next one")
    assert len(made) == 5
    ahead.close()


def test_close_ends_the_thread_closes_the_source_on_its_thread_and_hands_what_is_left_to_discard():
    closed_on = []

    def source():
        try:
            yield from range(100)
        finally:
            closed_on.append(threading.current_thread().name)

    discarded, made = [], []
    ahead = Ahead(source(), lambda x: made.append(x) or x, depth=2, name="test-ahead",
                  discard=discarded.append).start()
    assert next(ahead) == 0
    wait_until(lambda: ahead.waiting == 2 and len(made) == 4, "the thread never filled its queue")
    calls_before = ahead.busy_s
    ahead.close()
    assert not ahead.alive and closed_on == ["test-ahead"]
    assert sorted(discarded) == [1, 2, 3]  # 2 waiting + the one it could not put: every result accounted for
    assert ahead.busy_s == calls_before and list(ahead) == []


def test_stop_only_asks_and_the_callers_next_ends_the_iteration():
    release = threading.Event()

    def work(x):
        if x == 1:
            release.wait(WAIT_S)
        return x

    ahead = Ahead(range(10), work, depth=2, name="test-ahead").start()
    assert next(ahead) == 0
    wait_until(lambda: ahead.state == "work", "the thread never reached the second item")
    ahead.stop()
    assert ahead.alive  # it finishes its current work first
    with pytest.raises(StopIteration):
        next(ahead)
    release.set()
    ahead.close()
    assert not ahead.alive


def test_close_from_its_own_thread_only_asks():
    """A finaliser the garbage collector runs on the thread itself must not wait for that thread."""
    holder: list[Ahead] = []

    def work(x):
        if x == 2:
            holder[0].close()  # would deadlock if it joined itself
        return x

    ahead = Ahead(range(10), work, depth=5, name="test-ahead")
    holder.append(ahead)
    ahead.start()
    wait_until(lambda: not ahead.alive, "the thread did not end after closing itself")
    ahead.close()


def test_the_thread_accounts_for_its_time_by_what_it_waited_for():
    gate = threading.Event()

    def source():
        yield 0
        gate.wait(WAIT_S)  # the thread waits for its source here
        yield 1

    ahead = Ahead(source(), lambda x: x, depth=1, name="test-ahead").start()
    assert next(ahead) == 0
    wait_until(lambda: ahead.state == "source", "the thread never waited for its source")
    time.sleep(0.05)
    gate.set()
    assert list(ahead) == [1]
    ahead.close()
    assert ahead.waited_source_s >= 0.05 and ahead.busy_s >= 0 and ahead.state == "ended"


def test_a_depth_below_one_is_refused():
    with pytest.raises(ValueError, match="depth"):
        Ahead([], lambda x: x, depth=0, name="test-ahead")


@pytest.mark.parametrize("taken", [0, 1, 5, 37])
def test_nothing_is_lost_or_duplicated_wherever_the_consumer_stops(taken):
    made, discarded = [], []
    lock = threading.Lock()

    def work(x):
        with lock:
            made.append(x)
        return x

    ahead = Ahead(range(1000), work, depth=4, name="test-ahead", discard=discarded.append).start()
    got = [next(ahead) for _ in range(taken)]
    ahead.close()
    assert got == list(range(taken))
    assert sorted(got + discarded) == made == list(range(len(made)))  # each result once: taken or discarded
    ahead.close()  # idempotent: nothing discarded twice
    assert sorted(got + discarded) == made


def test_a_consumer_that_stops_early_stops_the_producer():
    closed_on, made = [], []

    def source():
        try:
            yield from range(10**6)
        finally:
            closed_on.append(threading.current_thread().name)

    with Ahead(source(), lambda x: made.append(x) or x, depth=2, name="test-ahead") as ahead:
        for x in ahead:
            if x == 3:
                break
    assert not ahead.alive and closed_on == ["test-ahead"]
    calls = len(made)
    assert calls <= 4 + 2 + 1  # taken, waiting, in hand: the producer stopped where the consumer did
    assert list(ahead) == [] and len(made) == calls


def test_close_while_the_thread_waits_for_room_returns_and_joins_it():
    ahead = Ahead(range(100), lambda x: x, depth=1, name="test-ahead").start()
    wait_until(lambda: ahead.state == "room", "the thread never waited for room")
    ahead.close()  # nobody takes anything: the thread must notice the stop while it waits
    assert not ahead.alive and ahead.state == "ended"


def test_an_error_the_thread_hits_after_stop_is_raised_by_close():
    release, working = threading.Event(), threading.Event()

    def work(x):
        working.set()
        release.wait(WAIT_S)
        raise Boom("after the stop")

    ahead = Ahead(range(3), work, depth=1, name="test-ahead").start()
    assert working.wait(WAIT_S)
    ahead.stop()
    with pytest.raises(StopIteration):
        next(ahead)  # the consumer asked for no more: nothing is raised there
    release.set()
    with pytest.raises(Boom, match="after the stop"):
        ahead.close()
    assert not ahead.alive


# ---------------------------------------------------------------------------------------------- used everywhere

#: modules that make a thread of their own, and why it is not a fastdata.background one (said in their docstrings)
OWN_THREADS = {
    "fastdata/background.py": "the primitive itself",
    "fastdata/interrupts.py": "the standard library's one-shot delayed call (threading.Timer): no loop, no results",
}


def test_every_background_thread_of_the_package_is_made_here():
    root = Path(__file__).resolve().parents[1]
    making = re.compile(r"\bthreading\.(Thread|Timer)\(|\bfrom threading import\b[^\n]*\b(Thread|Timer)\b")
    found = sorted(str(path.relative_to(root)) for folder in ("fastdata", "converters")
                   for path in (root / folder).rglob("*.py") if making.search(path.read_text()))
    assert found == sorted(OWN_THREADS), "make background threads with fastdata.background (Background or Ahead)"
