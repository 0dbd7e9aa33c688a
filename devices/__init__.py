"""The device catalog: one TOML file per accelerator, shipped as package data."""
