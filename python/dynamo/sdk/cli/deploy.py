"""``dynamo deploy GRAPH|ARTIFACT [-f config.yaml] --target kubernetes [--namespace NS] [-o DIR] [--apply]``:
render a graph (``module:Service``, resolved as ``dynamo serve`` resolves it) or a built
artifact (``dynamo build``) as Kubernetes manifests, and with ``--apply`` apply them to
the current kubeconfig context and wait until they are ready."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from dynamo.sdk.cli.plan import load_config, working_dir_for
from dynamo.sdk.deploy import apply, artifact, lifecycle, platform
from dynamo.sdk.deploy.errors import DeployError, DeployErrorKind
from dynamo.sdk.deploy.graph import ResolvedGraph, resolve_graph
from dynamo.sdk.deploy.kubernetes import RenderOptions, dump, render
from dynamo.sdk.lib.config import ServiceConfigError
from dynamo.sdk.lib.overrides import deep_merge

TARGETS = ("kubernetes",)
#: Default bound on waiting for readiness after --apply (seconds).
DEFAULT_TIMEOUT = 600


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # argparse keeps this type private
    parser = subparsers.add_parser(
        "deploy",
        help="render a graph (or a built artifact) as Kubernetes manifests",
        description="Render every service of the graph as Kubernetes objects (docs/deploy.md). Extra "
        "--Service.key=value arguments override the configuration, as for dynamo serve.",
    )
    parser.add_argument("graph", metavar="GRAPH|ARTIFACT", help="module:Service, or a directory dynamo build wrote")
    parser.add_argument("-f", "--config-file", default=None, help="YAML configuration file (over the artifact's)")
    parser.add_argument("--target", choices=TARGETS, default="kubernetes", help="where to deploy (kubernetes)")
    parser.add_argument("--namespace", default=None, help="Kubernetes namespace of every object")
    parser.add_argument("-o", "--output-dir", default=None, help="write <graph>.yaml there (default: stdout)")
    parser.add_argument("--name", default=None, help="the graph's name on the cluster (default: the module's)")
    parser.add_argument("--working-dir", default=None, help="directory the module is imported from (default: .)")
    parser.add_argument("--image", default=None,
                        help="image of every service (default: ServiceArgs.image, else $DYNAMO_IMAGE or "
                        "dynamo:latest; for an artifact: its own dynamo-GRAPH:TAG)")
    parser.add_argument("--registry", default=None, help="for an artifact: the registry its image was pushed to "
                        "(image REGISTRY/dynamo-GRAPH:TAG)")
    parser.add_argument("--etcd", default=None, metavar="URL", help="existing etcd endpoints (no etcd StatefulSet)")
    parser.add_argument("--nats", default=None, metavar="URL", help="existing NATS server (no NATS StatefulSet)")
    parser.add_argument("--ingress", default=None, metavar="HOST", help="add an Ingress for HOST to the frontend")
    parser.add_argument("--ingress-class", default=None, help="ingressClassName of that Ingress")
    parser.add_argument("--shutdown-timeout", type=int, default=lifecycle.DEFAULT_SHUTDOWN_TIMEOUT,
                        help="DYN_SHUTDOWN_TIMEOUT (seconds) of services whose envs do not set it "
                        f"(default {lifecycle.DEFAULT_SHUTDOWN_TIMEOUT})")
    parser.add_argument("--etcd-image", default=platform.ETCD_IMAGE, help=f"default {platform.ETCD_IMAGE}")
    parser.add_argument("--nats-image", default=platform.NATS_IMAGE, help=f"default {platform.NATS_IMAGE}")
    parser.add_argument("--apply", action="store_true",
                        help="apply the objects (server-side apply, field manager dynamo) to the current "
                        "kubeconfig context and wait until every Deployment is ready")
    parser.add_argument("--context", default=None, help="with --apply: the kubeconfig context (default: current)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"with --apply: seconds to wait for readiness (default {DEFAULT_TIMEOUT})")
    parser.add_argument("--server-dry-run", action="store_true",
                        help="with --apply: the API server checks every object and changes nothing (no wait)")
    parser.set_defaults(handler=deploy, accepts_overrides=True)



def resolve(args: argparse.Namespace, extra: Sequence[str]) -> tuple[ResolvedGraph, str | None]:
    """The graph the arguments name, and the image its artifact implies (None for a graph).
    An artifact is resolved from its own source and configuration (``-f`` merged over it)."""
    file_config, overrides = load_config(args.config_file, extra)
    if not artifact.is_artifact(args.graph):
        if args.registry:
            raise DeployError(DeployErrorKind.INVALID, "--registry names where an artifact's image is; use --image")
        working_dir = working_dir_for(args.graph, args.working_dir)
        return resolve_graph(args.graph, working_dir, file_config, overrides, args.name), None
    built = artifact.load(args.graph)
    sys.dont_write_bytecode = True  # leave the artifact's directory as it was built
    config = deep_merge(built.config(), file_config)
    source = built.path / built.manifest["source"]
    graph = resolve_graph(built.manifest["graph"], source, config, overrides, args.name or built.manifest["name"])
    image = f"{args.registry.rstrip('/')}/{built.image}" if args.registry else built.image
    return graph, image


def options(args: argparse.Namespace, artifact_image: str | None) -> RenderOptions:
    """The render options the arguments give."""
    if args.shutdown_timeout < 0:
        raise ServiceConfigError(f"--shutdown-timeout must be >= 0, got {args.shutdown_timeout}")
    return RenderOptions(
        namespace=args.namespace,
        image=args.image or artifact_image,
        etcd=args.etcd,
        nats=args.nats,
        ingress_host=args.ingress,
        ingress_class=args.ingress_class,
        shutdown_timeout=args.shutdown_timeout,
        etcd_image=args.etcd_image,
        nats_image=args.nats_image,
    )


def deploy(args: argparse.Namespace, extra: Sequence[str]) -> int:
    """Run ``dynamo deploy``; returns the exit status."""
    try:
        graph, artifact_image = resolve(args, extra)
        for warning in graph.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        objects = render(graph, options(args, artifact_image))
    except (DeployError, ServiceConfigError, ValueError, ImportError, RuntimeError, TypeError) as exc:
        print(f"dynamo deploy: error: {exc}", file=sys.stderr)
        return 2
    text = dump(objects)
    if args.output_dir:
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{graph.name}.yaml"
        path.write_text(text)
        print(f"wrote {len(objects)} objects to {os.fspath(path)}", file=sys.stderr)
    elif not args.apply:
        sys.stdout.write(text)
    if not args.apply:
        return 0
    try:
        apply_objects(args, objects)
    except DeployError as exc:
        print(f"dynamo deploy: error: {exc}", file=sys.stderr)
        return 1
    return 0


def apply_objects(args: argparse.Namespace, objects: list[dict]) -> None:
    """``--apply``: apply, then wait for every Deployment (progress on stderr)."""
    if args.timeout <= 0:
        raise DeployError(DeployErrorKind.INVALID, f"--timeout must be > 0, got {args.timeout:g}")
    client, context_namespace = apply.connect(args.context)
    applier = apply.Applier(client, args.namespace or context_namespace)
    apply.apply_all(applier, objects, sys.stderr, dry_run=args.server_dry_run)
    if args.server_dry_run:
        return
    deployments = [o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"]
    apply.wait_ready(applier, deployments, args.timeout, sys.stderr)
    print(f"{len(deployments)} deployments ready in {applier.namespace}", file=sys.stderr)
