"""Certificates for the TLS tests, generated at test time with ``cryptography``.

A CA, a server certificate for ``127.0.0.1``/``localhost`` signed by it, a client
certificate signed by it (key encrypted with a password), and a second CA that signed
nothing here (a client trusting only it must refuse the server).
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    """PEM files of one generated PKI (paths as strings, as kafka-python takes them)."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    client_key_password: str
    other_ca: str


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _cert(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: str, issuer_key: ec.EllipticCurvePrivateKey, *, ca: bool
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        ).add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    else:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        ).add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, *blobs: bytes) -> str:
    path.write_bytes(b"".join(blobs))
    path.chmod(0o600)
    return str(path)


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key(key: ec.EllipticCurvePrivateKey, password: str | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption()
    )
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


def make_tls_files(directory: Path, client_key_password: str = "key-pass-7f3a") -> TlsFiles:
    """Generate the PKI into ``directory`` (created if needed)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, other_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    server_key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _cert("kafka_py test CA", ca_key, "kafka_py test CA", ca_key, ca=True)
    other = _cert("an unrelated CA", other_key, "an unrelated CA", other_key, ca=True)
    server = _cert("127.0.0.1", server_key, "kafka_py test CA", ca_key, ca=False)
    client = _cert("kafka_py client", client_key, "kafka_py test CA", ca_key, ca=False)
    return TlsFiles(
        ca=_write(directory / "ca.pem", _pem(ca)),
        server_cert=_write(directory / "server.pem", _pem(server)),
        server_key=_write(directory / "server.key", _key(server_key)),
        client_cert=_write(directory / "client.pem", _pem(client)),
        client_key=_write(directory / "client.key", _key(client_key, client_key_password)),
        client_key_password=client_key_password,
        other_ca=_write(directory / "other-ca.pem", _pem(other)),
    )
