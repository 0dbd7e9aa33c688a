"""The runtime catalog: one TOML file per software stack, shipped as package data."""
