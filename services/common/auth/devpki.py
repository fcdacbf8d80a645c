"""A throwaway PKI for loopback TLS (``cryptography``, made at run time): a CA, a server certificate
for 127.0.0.1, ::1 and localhost, a client certificate it signed (mutual TLS), and a second ("rogue")
CA with its own client. The TLS tests and ``lookahead-rag-bench serve --ways on_tls`` use it; it is
never a production PKI (one-day validity, keys unencrypted on disk).

    pki = make_pki(directory)
    TlsSettings(cert_file=pki.server_cert, key_file=pki.server_key, ca_file=pki.ca)
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=1)  # how long the certificates are valid
CLOCK_SKEW = datetime.timedelta(minutes=5)  # valid from this long ago (clocks that disagree a little)
LOOPBACK_V4 = "127.0.0.1"


@dataclass(frozen=True)
class Pki:
    """PEM files: the CA, the server's and a client's certificate and key, and a rogue CA's client."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_ca: Path
    rogue_client_cert: Path
    rogue_client_key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, issuer_key: ec.EllipticCurvePrivateKey,
          *, ca: bool = False, usage: x509.ObjectIdentifier | None = None,
          sans: list[x509.GeneralName] | None = None) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject)).issuer_name(issuer).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW).not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False, encipher_only=False,
            decipher_only=False), critical=True)
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(directory: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> tuple[Path, Path]:
    cert_path, key_path = directory / f"{name}.crt", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def _authority(directory: Path, name: str) -> tuple[Path, x509.Name, ec.EllipticCurvePrivateKey]:
    key = _key()
    subject = _name(f"{name} test CA")
    cert = _cert(f"{name} test CA", key, subject, key, ca=True)
    cert_path, _ = _write(directory, name, cert, key)
    return cert_path, subject, key


def make_pki(d: Path) -> Pki:
    """Write a CA, a server and a client certificate, and a rogue CA with its own client, under ``d``."""
    ca, ca_name, ca_key = _authority(d, "ca")
    rogue_ca, rogue_name, rogue_key = _authority(d, "rogue-ca")
    sans: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(LOOPBACK_V4)),
                                    x509.IPAddress(ipaddress.ip_address("::1"))]
    server_key, client_key, rogue_client_key = _key(), _key(), _key()
    server = _cert("draftcache", server_key, ca_name, ca_key, usage=ExtendedKeyUsageOID.SERVER_AUTH, sans=sans)
    client = _cert("generator", client_key, ca_name, ca_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    rogue = _cert("intruder", rogue_client_key, rogue_name, rogue_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    server_cert, server_key_path = _write(d, "server", server, server_key)
    client_cert, client_key_path = _write(d, "client", client, client_key)
    rogue_cert, rogue_key_path = _write(d, "rogue-client", rogue, rogue_client_key)
    return Pki(ca, server_cert, server_key_path, client_cert, client_key_path, rogue_ca, rogue_cert, rogue_key_path)
