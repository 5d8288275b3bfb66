"""A directory updated the way the kubelet updates a mounted Secret."""

from __future__ import annotations

import os
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from certs import CertifiedKey, write_tls_dir

FILE_NAMES = ("ca.crt", "tls.crt", "tls.key")


def publish(volume: Path, *, ca: CertifiedKey, serving: CertifiedKey) -> None:
    """Publish a new version of the Secret into ``volume``.

    The files go into a new timestamped directory, the ``..data`` symlink is
    swapped to it in one rename, and the user-visible names are symlinks
    through ``..data``, so every one of them changes at the same instant.
    """
    volume.mkdir(parents=True, exist_ok=True)
    data = volume / "..data"
    previous = data.resolve() if data.is_symlink() else None
    stamp = datetime.now(UTC).strftime("..%Y_%m_%d_%H_%M_%S.")
    version = Path(tempfile.mkdtemp(dir=volume, prefix=stamp))
    write_tls_dir(version, ca=ca, serving=serving)
    staged = volume / "..data_tmp"
    staged.symlink_to(version.name)
    os.replace(staged, data)
    for name in FILE_NAMES:
        link = volume / name
        if not link.is_symlink():
            link.symlink_to(Path("..data") / name)
    if previous is not None:
        shutil.rmtree(previous)
