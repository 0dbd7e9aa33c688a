"""The model catalog: one TOML file per model, shipped as package data."""
