"""``@service``: turn a class into a node of a service graph.

The decorator records settings and returns a ``DynamoService`` wrapping the class; it
connects nothing. ``dynamo serve`` (or ``python -m dynamo.sdk.run``) builds the
instance and serves its endpoints.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any, ClassVar

from pydantic import TypeAdapter, ValidationError

from dynamo.sdk.dependency import Dependency
from dynamo.sdk.endpoint import EndpointSpec, check_abstract_endpoints, endpoint_specs
from dynamo.sdk.lib.config import SERVICE_ARGS, ServiceConfig, ServiceConfigError
from dynamo.sdk.lib.overrides import deep_merge
from dynamo.sdk.service_args import ServiceArgs, validate_service_args


class DynamoService:
    """A ``@service`` class: its settings, endpoints and dependencies."""

    #: Edges chosen with ``.link()``: source service → names of its kept dependencies.
    _links: ClassVar[dict[DynamoService, set[str]]] = {}
    #: Services that appear in any link, as source or target.
    _linked: ClassVar[set[DynamoService]] = set()

    def __init__(self, inner: type, settings: dict[str, Any], app: Any = None) -> None:
        self.inner = inner
        self.decorator_settings = settings
        self.app = app
        self.name: str = settings.get("dynamo", {}).get("name") or inner.__name__
        validate_service_args(self.name, settings)  # fail at import time on a bad decorator
        check_abstract_endpoints(inner)
        self._endpoints = endpoint_specs(inner)
        self.__doc__ = inner.__doc__
        self.__module__ = inner.__module__
        self.__qualname__ = inner.__qualname__
        self.__name__ = inner.__name__

    # ------------------------------------------------------------------ structure

    @property
    def dependencies(self) -> dict[str, Dependency]:
        """Every ``depends()`` of the class (inherited ones included), by attribute name."""
        found: dict[str, Dependency] = {}
        for klass in reversed(self.inner.__mro__):
            for attr, value in vars(klass).items():
                if isinstance(value, Dependency):
                    found[attr] = value
        return found

    def used_dependencies(self) -> dict[str, Dependency]:
        """The dependencies the graph follows: all of them, unless ``.link()`` chose edges
        touching this service, then only the linked ones."""
        deps = self.dependencies
        if self not in DynamoService._linked:
            return deps
        kept = DynamoService._links.get(self, set())
        return {attr: dep for attr, dep in deps.items() if attr in kept}

    def endpoints(self, transport: str | None = None) -> dict[str, EndpointSpec]:
        """Endpoint specs by name, optionally only those of one transport (``dynamo``/``http``)."""
        return {n: s for n, s in self._endpoints.items() if transport is None or s.transport == transport}

    def endpoint_names(self) -> list[str]:
        """Names of the endpoints served on the Dynamo runtime."""
        return list(self.endpoints("dynamo"))

    def link(self, other: DynamoService) -> DynamoService:
        """Use ``other`` for the one dependency it can fill (declared as ``other`` itself or
        as an interface or base class of it), and follow only linked edges from here.
        Returns ``other`` so that links chain: ``A.link(B).link(C)``."""
        other_inner = getattr(other, "inner", other)
        matches = []
        for attr, dep in self.dependencies.items():
            declared = getattr(dep.on, "inner", dep.on)
            if isinstance(declared, type) and issubclass(other_inner, declared):
                matches.append((attr, dep))
        if not matches:
            raise ValueError(f"{self.name} has no dependency that {getattr(other, 'name', other)} can fill "
                             f"(dependencies: {sorted(self.dependencies)})")
        if len(matches) > 1:
            raise ValueError(f"{getattr(other, 'name', other)} fills several dependencies of {self.name}: "
                             f"{sorted(a for a, _ in matches)}; link an exact service")
        attr, dep = matches[0]
        dep.on = other
        DynamoService._links.setdefault(self, set()).add(attr)
        DynamoService._linked.update({self, other})
        return other

    def all_services(self) -> list[DynamoService]:
        """This service and everything it (transitively) uses: dependencies first, itself last."""
        order: list[DynamoService] = []
        visiting: set[DynamoService] = set()

        def visit(svc: DynamoService) -> None:
            if svc in order:
                return
            if svc in visiting:
                raise ValueError(f"dependency cycle through {svc.name}")
            visiting.add(svc)
            for dep in svc.used_dependencies().values():
                target = dep.on
                if isinstance(target, DynamoService):
                    visit(target)
                elif hasattr(target, "dynamo_address"):
                    visit_deployment(target)  # a BaseDeployment: its own links only
                else:
                    dep.address()  # raises: an unlinked interface
            visiting.discard(svc)
            order.append(svc)

        def visit_deployment(deployment: Any) -> None:
            if deployment in order:
                return
            if deployment in visiting:
                raise ValueError(f"dependency cycle through {deployment.name}")
            visiting.add(deployment)
            for after in deployment.linked():
                visit_deployment(after)
            visiting.discard(deployment)
            order.append(deployment)

        visit(self)
        return order

    def find(self, name: str) -> Any:
        """The service (or deployment) named ``name`` in this graph."""
        for svc in self.all_services():
            if svc.name == name:
                return svc
        raise ValueError(f"no service named {name!r} in the graph of {self.name} "
                         f"(services: {[s.name for s in self.all_services()]})")

    # ------------------------------------------------------------------ configuration

    def service_args(self, config: dict[str, Any] | None = None) -> ServiceArgs:
        """The decorator's settings with the configuration's ``ServiceArgs`` merged over them."""
        if config is None:
            config = ServiceConfig.get_instance()
        section = config.get(self.name) or {}
        override = section.get(SERVICE_ARGS) or {}
        if not isinstance(override, dict):
            raise ServiceConfigError(f"{self.name}.{SERVICE_ARGS} must be a mapping, got {override!r}")
        return validate_service_args(self.name, deep_merge(self.decorator_settings, override))

    def dynamo_address(self) -> tuple[str, str]:
        """(namespace, component name) this service registers under."""
        return self.service_args().dynamo.namespace, self.name

    def constructor_defaults(self) -> dict[str, Any]:
        """The defaults of the class's constructor parameters."""
        return {
            p.name: p.default
            for p in _init_params(self.inner)
            if p.default is not inspect.Parameter.empty
        }

    def constructor_kwargs(self, config: dict[str, Any] | None = None) -> dict[str, Any]:
        """Constructor arguments from the configuration keys of the same names, type-checked
        against the parameter's annotation (or its default's type)."""
        cfg = ServiceConfig(config) if config is not None else ServiceConfig.get_instance()
        values = cfg.get_parsed_config(self.name)
        kwargs: dict[str, Any] = {}
        for param in _init_params(self.inner):
            if param.name in values:
                kwargs[param.name] = _check_type(self.name, param, values[param.name])
        return kwargs

    def effective_config(self, config: dict[str, Any] | None = None) -> dict[str, Any]:
        """What the service runs with: ``ServiceArgs`` (decorator < config) and its keys
        (constructor defaults < config), as ``dynamo serve --dry-run`` prints it."""
        cfg = ServiceConfig(config) if config is not None else ServiceConfig.get_instance()
        keys = {**self.constructor_defaults(), **cfg.get_parsed_config(self.name), **self.constructor_kwargs(cfg)}
        args = self.service_args(cfg).model_dump(exclude_none=True)
        return {SERVICE_ARGS: args, **copy.deepcopy(keys)}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Build an instance of the class (the runner passes configured constructor arguments)."""
        return self.inner(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<service {self.name}>"


def _init_params(cls: type) -> list[inspect.Parameter]:
    init = cls.__init__
    if init is object.__init__:
        return []
    params = list(inspect.signature(init).parameters.values())[1:]
    return [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _check_type(service: str, param: inspect.Parameter, value: Any) -> Any:
    annotation = param.annotation
    if annotation is inspect.Parameter.empty or isinstance(annotation, str):
        default = param.default
        if default is inspect.Parameter.empty or default is None:
            return value
        annotation = type(default)
    if annotation is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # `--Svc.name=123` parses as a number
    try:
        return TypeAdapter(annotation).validate_python(value)
    except ValidationError as exc:
        msg = exc.errors()[0]["msg"] if exc.errors() else str(exc)
        expected = getattr(annotation, "__name__", annotation)
        raise ServiceConfigError(
            f"{service}.{param.name}: {msg} (got {value!r}; the constructor expects {expected})"
        ) from None
    except Exception:
        return value  # an annotation pydantic cannot check


def service(
    inner: type | None = None,
    /,
    *,
    dynamo: dict[str, Any] | None = None,
    resources: dict[str, Any] | None = None,
    workers: int | None = None,
    image: str | None = None,
    envs: dict[str, str] | list[dict[str, str]] | None = None,
    app: Any = None,
    **_ignored: Any,
) -> Any:
    """Make a class a service. ``dynamo`` (``namespace``, ``enabled``…), ``resources``
    (``gpu`` drives ``CUDA_VISIBLE_DEVICES``), ``workers`` (processes), ``image``,
    ``envs`` (set in its processes) and ``app`` (a FastAPI app for ``@api`` routes)
    are defaults that a ``ServiceArgs`` configuration section overrides. Unknown keyword
    settings are accepted and ignored (deployment hints of other tools)."""
    settings: dict[str, Any] = {}
    if dynamo is not None:
        settings["dynamo"] = dict(dynamo)
    if resources is not None:
        settings["resources"] = dict(resources)
    if workers is not None:
        settings["workers"] = workers
    if image is not None:
        settings["image"] = image
    if envs is not None:
        settings["envs"] = envs

    def decorator(cls: type) -> DynamoService:
        if not isinstance(cls, type):
            raise TypeError(f"@service decorates a class, got {cls!r}")
        return DynamoService(cls, settings, app)

    return decorator(inner) if inner is not None else decorator

