"""The container image services default to: ``DYNAMO_IMAGE`` from the environment, else
``dynamo:latest``. Deployment tooling reads it; local ``dynamo serve`` does not."""

from __future__ import annotations

import os

DEFAULT_IMAGE = "dynamo:latest"

#: The image, as the environment says at import time.
DYNAMO_IMAGE = os.environ.get("DYNAMO_IMAGE", DEFAULT_IMAGE)
