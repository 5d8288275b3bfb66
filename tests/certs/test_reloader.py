"""Picking up new certificate files into a live server context."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import pytest

from certs import (
    CertificateReloader,
    CertifiedKey,
    KeyMismatchError,
    TLSPaths,
    server_ssl_context,
    write_tls_dir,
)
from tests.certs.factory import make_serving, wall_clock_pair
from tests.certs.handshake import presented_certificate


@dataclass
class Served:
    """A server context with its reloader, and the pairs it starts with and moves to."""

    paths: TLSPaths
    context: ssl.SSLContext
    reloader: CertificateReloader
    ca: CertifiedKey
    old: CertifiedKey
    new: CertifiedKey

    def presented(self) -> bytes:
        """Return the certificate a new handshake is shown."""
        return presented_certificate(self.context, self.ca.cert_pem)


@pytest.fixture
def served(tmp_path: Path) -> Served:
    ca, old = wall_clock_pair()
    paths = write_tls_dir(tmp_path, ca=ca, serving=old)
    context = server_ssl_context(paths.cert_file, paths.key_file)
    reloader = CertificateReloader(context, paths.cert_file, paths.key_file)
    # Made on a clock a few minutes behind, the new certificate expires at
    # another instant than the old one, so ``not_after`` tells them apart.
    new = make_serving(ca, now=old.not_before)
    return Served(paths, context, reloader, ca, old, new)


def test_unchanged_files_are_not_reloaded(served: Served) -> None:
    assert served.reloader.check() is False
    assert served.reloader.last_error is None
    assert served.reloader.not_after == served.old.not_after
    assert served.presented() == served.old.cert_pem


def test_changed_files_are_loaded_into_the_same_context(served: Served) -> None:
    write_tls_dir(served.paths.cert_file.parent, ca=served.ca, serving=served.new)

    assert served.reloader.check() is True
    assert served.reloader.check() is False
    assert served.presented() == served.new.cert_pem
    assert served.reloader.not_after == served.new.not_after


@pytest.mark.parametrize(
    ("cert", "key", "reason"),
    [
        pytest.param("new", "old", "does not match the certificate", id="new-cert-old-key"),
        pytest.param("old", "new", "does not match the certificate", id="old-cert-new-key"),
        pytest.param("half-new", "new", "not a valid PEM certificate", id="cert-cut-short"),
        pytest.param("new", "empty", "not a valid unencrypted PEM", id="key-still-empty"),
        pytest.param("new", "missing", "cannot read the certificate files", id="key-missing"),
    ],
)
def test_half_written_update_is_refused_then_taken_once_complete(
    served: Served, cert: str, key: str, reason: str
) -> None:
    contents = {
        "old": (served.old.cert_pem, served.old.key_pem),
        "new": (served.new.cert_pem, served.new.key_pem),
        "half-new": (served.new.cert_pem[: len(served.new.cert_pem) // 2], b""),
        "empty": (b"", b""),
    }
    served.paths.cert_file.write_bytes(contents[cert][0])
    if key == "missing":
        served.paths.key_file.unlink()
    else:
        served.paths.key_file.write_bytes(contents[key][1])

    assert served.reloader.check() is False
    assert served.reloader.last_error is not None
    assert reason in served.reloader.last_error
    assert served.presented() == served.old.cert_pem
    assert served.reloader.not_after == served.old.not_after
    assert served.reloader.check() is False, "an unusable pair is retried, never taken"

    write_tls_dir(served.paths.cert_file.parent, ca=served.ca, serving=served.new)

    assert served.reloader.check() is True
    assert served.reloader.last_error is None
    assert served.presented() == served.new.cert_pem


def test_files_restored_to_the_loaded_pair_clear_the_error(served: Served) -> None:
    served.paths.key_file.write_bytes(served.new.key_pem)
    served.reloader.check()

    served.paths.key_file.write_bytes(served.old.key_pem)

    assert served.reloader.check() is False
    assert served.reloader.last_error is None


def test_a_failed_load_leaves_the_old_certificate_served(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Loading a certificate with a key that is not its own makes OpenSSL keep
    # the new certificate and drop the key: the context could then complete
    # no handshake at all. The first load after the change fails that way.
    stray = write_tls_dir(tmp_path / "stray", ca=served.ca, serving=served.new)
    stray.key_file.write_bytes(served.old.key_pem)
    real_load = served.context.load_cert_chain
    calls: list[str] = []

    def load_that_fails_once(certfile: str, keyfile: str | None = None) -> None:
        calls.append(certfile)
        if len(calls) == 1:
            real_load(stray.cert_file, stray.key_file)
        real_load(certfile, keyfile)

    monkeypatch.setattr(served.context, "load_cert_chain", load_that_fails_once)
    write_tls_dir(served.paths.cert_file.parent, ca=served.ca, serving=served.new)

    assert served.reloader.check() is False
    assert served.reloader.last_error is not None
    assert "loading the new pair failed" in served.reloader.last_error
    assert served.presented() == served.old.cert_pem
    assert served.reloader.not_after == served.old.not_after


def test_reloader_refuses_to_start_from_a_mismatched_pair(served: Served) -> None:
    served.paths.key_file.write_bytes(served.new.key_pem)

    with pytest.raises(KeyMismatchError):
        CertificateReloader(served.context, served.paths.cert_file, served.paths.key_file)
