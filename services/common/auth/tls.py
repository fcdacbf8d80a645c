"""Transport security: the ``[tls]`` settings (env ``LAR_TLS_``) and what is built from them.

One section per process. Its servers (gRPC, and the HTTP endpoint) present ``cert_file`` and
``key_file``; with ``client_ca_file`` set every caller must present a certificate that CA signed
(mutual TLS). When it calls another service (the generator's channels, ``ask``, ``ingest``) it
verifies the server against ``ca_file`` and presents ``client_cert_file``/``client_key_file``::

    tls = load_settings(TlsSettings, "tls", config_file)
    server.add_secure_port(address, server_credentials(tls))          # None: TLS is off
    grpc.aio.secure_channel(target, channel_credentials(tls), options=channel_options(tls))

``check_bind`` is the one rule for listening: loopback may go without TLS and without auth (the
embedded demo and the tests need no set-up); any other address needs server TLS, or
``allow_insecure = true``, and ``[auth] mode = "required"``, or ``[auth] allow_unauthenticated = true``;
each allowance is logged as a warning. TLS alone is not enough: it hides the traffic, not who sends it.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import grpc
from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from lookahead_rag.services.common.auth.settings import AuthSettings
from lookahead_rag.services.common.rpc.channel_config import ChannelSettings
from lookahead_rag.services.common.rpc.channel_config import channel_options as balancing_options
from lookahead_rag.services.common.settings import ConfigError, PathArg, ServiceSettings, load_settings

log = logging.getLogger(__name__)

SECTION = "tls"
LOOPBACK_NAMES = frozenset({"localhost"})  # host names that always mean loopback
TARGET_NAME_OVERRIDE = "grpc.ssl_target_name_override"  # gRPC channel option: the name to verify


class InsecureBindError(ConfigError):
    """A server would listen on a non-loopback address in plaintext and ``allow_insecure`` is off."""


class UnauthenticatedBindError(InsecureBindError):
    """A server would listen on a non-loopback address with ``[auth] mode = "off"`` and
    ``allow_unauthenticated`` is off (TLS or not)."""


class TlsSettings(ServiceSettings):
    """TLS and mutual TLS of every gRPC server and channel of this process, and of its HTTP endpoint."""

    model_config = SettingsConfigDict(env_prefix="LAR_TLS_")
    section: ClassVar[str] = SECTION

    # --- this process's servers ---
    cert_file: Path | None = Field(
        None, description="PEM certificate (chain) the gRPC and HTTP servers present; with key_file: TLS on"
    )
    key_file: Path | None = Field(None, description="PEM private key of cert_file")
    client_ca_file: Path | None = Field(
        None, description="PEM CA bundle; set: callers must present a certificate it signed (mutual TLS)"
    )
    # --- this process as a client of another service ---
    ca_file: Path | None = Field(
        None, description="PEM CA bundle the servers this process calls are verified against (None: system roots)"
    )
    client_cert_file: Path | None = Field(
        None, description="PEM certificate this process presents when it calls a service requiring mutual TLS"
    )
    client_key_file: Path | None = Field(None, description="PEM private key of client_cert_file")
    server_name_override: str = Field(
        "", description="name checked in server certificates instead of the target's host (tests only)"
    )
    # --- policy ---
    allow_insecure: bool = Field(
        False, description="let servers listen in plaintext on a non-loopback address (logged as a warning)"
    )

    @model_validator(mode="after")
    def _pairs(self) -> TlsSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file must be set together")
        if (self.client_cert_file is None) != (self.client_key_file is None):
            raise ValueError("client_cert_file and client_key_file must be set together")
        if self.client_ca_file is not None and self.cert_file is None:
            raise ValueError("client_ca_file (mutual TLS) needs cert_file and key_file")
        return self

    @property
    def server_enabled(self) -> bool:
        """This process's servers speak TLS."""
        return self.cert_file is not None and self.key_file is not None

    @property
    def mutual(self) -> bool:
        """Its servers require a client certificate."""
        return self.server_enabled and self.client_ca_file is not None

    @property
    def client_enabled(self) -> bool:
        """Its channels speak TLS: a CA or a client certificate is set, or its own servers use TLS
        (one ``[tls]`` section per deployment: a process serving TLS expects its peers to)."""
        return self.ca_file is not None or self.client_cert_file is not None or self.server_enabled


def load_tls(config_file: PathArg = None, **overrides: Any) -> TlsSettings:
    """The ``[tls]`` section: defaults < TOML file < ``LAR_TLS_*`` < ``overrides``."""
    return load_settings(TlsSettings, SECTION, config_file, **overrides)


def _read(path: Path | None, field: str) -> bytes | None:
    """The file's bytes (None when unset); an unreadable file is a one-line ConfigError."""
    if path is None:
        return None
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise ConfigError(f"[tls] {field} = {str(path)!r}: cannot read it ({exc.strerror or exc})") from None


# --- gRPC ---


def server_credentials(tls: TlsSettings | None) -> grpc.ServerCredentials | None:
    """TLS (mutual with ``client_ca_file``) credentials for ``add_secure_port``; None when TLS is off."""
    if tls is None or not tls.server_enabled:
        return None
    key, cert = _read(tls.key_file, "key_file"), _read(tls.cert_file, "cert_file")
    client_ca = _read(tls.client_ca_file, "client_ca_file")
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def channel_credentials(tls: TlsSettings | None) -> grpc.ChannelCredentials | None:
    """Credentials of a channel to another service; None when this process's channels are plaintext."""
    if tls is None or not tls.client_enabled:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_read(tls.ca_file, "ca_file"),
        private_key=_read(tls.client_key_file, "client_key_file"),
        certificate_chain=_read(tls.client_cert_file, "client_cert_file"),
    )


def channel_options(tls: TlsSettings | None) -> list[tuple[str, str]]:
    """Channel options TLS adds (the name to verify, when overridden)."""
    if tls is None or not tls.client_enabled or not tls.server_name_override:
        return []
    return [(TARGET_NAME_OVERRIDE, tls.server_name_override)]


def sync_channel(target: str, tls: TlsSettings | None, channels: ChannelSettings | None = None) -> grpc.Channel:
    """A blocking channel to ``target`` (HOST:PORT): TLS when ``tls`` says so, else plaintext; load
    balancing and retries from ``channels`` (services.common.rpc.channel_config; None: its defaults)."""
    credentials = channel_credentials(tls)
    balancing = balancing_options(channels)
    if credentials is None:
        return grpc.insecure_channel(target, options=balancing)
    return grpc.secure_channel(target, credentials, options=[*balancing, *channel_options(tls)])


# --- HTTP (uvicorn) ---


def uvicorn_ssl(tls: TlsSettings | None) -> dict[str, Any]:
    """``uvicorn.Config`` keyword arguments: the same certificate, and client certificates required
    with ``client_ca_file``; empty when TLS is off."""
    if tls is None or not tls.server_enabled:
        return {}
    kwargs: dict[str, Any] = {"ssl_certfile": str(tls.cert_file), "ssl_keyfile": str(tls.key_file)}
    if tls.client_ca_file is not None:
        kwargs |= {"ssl_ca_certs": str(tls.client_ca_file), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return kwargs


# --- where a server may listen ---


def is_loopback(host: str) -> bool:
    """``host`` is a loopback address (127.0.0.0/8, ::1) or ``localhost``; "" and 0.0.0.0 are not."""
    name = host.strip().strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # any other host name may resolve anywhere


def check_bind(hosts: Mapping[str, str], tls: TlsSettings, auth: AuthSettings) -> None:
    """Refuse to listen beyond loopback in plaintext or without auth: ``hosts`` maps each server (e.g.
    "retriever", "http") to the address it binds. Raises InsecureBindError (one line) unless server TLS
    is on or ``allow_insecure`` is set, then UnauthenticatedBindError unless ``[auth] mode = "required"``
    or ``allow_unauthenticated`` is set; each allowance is logged as a WARNING."""
    exposed = {name: host for name, host in hosts.items() if not is_loopback(host)}
    if not exposed:
        return
    where = ", ".join(f"{name} on {host or '*'}" for name, host in exposed.items())
    # each rule: (secured, allowance, the refusal without the allowance, the warning with it), TLS first
    rules = (
        (tls.server_enabled, tls.allow_insecure, InsecureBindError(
            f"[tls] refusing to serve {where} without TLS: set cert_file and key_file "
            "(LAR_TLS_CERT_FILE, LAR_TLS_KEY_FILE), bind 127.0.0.1, or set allow_insecure = true "
            "(LAR_TLS_ALLOW_INSECURE=true)"
        ), "serving %s WITHOUT TLS (allow_insecure = true): anyone on the network can read and send every request"),
        (auth.required, auth.allow_unauthenticated, UnauthenticatedBindError(
            f'[auth] refusing to serve {where} with mode = "off" (TLS or not): anyone who reaches it could '
            'ingest, delete and read every tenant; set mode = "required" with keys_file or cert_subjects '
            "(LAR_AUTH_MODE, LAR_AUTH_KEYS_FILE), bind 127.0.0.1, or set allow_unauthenticated = true "
            "(LAR_AUTH_ALLOW_UNAUTHENTICATED=true)"
        ), 'serving %s WITHOUT AUTHENTICATION ([auth] mode = "off", allow_unauthenticated = true): anyone who '
           "reaches it acts for every tenant"),
    )
    for secured, allowed, refusal, warning in rules:
        if secured:
            continue
        if not allowed:
            raise refusal
        log.warning(warning, where)


# --- command lines (ask, ingest) ---


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config`` (its [tls] table; LAR_TLS_* apply too) and flags overriding the client fields."""
    group = parser.add_argument_group("TLS", "defaults: the [tls] table of --config / $LAR_CONFIG, then LAR_TLS_*")
    group.add_argument("--config", default=None, help="TOML configuration file (else $LAR_CONFIG)")
    group.add_argument("--ca-file", default=None, help="PEM CA bundle the server is verified against (TLS on)")
    group.add_argument("--client-cert", default=None, help="PEM certificate to present (mutual TLS)")
    group.add_argument("--client-key", default=None, help="PEM private key of --client-cert")
    group.add_argument("--server-name", default=None, help="name to verify in the server's certificate")


def tls_from_args(args: argparse.Namespace) -> TlsSettings:
    """The client's TLS settings: the config file and env, overridden by the flags given."""
    flags = {"ca_file": args.ca_file, "client_cert_file": args.client_cert, "client_key_file": args.client_key,
             "server_name_override": args.server_name}
    return load_tls(args.config, **{k: v for k, v in flags.items() if v is not None})
