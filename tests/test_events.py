"""The event plane from Python: publish/subscribe between processes and between
runtimes. Delivery is at most once, so publishers repeat until the subscriber has one."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from dynamo.runtime import DistributedRuntime
from helpers import shutdown_runtime

#: Bound on the first event getting through (subscriptions take a moment to connect).
DELIVERY_TIMEOUT = 15.0


class Inbox:
    """Reads a subscription in a task into a queue, so waits can be bounded."""

    def __init__(self, subscription: Any):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.task = asyncio.ensure_future(self._read(subscription))

    async def _read(self, subscription: Any) -> None:
        async for event in subscription:
            await self.queue.put(event)

    def close(self) -> None:
        self.task.cancel()


async def publish_until_received(scope: Any, subject: str, inbox: Inbox, make_event, accept) -> Any:
    """Publish `make_event(n)` every 100 ms until `inbox` holds an event `accept` takes."""
    deadline = time.monotonic() + DELIVERY_TIMEOUT
    n = 0
    while time.monotonic() < deadline:
        await scope.publish(subject, make_event(n))
        n += 1
        try:
            while True:
                event = await asyncio.wait_for(inbox.queue.get(), 0.1)
                if accept(event):
                    return event
        except asyncio.TimeoutError:
            pass
        if inbox.task.done():
            inbox.task.result()  # the subscription failed: raise why
            pytest.fail("the subscription ended")
    pytest.fail(f"no event on '{subject}' within {DELIVERY_TIMEOUT:.0f}s ({n} published)")


@pytest.mark.parametrize("scope", ["namespace", "component"])
async def test_events_between_processes(runtime, workers, namespace, scope):
    worker = await workers.start("events_worker.py", "--namespace", namespace, "--scope", scope)
    here = runtime.namespace(namespace)
    if scope == "component":
        here = here.component("backend")
    inbox = Inbox(await here.subscribe("pong"))
    try:
        pong = await publish_until_received(
            here, "ping", inbox,
            make_event=lambda n: {"n": n, "text": "ping", "nested": [1, 2.5, None, True]},
            accept=lambda event: isinstance(event, dict) and "ping" in event,
        )
    finally:
        inbox.close()
    assert pong["pid"] == worker.pid
    assert pong["ping"]["text"] == "ping"
    assert pong["ping"]["nested"] == [1, 2.5, None, True]


async def test_events_between_two_runtimes(runtime, namespace):
    other = DistributedRuntime(asyncio.get_running_loop(), False)
    try:
        inbox = Inbox(await other.namespace(namespace).component("backend").subscribe("load"))
        try:
            event = await publish_until_received(
                runtime.namespace(namespace).component("backend"), "load", inbox,
                make_event=lambda n: {"worker": runtime.instance_id(), "active_blocks": n},
                accept=lambda event: True,
            )
        finally:
            inbox.close()
        assert event["worker"] == runtime.instance_id()
        assert isinstance(event["active_blocks"], int)
    finally:
        await shutdown_runtime(other)


async def test_subscribers_only_see_their_subject(runtime, namespace):
    ns = runtime.namespace(namespace)
    wanted = Inbox(await ns.subscribe("wanted"))
    unwanted = Inbox(await ns.subscribe("unwanted"))
    try:
        await publish_until_received(ns, "wanted", wanted, make_event=lambda n: n, accept=lambda e: True)
        # Not a sleep and a look: markers on "unwanted" show what reached it. Once the first
        # arrives, both subscriptions are live; one more "wanted" event, then markers of a
        # second round behind it (one publisher's events arrive in order): when one of
        # those arrives, a leaked "wanted" event would have arrived before it.
        seen: list[Any] = []

        def marker(round_: str) -> Any:
            def accept(event: Any) -> bool:
                seen.append(event)
                return isinstance(event, dict) and event.get("marker") == round_

            return accept

        await publish_until_received(ns, "unwanted", unwanted, make_event=lambda n: {"marker": "first", "n": n},
                                     accept=marker("first"))
        await ns.publish("wanted", "late")
        await publish_until_received(ns, "unwanted", unwanted, make_event=lambda n: {"marker": "second", "n": n},
                                     accept=marker("second"))
        assert [e for e in seen if not (isinstance(e, dict) and "marker" in e)] == [], seen
    finally:
        wanted.close()
        unwanted.close()
