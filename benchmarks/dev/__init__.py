"""Developer tools, apart from the benchmarks users run (``python -m benchmarks``): the launch
knobs' sweeps (``tune_*``, on :mod:`benchmarks.dev.tuning`), the offline builds of every kernel
form (``offline``, ``registers``: registers, spills, shared memory, no GPU needed), the cast
kernels of a compiled step (``cast_kernels``) and the FP8 byte mix's ceiling (``fp8_ceiling``:
stand-in kernels beside ours). docs/TUNING.md says which sweep set which knob."""
