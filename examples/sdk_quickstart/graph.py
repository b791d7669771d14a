from dynamo.sdk import api, depends, endpoint, service
from pydantic import BaseModel


class Text(BaseModel):
    text: str


@service(dynamo={"namespace": "demo"}, workers=2)
class Backend:
    def __init__(self, suffix: str = "!"):       # filled from configuration
        self.suffix = suffix

    @endpoint()                                   # served on the runtime: demo.Backend.generate
    async def generate(self, request: Text):
        for word in request.text.split():
            yield word + self.suffix


@service(dynamo={"namespace": "demo"})
class Frontend:
    backend = depends(Backend)                    # an edge of the graph, and a client

    @api()                                        # POST /generate on the web app (port 8000)
    async def generate(self, request: Text):
        async for word in self.backend.generate(request):
            yield word + "\n"
