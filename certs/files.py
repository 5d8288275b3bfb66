"""TLS files on disk: writing them, serving them, and picking up new ones."""

from __future__ import annotations

import hashlib
import os
import ssl
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TypeAlias

from certs.material import CertifiedKey, load_certified_key

StrPath: TypeAlias = str | os.PathLike[str]


@dataclass(frozen=True)
class TLSPaths:
    """Where ``write_tls_dir`` put the CA, the serving certificate and its key."""

    ca_file: Path
    cert_file: Path
    key_file: Path


def write_tls_dir(directory: StrPath, *, ca: CertifiedKey, serving: CertifiedKey) -> TLSPaths:
    """Write ``ca.crt``, ``tls.crt`` and ``tls.key`` into ``directory``.

    The names are those of a mounted ``kubernetes.io/tls`` Secret plus
    ``ca.crt``. Each file is replaced atomically, so a reader sees either the
    old or the new content of a file, never a part of it. The key is
    written before the certificate; a reader that catches the pair in
    between finds a mismatch and must keep what it has.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    paths = TLSPaths(root / "ca.crt", root / "tls.crt", root / "tls.key")
    _replace(paths.ca_file, ca.cert_pem, mode=0o644)
    _replace(paths.key_file, serving.key_pem, mode=0o600)
    _replace(paths.cert_file, serving.cert_pem, mode=0o644)
    return paths


def server_ssl_context(
    cert_file: StrPath, key_file: StrPath, *, client_ca_file: StrPath | None = None
) -> ssl.SSLContext:
    """Build the TLS server context the webhook listens with.

    With ``client_ca_file``, a client that presents a certificate must present one signed
    by that CA, or the handshake fails. Presenting none stays possible at this layer, so
    that health probes and metric scrapes, which have no certificate, still connect; the
    server decides per path whether a verified certificate is required
    (``peer_certificate_verified``).
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # HTTP/1.1 only, the one protocol the webhook serves: the apiserver, which would take
    # HTTP/2 if offered it, then calls over HTTP/1.1 (docs/security.md, "HTTP/1.1 only").
    context.set_alpn_protocols(["http/1.1"])
    # No session tickets: the apiserver never resumes a session (client-go keeps no session
    # cache), so each would be made for nothing, and making one holds the client's
    # certificate: it more than doubled the server's share of a handshake with one. A burst
    # makes the apiserver open a connection, and so a handshake, for most of its calls.
    context.num_tickets = 0
    context.options |= ssl.OP_NO_TICKET
    context.load_cert_chain(cert_file, key_file)
    if client_ca_file is not None:
        context.verify_mode = ssl.CERT_OPTIONAL
        context.load_verify_locations(cafile=client_ca_file)
    return context


def peer_certificate_verified(peer_certificate: object) -> bool:
    """Tell whether a connection's peer presented a certificate the context verified.

    Takes what ``getpeercert()`` returned: a non-empty dict only for a verified certificate.
    """
    return isinstance(peer_certificate, dict) and bool(peer_certificate)


class CertificateReloader:
    """Swap the certificate of a live ``ssl.SSLContext`` when its files change.

    ``load_cert_chain`` on the same context object makes every later handshake
    of a running server present the new certificate, while connections already
    open keep the one they started with.

    Changes are found by comparing a digest of the files' bytes, not their
    modification time or file events: a mounted Secret is updated by swapping
    the ``..data`` symlink to a new directory, which leaves the ``tls.crt``
    link itself untouched and is missed by watchers of that path.
    """

    def __init__(self, context: ssl.SSLContext, cert_file: StrPath, key_file: StrPath) -> None:
        """Load the current pair into ``context``; raise if it is not valid."""
        self._context = context
        self._cert_file = Path(cert_file)
        self._key_file = Path(key_file)
        cert_pem, key_pem = self._read()
        self._loaded = load_certified_key(cert_pem, key_pem)
        self._load(self._loaded)
        self._digest = _digest(cert_pem, key_pem)
        self.last_error: str | None = None

    @property
    def not_after(self) -> datetime:
        """Return the expiry of the certificate the context presents now."""
        return self._loaded.not_after

    def check(self) -> bool:
        """Load the files into the context if their content changed and is valid.

        Returns True if a new certificate was loaded. Never raises for a bad
        or half-written pair: the old certificate stays in use, the reason
        goes to ``last_error`` and the next call tries again.
        """
        try:
            cert_pem, key_pem = self._read()
        except OSError as exc:
            self.last_error = f"cannot read the certificate files: {exc}"
            return False
        digest = _digest(cert_pem, key_pem)
        if digest == self._digest:
            self.last_error = None
            return False
        try:
            candidate = load_certified_key(cert_pem, key_pem)
        except ValueError as exc:
            self.last_error = f"kept the certificate in use; the new files are not a pair: {exc}"
            return False
        try:
            self._load(candidate)
        except OSError as exc:
            self.last_error = f"kept the certificate in use; loading the new pair failed: {exc}"
            # A failed load_cert_chain may already have put in the new
            # certificate and dropped the old key; restore the known-good pair.
            self._load(self._loaded)
            return False
        self._loaded, self._digest, self.last_error = candidate, digest, None
        return True

    def _read(self) -> tuple[bytes, bytes]:
        # The two reads may straddle a Secret update and return halves of two
        # different pairs; validation then refuses them until the next call.
        return self._cert_file.read_bytes(), self._key_file.read_bytes()

    def _load(self, pair: CertifiedKey) -> None:
        # load_cert_chain only takes paths. Loading from a private copy of the
        # bytes just validated, rather than from the watched files, rules out
        # loading a newer, unvalidated pair that landed in between.
        with tempfile.TemporaryDirectory(prefix="gpuadm-tls-") as private_dir:
            combined = Path(private_dir) / "tls.pem"
            fd = os.open(combined, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(pair.cert_pem + b"\n" + pair.key_pem)
            self._context.load_cert_chain(combined)


def _digest(cert_pem: bytes, key_pem: bytes) -> bytes:
    return hashlib.sha256(cert_pem + b"\0" + key_pem).digest()


def _replace(path: Path, data: bytes, *, mode: int) -> None:
    # mkstemp creates the file 0600, so the key is never readable by others,
    # not even for the moment before the chmod.
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), mode)
            out.write(data)
            out.flush()
            # Durable before visible: after a crash the name points to the
            # whole new content or to the old one.
            os.fsync(out.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
