"""Cancellation travels end to end: the caller stops or abandons a stream and the
worker's handler sees it in its request context and stops generating."""

from __future__ import annotations

import re

import pytest
from helpers import bounded, data_of, wait_for_instances

#: Items the handler would send if nobody stopped it, and the pause between them.
LONG_STREAM = {"count": 2000, "delay": 0.01}
#: Bound on the handler reporting that it ended.
REPORT_TIMEOUT = 10.0


async def client_of(runtime, namespace: str):
    return await runtime.namespace(namespace).component("backend").endpoint("generate").client()


def parse_done(line: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S+)", line))


@pytest.mark.parametrize("mode", ["poll", "await"])
async def test_stop_generating_reaches_the_handler(runtime, workers, namespace, mode):
    worker = await workers.start("cancel_worker.py", "--namespace", namespace)
    client = await client_of(runtime, namespace)
    await wait_for_instances(client, 1)
    tag = f"stop-{mode}"

    stream = await client.generate({**LONG_STREAM, "tag": tag, "mode": mode})
    received = []

    async def read_all() -> None:
        async for item in stream:
            received.append(data_of(item))
            if len(received) == 5:
                stream.stop_generating()

    # After a stop the stream still ends normally (no exception), just early.
    await bounded(read_all(), REPORT_TIMEOUT, "the stream to end after stop_generating()")
    done = parse_done(await worker.wait_for_line(f"DONE tag={tag} ", REPORT_TIMEOUT))

    assert 5 <= len(received) < 200, f"{len(received)} items arrived after a stop at 5"
    assert [item["i"] for item in received] == list(range(len(received)))
    assert done["how"] == "stopped", done
    assert done["stopped"] == "True", done
    assert int(done["sent"]) < 200, done
    # The request id the handler saw is the one every item carried.
    assert {item["id"] for item in received} == {done["id"]}


async def test_kill_reaches_the_handler(runtime, workers, namespace):
    worker = await workers.start("cancel_worker.py", "--namespace", namespace)
    client = await client_of(runtime, namespace)
    await wait_for_instances(client, 1)

    stream = await client.generate({**LONG_STREAM, "tag": "kill", "mode": "await"})
    received = []

    async def read_some() -> None:
        async for item in stream:
            received.append(data_of(item))
            if len(received) == 5:
                stream.kill()
                break

    await bounded(read_some(), REPORT_TIMEOUT, "five items")
    done = parse_done(await worker.wait_for_line("DONE tag=kill ", REPORT_TIMEOUT))

    assert int(done["sent"]) < 200, done
    assert done["stopped"] == "True", done
    assert done["how"] in {"stopped", "closed"}, done


async def test_breaking_out_of_an_unnamed_stream_kills_it(runtime, workers, namespace):
    worker = await workers.start("cancel_worker.py", "--namespace", namespace)
    client = await client_of(runtime, namespace)
    await wait_for_instances(client, 1)

    async def read_some() -> int:
        seen = 0
        async for _ in await client.generate({**LONG_STREAM, "tag": "break", "mode": "await"}):
            seen += 1
            if seen == 5:
                break
        return seen

    assert await bounded(read_some(), REPORT_TIMEOUT, "five items") == 5
    done = parse_done(await worker.wait_for_line("DONE tag=break ", REPORT_TIMEOUT))

    assert int(done["sent"]) < 200, done
    assert done["how"] in {"stopped", "closed"}, done

    # The worker and the client are fine afterwards.
    stream = await client.generate({"count": 3, "delay": 0, "tag": "after"})
    assert len([item async for item in stream]) == 3
