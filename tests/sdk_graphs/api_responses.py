"""`@api` handlers returning every kind of result: errors, Starlette responses, streams,
pydantic models (tests/test_sdk_api.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

from dynamo.sdk import api, service
from fastapi import HTTPException
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel


class Words(BaseModel):
    text: str


class Count(BaseModel):
    words: int


@service(dynamo={"namespace": "api"})
class Api:
    @api()
    async def fail(self, request: Words) -> str:
        raise ValueError(f"cannot handle {request.text!r}")

    @api()
    async def fail_stream(self, request: Words) -> AsyncIterator[str]:
        raise RuntimeError("no words today")
        yield request.text  # unreachable: makes this an async generator

    @api()
    async def fail_midway(self, request: Words) -> AsyncIterator[str]:
        yield "first\n"
        raise RuntimeError("gave up after one word")

    @api()
    async def teapot(self, request: Words) -> str:
        raise HTTPException(status_code=418, detail="short and stout")

    @api()
    async def stream(self, request: Words) -> StreamingResponse:
        async def lines() -> AsyncIterator[str]:
            for word in request.text.split():
                yield f'{{"word": "{word}"}}\n'

        return StreamingResponse(lines(), media_type="application/x-ndjson", headers={"x-words": "yes"})

    @api()
    async def created(self, request: Words) -> JSONResponse:
        return JSONResponse({"created": request.text}, status_code=201)

    @api()
    def plain(self, request: Words) -> PlainTextResponse:
        return PlainTextResponse(request.text.upper(), status_code=202)

    @api()
    async def words(self, request: Words) -> AsyncIterator[str]:
        for word in request.text.split():
            yield word + "\n"

    @api()
    def counts(self, request: Words) -> Iterator[Count]:
        for word in request.text.split():
            yield Count(words=len(word))

    @api()
    async def count(self, request: Words) -> Count:
        return Count(words=len(request.text.split()))
