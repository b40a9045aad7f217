"""`latscope capacity`: the highest open-loop rate at which every SLO of a scenario holds with
confidence, found in a bounded number of steps, and what a request costs there.

| module | holds |
| --- | --- |
| shape.py | a scenario's traffic scaled by one factor; its measured rate |
| search.py | the next rate from the confident ends and the undecided band; the stop reasons and their exit codes |
| steps.py | one step: its looks (a run and up to two extensions) pooled and judged; a dead target |
| runner.py | the search loop, the confident ends and the undecided band, capacity.json |
"""

from latscope.capacity.runner import CapacityOptions, StepStart, find_capacity
from latscope.capacity.search import STOPS

__all__ = ["STOPS", "CapacityOptions", "StepStart", "find_capacity"]
