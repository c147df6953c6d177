"""Named presets, one TOML file per algorithm (`configs/<algo>.toml`), shipped
as package data of `jaxzoo.configs` and read by `jaxzoo.cli`."""
