"""Router-policy YAML: Dynamo's schema, strict at every level, errors that name the key."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dynamo_thunderagent.catalog import (
    PluginError,
    builtin_catalog,
    load_policy,
)
from dynamo_thunderagent.classifier import ThunderAgentClassifier
from dynamo_thunderagent.cli import main
from dynamo_thunderagent.config import PolicyError
from dynamo_thunderagent.parameters import ThunderAgentParameters

REPO = Path(__file__).resolve().parents[2]
DEFAULT_POLICY = REPO / "policies" / "thunderagent.yaml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


def test_default_policy_resolves_with_dynamo_defaults() -> None:
    resolved = load_policy(DEFAULT_POLICY)
    assert resolved.classifier is not None
    assert resolved.classifier.parameters == ThunderAgentParameters()
    assert resolved.stages["aggregated"].name == "ta"


def test_default_policy_uses_only_parameters_dynamo_knows() -> None:
    import yaml

    data = yaml.safe_load(DEFAULT_POLICY.read_text())
    assert set(data["request_classifier"]["parameters"]) <= set(ThunderAgentParameters.model_fields)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("request_classifier: {type: thunderagent}\nextra: 1\n", "extra: unknown key"),
        ("request_classifier: {type: thunderagent, params: {}}\n", "params: unknown key"),
        ("worker_selection: {instances: [{name: a, type: thunderagent, x: 1}]}\n",
         "x: unknown key"),
        ("worker_selection: {instances: [], aggregated: ta}\n",
         "'ta' is not a configured instance"),
        ("worker_selection: {instances: [{name: default, type: thunderagent}]}\n", "reserved"),
        ("worker_selection: {instances: [{name: a, type: thunderagent}, "
         "{name: a, type: thunderagent}]}\n", "unique"),
        ("request_classifier: {type: nope}\n", "registered types: ['thunderagent']"),
        ("request_classifier: {type: thunderagent, parameters: {pause_treshold: 0.9}}\n",
         "pause_treshold: unknown key"),
        ("request_classifier: {type: thunderagent, parameters: {pause_threshold: 1.5}}\n",
         "pause_threshold: Input should be less than or equal to 1"),
        ("request_classifier: {type: thunderagent, parameters: {pause_target: 0.99}}\n",
         "pause_target (0.99) must be <= pause_threshold"),
        ("request_classifier: {type: thunderagent, parameters: {resume_timeout_seconds: 0}}\n",
         "resume_timeout_seconds: Input should be greater than 0"),
        ("request_classifier: {type: thunderagent, parameters: {aging_makes_room: true}}\n",
         "aging_makes_room needs max_wait_seconds"),
        ("request_classifier: {type: thunderagent, parameters: {aging_makes_room: true, "
         "max_wait_seconds: 60, pause_rule: upstream}}\n",
         "aging_makes_room works with pause_rule parity only"),
        ("request_classifier: {type: thunderagent, parameters: {acting_decay_tau_seconds: .inf}}\n",
         "acting_decay_tau_seconds"),
        ("request_classifier: {type: thunderagent, parameters: {max_tracked_requests: 0}}\n",
         "max_tracked_requests"),
        ("request_classifier: {type: thunderagent, parameters: {pause_threshold: \"0.9\"}}\n",
         "pause_threshold: Input should be a valid number"),
        ("request_classifier: {type: thunderagent, parameters: {pause_threshold: true}}\n",
         "pause_threshold: Input should be a valid number"),
        ("request_classifier: {type: thunderagent, parameters: {buffer_per_program: 1.5}}\n",
         "buffer_per_program: Input should be a valid integer"),
        ("request_classifier: {type: thunderagent, parameters: "
         "{scheduler_interval_seconds: 1.0e-9}}\n",
         "scheduler_interval_seconds: Input should be greater than or equal to 0.01"),
        ("request_classifier: {type: thunderagent, parameters: "
         "{session_retention_seconds: 1.0e+12}}\n",
         "session_retention_seconds: Input should be less than or equal to 604800"),
        ("request_classifier: {type: thunderagent, parameters: {max_tracked_requests: 1e99}}\n",
         "max_tracked_requests"),
        ("request_classifier: {type: thunderagent, parameters: {resume_on_events: \"yes\"}}\n",
         "resume_on_events: Input should be a valid boolean"),
        ("request_classifier: {type: thunderagent, parameters: {sessionless_kv: keep}}\n",
         "sessionless_kv: Input should be 'ignore' or 'reserve'"),
        ("request_classifier: {type: thunderagent, parameters: "
         "{sessionless_kv_full_loss: 0.1}}\n",
         "sessionless_kv_full_loss scales the room reserved for requests without a session "
         "id, which sessionless_kv: ignore does not reserve"),
        ("request_classifier: {type: thunderagent, parameters: "
         "{sessionless_kv: reserve, sessionless_kv_full_loss: 0}}\n",
         "sessionless_kv_full_loss: Input should be greater than 0"),
        ("request_classifier: {type: thunderagent, parameters: {pause_threshold: 0.9}}\n"
         "request_classifier: {type: thunderagent}\n",
         "key 'request_classifier' appears twice (lines 1 and 2)"),
        ("request_classifier:\n  type: thunderagent\n  parameters:\n"
         "    buffer_per_program: 10\n    buffer_per_program: 20\n",
         "key 'buffer_per_program' appears twice"),
        ("", "the policy is empty"),
        ("# only a comment\n", "the policy is empty"),
        ("{}\n", "the policy is empty"),
        ("- a list\n", "top level must be a mapping"),
        ("request_classifier: [\n", "not valid YAML"),
    ],
)
def test_bad_policy_fails_at_load_time_naming_file_and_key(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(PolicyError) as error:
        load_policy(path)
    assert str(path) in str(error.value)
    assert expected in str(error.value)


def test_unknown_parameter_error_lists_the_allowed_parameters(tmp_path: Path) -> None:
    path = write(tmp_path, "request_classifier: {type: thunderagent, parameters: {bogus: 1}}\n")
    with pytest.raises(PolicyError, match="accepts parameters: pause_threshold"):
        load_policy(path)


SELECTOR = ("worker_selection: {{instances: [{{name: ta, type: thunderagent, parameters: "
            "{{preferred_load_slack: {}}}}}], aggregated: ta}}\n")


@pytest.mark.parametrize("value", ["-0.1", "101", "'0.5'", "true"])
def test_a_bad_preferred_load_slack_is_refused_naming_the_key(tmp_path: Path,
                                                             value: str) -> None:
    path = write(tmp_path, SELECTOR.format(value))
    with pytest.raises(PolicyError, match="preferred_load_slack") as error:
        load_policy(path)
    assert str(path) in str(error.value)


def test_the_selectors_parameters_are_listed_when_one_is_unknown(tmp_path: Path) -> None:
    path = write(tmp_path, SELECTOR.replace("preferred_load_slack", "slack").format(1))
    with pytest.raises(PolicyError, match="accepts parameters: preferred_load_slack"):
        load_policy(path)
    assert load_policy(write(tmp_path, SELECTOR.format(0.5))).stages[
        "aggregated"].parameters.model_dump() == {"preferred_load_slack": 0.5}


def test_validate_prints_resolved_config_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(DEFAULT_POLICY)]) == 0
    out = capsys.readouterr().out
    assert '"pause_threshold": 0.95' in out and '"aggregated"' in out


def test_validate_names_unknown_parameter_and_exits_nonzero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "request_classifier: {type: thunderagent, parameters: {bogus: 1}}\n")
    assert main(["validate", str(path)]) != 0
    err = capsys.readouterr().err
    assert str(path) in err and "bogus" in err


@pytest.mark.parametrize("text", [
    "request_classifier: {type: thunderagent}\n",
    "worker_selection:\n  instances: [{name: ta, type: thunderagent}]\n  aggregated: ta\n",
    "request_classifier: {type: thunderagent}\nworker_selection:\n"
    "  instances: [{name: ta, type: thunderagent}]\n  decode: ta\n",
])
def test_validate_refuses_what_serve_refuses(
    tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A file without a classifier or an aggregated stage passes the schema, but serve (and
    # a reload) refuse it; validate used to print it resolved and exit 0.
    assert main(["validate", str(write(tmp_path, text))]) == 2
    assert "the router needs request_classifier and worker_selection.aggregated" in (
        capsys.readouterr().err)


def test_validate_missing_file_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "/nonexistent/policy.yaml"]) != 0
    assert "cannot read policy file" in capsys.readouterr().err


# ---- catalog --------------------------------------------------------------------
def test_thunderagent_is_registered_for_both_roles() -> None:
    catalog = builtin_catalog()
    assert catalog.request_classifiers.names() == ["thunderagent"]
    assert catalog.worker_selectors.names() == ["thunderagent"]


@pytest.mark.parametrize("name", ["", "   ", "default", "thunderagent"])
def test_catalog_refuses_empty_reserved_and_duplicate_names(name: str) -> None:
    catalog = builtin_catalog()
    with pytest.raises(PluginError):
        catalog.request_classifiers.register(name, ThunderAgentClassifier)


def test_catalog_refuses_a_type_of_the_wrong_role() -> None:
    catalog = builtin_catalog()
    with pytest.raises(PluginError, match="subclass"):
        catalog.worker_selectors.register("mine", ThunderAgentClassifier)  # type: ignore[arg-type]


def test_unknown_type_lists_registered_types() -> None:
    expected = r"unknown type 'x'; registered types: \['thunderagent'\]"
    with pytest.raises(PluginError, match=expected):
        builtin_catalog().request_classifiers.get("x")


def test_a_huge_policy_file_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    import time

    path = tmp_path / "huge.yaml"
    with open(path, "w") as handle:
        handle.write("request_classifier: {type: thunderagent}\nunknown:\n")
        line = "  - " + "x" * 1000 + "\n"
        for _ in range(50_000):  # 50 MB under an unknown key
            handle.write(line)
    started = time.monotonic()
    with pytest.raises(PolicyError, match="larger than 64 KiB"):
        load_policy(path)
    assert time.monotonic() - started < 5  # refused by its size, not after parsing it


@pytest.mark.parametrize("kind", ["a FIFO", "a directory", "a character device"])
def test_a_policy_path_that_is_not_a_regular_file_is_refused_without_reading_it(
        tmp_path: Path, kind: str) -> None:
    # A FIFO nobody writes to used to block the read for ever: on a reload, that froze
    # the router's event loop and with it every request.
    import os
    import threading

    path = tmp_path / "policy.yaml"
    if kind == "a FIFO":
        os.mkfifo(path)
    elif kind == "a directory":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")
    outcome: list[BaseException] = []
    reader = threading.Thread(target=lambda: outcome.append(_raises(load_policy, path)),
                              daemon=True)
    reader.start()
    reader.join(5)
    assert outcome, "the read blocked"
    assert isinstance(outcome[0], PolicyError)
    assert f"not a regular file ({kind})" in str(outcome[0])


def _raises(call: Callable[..., object], *args: object) -> BaseException:
    try:
        call(*args)
    except BaseException as error:  # the test looks at what it was
        return error
    raise AssertionError("no error")


def test_a_policy_that_is_not_utf8_says_so(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"request_classifier: {type: thunderagent}  # caf\xe9\n")
    with pytest.raises(PolicyError, match="not UTF-8"):
        load_policy(path)


def test_yaml_merge_keys_still_work_and_odd_keys_get_a_yaml_error(tmp_path: Path) -> None:
    merged = write(tmp_path, "base: &base {type: thunderagent}\n"
                             "request_classifier:\n  <<: *base\n  parameters: {}\n")
    with pytest.raises(PolicyError, match="base: unknown key"):
        load_policy(merged)  # the merge worked; only the helper key is unknown
    odd = tmp_path / "odd.yaml"
    odd.write_text("? [a, b]\n: 1\n")
    with pytest.raises(PolicyError, match="not valid YAML"):
        load_policy(odd)


# YAML 1.1 (PyYAML's default) reads these as text, which a strict number field refuses;
# Dynamo's loader and YAML 1.2 read them as numbers.
EXPONENT_NUMBERS = [
    ("acting_decay_tau_seconds", "1e12", 1e12),
    ("resume_timeout_seconds", "2.5e3", 2500.0),
    ("pause_threshold", "9.5E-1", 0.95),
    ("acting_decay_tau_seconds", ".5e3", 500.0),
    ("resume_timeout_seconds", "+1e3", 1000.0),
    ("session_retention_seconds", "1.e3", 1000.0),
]


@pytest.mark.parametrize(("key", "text", "value"), EXPONENT_NUMBERS)
def test_numbers_in_exponent_form_are_numbers_as_in_yaml_1_2(
    tmp_path: Path, key: str, text: str, value: float
) -> None:
    path = write(tmp_path, "request_classifier:\n  type: thunderagent\n  parameters:\n"
                           f"    {key}: {text}\n")
    params = load_policy(path).classifier.parameters
    assert isinstance(params, ThunderAgentParameters)
    assert getattr(params, key) == value


def test_an_exponent_number_is_no_integer_and_a_near_miss_stays_text(tmp_path: Path) -> None:
    # An integer field still wants an integer.
    whole = write(tmp_path, "request_classifier: {type: thunderagent, parameters: "
                            "{max_tracked_requests: 1e4}}\n")
    with pytest.raises(PolicyError, match="max_tracked_requests: Input should be a valid integer"):
        load_policy(whole)
    # Only numbers: a word that merely starts like one stays text.
    odd = write(tmp_path, "request_classifier: {type: thunderagent, parameters: "
                          "{pause_threshold: 1e12x}}\n")
    with pytest.raises(PolicyError, match="pause_threshold: Input should be a valid number"):
        load_policy(odd)


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ("{pause_threshold: 2}", "pause_threshold: Input should be less than or equal to 1 "
         "(got 2; allowed: number in [0, 1])"),
        ("{buffer_per_program: -3}", "(got -3; allowed: integer in [0, 10,000,000])"),
        ("{max_wait_seconds: 0}", "(got 0; allowed: off, or number in (0, 604,800])"),
        ("{placement: nearest}", "allowed: least_used, least_busy)"),
        ("{resume_on_events: 1}", "(got 1; allowed: true, false)"),
    ],
)
def test_a_bad_value_says_what_its_key_accepts(tmp_path: Path, parameters: str,
                                                expected: str) -> None:
    policy = f"request_classifier: {{type: thunderagent, parameters: {parameters}}}\n"
    path = write(tmp_path, policy)
    with pytest.raises(PolicyError) as error:
        load_policy(path)
    assert expected in str(error.value)
    assert "accepts parameters" not in str(error.value)  # only for an unknown key


def test_an_unknown_key_names_the_closest_known_one(tmp_path: Path) -> None:
    path = write(tmp_path, "request_classifier: {type: thunderagent, "
                 "parameters: {pause_threshhold: 0.9}}\n")
    with pytest.raises(PolicyError, match="unknown key \\(did you mean 'pause_threshold'\\?\\)"):
        load_policy(path)


def test_a_yaml_error_points_at_the_line_without_naming_a_string(tmp_path: Path) -> None:
    path = write(tmp_path, "request_classifier:\n  type: thunderagent\n  parameters:\n"
                 "    pause_threshold: [1\n")
    with pytest.raises(PolicyError) as error:
        load_policy(path)
    message = str(error.value)
    assert message.startswith(f"{path}: not valid YAML") and "at line 4, column 22" in message
    assert "<unicode string>" not in message
