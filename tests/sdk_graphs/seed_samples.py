"""Code samples of the SDK seeds, as written, with the names they leave undefined
filled in (a request type, a stand-in engine) so they run on CPU."""

import argparse
import json
import os
from typing import Optional

from dynamo.sdk import async_on_shutdown, async_on_start, depends, dynamo_context, endpoint, service
from dynamo.sdk.lib.config import ServiceConfig
from pydantic import BaseModel


class ChatCompletionRequest(BaseModel):
    text: str


class _Engine:
    def __init__(self, model_name):
        self.model_name = model_name
        self.closed = False

    async def generate(self, request):
        return f"{self.model_name}: {request}"

    async def shutdown(self):
        self.closed = True


async def initialize_model_engine(model_name):
    return _Engine(model_name)


@service(dynamo={"namespace": "dynamo"})
class ServiceB:
    @endpoint()
    async def preprocess(self, request: ChatCompletionRequest):
        return request.text.upper()


# "Writing a Service"
@service(dynamo={"namespace": "dynamo"}, resources={"gpu": 1})
class ServiceA:
    # Define service dependencies
    service_b = depends(ServiceB)

    def __init__(self, model_name="meta-llama/Llama-3.1-8B-Instruct"):
        self.model_name = model_name
        self.engine = None

    @async_on_start
    async def async_init(self):
        # Initialize resources that require async operations
        self.engine = await initialize_model_engine(self.model_name)
        print(f"ServiceA initialized with model: {self.model_name}")

    @async_on_shutdown
    async def async_shutdown(self):
        # Clean up resources
        if self.engine:
            await self.engine.shutdown()
            print("ServiceA engine shut down")

    @endpoint()
    async def generate(self, request: ChatCompletionRequest):
        # Call dependent service
        processed_request = await self.service_b.preprocess(request)

        # Use the engine to generate a response
        response = await self.engine.generate(processed_request)
        return response


# "Accessing Configuration in Services"
class MyService:
    def __init__(self):
        config = ServiceConfig.get_instance()
        # Get with default value
        self.model_name = config.get("MyService", {}).get("model_name", "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B")
        self.temperature = config.get("MyService", {}).get("temperature", 0.7)
        # Require a config value (raises error if missing)
        self.api_key = config.require("MyService", "api_key")
        # Get all config for this service
        all_my_config = config.get("MyService", {})
        self.all = all_my_config


# "Parsing Configuration as CLI Arguments"
class MyLibArgumentParser(argparse.ArgumentParser):
    def __init__(self):
        super().__init__()
        self.add_argument("--option1")
        self.add_argument("--flag2", action="store_true")
        self.add_argument("--option3")


def setup_my_lib():
    config = ServiceConfig.get_instance()
    # Get all MyService config with prefix "lib_" as CLI args
    cli_args = config.as_args("MyService", prefix="lib_")
    # Returns: ["--option1", "value1", "--flag2", "--option3", "value3"]
    # Pass to an external library's argument parser
    lib_parser = MyLibArgumentParser()
    lib_args = lib_parser.parse_args(cli_args)
    return lib_args


# "Overriding Service Decorator with ServiceArgs"
def _get_service_args(self, service_name: str) -> Optional[dict]:  # noqa: UP045 - as the seed writes it
    """Get ServiceArgs from environment config if specified"""
    config_str = os.environ.get("DYNAMO_SERVICE_CONFIG")
    if config_str:
        config = json.loads(config_str)
        service_config = config.get(service_name, {})
        return service_config.get("ServiceArgs")
    return None


# "Note" on accessing the bindings from a service
@service(dynamo={"namespace": "dynamo"})
class VllmWorker:
    @endpoint()
    async def generate(self, request: ChatCompletionRequest):
        yield f"worker: {request.text}"


@service(dynamo={"namespace": "dynamo"})
class Processor:
    worker = depends(VllmWorker)

    @async_on_start
    async def connect(self):
        runtime = dynamo_context["runtime"]
        comp_ns, comp_name = VllmWorker.dynamo_address()  # dynamo://{namespace}/{name}
        print(f"[Processor] comp_ns: {comp_ns}, comp_name: {comp_name}")
        self.worker_client = (
            await runtime.namespace(comp_ns)
            .component(comp_name)
            .endpoint("generate")
            .client()
        )

    @endpoint()
    async def generate(self, request: ChatCompletionRequest):
        await self.worker_client.wait_for_instances(30)
        stream = await self.worker_client.generate(request)
        async for item in stream:
            yield item.data()
