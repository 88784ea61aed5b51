"""The kernels (torch): the bottom floor of the house, below the walker (sigprop/walker/).

``device`` (devices, dtypes, free memory, threads, matmul precision), ``logspace`` (weight-
normalised layer parameters as a row scale, the ReLU masks bit-packed, renormalised states and
their ln-norms, batch norm), ``sampling`` (each init's draw of a layer, the probe's inputs, error
vectors and pairs, the per-layer generators), ``ops`` (a dense or conv layer's forward, vector-
Jacobian product and differentiable ``apply``), ``haar`` (Haar-orthogonal directions by
Householder reflectors, batched on CUDA), ``replay`` (a step captured once as a CUDA graph and
replayed).  Nothing here knows a net kind or a plan."""
