"""What every way of serving a Python handler shares: the shape of its signature, the
request parsed into its pydantic model, its result as a stream of items, and the items
checked against a response model or turned into text.

Used by ``dynamo_endpoint`` (``dynamo/runtime/__init__.py``), the per-request runner the
bindings call (``_serving.py``), and the SDK (``sdk/endpoint.py``, ``sdk/runner.py``,
``sdk/web.py``). A new way of serving a handler takes these rather than writing its own.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError


@dataclass(frozen=True)
class HandlerShape:
    """What a handler's signature says about how to call it."""

    #: The first parameter is ``self``: a method seen before it is bound (as decorators see it).
    is_method: bool
    #: The annotation of the request parameter (``Any`` when there is none).
    request_type: Any
    #: The handler accepts a context after the request (two positional parameters, or ``*args``).
    takes_context: bool


def handler_shape(func: Callable[..., Any]) -> HandlerShape:
    """The shape of ``func``'s signature; a callable whose signature cannot be read takes
    the request alone."""
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return HandlerShape(is_method=False, request_type=Any, takes_context=False)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    is_method = bool(positional) and positional[0].name == "self"
    if is_method:
        positional = positional[1:]
    variadic = any(p.kind is p.VAR_POSITIONAL for p in params)
    request_type: Any = Any
    if positional:
        try:
            hints = typing.get_type_hints(func)
        except Exception:
            hints = {}
        request_type = hints.get(positional[0].name, positional[0].annotation)
        if request_type is inspect.Parameter.empty:
            request_type = Any
    return HandlerShape(
        is_method=is_method,
        request_type=request_type,
        takes_context=variadic or len(positional) >= 2,
    )


def is_model(model: Any) -> bool:
    """Whether ``model`` is a pydantic model class (requests and items are checked against it)."""
    return isinstance(model, type) and issubclass(model, BaseModel)


def parse_request(model: Any, value: Any, endpoint: str | None = None) -> Any:
    """``value`` as ``model`` when that is a pydantic model: validated from a dict, JSON
    text or another model (an instance of ``model`` is kept); anything else is passed
    through. Raises ``ValueError`` naming the model (and ``endpoint``, when given) when
    it does not validate."""
    if not is_model(model) or isinstance(value, model):
        return value
    try:
        if isinstance(value, (str, bytes, bytearray)):
            return model.model_validate_json(value)
        if isinstance(value, BaseModel):
            value = value.model_dump()
        return model.model_validate(value)
    except ValidationError as exc:
        what = f"endpoint '{endpoint}' ({model.__name__})" if endpoint else model.__name__
        raise ValueError(f"invalid request for {what}: {exc}") from exc


def check_item(model: Any, item: Any) -> Any:
    """``item`` checked against ``model`` when that is a pydantic model: JSON text is
    validated and returned unchanged (the reference's examples yield
    ``Response(...).model_dump_json()``), anything else not yet a ``model`` is validated
    into one. Raises pydantic's ``ValidationError``."""
    if not is_model(model):
        return item
    if isinstance(item, (str, bytes)):
        model.model_validate_json(item)
        return item
    if isinstance(item, model):
        return item
    return model.model_validate(item)


def as_text(item: Any) -> str | bytes:
    """One item as text for an HTTP body: text as it is, anything else one JSON line."""
    if isinstance(item, (str, bytes)):
        return item
    if hasattr(item, "model_dump_json"):
        return item.model_dump_json() + "\n"
    return json.dumps(item) + "\n"


async def as_stream(result: Any) -> AsyncIterator[Any]:
    """The items of whatever a handler returned, as an async iterator: an async iterator
    (an async generator) is returned itself; an awaitable is awaited first (a coroutine may
    return an async iterator); a sync generator yields its items; any other value is one
    item, and ``None`` none. The caller closes it (``aclose``) when it stops early."""
    if inspect.isawaitable(result) and not hasattr(result, "__aiter__"):
        result = await result
    if hasattr(result, "__aiter__"):
        return typing.cast(AsyncIterator[Any], result)
    if inspect.isgenerator(result):
        return _from_sync(result)
    return _one(result)


async def _from_sync(items: Iterator[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item


async def _one(item: Any) -> AsyncIterator[Any]:
    if item is not None:
        yield item
