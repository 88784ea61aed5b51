"""The engines (sigprop/engines/registry.py): ``plan`` walks sigprop's own nets
(sigprop/engines/plan.py), ``model`` probes a user's module (sigprop/model/engine.py); what
they share is sigprop/engines/shared.py.  Importing this package registers both."""

from sigprop.engines import plan, shared
from sigprop.engines.registry import ENGINES, Engine, of, register
from sigprop.model import engine as model_engine

__all__ = ["ENGINES", "Engine", "model_engine", "of", "plan", "register", "shared"]
