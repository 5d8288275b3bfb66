"""The apiserver's credentials as the official client finds them, handed to the async client."""

from __future__ import annotations

import kubernetes.client

from webhook.kube.client import AUTHORIZATION_SECONDS, Kube


def rotating_client(tokens: list[str]) -> tuple[kubernetes.client.ApiClient, list[int]]:
    """A client whose refresh hook hands out the next token each time it runs (as a
    kubeconfig's hook reloads a rotated token file); and how often it ran."""
    configuration = kubernetes.client.Configuration()
    configuration.host = "https://apiserver.example:6443"
    configuration.api_key_prefix["authorization"] = "Bearer"
    configuration.api_key["authorization"] = "loaded"  # as the loader leaves it
    runs = [0]

    def refresh(config: kubernetes.client.Configuration) -> None:
        config.api_key["authorization"] = tokens[min(runs[0], len(tokens) - 1)]
        runs[0] += 1

    configuration.refresh_api_key_hook = refresh
    return kubernetes.client.ApiClient(configuration), runs


def test_the_header_is_built_through_the_refresh_hook_at_most_every_few_seconds() -> None:
    now = [100.0]
    client, runs = rotating_client(["first", "rotated"])
    endpoint = Kube(client, clock=lambda: now[0]).endpoint()

    assert endpoint.authorization() == "Bearer first"
    for _ in range(50):  # every call of a busy second: the hook runs once
        now[0] += AUTHORIZATION_SECONDS / 100
        assert endpoint.authorization() == "Bearer first"
    assert runs == [1]

    now[0] += AUTHORIZATION_SECONDS  # the token file was rotated meanwhile
    assert endpoint.authorization() == "Bearer rotated"
    assert runs == [2]


def test_a_client_without_a_token_sends_no_header() -> None:
    configuration = kubernetes.client.Configuration()
    configuration.host = "https://apiserver.example:6443"
    endpoint = Kube(kubernetes.client.ApiClient(configuration)).endpoint()
    assert endpoint.authorization() is None
    assert endpoint.host == "https://apiserver.example:6443"
