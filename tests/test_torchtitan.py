"""torchtitan 0.3.0 with our RMSNorm: ``triton_layers.integrations.torchtitan``.

Its Llama 3 model at tiny dims (dim 64, 2 layers, vocab 128; torch's SDPA, causal, in place of
FlexAttention, which torchtitan compiles: minutes on a CPU), built from torchtitan's own
configs: the override (what ``--override.imports`` applies) and the ``ModelConfigConverter``
make every norm ours, and the converted model computes what torchtitan's does, in one process
and under torchtitan's own ``parallelize_llama`` on CPU ranks over gloo (TP=2 with sequence
parallelism; FSDP2 x TP on a 2 x 2 mesh), each against torchtitan's unconverted model in one
process, from the same weights: outputs, loss, every gradient, and the loss after an AdamW
step. The kernels run through the Triton interpreter (their launches are counted); on a GPU
machine the one-process test runs on the GPU and the gloo ranks take the reference path.

Skipped where torchtitan (and what its model code imports) is not installed.
"""
from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist

try:
    import torchtitan.models.llama3 as llama3
except ModuleNotFoundError as _err:
    pytest.skip(f"torchtitan is not installed ({_err})", allow_module_level=True)
except ImportError as _err:  # (torchtitan 0.3.0 imports names torch 2.11 lacks: DataParallelMeshDims)
    pytest.skip(f"torchtitan does not import with torch {torch.__version__}: {_err}", allow_module_level=True)

from torchtitan.config import OverrideConfig, ParallelismConfig, apply_overrides  # noqa: E402
from torchtitan.config.override import _REGISTRY  # noqa: E402
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm, compute_ffn_hidden_dim  # noqa: E402
from torchtitan.models.common.attention import ScaledDotProductAttention  # noqa: E402
from torchtitan.models.llama3.sharding import set_llama3_sharding_config  # noqa: E402

import triton_layers  # noqa: E402
from tests.test_tensor_parallel import rank_start_method  # noqa: E402
from triton_layers.integrations import torchtitan as tti  # noqa: E402

DIM, HEADS, LAYERS, VOCAB, BATCH, SEQ = 64, 4, 2, 128, 2, 16
N_NORMS = 2 * LAYERS + 1


def _config(*, tp: int = 1, dp: int = 1) -> llama3.Llama3Model.Config:
    """torchtitan's Llama 3 config (its ``_debugmodel``, at tiny dims), SDPA inside attention,
    given its sharding as the trainer gives it: ``set_llama3_sharding_config``, what
    ``update_from_config`` does for a caller that is not the trainer, beside its checks (the TP
    degree divides the heads). update_from_config itself imports ``torchtitan.trainer``, and
    with it the trainer's packages (torchdata, tensorboard, datasets, wandb), which a fresh
    environment with the model's packages alone (.ci/run) lacks."""
    rope = ComplexRoPE.Config(dim=DIM // HEADS, max_seq_len=4 * SEQ, theta=500000, scaling="llama")
    config = llama3.Llama3Model.Config(
        dim=DIM, vocab_size=VOCAB,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM, param_init=llama3._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=DIM, param_init=llama3._NORM_INIT),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB, param_init=llama3._output_linear_init(DIM)),
        layers=llama3._build_llama3_layers(n_layers=LAYERS, dim=DIM, n_heads=HEADS, rope=rope, attn_backend="flex",
                                           hidden_dim=compute_ffn_hidden_dim(DIM, multiple_of=32)))
    for layer in config.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    parallelism = ParallelismConfig(tensor_parallel_degree=tp, data_parallel_shard_degree=dp,
                                    spmd_backend="partial_dtensor")
    assert HEADS % tp == 0, (HEADS, tp)
    set_llama3_sharding_config(config, enable_sp=parallelism.enable_sequence_parallel)
    return config


def _override(config):
    """``--override.imports triton_layers.integrations.torchtitan.rms_norm``, as the trainer
    applies it (after the sharding config); the log lines of the replacements."""
    return apply_overrides(OverrideConfig(imports=[tti.OVERRIDE]), config)


def _build(config, seed: int = 0, device: str = "cpu"):
    """On the meta device, then materialized and initialized, as the trainer does."""
    with torch.device("meta"):
        model = config.build()
    model.verify_module_protocol()
    model.to_empty(device=device)
    with torch.no_grad():
        torch.manual_seed(seed)
        model.init_weights(buffer_device=None)
    return model


def _batch(seed: int = 1, rows: int = BATCH, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (rows, SEQ + 1), generator=g).to(device)
    return tokens[:, :-1], tokens[:, 1:]


class _Launches:
    """Counts the launches of our norm kernels (their pre-run hooks: every interpreted launch)."""

    def __enter__(self):
        from triton_layers.kernels import layer_norm

        self.kernels = [getattr(layer_norm, n) for n in dir(layer_norm)
                        if n.startswith("_norm_") and n.endswith("_kernel")]
        self.fwd = self.bwd = 0
        self.hooks = [(k, self._hook("fwd" if "fwd" in k.__name__ else "bwd")) for k in self.kernels]
        for k, hook in self.hooks:
            k.add_pre_run_hook(hook)
        return self

    def _hook(self, which):
        def hook(*args, **kwargs):
            setattr(self, which, getattr(self, which) + 1)
        return hook

    def __exit__(self, *exc):
        for k, hook in self.hooks:
            k.pre_run_hooks.remove(hook)


def _close(got, want, what: str, tol: float) -> None:
    from torch.distributed.tensor import DTensor

    got = (got.full_tensor() if isinstance(got, DTensor) else got).detach()
    want = want.detach()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    err = float((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-12))
    assert err <= tol, f"{what}: max error {err:.2e} of max |value| (tolerance {tol:.0e})"


def _norms(model) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, (RMSNorm, triton_layers.TritonRMSNorm))]


# --- conversion of the config ------------------------------------------------------------

def test_the_override_is_registered_and_replaces_every_stock_rmsnorm():
    ov = _REGISTRY[tti.OVERRIDE]  # (registered by importing the module)
    assert tti.OVERRIDE == "triton_layers.integrations.torchtitan.rms_norm"
    assert ov.target_cls is RMSNorm.Config and ov.exact

    class OtherNorm(RMSNorm):  # a subclass computing something else: not claimed
        @dataclass(kw_only=True, slots=True)
        class Config(RMSNorm.Config):
            pass

    config = _config(tp=2)
    stock = config.layers[0].attention_norm
    config.layers[1].ffn_norm = OtherNorm.Config(normalized_shape=DIM)
    replaced = _override(config)
    assert len(replaced) == N_NORMS - 1, replaced
    new = config.layers[0].attention_norm
    assert type(new) is tti.TitanTritonRMSNorm.Config and new.use_triton is None
    # The fields the trainer set before the override, kept: the sharding (sequence parallel)
    # and the init, the shape and eps.
    assert new.sharding_config is stock.sharding_config is not None
    assert (new.param_init, new.normalized_shape, new.eps) == (stock.param_init, DIM, stock.eps)
    assert type(config.norm) is tti.TitanTritonRMSNorm.Config
    assert type(config.layers[1].ffn_norm) is OtherNorm.Config
    # kwargs of an --override.imports entry reach the new configs
    config = _config()
    apply_overrides(OverrideConfig(imports=[(tti.OVERRIDE, {"use_triton": False})]), config)
    assert config.norm.use_triton is False


def test_the_model_converter_converts_the_debugmodel():
    """torchtitan's own "debugmodel" flavor (dim 256, 6 layers), through ``model_registry``'s
    ``converters``: all 13 norms ours once built (on the meta device)."""
    spec = llama3.model_registry("debugmodel", converters=[tti.TritonRMSNormConverter.Config(use_triton=True)])
    with torch.device("meta"):
        model = spec.model.build()
    model.verify_module_protocol()  # (the trainer's check: a plain TritonRMSNorm would fail it)
    norms = [m for m in model.modules() if isinstance(m, (RMSNorm, triton_layers.TritonRMSNorm))]
    assert len(norms) == 13 and all(type(m) is tti.TitanTritonRMSNorm and m.use_triton for m in norms)
    assert model.norm.weight.is_meta and model.norm.eps == 1e-5


# --- one process -------------------------------------------------------------------------

def test_the_converted_model_computes_what_torchtitans_does():
    """Outputs and every gradient, our kernels running (the override's model against
    torchtitan's, same weights); and ``convert_model`` on a built model, weights kept."""
    device = "cuda" if torch.cuda.is_available() else "cpu"  # (the kernels: CUDA, else the interpreter)
    stock = _build(_config(), device=device)
    config = _config()
    _override(config)
    ours = _build(config, device=device)
    ours.load_state_dict(stock.state_dict())
    assert _norms(ours) == _norms(stock) and len(_norms(ours)) == N_NORMS
    assert all(isinstance(m, tti.TitanTritonRMSNorm) for n, m in ours.named_modules() if n in _norms(ours))

    inputs, labels = _batch(device=device)
    results = []
    for model, launches in ((stock, False), (ours, True)):
        with _Launches() as counted:
            logits = model(inputs)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
            loss.backward()
        # (N_NORMS norms a forward, one launch each; their backward at least one each)
        if launches:
            assert counted.fwd == N_NORMS and counted.bwd >= N_NORMS, vars(counted)
        else:
            assert counted.fwd == counted.bwd == 0, vars(counted)
        results.append((logits, loss, {n: p.grad for n, p in model.named_parameters()}))
    (want_y, want_loss, want_grads), (y, loss, grads) = results
    _close(y, want_y, "logits", 1e-5)
    _close(loss, want_loss, "loss", 1e-6)
    assert grads.keys() == want_grads.keys()
    for name, g in grads.items():
        _close(g, want_grads[name], f"grad {name}", 1e-5)

    # A model built already, its weights not the init's: converted in place.
    with torch.no_grad():
        for p in stock.parameters():
            p.add_(0.1 * torch.randn(p.shape).to(p))
    want = stock(inputs)
    converted = tti.convert_model(stock)
    assert converted is stock and len([m for m in stock.modules() if type(m) is tti.TitanTritonRMSNorm]) == N_NORMS
    assert stock.norm._sharding_config is not None and stock.norm._param_init is not None
    stock.verify_module_protocol()
    _close(stock(inputs), want, "logits after convert_model", 1e-5)


# --- ranks over gloo ----------------------------------------------------------------------

def _spawn(world: int, tp: int, ac: str = "") -> None:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:  # (forked ranks start with torchtitan imported)
        mp.start_processes(_worker, args=(world, os.path.join(tmp, "store"), tp, ac, tmp), nprocs=world, join=True,
                           start_method=rank_start_method())


def _worker(rank: int, world: int, store: str, tp: int, ac: str, tmp: str) -> None:
    torch.set_num_threads(1)  # (one thread a rank: rank_start_method says why)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        _parallel_case(world, tp, ac, tmp)
    finally:
        dist.destroy_process_group()
    # Leave without the interpreter's teardown, where gloo can abort a process after all its
    # work (tests/test_tensor_parallel.py's _worker says more). A failure above raises first.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _parallel_case(world: int, tp: int, ac: str, tmp: str) -> None:
    """The converted model under torchtitan's ``parallelize_llama`` (``partial_dtensor``: its
    default ``spmd_types`` backend cannot run TP under torch's FSDP2, converted or not; see
    examples/torchtitan_tp.py) against torchtitan's unconverted model in this process: each
    data-parallel rank takes its rows of the batch; the loss is the mean over all of them."""
    import torchtitan.distributed.parallel_dims as parallel_dims_module
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, Shard
    from torchtitan.config import CompileConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.models.llama3.parallelize import parallelize_llama

    parallel_dims_module.device_type = "cpu"  # (torchtitan's meshes: "cuda" where it finds no accelerator)
    dist_utils.set_spmd_backend("partial_dtensor")
    dp = world // tp
    parallelism = ParallelismConfig(tensor_parallel_degree=tp, data_parallel_shard_degree=dp,
                                    spmd_backend="partial_dtensor")
    parallel_dims = ParallelDims.from_config(parallelism, world)
    parallel_dims.build_mesh()
    config = _config(tp=tp, dp=dp)
    _override(config)
    with torch.device("meta"):
        model = config.build()
    model.verify_module_protocol()
    model = parallelize_llama(model, parallel_dims=parallel_dims, parallelism=parallelism,
                              training=TrainingConfig(mixed_precision_param="float32", local_batch_size=BATCH,
                                                      seq_len=SEQ),
                              compile_config=CompileConfig(), dump_folder=tmp,
                              ac_config={"": None, "selective": SelectiveAC.Config(), "full": FullAC.Config()}[ac])
    # apply_fsdp_to_decoder turns FSDP2's gradient division off (a divide factor of 1), which
    # FSDP2 then reduces with PREMUL_SUM, an op gloo lacks: plain sums, the same values.
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)
    model.to_empty(device="cpu")
    with torch.no_grad():
        torch.manual_seed(0)
        model.init_weights(buffer_device=None)
    # (names as the unwrapped model's: activation checkpointing wraps each block in a
    # CheckpointWrapper, whose child is _checkpoint_wrapped_module)
    unwrapped = lambda name: name.replace("_checkpoint_wrapped_module.", "")  # noqa: E731
    params = {unwrapped(n): p for n, p in model.named_parameters()}
    norms = {unwrapped(n): m for n, m in model.named_modules()
             if isinstance(m, (RMSNorm, triton_layers.TritonRMSNorm))}
    # (isinstance: FSDP2 makes a class of its own for a module it wraps, FSDPTitanTritonRMSNorm)
    assert len(norms) == N_NORMS and all(isinstance(m, tti.TitanTritonRMSNorm) for m in norms.values()), norms
    assert all(isinstance(m.weight, DTensor) for m in norms.values())

    # (CPU tensors take the kernels through the interpreter, not on a GPU machine: the reference)
    kernels = triton_layers.uses_kernels(torch.zeros(1))

    # torchtitan's model in one process, from the same weights, on the whole batch.
    reference = _build(_config())
    with torch.no_grad():
        for name, p in reference.named_parameters():
            p.copy_(params[name].full_tensor())
    inputs, labels = _batch(rows=BATCH * dp)
    dp_rank = parallel_dims.get_mesh("batch").get_local_rank() if dp > 1 else 0
    rows = slice(dp_rank * BATCH, (dp_rank + 1) * BATCH)

    # The norms see their input sharded on the sequence (torchtitan's sequence parallelism).
    seen = []
    norms["layers.0.attention_norm"].register_forward_pre_hook(lambda m, args: seen.append(args[0]))

    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, reference)]
    for step in range(2):
        want_logits = reference(inputs)
        want = torch.nn.functional.cross_entropy(want_logits.flatten(0, 1), labels.flatten())
        want.backward()
        with _Launches() as forward:
            logits = model(inputs[rows])
            full = logits.full_tensor()  # (the lm_head's output: sharded on the vocabulary)
            # this rank's share of the mean over the whole batch (FSDP2 sums gradients over
            # the data-parallel ranks: apply_fsdp_to_decoder turns its division off)
            loss = torch.nn.functional.cross_entropy(full.flatten(0, 1), labels[rows].flatten(),
                                                     reduction="sum") / labels.numel()
        with _Launches() as backward:  # (with activation checkpointing: the blocks' forwards again)
            loss.backward()
        if kernels:
            assert forward.fwd == N_NORMS and forward.bwd == 0, vars(forward)
            assert backward.bwd >= N_NORMS and backward.fwd == (2 * LAYERS if ac else 0), vars(backward)
        total = loss.detach().clone()
        dist.all_reduce(total)  # (the sum over the dp ranks, each counted tp times)
        _close(total / tp, want.detach(), f"loss, step {step}", 1e-5)
        _close(full, want_logits[rows].detach(), f"logits, step {step}", 1e-5)
        if step == 0:
            assert isinstance(seen[0], DTensor) and Shard(1) in seen[0].placements, seen[0]
            for name, p in reference.named_parameters():
                _close(params[name].grad, p.grad, f"grad {name}", 1e-4)
        for opt in optimizers:
            opt.step()
            opt.zero_grad()


def test_tensor_parallel_two_ranks():
    """TP=2 (sequence parallel norms), torchtitan's parallelize_llama, with the selective
    activation checkpointing of its debugmodel config."""
    _spawn(2, 2, "selective")


def test_fsdp2_and_tensor_parallel_four_ranks():
    """FSDP2 x TP on a 2 x 2 mesh, torchtitan's parallelize_llama, each block checkpointed."""
    _spawn(4, 2, "full")
