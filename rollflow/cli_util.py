"""Small pieces every command group's CLI uses."""

from __future__ import annotations

from pydantic import BaseModel


def print_yaml(config: BaseModel) -> None:
    """Print a config with every default filled in, in the YAML users write."""
    import yaml

    print(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False), end="")
