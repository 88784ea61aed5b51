"""The engines (sigprop/engines/registry.py): ``plan`` walks sigprop's own nets
(sigprop/engines/plan.py, registered on import of this package), ``model`` probes a user's
module (sigprop/engines/model.py, imported by ``registry.of`` the first time a kind asks for it:
the model package sits beside this one, and imports it, not the other way round); what they share is
sigprop/engines/shared.py."""

from sigprop.engines import plan, shared
from sigprop.engines.registry import ENGINES, Engine, of, register

__all__ = ["ENGINES", "Engine", "of", "plan", "register", "shared"]
