"""A certificate authority made for one test, and a server certificate it signs.

What a team with its own CA hands out: the CA's certificate (members trust it, e.g. the light
client with ``SSL_CERT_FILE``), and for the proxy a certificate for its names with the key.
Headless Chromium is told to accept the server's key by its SPKI hash
(``--ignore-certificate-errors-spki-list``), which pins that one key rather than trusting the CA
for every name. Keys are ECDSA P-256; everything lives one hour.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TestTls", "make_tls"]


@dataclass(frozen=True)
class TestTls:
    """The files :func:`make_tls` wrote and the server key's pin.

    Attributes:
        ca: the CA's certificate (PEM).
        cert: the server's certificate followed by the CA's (PEM; what a proxy serves).
        key: the server's private key (PEM, unencrypted, 0600).
        spki: base64 SHA-256 of the server certificate's SubjectPublicKeyInfo (Chromium's pin).
    """

    __test__ = False  # not a pytest class

    ca: Path
    cert: Path
    key: Path
    spki: str


def make_tls(folder: Path, names: Sequence[str], ips: Sequence[str] = ()) -> TestTls:
    """Make a CA and a certificate for ``names`` (and ``ips``) signed by it, in ``folder``.

    Args:
        folder: where the files go (made if missing).
        names: the DNS names the server certificate holds.
        ips: IP addresses it holds too.

    Returns:
        The files and the pin.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    life = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(hours=1))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedtune test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(life[0])
        .not_valid_after(life[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    alt = [x509.DNSName(n) for n in names] + [x509.IPAddress(ipaddress.ip_address(a)) for a in ips]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(life[0])
        .not_valid_after(life[1])
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    paths = TestTls(folder / "ca.pem", folder / "server.pem", folder / "server.key", "")
    paths.ca.write_bytes(ca.public_bytes(pem))
    paths.cert.write_bytes(cert.public_bytes(pem) + ca.public_bytes(pem))
    paths.key.touch(mode=0o600)
    paths.key.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    spki = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    pin = base64.b64encode(hashlib.sha256(spki).digest()).decode()
    return TestTls(paths.ca, paths.cert, paths.key, pin)
