"""Drivers shipped with the package, run as ``python -m sigprop.examples.NAME`` (pip installs them;
a clone has them too): ``slurm_sweep``, the SLURM driver of docs/cluster.md."""
