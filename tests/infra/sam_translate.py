"""Print a SAM template as the SAM translator turns it into CloudFormation, as JSON on stdout.

Run with the python of aws-sam-cli's venv (it ships ``samtranslator``), so the project's venv needs no copy of it:
``.tools/sam/bin/python tests/infra/sam_translate.py template.yaml``. Like ``sam validate``, local code and layer
paths are swapped for a placeholder S3 URI first (the translator accepts only S3 locations); nothing reaches AWS.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from boto3.session import Session
from samtranslator.parser.parser import Parser
from samtranslator.translator.translator import Translator
from samtranslator.yaml_helper import yaml_parse

PLACEHOLDER_CODE_URI = "s3://inferq-placeholder/code.zip"


def translate(path: Path, region: str = "us-east-1") -> dict[str, Any]:
    template = yaml_parse(path.read_text())
    for resource in template.get("Resources", {}).values():
        if resource.get("Type") == "AWS::Serverless::Function":
            properties = resource.setdefault("Properties", {})
            if isinstance(properties.get("CodeUri"), str) and not properties["CodeUri"].startswith("s3://"):
                properties["CodeUri"] = PLACEHOLDER_CODE_URI
        if resource.get("Type") == "AWS::Serverless::LayerVersion":  # a generated registry layer (infra/registry)
            properties = resource.setdefault("Properties", {})
            if isinstance(properties.get("ContentUri"), str) and not properties["ContentUri"].startswith("s3://"):
                properties["ContentUri"] = PLACEHOLDER_CODE_URI
    translator = Translator(
        managed_policy_map=None, sam_parser=Parser(), plugins=[], boto_session=Session(region_name=region)
    )
    return translator.translate(sam_template=template, parameter_values={}, get_managed_policy_map=lambda: {})


if __name__ == "__main__":
    json.dump(translate(Path(sys.argv[1])), sys.stdout, indent=1, default=str)
