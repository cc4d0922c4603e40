"""Find and import a flow: `models/<name>/<version>/flow.py` with `def flow(batch, settings)`.

The settings class is the annotation of the flow's second parameter (a `Settings`
subclass), else a module-level class named `Settings`; a flow without settings declares
no models and reads only the runtime's keys. Its request parameters are the one
`Parameters` subclass the module defines, if any.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ...base.modelconfig import parse_config, string_parameters
from .parameters import Parameters
from ...base.errors import ConfigError
from .settings import RuntimeSettings, Settings, parse_settings

__all__ = ["FLOW_FILE", "FlowDefinition", "declared_calls", "declared_in_process", "declared_models",
           "declared_preferences", "flow_settings", "is_flow_model", "load_flow"]

FLOW_FILE = "flow.py"


@dataclass(frozen=True)
class FlowDefinition:
    fn: Callable
    settings: type[Settings] | None
    path: Path
    parameters: type[Parameters] | None = None  # the request parameters it declares (parameters.py)


def _import(path: Path):
    """Import flow.py under a name of its own, so that several flows live in one process."""
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    name = f"bls_flow_{path.parent.parent.name}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the settings' annotations resolve through it
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_flow(path: Path) -> FlowDefinition:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path} is missing: a flow model's version folder holds flow.py with `def flow(batch, "
                          "settings)`")
    module = _import(path)
    fn = getattr(module, "flow", None)
    if not callable(fn):
        raise ConfigError(f"{path} has no function `flow(batch, settings)`")
    params = list(inspect.signature(fn).parameters.values())
    if len(params) != 2:
        raise ConfigError(f"{path}: flow() takes {len(params)} parameter(s); write it as `def flow(batch, settings)`")
    hint = typing.get_type_hints(fn).get(params[1].name)
    settings = hint if isinstance(hint, type) and issubclass(hint, Settings) else getattr(module, "Settings", None)
    if (settings is not None
            and not (isinstance(settings, type) and issubclass(settings, Settings) and settings is not Settings)):
        settings = None
    declared = [v for v in vars(module).values()
                if isinstance(v, type) and issubclass(v, Parameters) and v is not Parameters
                and v.__module__ == module.__name__]
    if len(declared) > 1:
        raise ConfigError(f"{path} declares {len(declared)} Parameters classes "
                          f"({', '.join(c.__name__ for c in declared)}); declare a flow's request parameters in one")
    return FlowDefinition(fn, settings, path, declared[0] if declared else None)


def is_flow_model(model_dir: Path, version: str = "1") -> bool:
    return (Path(model_dir) / version / FLOW_FILE).is_file()


def declared_models(model_dir: Path, version: str = "1") -> tuple[str, ...]:
    """The models the flow in model_dir may call, with its config.pbtxt's settings applied
    (what the launcher loads with it, and unloads after it when draining)."""
    return tuple(dict.fromkeys(m for models in declared_preferences(model_dir, version) for m in models))


def flow_settings(model_dir: Path, version: str = "1") -> tuple[RuntimeSettings, Settings]:
    """The flow model's settings as it loads them: its flow.py's defaults and the runtime's,
    with what its config.pbtxt sets (the config carries only what differs from them)."""
    model_dir = Path(model_dir)
    flow = load_flow(model_dir / version / FLOW_FILE)
    return parse_settings(string_parameters(parse_config(model_dir)), flow.settings, model_dir.name)


def declared_calls(model_dir: Path, version: str = "1") -> tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]:
    """The flow's lists of candidates, each in its order of preference (a shadow's or a
    canary's model a list of its own), and the children it runs in its own process (its
    run_in_process), both with its config.pbtxt's settings applied: the flow read once."""
    options, settings = flow_settings(model_dir, version)
    trials = tuple((t.model,) for t in (options.shadow, options.canary) if t is not None)
    return tuple(tuple(c) for c in settings.candidate_lists()) + trials, options.run_in_process


def declared_in_process(model_dir: Path, version: str = "1") -> tuple[str, ...]:
    """The children the flow runs in its own process (its run_in_process parameter)."""
    return declared_calls(model_dir, version)[1]


def declared_preferences(model_dir: Path, version: str = "1") -> tuple[tuple[str, ...], ...]:
    """The flow's lists of candidates, each in its order of preference, with its config.pbtxt's
    settings applied; a shadow's or a canary's model is a list of its own."""
    return declared_calls(model_dir, version)[0]
