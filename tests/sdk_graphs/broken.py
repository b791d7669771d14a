"""A graph whose Backend cannot start: its constructor raises."""

from dynamo.sdk import depends, endpoint, service


@service(dynamo={"namespace": "broken"})
class Backend:
    def __init__(self, model_path: str = "/nonexistent/model") -> None:
        raise RuntimeError(f"boom: cannot load {model_path}")

    @endpoint()
    async def generate(self, request: str):
        yield request


@service(dynamo={"namespace": "broken"})
class Frontend:
    backend = depends(Backend)

    @endpoint()
    async def generate(self, request: str):
        async for item in self.backend.generate(request):
            yield item
