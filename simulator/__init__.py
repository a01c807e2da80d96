"""Synthetic fleets with ground truth (`burnrate simulate`): the analyzer's input, written
with the agent's simulated GPU model and recording writer."""
