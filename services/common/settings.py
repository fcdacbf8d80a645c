"""Service settings: defaults < a TOML file's table < environment variables.

Every service reads its settings the same way::

    settings = load_settings(RetrieverSettings, "retriever", args.config)

``config_file`` (``--config FILE``) or else ``$LAR_CONFIG`` names a TOML file with one table per
section (``[retriever]``, ``[draftcache]``, ``[generator]``, ``[kafka]``, ``[logging]``); the
section's environment variables (``LAR_RETRIEVER_CHUNK_CHARS=...``) override the file. Secrets may
also come from files: with ``$LAR_SECRETS_DIR`` set (unset by default; nothing is read implicitly),
a file there named like a field's variable (``LAR_KAFKA_SASL_PLAIN_PASSWORD``, any case) sets that
field, as a Kubernetes Secret mounted as a volume provides it. Precedence, lowest first: default <
TOML file < secrets file < environment variable < overrides (env wins, so one variable can still
replace a mounted value). An unknown
field (in the file or as a prefixed variable), an unknown table or an ill-typed value raises
``ConfigError`` with one line naming the section, the field and where the value came from.

``load_settings`` works with any pydantic-settings class; new classes derive from
``ServiceSettings`` (file + env, extra fields forbidden) or ``ServerSettings`` (plus host and ports).
"""

from __future__ import annotations

import difflib
import logging
import os
import tomllib
import warnings
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SecretsSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from lookahead_rag.services.common.ports import CONFIG_ENV, SECRETS_DIR_ENV

log = logging.getLogger(__name__)

S = TypeVar("S", bound=BaseSettings)
PathArg = str | os.PathLike[str] | None

class ConfigError(ValueError):
    """A configuration problem, in one line that names the field and where its value came from."""


def _existing(raw: str, is_there: Callable[[Path], bool], what: str, source: str) -> Path | None:
    """``raw`` as a path (None when empty); one that is not there is a ConfigError naming ``what`` and ``source``."""
    if not raw:
        return None
    path = Path(raw).expanduser()
    if not is_there(path):
        raise ConfigError(f"{what} {path} not found (from {source})")
    return path


def config_path(config_file: PathArg = None) -> Path | None:
    """The TOML file to read: ``config_file``, else ``$LAR_CONFIG``, else none."""
    raw = os.fspath(config_file) if config_file else os.environ.get(CONFIG_ENV, "")
    return _existing(raw, Path.is_file, "config file", f"--config or ${CONFIG_ENV}")


def secrets_dir() -> Path | None:
    """The directory of secret files: ``$LAR_SECRETS_DIR``, else none (a set but missing one: ConfigError)."""
    return _existing(os.environ.get(SECRETS_DIR_ENV, ""), Path.is_dir, "secrets directory", f"${SECRETS_DIR_ENV}")


def secret_file(cls: type[BaseSettings], field: str, directory: Path | None) -> Path | None:
    """The file of ``directory`` that sets ``field`` (named like its env variable, any case), if any."""
    if directory is None:
        return None
    wanted = env_name(cls, field)
    return next((p for p in sorted(directory.iterdir()) if p.name.upper() == wanted and p.is_file()), None)


def read_config(path: Path) -> dict[str, Any]:
    """The whole TOML file, one table per section (``check_tables`` refuses unknown ones)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    for name, table in data.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: {name} must be a table ([{name}]), not a value")
    return data


def check_tables(path: Path, known: Collection[str]) -> None:
    """Refuse a table of ``path`` that names no known section (a typo would otherwise be ignored)."""
    for name in read_config(path):
        if name not in known:
            raise ConfigError(f"{path}: unknown table [{name}]{_did_you_mean(name, known)}")


def env_prefix(cls: type[BaseSettings]) -> str:
    return str(cls.model_config.get("env_prefix") or "")


def env_name(cls: type[BaseSettings], field: str) -> str:
    """The environment variable that sets ``field`` (upper case; matching is case-insensitive)."""
    return (env_prefix(cls) + field).upper()


def _did_you_mean(name: str, known: Any) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _unknown_env(cls: type[BaseSettings], section: str) -> None:
    """A prefixed variable that matches no field is a typo: refuse it instead of ignoring it."""
    prefix = env_prefix(cls).upper()
    if not prefix:
        return
    known = {env_name(cls, name) for name in (*cls.model_fields, *renames(cls))}
    nested = str(cls.model_config.get("env_nested_delimiter") or "")
    for var in sorted(os.environ):
        upper = var.upper()
        if not upper.startswith(prefix) or upper in known:
            continue
        if nested and any(upper.startswith(k + nested.upper()) for k in known):
            continue
        raise ConfigError(f"[{section}] unknown environment variable {var}{_did_you_mean(upper, known)}")


def _origin(cls: type[BaseSettings], section: str, field: str, table: dict[str, Any], path: Path | None
            ) -> str:
    wanted = env_name(cls, field)
    for var in os.environ:
        if var.upper() == wanted:
            return f"env {var}"
    found = secret_file(cls, field, secrets_dir())
    if found is not None:
        return f"secrets file {found}"
    if field in table:
        return f"{path} [{section}]"
    return "default"


def _one_line(exc: ValidationError, cls: type[BaseSettings], section: str, table: dict[str, Any],
              path: Path | None) -> str:
    parts = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ())]
        field = ".".join(loc)
        top = loc[0] if loc else ""
        if err["type"] == "extra_forbidden":
            where = f" in {path}" if top in table else ""
            parts.append(f"{field}{where}: unknown field{_did_you_mean(top, cls.model_fields)}")
            continue
        if top not in cls.model_fields:  # a model-level check across fields
            parts.append(str(err["msg"]).removeprefix("Value error, "))
            continue
        got = repr(err.get("input"))
        got = got if len(got) <= 60 else got[:57] + "..."
        where = _origin(cls, section, top, table, path)
        parts.append(f"{field} = {got} (from {where}): {err['msg']}")
    return f"[{section}] " + "; ".join(parts)


def toml_sources(settings_cls: type[BaseSettings], path: Path | None, section: str
                 ) -> list[PydanticBaseSettingsSource]:
    """pydantic-settings' TOML source over ``[section]`` of ``path`` (none without such a table)."""
    if path is None or not section or section not in read_config(path):
        return []
    return [TomlConfigSettingsSource(settings_cls, toml_file=path, toml_table_header=(section,))]


def _file_then_env(
    cls: type[BaseSettings],
    settings_cls: type[BaseSettings],
    init_settings: PydanticBaseSettingsSource,
    env_settings: PydanticBaseSettingsSource,
    dotenv_settings: PydanticBaseSettingsSource,
    file_secret_settings: PydanticBaseSettingsSource,
) -> tuple[PydanticBaseSettingsSource, ...]:
    """settings_customise_sources: init > env > a file of $LAR_SECRETS_DIR > ``[cls.section]`` of
    ``cls.config_file`` or $LAR_CONFIG."""
    path = getattr(cls, "config_file", None) or config_path(None)
    directory = secrets_dir()
    secrets = [] if directory is None else [SecretsSettingsSource(settings_cls, secrets_dir=directory)]
    return (init_settings, env_settings, *secrets, *toml_sources(settings_cls, path, getattr(cls, "section", "")))


def _loader(cls: type[S], section: str, path: Path | None) -> type[S]:
    """A throw-away subclass of ``cls`` reading env > the file's table, with extra fields forbidden."""
    namespace = {
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__annotations__": {"section": ClassVar[str], "config_file": ClassVar[Path | None]},
        "section": section,
        "config_file": path,
        "model_config": SettingsConfigDict(extra="forbid"),  # merged over cls's own config
        "settings_customise_sources": classmethod(_file_then_env),
    }
    return type(cls.__name__, (cls,), namespace)  # type: ignore[return-value]


def renames(cls: type[BaseSettings]) -> dict[str, str]:
    """``cls``'s renamed fields: old name -> new name (``ServiceSettings.renamed``)."""
    return dict(getattr(cls, "renamed", {}))


def deprecated_name(cls: type[BaseSettings], old: str, new: str) -> None:
    """Warn (DeprecationWarning and the log) that ``old`` was read as ``new``."""
    message = f"[{getattr(cls, 'section', '') or cls.__name__}] {old} is renamed {new}: read as {new}; use the new name"
    warnings.warn(message, DeprecationWarning, stacklevel=3)
    log.warning("%s", message)


def _renamed_env(cls: type[BaseSettings], overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` plus the value of a renamed field's old variable, where neither the overrides nor the new
    variable set the field (the env source reads fields' own names only)."""
    env = {var.upper(): value for var, value in os.environ.items()}
    out = dict(overrides)
    for old, new in renames(cls).items():
        value = env.get(env_name(cls, old))
        if value is None:
            continue
        deprecated_name(cls, env_name(cls, old), env_name(cls, new))
        if new not in out and old not in out and env_name(cls, new) not in env:
            out[new] = value
    return out


def load_settings(cls: type[S], section: str, config_file: PathArg = None, **overrides: Any) -> S:
    """``cls`` filled from defaults < ``[section]`` of the TOML file < ``cls``'s env prefix < overrides.

    Works with any ``BaseSettings`` subclass; returns an instance of ``cls`` itself.
    Raises ``ConfigError`` (one line) for an unknown field, table or variable, or an ill-typed value.
    """
    path = config_path(config_file)
    table = read_config(path).get(section, {}) if path else {}
    _unknown_env(cls, section)
    overrides = _renamed_env(cls, overrides)
    try:
        loaded = _loader(cls, section, path)(**overrides)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc, cls, section, table, path)) from None
    except SettingsError as exc:  # e.g. a list/dict variable that is not valid JSON
        raise ConfigError(f"[{section}] {exc}") from None
    values = {name: getattr(loaded, name) for name in cls.model_fields}
    built = cls.model_construct(_fields_set=set(loaded.model_fields_set), **values)
    if loaded.__pydantic_private__:  # what validation recorded beside the fields (ModelSettings.auto_choice)
        built.__pydantic_private__ = dict(loaded.__pydantic_private__)
    return built


def origins(cls: type[BaseSettings], section: str, config_file: PathArg) -> dict[str, str]:
    """field -> where its effective value comes from: ``default``, the file, or ``env VAR``."""
    path = config_path(config_file)
    table = read_config(path).get(section, {}) if path else {}
    return {name: _origin(cls, section, name, table, path) for name in cls.model_fields}


class ServiceSettings(BaseSettings):
    """Base of every service's settings: ``section``'s table of ``$LAR_CONFIG`` < env; extras forbidden.

    Subclasses set ``section`` and ``model_config = SettingsConfigDict(env_prefix="LAR_<SECTION>_")``.
    ``load_settings`` additionally honours ``--config`` and gives one-line errors.
    """

    model_config = SettingsConfigDict(extra="forbid")
    section: ClassVar[str] = ""  # the TOML table, e.g. "retriever"
    config_file: ClassVar[Path | None] = None  # None: $LAR_CONFIG (load_settings passes --config here)
    renamed: ClassVar[dict[str, str]] = {}  # old field name -> new: the old one is still read, with a warning

    settings_customise_sources = classmethod(_file_then_env)  # type: ignore[assignment]

    @model_validator(mode="before")
    @classmethod
    def _read_renamed(cls, data: Any) -> Any:
        """A renamed field given by its old name (a file's table, an argument) is read as the new one; the new
        name wins when both are given."""
        if not isinstance(data, dict) or not cls.renamed:
            return data
        data = dict(data)
        for old, new in cls.renamed.items():
            if old in data:
                deprecated_name(cls, old, new)
                data.setdefault(new, data.pop(old))
        return data


def port_field(default: int) -> Any:
    """The ``port`` field of a ServerSettings subclass, with the service's default port."""
    return Field(default, ge=0, le=65535, description="gRPC listen port (0 = any free port)")


def metrics_port_field(default: int | None) -> Any:
    """The ``metrics_port`` field of a ServerSettings subclass, with the service's default port."""
    return Field(default, ge=0, le=65535, description="Prometheus /metrics HTTP port (0 = any free port, None = off)")


SERVICE_MESSAGE_BYTES = 8 * 1024 * 1024  # a service's largest gRPC message unless its section says otherwise


class ServerSettings(ServiceSettings):
    """A gRPC service's listen address, metrics exporter and shutdown grace; subclasses redeclare
    ``port`` and ``metrics_port`` with their defaults from services.common.ports, e.g.::

        class RetrieverSettings(ServerSettings):
            model_config = SettingsConfigDict(env_prefix="LAR_RETRIEVER_")
            section: ClassVar[str] = "retriever"
            port: int = port_field(ports.RETRIEVER_GRPC_PORT)
            metrics_port: int | None = metrics_port_field(ports.RETRIEVER_METRICS_PORT)
    """

    host: str = Field(
        "127.0.0.1", description="interface the gRPC and metrics servers bind (0.0.0.0 in containers)"
    )
    port: int = port_field(0)
    metrics_port: int | None = metrics_port_field(None)
    metrics_refresh_s: float = Field(
        5.0, gt=0, description="seconds between samples of state gauges (consumer lag, outbox depth, trie sizes)"
    )
    max_message_bytes: int = Field(
        SERVICE_MESSAGE_BYTES, gt=0, description="largest gRPC message this service receives or sends"
    )
    drain_s: float = Field(0.0, ge=0, description="graceful stop: first, seconds served while health is NOT_SERVING")
    shutdown_grace_s: float = Field(
        5.0, ge=0, description="graceful stop: then seconds in-flight calls may finish (new ones refused)"
    )
    # A client's connection is closed (GOAWAY; its calls in flight still finish) after this long, so a
    # client re-resolves its dns:/// target and spreads over replicas added since (0: never).
    max_connection_age_s: float = Field(
        300.0, ge=0, description="seconds before a client connection is recycled (re-resolved DNS; 0: never)"
    )


class LoggingSettings(ServiceSettings):
    """Process-wide logging (one per process, also under ``serve all``)."""

    model_config = SettingsConfigDict(env_prefix="LAR_LOG_")
    section: ClassVar[str] = "logging"

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="lowest level logged; prompt and answer text appear only at DEBUG"
    )
    format: Literal["json", "text"] = Field(
        "json", description="json: one JSON object a line; text: for humans"
    )


OTEL_ENDPOINT_ENVS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")  # OTel's, first wins
OTEL_SERVICE_NAME_ENV = "OTEL_SERVICE_NAME"  # OTel's service name variable
OTEL_DISABLED_ENV = "OTEL_SDK_DISABLED"  # OTel's off switch ("true": no tracing whatever else says)


class TracingSettings(ServiceSettings):
    """OpenTelemetry traces (``services.common.telemetry.tracing``): off unless an OTLP endpoint is set."""

    model_config = SettingsConfigDict(env_prefix="LAR_TRACING_")
    section: ClassVar[str] = "tracing"

    otlp_endpoint: str = Field(
        "", description="OTLP/gRPC collector, e.g. http://otel-collector:4317 (empty: $OTEL_EXPORTER_OTLP_ENDPOINT; "
                        "neither: tracing off)"
    )
    service_name: str = Field(
        "", description="service.name of the spans (empty: $OTEL_SERVICE_NAME, else lookahead-rag-<service>, "
                        "or lookahead-rag for several)"
    )
    sample_ratio: float = Field(
        1.0, ge=0.0, le=1.0, description="share of new traces kept (a caller's sampled traceparent is followed)"
    )

    @property
    def endpoint(self) -> str:
        """Where spans go: ``otlp_endpoint``, else OTel's own variables; "" (off) when OTEL_SDK_DISABLED=true."""
        if os.environ.get(OTEL_DISABLED_ENV, "").strip().lower() == "true":
            return ""
        return self.otlp_endpoint or next((os.environ[v] for v in OTEL_ENDPOINT_ENVS if os.environ.get(v)), "")

    @property
    def enabled(self) -> bool:
        return bool(self.endpoint)

    def name_for(self, services: Collection[str]) -> str:
        """service.name for a process serving ``services``: the setting, $OTEL_SERVICE_NAME, or derived."""
        own = self.service_name or os.environ.get(OTEL_SERVICE_NAME_ENV, "")
        if own:
            return own
        return f"lookahead-rag-{next(iter(services))}" if len(services) == 1 else "lookahead-rag"
