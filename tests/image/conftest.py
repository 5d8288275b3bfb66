"""Fixtures of the image tests: the image, built once per session by ``image/build.sh``."""

from __future__ import annotations

import pytest

from tests.image.container import BuiltImage, ImageError, build_image


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``image`` marker."""
    config.addinivalue_line(
        "markers",
        "image: builds the gpuadm image (mmdebstrap, buildah) and runs it with umoci and runc",
    )


@pytest.fixture(scope="session")
def image() -> BuiltImage:
    """Return the built image; fail, never skip, when it cannot be built."""
    try:
        return build_image()
    except ImageError as error:
        pytest.fail(str(error), pytrace=False)
