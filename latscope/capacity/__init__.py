"""`latscope capacity`: the highest open-loop rate at which every SLO of a scenario holds with
confidence, found in a bounded number of steps, and what a request costs there.

| module | holds |
| --- | --- |
| shape.py | a scenario's traffic scaled by one factor; its measured rate |
| search.py | the bracket: double until a fail, then bisect; the stop reasons and their exit codes |
| runner.py | the steps (each an ordinary run, judged by analysis/slo_confidence.py), capacity.json |
"""

from latscope.capacity.runner import CapacityOptions, StepStart, find_capacity
from latscope.capacity.search import STOPS

__all__ = ["STOPS", "CapacityOptions", "StepStart", "find_capacity"]
