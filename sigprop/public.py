"""The API's names (no torch here: ``import sigprop`` reads them before it loads sigprop/api.py)."""

#: what ``sigprop.NAME`` reaches in sigprop/api.py (``probe_<kind>`` besides: one per net kind)
API = (
    "probe",
    "init_",
    "hessian",
    "spectrum",
    "run_sweep",
    "sweep",
    "spec",
    "keywords",
    "run_checks",
    "lowest_curvature",
    "rerun_specs",
    "rerun",
    "theory_table",
    "width_check",
)
