"""Services asking for whole and fractional GPUs."""

from dynamo.sdk import depends, endpoint, service


@service(dynamo={"namespace": "gpus"}, resources={"gpu": 0.5}, workers=2)
class Half:
    @endpoint()
    async def generate(self, request: str):
        yield request


@service(dynamo={"namespace": "gpus"}, resources={"gpu": 1}, workers=2)
class Whole:
    half = depends(Half)

    @endpoint()
    async def generate(self, request: str):
        yield request
