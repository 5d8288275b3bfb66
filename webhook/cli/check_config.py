"""`gpuadm check-config`: validate policy and quota files, or ConfigMaps holding them."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from policies import ConfigError, load_policy, load_quotas, policy_warnings
from webhook.cli.exits import ExitCode


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `gpuadm check-config` to the command line."""
    check = sub.add_parser("check-config", help="validate policy and quota files")
    check.add_argument("files", type=Path, nargs="+", help="policy.yaml, quotas.yaml or ConfigMaps")
    check.set_defaults(run=run)


def run(args: argparse.Namespace) -> ExitCode:
    """Validate each file; print every problem, or a line saying all is well.

    Warnings (a valid policy that may not do what its author meant) do not fail the check.
    """
    problems: list[str] = []
    policies, quotas = [], []
    for path in args.files:
        try:
            for key, text in _config_texts(path):
                source = f"{path}[{key}]" if key else str(path)
                if _is_policy(key, text):
                    policies.append(load_policy(text, source=source))
                else:
                    quotas.append((source, load_quotas(text, source=source)))
        except ConfigError as error:
            problems += error.problems
        except (OSError, yaml.YAMLError) as error:
            problems.append(f"{path}: {error}")
    for policy in policies:
        for source, quota in quotas:
            problems += [f"{source}: {problem}" for problem in quota.unknown_classes(policy)]
    for problem in problems:
        print(problem)
    for policy in policies:
        for warning in policy_warnings(policy):
            print(f"warning: {warning}")
    if problems:
        return ExitCode.REFUSED
    print(f"ok: {len(policies)} policy and {len(quotas)} quota config(s) are valid")
    return ExitCode.OK


def _config_texts(path: Path) -> list[tuple[str, str]]:
    """Return (key, text) of each config in a file: itself, or the data of a ConfigMap."""
    text = path.read_text()
    document = yaml.safe_load(text)
    if isinstance(document, dict) and document.get("kind") == "ConfigMap":
        data = document.get("data") or {}
        return [(key, str(value)) for key, value in data.items() if key.endswith((".yaml", ".yml"))]
    return [("", text)]


def _is_policy(key: str, text: str) -> bool:
    if key:
        return key.startswith("policy")
    document = yaml.safe_load(text)
    return isinstance(document, dict) and "classes" in document
