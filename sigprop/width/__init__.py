"""The coordinate check (``sigprop width``, ``sigprop.width_check``): a model at several widths
trained a few optimizer steps under a parametrization (SP, μP, NTK, or its own), each site's
coordinate size fitted against the width beside the exponent theory predicts
(sigprop/theory/width.py; docs/theory.md §15).

``params`` tells a model's weights apart by how they grow with the width and applies a
parametrization (init and per-layer learning rates); ``train`` runs the steps and records each
site; ``fit`` fits slopes and reads the verdicts; ``nets`` builds sigprop's own nets at a width.
"""
