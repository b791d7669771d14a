"""``BaseDeployment``: deployment facts of a component in a plain class (proposal 002).

A component written directly against the runtime (its own ``main`` with
``@dynamo_worker()``) declares where it registers and what it needs here instead of in
``@service``::

    class Deployment(BaseDeployment):
        namespace = "dynamo"
        name = "sgldecode"
        resources = {"gpu": 1}

    deploy = Deployment()            # ServiceArgs from the configuration applied
    component = runtime.namespace(deploy.namespace).component(deploy.name)

SDK services can ``depends(Deployment)`` on it, and ``dynamo serve`` starts it with
``python -m <entrypoint>`` (default: the module that defines the class). A graph can
chain another deployment after it, ``Worker.link(PrefillWorker)``: one the deployment
talks to by its own means (discovery), started with it.
"""

from __future__ import annotations

from typing import Any, ClassVar

from dynamo.sdk.lib.config import SERVICE_ARGS, ServiceConfig, ServiceConfigError
from dynamo.sdk.lib.overrides import deep_merge
from dynamo.sdk.service_args import DEFAULT_NAMESPACE, ServiceArgs, validate_service_args


class BaseDeployment:
    """Subclass it and set the class attributes; instances carry the configured values."""

    namespace: ClassVar[str] = DEFAULT_NAMESPACE
    #: Component name (default: the class name).
    name: ClassVar[str] = ""
    resources: ClassVar[dict[str, Any]] = {}
    workers: ClassVar[int] = 1
    envs: ClassVar[dict[str, str]] = {}
    image: ClassVar[str | None] = None
    #: The module ``dynamo serve`` runs with ``python -m`` (default: this class's module).
    entrypoint: ClassVar[str | None] = None
    #: Endpoint names dependents may call (None: any name).
    endpoints: ClassVar[list[str] | None] = None

    #: Deployments linked after each deployment class by a graph (``A.link(B)``).
    _links: ClassVar[dict[type[BaseDeployment], list[type[BaseDeployment]]]] = {}

    @classmethod
    def link(cls, other: type[BaseDeployment]) -> type[BaseDeployment]:
        """Start ``other`` with this deployment in a graph (it has no ``depends()`` to fill:
        the two find each other through discovery). Returns ``other`` so links chain."""
        if not (isinstance(other, type) and issubclass(other, BaseDeployment)):
            raise ValueError(f"{cls.name} can link only another BaseDeployment, not {other!r}")
        linked = BaseDeployment._links.setdefault(cls, [])
        if other not in linked:
            linked.append(other)
        return other

    @classmethod
    def linked(cls) -> list[type[BaseDeployment]]:
        """The deployments a graph linked after this one."""
        return list(BaseDeployment._links.get(cls, []))

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("name"):
            cls.name = cls.__name__

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        args = type(self).service_args(config)
        # Instance attributes shadow the class defaults with the configured values.
        self.namespace = args.dynamo.namespace  # type: ignore[misc]
        self.resources = dict(args.resources)  # type: ignore[misc]
        self.workers = args.workers  # type: ignore[misc]
        self.envs = dict(args.envs)  # type: ignore[misc]
        self.image = args.image  # type: ignore[misc]

    @classmethod
    def service_args(cls, config: dict[str, Any] | None = None) -> ServiceArgs:
        """The class attributes with the configuration's ``ServiceArgs`` merged over them."""
        if config is None:
            config = ServiceConfig.get_instance()
        settings: dict[str, Any] = {
            "dynamo": {"namespace": cls.namespace, "name": cls.name},
            "resources": dict(cls.resources),
            "workers": cls.workers,
            "envs": dict(cls.envs),
        }
        if cls.image is not None:
            settings["image"] = cls.image
        override = (config.get(cls.name) or {}).get(SERVICE_ARGS) or {}
        if not isinstance(override, dict):
            raise ServiceConfigError(f"{cls.name}.{SERVICE_ARGS} must be a mapping, got {override!r}")
        return validate_service_args(cls.name, deep_merge(settings, override))

    @classmethod
    def dynamo_address(cls) -> tuple[str, str]:
        """(namespace, component name), configuration applied."""
        return cls.service_args().dynamo.namespace, cls.name

    @classmethod
    def endpoint_names(cls) -> list[str] | None:
        return None if cls.endpoints is None else list(cls.endpoints)

    @classmethod
    def module(cls) -> str:
        """The module ``python -m`` runs for this component."""
        module = cls.entrypoint or cls.__module__
        if module == "__main__":
            raise ServiceConfigError(
                f"{cls.name}: set `entrypoint = 'package.module'` on the deployment class; "
                "it is defined in a script run as __main__"
            )
        return module

    @classmethod
    def effective_config(cls, config: dict[str, Any] | None = None) -> dict[str, Any]:
        cfg = ServiceConfig(config) if config is not None else ServiceConfig.get_instance()
        return {SERVICE_ARGS: cls.service_args(cfg).model_dump(exclude_none=True), **cfg.get_parsed_config(cls.name)}
