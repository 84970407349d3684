"""Runnable examples; a package so that benchmarks and tests import the example model
(``examples.colt5_lm``) by name. Not installed with triton_layers."""
