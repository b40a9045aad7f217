"""The scenario: what to hit, with what traffic, for how long — the first record of the pipeline.

    scenario.yaml --load.py--> Scenario (schema.py and its sections) --plan.py--> Plan --> ...

| module | holds |
| --- | --- |
| base.py | the base model, durations, shared checks, the secret markers on fields, `ProblemAt` |
| protocols.py | one row per wire protocol (URL rules, defaults, client) and the `openai:`/`kserve:` options |
| target.py | `target:` (and `launch:`), and `Endpoint`, what one class resolves to |
| phases.py | `phases:` and their arrival processes |
| workload.py | `workload:`: classes, lengths, datasets, tensors |
| settings.py | `limits:`, `slos:`, `goodput:`, `output:`, `validity:` |
| telemetry.py | `telemetry:` |
| actions.py | `actions:` |
| schema.py | `Scenario`, the root, and the checks across sections |
| load.py | YAML (with line numbers) -> `--set` -> `${VAR}` -> validation, errors naming file:line:field |
| redact.py | secrets out of what is shown (scenario.yaml, errors, action records); the JSON Schema |
| gate_file.py | the gate file of `latscope gate --slo` (SLOs and the regression policy) |

This package imports nothing from latscope but `errors`: a scenario is data, and everything after it
(the plan, the engine, the analysis) reads it, never the other way round.
"""

from latscope.scenario.actions import ACTION_KINDS, Action, ActionWhen, HttpCall
from latscope.scenario.base import Duration, PositiveDuration
from latscope.scenario.load import apply_overrides, load_scenario, scenario_from_dict
from latscope.scenario.phases import (ARRIVAL_TYPES, Arrival, BurstArrival, ConstantArrival, IdleArrival, MmppArrival,
                                      Phase, PoissonArrival, RampArrival, Spacing, SpikeArrival, StepsArrival,
                                      TraceArrival, TraceLengths)
from latscope.scenario.protocols import PROTOCOLS, KServeOptions, OpenAIOptions, Protocol, ProtocolSpec
from latscope.scenario.redact import action_secrets, redacted_yaml, scenario_json_schema, scrub, secret_values
from latscope.scenario.schema import Scenario
from latscope.scenario.settings import Goodput, Limits, Output, Slo, Validity
from latscope.scenario.target import Endpoint, Launch, Target
from latscope.scenario.telemetry import PrometheusMetric, PrometheusSource, Telemetry
from latscope.scenario.workload import (LENGTH_DISTS, Dataset, EmpiricalLength, FixedLength, LengthDist,
                                        LognormalLength, NormalLength, TensorSpec, UniformLength, Workload,
                                        WorkloadClass, encoded_body)

__all__ = [
    "ACTION_KINDS", "ARRIVAL_TYPES", "LENGTH_DISTS", "PROTOCOLS",
    "Action", "ActionWhen", "Arrival", "BurstArrival", "ConstantArrival", "Dataset", "Duration", "EmpiricalLength",
    "Endpoint", "FixedLength", "Goodput", "HttpCall", "IdleArrival", "KServeOptions", "Launch", "LengthDist", "Limits",
    "LognormalLength", "MmppArrival", "NormalLength", "OpenAIOptions", "Output", "Phase", "PoissonArrival",
    "PositiveDuration", "PrometheusMetric", "PrometheusSource", "Protocol", "ProtocolSpec", "RampArrival", "Scenario",
    "Slo", "Spacing", "SpikeArrival", "StepsArrival", "Target", "Telemetry", "TensorSpec", "TraceArrival",
    "TraceLengths", "UniformLength", "Validity", "Workload", "WorkloadClass",
    "action_secrets", "apply_overrides", "encoded_body", "load_scenario", "redacted_yaml", "scenario_from_dict",
    "scenario_json_schema", "scrub", "secret_values",
]
