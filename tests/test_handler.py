"""The handler plumbing every way of serving a Python handler shares
(``dynamo.runtime._handler``): signature shapes, request parsing, result streams, items."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pydantic
import pytest
from dynamo.runtime._handler import as_stream, as_text, check_item, handler_shape, parse_request


class Req(pydantic.BaseModel):
    text: str


class Other(pydantic.BaseModel):
    text: str


async def items_of(result: Any) -> list[Any]:
    return [item async for item in await as_stream(result)]


async def test_every_result_shape_becomes_a_stream() -> None:
    async def agen() -> AsyncIterator[int]:
        yield 1
        yield 2

    async def coro_value() -> int:
        return 7

    async def coro_none() -> None:
        return None

    async def coro_agen() -> AsyncIterator[int]:
        return agen()

    def gen() -> Any:
        yield from (3, 4)

    assert await items_of(agen()) == [1, 2]
    assert await items_of(coro_value()) == [7]
    assert await items_of(coro_none()) == []
    assert await items_of(coro_agen()) == [1, 2]
    assert await items_of(gen()) == [3, 4]
    assert await items_of({"a": 1}) == [{"a": 1}]


async def test_an_async_generator_is_returned_itself_so_its_caller_can_close_it() -> None:
    async def agen() -> AsyncIterator[int]:
        yield 1

    stream = agen()
    assert await as_stream(stream) is stream


def test_handler_shapes() -> None:
    def request_only(request: Req) -> None: ...
    def with_context(request: Req, context: Any) -> None: ...
    def variadic(*args: Any) -> None: ...

    class Service:
        def method(self, request: Req, context: Any) -> None: ...
        def plain(self, request: int) -> None: ...

    assert handler_shape(request_only).request_type is Req
    assert handler_shape(request_only).takes_context is False
    assert handler_shape(with_context).takes_context is True
    assert handler_shape(variadic).takes_context is True
    unbound = handler_shape(Service.method)
    assert (unbound.is_method, unbound.request_type, unbound.takes_context) == (True, Req, True)
    bound = handler_shape(Service().method)
    assert (bound.is_method, bound.takes_context) == (False, True)
    assert handler_shape(Service.plain).takes_context is False


def test_requests_parse_from_dicts_json_and_other_models() -> None:
    assert parse_request(Req, {"text": "a"}) == Req(text="a")
    assert parse_request(Req, '{"text": "b"}') == Req(text="b")
    assert parse_request(Req, Other(text="c")) == Req(text="c")
    same = Req(text="d")
    assert parse_request(Req, same) is same
    assert parse_request(Any, {"text": "e"}) == {"text": "e"}
    with pytest.raises(ValueError, match="invalid request for Req"):
        parse_request(Req, {"nope": 1})
    with pytest.raises(ValueError, match=r"invalid request for endpoint 'gen' \(Req\)"):
        parse_request(Req, {"nope": 1}, "gen")


def test_items_are_checked_and_json_text_is_sent_unchanged() -> None:
    text = Req(text="a").model_dump_json()
    assert check_item(Req, text) is text
    assert check_item(Req, {"text": "b"}) == Req(text="b")
    with pytest.raises(pydantic.ValidationError):
        check_item(Req, '{"nope": 1}')
    assert check_item(None, {"x": 1}) == {"x": 1}
    assert as_text("raw") == "raw"
    assert as_text(Req(text="c")) == '{"text":"c"}\n'
    assert as_text({"a": 1}) == '{"a": 1}\n'
