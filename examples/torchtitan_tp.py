"""torchtitan 0.3.0's Llama 3 debug model trained a few steps with tensor parallelism (TP=2),
once as torchtitan builds it and once with its RMSNorms swapped for triton_layers' by the
override ``triton_layers.integrations.torchtitan.rms_norm`` (what ``--override.imports``
applies in torchtitan's trainer), from the same weights on the same synthetic batches.
Prints both loss curves and their largest difference; exits non-zero when they diverge
beyond the tolerance of the precision (``--mixed-precision``).

Run (2 GPUs, NCCL, the Triton kernels; the "debugmodel" flavor, FlexAttention):
    torchrun --standalone --nproc_per_node 2 examples/torchtitan_tp.py
Dry run (2 CPU ranks over gloo, the kernels through the Triton interpreter):
    TRITON_INTERPRET=1 torchrun --standalone --nproc_per_node 2 examples/torchtitan_tp.py \\
        --cpu --attention sdpa --seq-len 32 --batch-size 2 --steps 2 --mixed-precision float32

Needs torch, torchtitan and what torchtitan imports for its model and parallelize code
(spmd_types, tyro, docstring_parser, typeguard): not its trainer, whose imports (datasets,
torchdata, tensorboard, wandb, ...) this avoids, nor any dataset or tokenizer. It does what
torchtitan's ``Trainer.__init__`` does for the model, in its order: the model config of
``model_registry("debugmodel")``, its sharding (``set_llama3_sharding_config``, the part of
``Llama3Model.Config.update_from_config`` that matters here: the rest imports the trainer),
the override, a meta-device build, ``parallelize_llama`` (TP with sequence parallelism,
activation checkpointing, then FSDP2 on a data-parallel mesh of size 1, which installs the
mixed precision policy), ``to_empty`` and ``init_weights``. Then a plain loop: AdamW,
torchtitan's gradient clipping, cross-entropy on the logits.

torch 2.11 (the GPU machines' torch) lacks ``torch.distributed.fsdp.DataParallelMeshDims``,
which torchtitan 0.3.0's FSDP module imports, so ``import torchtitan.models.llama3`` fails
there. FSDP2 is only handed one under the ``full_dtensor`` and ``spmd_types`` backends, so
where it is missing this script puts a stand-in there before importing torchtitan
(:func:`fsdp_compat`). Of the other torch names torchtitan's model and
parallelize code imports, none is missing in torch 2.11 (looked up there); whether it all runs
on torch 2.11 was not tried (torchtitan 0.3.0 was written against a newer torch).

The SPMD backend is ``partial_dtensor`` (DTensors on the TP axis), not torchtitan's default
``spmd_types``: under TP that backend hands ``fully_shard`` plain tensors annotated
with SPMD types, which torch 2.13's FSDP2 refuses ("all parameters must be DTensors on the
full SPMD mesh"), with or without triton_layers.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as TF

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# Largest relative difference of the two loss curves allowed. Both runs start from the same
# weights and batches; the norms compute the same function and differ by rounding alone (ours
# computes in fp32 and rounds once). In bf16 (torchtitan's default mixed precision: FSDP2
# computes in bf16) a norm output one bf16 ulp (2**-8 relative) apart in a few places moves
# the loss by far less than that, and 10 AdamW steps let it drift a little further; in fp32 the
# rounding differences are ~1e-7 and drift to ~1e-5 at most. A wrong norm (another eps, a lost
# weight, a wrong sharding) moves the first loss by O(1e-1) or more.
TOLERANCE = {"bfloat16": 2e-2, "float32": 1e-4}

SPMD_BACKEND = "partial_dtensor"  # (the module docstring says why)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=8, help="sequences per step (every TP rank sees them all)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--lr", type=float, default=8e-4, help="AdamW's (the debugmodel config's)")
    p.add_argument("--max-norm", type=float, default=1.0, help="gradient clipping (torchtitan's default)")
    p.add_argument("--mixed-precision", choices=sorted(TOLERANCE), default="bfloat16",
                   help="FSDP2's param_dtype (torchtitan's training.mixed_precision_param)")
    p.add_argument("--attention", choices=("flex", "sdpa"), default="flex",
                   help="flex: the debugmodel's FlexAttention (compiled); sdpa: torch's SDPA, causal "
                        "(CPU dry runs: compiling flex_attention there needs a C++ toolchain and minutes)")
    p.add_argument("--ac", choices=("selective", "full", "none"), default="selective",
                   help="activation checkpointing (the debugmodel config's: selective)")
    p.add_argument("--use-triton", choices=("auto", "true", "false"), default="auto",
                   help="the override's kwarg: auto = the kernels where they run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cpu", action="store_true", help="gloo on CPU ranks (a dry run)")
    return p.parse_args()


def fsdp_compat() -> bool:
    """Where ``torch.distributed.fsdp`` lacks ``DataParallelMeshDims`` (torch 2.11), put a
    stand-in there so that torchtitan 0.3.0 imports (module docstring); True if it did."""
    import torch.distributed.fsdp as fsdp

    if hasattr(fsdp, "DataParallelMeshDims"):
        return False
    from dataclasses import dataclass

    @dataclass
    class DataParallelMeshDims:  # (torchtitan builds one only for full_dtensor / spmd_types)
        shard: object = None
        replicate: object = None

    fsdp.DataParallelMeshDims = DataParallelMeshDims
    return True


def batches(steps: int, batch: int, seq: int, vocab: int, seed: int) -> list[torch.Tensor]:
    """Synthetic token sequences, ``seq + 1`` long (inputs and shifted labels): each follows
    ``t[i+1] = (5 * t[i] + 17) % vocab`` from a random start, so there is something to learn
    (the loss falls within a few steps), and no dataset or tokenizer is needed."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        t = torch.empty(batch, seq + 1, dtype=torch.long)
        t[:, 0] = torch.randint(0, vocab, (batch,), generator=g)
        for i in range(seq):
            t[:, i + 1] = (5 * t[:, i] + 17) % vocab
        out.append(t)
    return out


def build(args, parallel_dims, parallelism, training, converted: bool):
    """The model as torchtitan's trainer builds and parallelizes it (the module docstring)."""
    from torchtitan.config import CompileConfig, OverrideConfig, apply_overrides
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import model_registry
    from torchtitan.models.llama3.parallelize import parallelize_llama
    from torchtitan.models.llama3.sharding import set_llama3_sharding_config

    config = model_registry("debugmodel").model
    if args.attention == "sdpa":
        for layer in config.layers:
            layer.attention.inner_attention = ScaledDotProductAttention.Config()
    n_heads = config.layers[0].attention.n_heads
    assert n_heads % parallel_dims.tp == 0, f"TP={parallel_dims.tp} must divide n_heads={n_heads}"
    set_llama3_sharding_config(config, enable_sp=parallelism.enable_sequence_parallel)
    if converted:
        from triton_layers.integrations.torchtitan import OVERRIDE

        use_triton = {"auto": None, "true": True, "false": False}[args.use_triton]
        entry = OVERRIDE if use_triton is None else (OVERRIDE, {"use_triton": use_triton})
        # The trainer applies overrides to its whole config tree; the model config is the part
        # with norms.
        replaced = apply_overrides(OverrideConfig(imports=[entry]), config)
        assert len(replaced) == 1 + 2 * len(config.layers), replaced
    with torch.device("meta"):
        model = config.build()
    model.verify_module_protocol()
    ac_config = {"selective": SelectiveAC.Config(), "full": FullAC.Config(), "none": None}[args.ac]
    model = parallelize_llama(model, parallel_dims=parallel_dims, training=training, parallelism=parallelism,
                              compile_config=CompileConfig(), ac_config=ac_config, dump_folder="/tmp/torchtitan_tp")
    return model


def train(model, data, args, device, use_flex: bool) -> list[float]:
    """``args.steps`` AdamW steps on ``data``; the loss of each step (before its update)."""
    from torchtitan.distributed import utils as dist_utils

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, foreach=True)
    losses = []
    for tokens in data:
        tokens = tokens.to(device)
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        masks = None
        if use_flex:  # (the trainer builds them from the dataloader's positions: one document a row here)
            positions = torch.arange(inputs.shape[1], device=device).expand_as(inputs)
            masks = model.get_attention_masks(positions=positions)
        logits = model(inputs, attention_masks=masks)
        if hasattr(logits, "full_tensor"):  # (the lm_head's output: sharded on the vocabulary)
            logits = logits.full_tensor()
        loss = TF.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
        loss.backward()
        dist_utils.clip_grad_norm_(list(model.parameters()), args.max_norm, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def main() -> int:
    args = parse_args()
    if args.cpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # (before triton_layers is imported)
    if fsdp_compat():
        print(f"torch {torch.__version__} lacks torch.distributed.fsdp.DataParallelMeshDims (torchtitan 0.3.0 "
              f"imports it): a stand-in put there (the partial_dtensor backend never hands it to FSDP2)",
              file=sys.stderr)
    import torchtitan.distributed.parallel_dims as parallel_dims_module
    from torch.distributed.tensor import DTensor
    from torchtitan.config import ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils

    from triton_layers import TritonRMSNorm

    backend = "gloo" if args.cpu else "nccl"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.cpu:
        device = torch.device("cpu")
        # torchtitan builds its meshes on its device_type, "cuda" where no accelerator is found
        parallel_dims_module.device_type = "cpu"
    else:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    dist_utils.set_spmd_backend(SPMD_BACKEND)
    parallelism = ParallelismConfig(tensor_parallel_degree=world, spmd_backend=SPMD_BACKEND)
    training = TrainingConfig(local_batch_size=args.batch_size, seq_len=args.seq_len,
                              mixed_precision_param=args.mixed_precision)
    parallel_dims = ParallelDims.from_config(parallelism, world)
    parallel_dims.build_mesh()

    # Three models of the same weights: torchtitan's, torchtitan's again (the run-to-run noise
    # of the GPU's own reductions, for the record) and the converted one.
    names = ("torchtitan", "torchtitan again", "triton_layers")
    models = {name: build(args, parallel_dims, parallelism, training, name == "triton_layers") for name in names}
    reference = models["torchtitan"]
    reference.to_empty(device=device)
    with torch.no_grad():
        torch.manual_seed(args.seed)
        reference.init_weights(buffer_device=None)
        for name in names[1:]:
            model = models[name]
            model.to_empty(device=device)
            model.init_weights(buffer_device=None)  # (buffers: the RoPE cache)
            params = dict(reference.named_parameters())
            for pname, p in model.named_parameters():
                p.copy_(params[pname])
    converted = models["triton_layers"]
    norms = [n for n, m in converted.named_modules() if isinstance(m, TritonRMSNorm)]
    assert len(norms) == 13 and all(isinstance(m.weight, DTensor) for m in converted.modules()
                                   if isinstance(m, TritonRMSNorm)), norms

    vocab = reference.config.vocab_size
    data = batches(args.steps, args.batch_size, args.seq_len, vocab, args.seed)
    curves = {}
    for name in names:
        models[name].train()
        curves[name] = train(models[name], data, args, device, args.attention == "flex")

    tol = TOLERANCE[args.mixed_precision]
    rel = lambda a, b: max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))  # noqa: E731
    diff = rel(curves["triton_layers"], curves["torchtitan"])
    noise = rel(curves["torchtitan again"], curves["torchtitan"])
    ok = diff <= tol and all(math.isfinite(x) for c in curves.values() for x in c)
    if rank == 0:
        print(f"torch {torch.__version__}, {backend}, TP={world}, {SPMD_BACKEND}, {args.mixed_precision}, "
              f"{args.attention} attention, AC {args.ac}, batch {args.batch_size} x {args.seq_len}, "
              f"{len(norms)} norms converted")
        print(f"{'step':>4}  " + "  ".join(f"{n:>16}" for n in names))
        for step in range(args.steps):
            print(f"{step + 1:>4}  " + "  ".join(f"{curves[n][step]:>16.6f}" for n in names))
        print(f"max relative loss difference: triton_layers vs torchtitan {diff:.3e} (tolerance {tol:.0e}); "
              f"torchtitan vs itself {noise:.3e}")
        print("PASS" if ok else "FAIL: the loss curves diverge")
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
