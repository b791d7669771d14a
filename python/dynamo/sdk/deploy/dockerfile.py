"""The artifact's ``Dockerfile``: the base image and our wheel are build arguments."""

from __future__ import annotations

import sys

from dynamo.sdk.deploy.graph import CONTAINER_WORKDIR


def dockerfile(graph_name: str, dynamo_requirement: str) -> str:
    """A Dockerfile that installs the wheel and the pinned requirements and copies the
    artifact to ``/app`` (the graph's source at ``/app/src``)."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    return f"""# The image of the graph {graph_name!r}, built by `dynamo build` (docs/deploy.md):
#   docker build -t dynamo-{graph_name}:TAG .     (TAG: this artifact's tag, in dynamo.yaml)
# BASE_IMAGE: any image with Python {python} (and what its engines need: CUDA, vLLM ...).
# DYNAMO_WHEEL: our wheel, as a requirement or a path under this directory
#   (cp ai_dynamo-*.whl . && docker build --build-arg DYNAMO_WHEEL=/app/ai_dynamo-....whl .).
ARG BASE_IMAGE=python:{python}-slim
FROM ${{BASE_IMAGE}}
ARG DYNAMO_WHEEL={dynamo_requirement}
WORKDIR /app
COPY . /app
RUN python -m pip install --no-cache-dir "${{DYNAMO_WHEEL}}" \\
    && python -m pip install --no-cache-dir -r /app/requirements.txt
ENV PYTHONPATH={CONTAINER_WORKDIR} PYTHONUNBUFFERED=1
WORKDIR {CONTAINER_WORKDIR}
"""
