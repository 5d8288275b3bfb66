"""Where the apiserver is and how to authenticate to it, as the kubeconfig says."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Pods per page of a full list: large enough that 100,000 pods take 200 round trips, small
# enough that one page (about 5 MiB of typical pods) never strains the apiserver or us.
LIST_PAGE_SIZE = 500
# The API group of DRA's claims and templates. Both constants live here, in the module
# every client reads, so that a module needing only them imports neither client library.
RESOURCE_API = "/apis/resource.k8s.io/v1"


@dataclass(frozen=True)
class Endpoint:
    """Where the apiserver is and how to authenticate to it, as the kubeconfig says."""

    host: str
    ca_file: str | None
    cert_file: str | None
    key_file: str | None
    verify: bool
    authorization: Callable[[], str | None]

    def ssl_context(self) -> ssl.SSLContext | bool:
        """Return the TLS settings for the apiserver's address."""
        if not self.host.startswith("https"):
            return False
        context = ssl.create_default_context(cafile=self.ca_file)
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context


def file_or_none(path: str | None) -> str | None:
    """Return a path the kubeconfig named if the file is there, else None."""
    return path if path and Path(path).exists() else None
