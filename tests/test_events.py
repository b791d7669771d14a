"""The event plane from Python: publish/subscribe between processes and between
runtimes. A subscription receives every event published after `subscribe()` returned,
including a new publisher's very first ones, so each event here is published once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from dynamo.runtime import DistributedRuntime
from helpers import shutdown_runtime

#: Bound on an event published once arriving (a new publisher may first wait for the
#: subscribers it finds in discovery to connect).
DELIVERY_TIMEOUT = 15.0


class Inbox:
    """Reads a subscription in a task into a queue, so waits can be bounded."""

    def __init__(self, subscription: Any):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.task = asyncio.ensure_future(self._read(subscription))

    async def _read(self, subscription: Any) -> None:
        async for event in subscription:
            await self.queue.put(event)

    async def next(self, what: str) -> Any:
        """The next event, or a test failure naming `what` after DELIVERY_TIMEOUT."""
        get = asyncio.ensure_future(self.queue.get())
        done, _ = await asyncio.wait({get, self.task}, timeout=DELIVERY_TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
        if get in done:
            return get.result()
        get.cancel()
        if self.task.done():
            self.task.result()  # the subscription failed: raise why
            pytest.fail("the subscription ended")
        pytest.fail(f"no event within {DELIVERY_TIMEOUT:.0f}s: {what}")

    def close(self) -> None:
        self.task.cancel()


@pytest.mark.parametrize("scope", ["namespace", "component"])
async def test_events_between_processes(runtime, workers, namespace, scope):
    worker = await workers.start("events_worker.py", "--namespace", namespace, "--scope", scope)
    here = runtime.namespace(namespace)
    if scope == "component":
        here = here.component("backend")
    inbox = Inbox(await here.subscribe("pong"))
    try:
        # Published once: the worker subscribed before it reported ready, and its answer
        # is its first publication.
        await here.publish("ping", {"text": "ping", "nested": [1, 2.5, None, True]})
        pong = await inbox.next("the worker's pong")
    finally:
        inbox.close()
    assert pong["pid"] == worker.pid
    assert pong["ping"]["text"] == "ping"
    assert pong["ping"]["nested"] == [1, 2.5, None, True]


async def test_a_new_publisher_loses_no_event(runtime, namespace):
    """A runtime started after the subscription publishes at once: every event arrives,
    in order, once."""
    inbox = Inbox(await runtime.namespace(namespace).component("backend").subscribe("load"))
    publisher = DistributedRuntime(asyncio.get_running_loop(), False)
    try:
        scope = publisher.namespace(namespace).component("backend")
        for n in range(100):
            await scope.publish("load", {"worker": publisher.instance_id(), "n": n})
        got = [await inbox.next(f"event {n} of 100") for n in range(100)]
        assert [event["n"] for event in got] == list(range(100))
        assert all(event["worker"] == publisher.instance_id() for event in got)
        # One publisher's events arrive in order: a duplicate would come before this one.
        await scope.publish("load", {"worker": publisher.instance_id(), "n": "end"})
        assert (await inbox.next("the end marker"))["n"] == "end", "an event arrived twice"
    finally:
        inbox.close()
        await shutdown_runtime(publisher)


async def test_a_new_subscription_gets_what_follows(runtime, namespace):
    """A subscription made while a publisher runs receives everything published after
    `subscribe()` returned."""
    scope = runtime.namespace(namespace).component("backend")
    await scope.publish("load", {"n": -1})  # the publisher is running before the subscriber
    other = DistributedRuntime(asyncio.get_running_loop(), False)
    try:
        inbox = Inbox(await other.namespace(namespace).component("backend").subscribe("load"))
        try:
            for n in range(100):
                await scope.publish("load", {"n": n})
            got = [await inbox.next(f"event {n} of 100") for n in range(100)]
            assert [event["n"] for event in got] == list(range(100))
        finally:
            inbox.close()
    finally:
        await shutdown_runtime(other)


async def test_subscribers_only_see_their_subject(runtime, namespace):
    ns = runtime.namespace(namespace)
    wanted = Inbox(await ns.subscribe("wanted"))
    unwanted = Inbox(await ns.subscribe("unwanted"))
    try:
        await ns.publish("wanted", 1)
        assert await wanted.next("the event on 'wanted'") == 1
        # Not a sleep and a look: one publisher's events arrive in order, so a leaked
        # "wanted" event would reach "unwanted" before this marker.
        await ns.publish("unwanted", {"marker": True})
        assert await unwanted.next("the marker on 'unwanted'") == {"marker": True}
    finally:
        wanted.close()
        unwanted.close()
