"""Simulation settings: the TOML sections, their values and defaults, and the model and GPU
presets they name."""
