"""A service that exits with status 3 the first time it starts and serves after its
restart (``ServiceArgs.restart: on-failure``)."""

import os
import sys
from pathlib import Path

from dynamo.sdk import endpoint, service


@service(dynamo={"namespace": "flaky"})
class Flaky:
    def __init__(self, marker: str = "") -> None:
        path = Path(marker)
        if not path.exists():
            path.write_text("started once")
            print("Flaky: failing on purpose", flush=True)
            sys.exit(3)
        self.pid = os.getpid()

    @endpoint()
    async def generate(self, request: str):
        yield f"{request} from {self.pid}"
