"""Reading a user's YAML file (prices, detector thresholds) into one-line errors."""
from __future__ import annotations

import yaml


def read_yaml(path: str, what: str, error: type[Exception]) -> object:
    """The parsed document (None for an empty file); `error` with one line when the file
    cannot be read or is not YAML."""
    try:
        with open(path, encoding="utf-8") as fh:
            return yaml.safe_load(fh)
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise error(f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from None
