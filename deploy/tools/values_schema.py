"""Write the chart's schema of `policy` and `quotas` from the models gpuadm loads them with.

`values.schema.json` is written by hand, except for these two values: each is
policy.yaml's or quotas.yaml's keys, checked at `helm install` by the JSON schema of the same
pydantic models `gpuadm serve` and `gpuadm check-config` read them with (`Policy`,
`QuotaConfig`), or the file's text, which the chart installs as written and its check Job
reads before anything else is installed (templates/config-check.yaml).

    python deploy/tools/values_schema.py          # write it
    python deploy/tools/values_schema.py --check  # exit 1 if the file is not what it writes
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from policies.policy import Policy
from policies.quota.quotas import QuotaConfig

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "deploy" / "helm" / "gpuadm" / "values.schema.json"
MODELS: dict[str, tuple[type[BaseModel], str]] = {
    "policy": (
        Policy,
        "policy.yaml (docs/configuration.md), as its keys or as its text, installed as "
        "written. Its keys are checked here by the models gpuadm loads them with; a text is "
        "checked whole by the check Job before anything is installed.",
    ),
    "quotas": (
        QuotaConfig,
        "quotas.yaml (docs/quota.md), as its keys or as its text, installed as written. Its "
        "keys are checked here by the models gpuadm loads them with; a text is checked whole "
        "by the check Job before anything is installed.",
    ),
}


def generated(schema: dict[str, Any]) -> dict[str, Any]:
    """Return `schema` with its `policy` and `quotas` parts made from the models."""
    definitions = {
        name: part
        for name, part in schema["definitions"].items()
        if name.split(".")[0] not in MODELS
    }
    for value, (model, description) in MODELS.items():
        part = model.model_json_schema(
            mode="validation", ref_template=f"#/definitions/{value}.{{model}}"
        )
        for name, definition in part.pop("$defs", {}).items():
            definitions[f"{value}.{name}"] = definition
        definitions[value] = part
        schema["properties"][value] = {
            "description": description,
            "anyOf": [{"type": "string"}, {"$ref": f"#/definitions/{value}"}],
        }
    schema["definitions"] = definitions
    return schema


def render() -> str:
    """The schema file as this script writes it."""
    return json.dumps(generated(json.loads(SCHEMA.read_text())), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if SCHEMA.read_text() != text:
            print(f"{SCHEMA}: not as the models make it; run {Path(__file__).name}")
            return 1
        return 0
    SCHEMA.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
