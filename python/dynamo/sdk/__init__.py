"""The Dynamo SDK: services as classes, wired into graphs, configured from YAML and the
command line, run with ``dynamo serve`` or one by one with ``python -m dynamo.sdk.run``.

```python
from dynamo.sdk import depends, endpoint, service

@service(dynamo={"namespace": "demo"})
class Backend:
    @endpoint()
    async def generate(self, text: str):
        yield text.upper()

@service(dynamo={"namespace": "demo"})
class Frontend:
    backend = depends(Backend)

    @endpoint()
    async def generate(self, text: str):
        async for item in self.backend.generate(text):
            yield item
```
"""

from __future__ import annotations

from dynamo.sdk.context import dynamo_context
from dynamo.sdk.dependency import depends
from dynamo.sdk.deployment import BaseDeployment
from dynamo.sdk.endpoint import AbstractService, abstract_endpoint, api, dynamo_endpoint, endpoint
from dynamo.sdk.hooks import async_on_shutdown, async_on_start, liveness, on_shutdown, readiness
from dynamo.sdk.lib.args import DynamoArgumentParser
from dynamo.sdk.lib.image import DYNAMO_IMAGE
from dynamo.sdk.service import DynamoService, service
from dynamo.sdk.standalone import run_component

__all__ = [
    "DYNAMO_IMAGE",
    "AbstractService",
    "BaseDeployment",
    "DynamoArgumentParser",
    "DynamoService",
    "abstract_endpoint",
    "api",
    "async_on_shutdown",
    "async_on_start",
    "depends",
    "dynamo_context",
    "dynamo_endpoint",
    "endpoint",
    "liveness",
    "on_shutdown",
    "readiness",
    "run_component",
    "service",
]
