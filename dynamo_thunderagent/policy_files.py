"""Where the shipped router-policy files are (in a checkout or an editable install)."""

from __future__ import annotations

from pathlib import Path

POLICY_DIR = Path(__file__).resolve().parents[1] / "policies"
# Dynamo's parameter set only: the file both Dynamo's builtin plugin and ours read.
PARITY_POLICY = POLICY_DIR / "thunderagent.yaml"
# Our mechanisms on top; what arm `ours` runs unless told otherwise.
EXTENDED_POLICY = POLICY_DIR / "thunderagent-extended.yaml"
