"""Deterministic, vectorized GPU-cluster simulator with ground-truth labels.

``load_scenario`` reads fixtures/scenarios/*.yaml; ``Cluster`` samples every contract
signal at any virtual time (see ``model``); ``faults`` documents what each injected
problem looks like in the signals.
"""

from exporter.simulator.model import SAMPLE_SIGNALS, Cluster, sample_key
from exporter.simulator.scenario import SCENARIO_DIR, Scenario, ScenarioError, list_scenarios, load_scenario

__all__ = ["SAMPLE_SIGNALS", "SCENARIO_DIR", "Cluster", "Scenario", "ScenarioError", "list_scenarios",
           "load_scenario", "sample_key"]
