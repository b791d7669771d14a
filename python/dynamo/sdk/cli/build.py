"""``dynamo build GRAPH [-f config.yaml] [-o DIR]``: a self-contained, reproducible artifact
of a graph (``dynamo.sdk.deploy.artifact``); prints its directory, whose name ends with
its tag."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from dynamo.sdk.cli.plan import load_config, working_dir_for
from dynamo.sdk.deploy import artifact
from dynamo.sdk.deploy.errors import DeployError
from dynamo.sdk.deploy.graph import resolve_graph
from dynamo.sdk.lib.config import ServiceConfigError

DEFAULT_OUTPUT = "dist"


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # argparse keeps this type private
    parser = subparsers.add_parser(
        "build",
        help="build a graph into a reproducible artifact",
        description="Write the graph's source, resolved configuration, pinned requirements, a Dockerfile and "
        "dynamo.yaml into DIR/<graph>-<tag> (docs/deploy.md). Extra --Service.key=value arguments override "
        "the configuration, as for dynamo serve.",
    )
    parser.add_argument("graph", metavar="GRAPH", help="module:Service")
    parser.add_argument("-f", "--config-file", default=None, help="YAML configuration file")
    parser.add_argument("-o", "--output-dir", default=DEFAULT_OUTPUT, help=f"where to write (default {DEFAULT_OUTPUT})")
    parser.add_argument("--name", default=None, help="the graph's name (default: the module's last part)")
    parser.add_argument("--working-dir", default=None, help="directory the module is imported from (default: .)")
    parser.set_defaults(handler=build, accepts_overrides=True)


def build(args: argparse.Namespace, extra: Sequence[str]) -> int:
    """Run ``dynamo build``; returns the exit status."""
    working_dir = Path(working_dir_for(args.graph, args.working_dir))
    try:
        file_config, overrides = load_config(args.config_file, extra)
        graph = resolve_graph(args.graph, working_dir, file_config, overrides, args.name)
        built, warnings = artifact.build(graph, working_dir, Path(args.output_dir))
    except (DeployError, ServiceConfigError, ValueError, ImportError, RuntimeError, TypeError, OSError) as exc:
        print(f"dynamo build: error: {exc}", file=sys.stderr)
        return 2
    for warning in (*graph.warnings, *warnings):
        print(f"warning: {warning}", file=sys.stderr)
    print(f"built {graph.name} {built.tag} (image {built.image}: docker build -t {built.image} {built.path})",
          file=sys.stderr)
    print(built.path)
    return 0
