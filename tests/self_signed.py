"""Certificates for 127.0.0.1 that no CA bundle on the machine trusts: for the
tests of TLS endpoints and proxies that only the user's own client trusts."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path
from typing import Any


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key: (certificate, key) files."""
    key = _key()
    certificate = _certificate(key, key, ca=True)
    return _write(directory, certificate, key)


def issued_by_a_private_ca(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 issued by a CA made for it and thrown away:
    (certificate, key) files. A client trusts it only by pinning it (its store
    holding the certificate itself, with ``VERIFY_X509_PARTIAL_CHAIN``)."""
    ca_key, key = _key(), _key()
    certificate = _certificate(key, ca_key, ca=False, issuer="a private CA")
    return _write(directory, certificate, key)


def _key() -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _certificate(key: Any, signer: Any, *, ca: bool, issuer: str = "127.0.0.1") -> Any:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .sign(signer, hashes.SHA256())
    )


def _write(directory: Path, certificate: Any, key: Any) -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization

    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path
