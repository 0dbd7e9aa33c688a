"""The collective libraries' time models as data: one TOML file per library."""
