from setuptools import find_packages, setup

setup(
    name="triton_layers",
    version="0.1.0",
    description="Transformer building blocks as nn.Modules running hand-written Triton kernels",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    author="triton_layers developers",
    license="MIT",
    license_files=["LICENSE"],
    classifiers=[
        "Development Status :: 3 - Alpha",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Environment :: GPU :: NVIDIA CUDA",
        "Operating System :: POSIX :: Linux",  # the Triton kernels
        "Operating System :: MacOS",  # the pure-torch reference path (Triton has no wheels there)
        "Operating System :: Microsoft :: Windows",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    packages=find_packages(include=["triton_layers", "triton_layers.*"]),
    # The floors (torch 2.11, Triton 3.6, Python 3.11) are what is tested: .ci/run reads them from
    # here and runs the suite under exactly them (torch 2.11.0 + Triton 3.6.0 on Python 3.11), as
    # well as under the newest (torch 2.13 + Triton 3.9); the GPU machines (H100, H200) run torch
    # 2.11 + Triton 3.6. Raising a floor here raises what CI installs. Older ones are not supported:
    # torch 2.6 could not import the package (infer_schema refused list[bool]), torch 2.7-2.8
    # failed 22-23 tests under the interpreter. Python 3.10 reached its end of life in October
    # 2026 (and the suite ran slower under it than CI's budget allows).
    python_requires=">=3.11",
    # numpy: Triton's interpreter (TRITON_INTERPRET=1, how the kernels run on a CPU) imports
    # it, and neither torch nor triton requires it.
    # Triton has wheels for Linux only: elsewhere (macOS, Windows) the package installs
    # without it and CPU tensors take the pure-torch reference.
    install_requires=["torch>=2.11", 'triton>=3.6; platform_system == "Linux"', "einops>=0.7", "packaging",
                      "numpy"],
    extras_require={
        # safetensors and transformers (with tokenizers, huggingface_hub: ~45 s of install on
        # CI's 2 cores) for tests/test_integrations.py, which skips their tests without them;
        # accelerate for transformers' Trainer (examples/train_hf_trainer.py and its test);
        # kernels for triton_layers.hub (tests/test_hub_layer.py).
        # pytest-xdist: the README's test command runs the suite on every core (-n auto), which
        # keeps CI's 2 cores within its time (its output says how long each run took).
        # Not torchtitan (tests/test_torchtitan.py skips without it): 0.3.0 does not import under
        # the torch 2.11 floor (no torch.distributed.fsdp.DataParallelMeshDims), and its pins
        # (datasets<4.8, hence huggingface_hub<2) and dependencies (datasets, tensorboard, wandb)
        # would change and grow what every other test runs with.
        "test": ["pytest>=7", "pytest-xdist>=3", "hypothesis>=6", "colt5-attention>=0.11", "safetensors>=0.4",
                 "transformers>=4.40", "accelerate>=1.1", "kernels>=0.10"],
        # transformers' kernel hook: triton_layers.hub.RMSNorm as a layer of the kernels package.
        "hub": ["kernels>=0.10"],
        # matplotlib and tqdm: the plots and progress bar of python -m benchmarks; transformers:
        # the Llama of its llama_step.
        "bench": ["liger-kernel>=0.5", "colt5-attention>=0.11", "matplotlib", "tqdm", "transformers>=4.56",
                  "accelerate>=1.1"],
    },
)
