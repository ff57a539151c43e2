"""Where the shipped router-policy files are: ``policies/`` of a checkout (an editable install
reads it through the package's ``policies`` link to it) or the copy a wheel ships in the
package."""

from __future__ import annotations

from pathlib import Path

POLICY_DIR = (Path(__file__).resolve().parent / "policies").resolve()
# Dynamo's parameter set only: the file both Dynamo's builtin plugin and ours read.
PARITY_POLICY = POLICY_DIR / "thunderagent.yaml"
# Our mechanisms on top; what arm `ours` runs unless told otherwise.
EXTENDED_POLICY = POLICY_DIR / "thunderagent-extended.yaml"
