"""Closed-form theory of signal propagation at initialization.  numpy/scipy only: no torch.

Every function cites the paper it implements, author-year:

* Arpit, Campos & Bengio (2019), "How to Initialize your Network? Robust Initialization for
  WeightNorm & ResNets", NeurIPS.  Theorem 1 (eq. 3) / Theorem 5 (eq. 9), Theorem 2 / 6,
  Theorems 3-4 / 7-8 (eq. 6-8, 43-64).
* Salimans & Kingma (2016), "Weight Normalization", NIPS, section 3.
* De & Smith (2020), "Batch Normalization Biases Residual Blocks Towards the Identity Function
  in Deep Networks", NeurIPS, appendices B-C.

The derivations of the per-init predictions and of the finite-width spread model are written
out in ``docs/theory.md``; the modules of this package are those formulas, nothing more, one
topic each: ``tolerances``, ``kn`` (K_n), ``spread`` (layer moments and the finite-width
spread), ``resnet`` (the band, residual closed forms, the BN ResNet), ``correlation`` (the
kernel recursion), ``conv`` (the conv energy map), ``activation`` (any activation's moments by
quadrature), ``attention`` (softmax attention's weights), ``free`` (the Jacobian's spectrum by
free probability).  Every name is
re-exported here: ``theory.kn_closed_form`` reads the same as before the split.  No net is
walked here: a net's prediction is the composition of its steps' maps (sigprop/plans/:
``predict``, ``predict_correlation``), and the closed forms the papers give for whole nets
(Theorems 1-4, the conv energy recursion) are references the composition must equal
(tests/theory/closed_forms.py).
"""

from sigprop.theory.activation import (
    QUADRATURE_CACHE,
    SharedMoments,
    activation_moments,
    bivariate_moment,
    derivative_mean,
    shared_moments,
)
from sigprop.theory.attention import (
    GRID_LOGIT_VARIANCE,
    MAX_LOGIT_VARIANCE,
    attention_entropy,
    attention_weights,
    capped,
    collision,
    key_weight,
    key_weights,
    logit_variance,
)
from sigprop.theory.conv import (
    ConvMoments,
    conv_bias_energy,
    conv_box,
    conv_box_adjoint,
    conv_layer_energy,
    conv_window,
    logaddexp,
    safe_log,
    weight_map,
    window_map,
)
from sigprop.theory.correlation import (
    CORR_COLLAPSE_K,
    centred,
    correlation_collapse_sd,
    correlation_depth_scale,
    relu_cosine_map,
    relu_cosine_maps,
    relu_shared_moments,
    standardized,
)
from sigprop.theory.free import (
    RELU_MU,
    S1_OF_DIRECTION,
    SpectralDensity,
    SpectrumPrediction,
    block_variance,
    chain_variance,
    free_density,
    gram_variance,
)
from sigprop.theory.kn import (
    kn_closed_form,
    kn_main_text_reading,
    kn_mixed_reading,
    kn_product_literal,
    kn_quadrature,
    log_gamma_half_ratio,
    log_sphere_area_ratio,
    log_wallis,
)
from sigprop.theory.resnet import (
    BN_EPS,
    RESNET_LOWER,
    RESNET_UPPER,
    TABLE_BLOCKS,
    TABLE_N,
    ResNetPrediction,
    bn_resnet_prediction,
    bn_statistics_prediction,
    branch_variance,
    in_resnet_band,
    resnet_ratio,
    resnet_step_variance,
    stage_band_ln,
    table,
)
from sigprop.theory.spread import (
    LayerMoments,
    _log_binomial_half,
    check_reference_ln,
    cornish_fisher_band,
    log_band,
    log_gamma,
    polygamma,
    relu_layer_log_cumulants,
    spread_c,
)
from sigprop.theory.tolerances import (
    DRAW_SHARE,
    EMPIRICAL_DRAWS,
    LN10,
    MAP_ACCURACY_BACKWARD,
    MAP_ACCURACY_COSINE,
    MAP_ACCURACY_FORWARD,
    POWER_LEVEL,
    POWER_TARGET,
    POWER_TARGET_PERCENT,
    SPREAD_C_GAUSSIAN,
    SPREAD_C_HALF_GAUSSIAN,
    SPREAD_C_ORTHOGONAL_BASE,
    Z_AGREEMENT,
    Z_CHECK,
    Z_POWER,
)

__all__ = [
    "DRAW_SHARE",
    "EMPIRICAL_DRAWS",
    "MAP_ACCURACY_BACKWARD",
    "MAP_ACCURACY_COSINE",
    "MAP_ACCURACY_FORWARD",
    "GRID_LOGIT_VARIANCE",
    "MAX_LOGIT_VARIANCE",
    "attention_weights",
    "capped",
    "attention_entropy",
    "collision",
    "key_weight",
    "key_weights",
    "logit_variance",
    "BN_EPS",
    "CORR_COLLAPSE_K",
    "ConvMoments",
    "LN10",
    "LayerMoments",
    "QUADRATURE_CACHE",
    "RELU_MU",
    "RESNET_LOWER",
    "RESNET_UPPER",
    "ResNetPrediction",
    "S1_OF_DIRECTION",
    "SPREAD_C_GAUSSIAN",
    "SPREAD_C_HALF_GAUSSIAN",
    "SPREAD_C_ORTHOGONAL_BASE",
    "SharedMoments",
    "SpectralDensity",
    "SpectrumPrediction",
    "TABLE_BLOCKS",
    "TABLE_N",
    "Z_AGREEMENT",
    "POWER_LEVEL",
    "POWER_TARGET",
    "POWER_TARGET_PERCENT",
    "Z_CHECK",
    "Z_POWER",
    "_log_binomial_half",
    "activation_moments",
    "relu_shared_moments",
    "block_variance",
    "bn_resnet_prediction",
    "bn_statistics_prediction",
    "branch_variance",
    "centred",
    "chain_variance",
    "check_reference_ln",
    "conv_bias_energy",
    "conv_box",
    "conv_box_adjoint",
    "conv_window",
    "weight_map",
    "window_map",
    "conv_layer_energy",
    "cornish_fisher_band",
    "correlation_collapse_sd",
    "correlation_depth_scale",
    "free_density",
    "gram_variance",
    "in_resnet_band",
    "kn_closed_form",
    "kn_main_text_reading",
    "kn_mixed_reading",
    "kn_product_literal",
    "kn_quadrature",
    "log_band",
    "log_gamma",
    "log_gamma_half_ratio",
    "log_sphere_area_ratio",
    "log_wallis",
    "logaddexp",
    "polygamma",
    "relu_cosine_map",
    "relu_cosine_maps",
    "relu_layer_log_cumulants",
    "resnet_ratio",
    "resnet_step_variance",
    "safe_log",
    "shared_moments",
    "bivariate_moment",
    "derivative_mean",
    "spread_c",
    "stage_band_ln",
    "standardized",
    "table",
]
