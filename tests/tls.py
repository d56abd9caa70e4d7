"""Client certificates of a throwaway CA, for the tests of mutual TLS: one that no broker of
the suite trusts, whatever name it carries."""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def client_certificate(folder: Path, common_name: str,
                       key_password: str = "") -> tuple[Path, Path]:
    """A client certificate for `common_name` with the subject deploy/local/kafka.sh gives its
    principals (O=ClusterWarden, OU=kafka-client), signed by a CA made for it alone; its
    key encrypted with `key_password` if given. Returns the PEM files (certificate, key)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    # The same name as the script's CA: only its key tells the two apart.
    issuer = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ClusterWarden local CA")])
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "ClusterWarden"),
                         x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "kafka-client"),
                         x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(key_password.encode()) if key_password
        else serialization.NoEncryption())
    cert_file = folder / f"{common_name}.pem"
    key_file = folder / f"{common_name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8, encryption))
    key_file.chmod(0o600)
    return cert_file, key_file
