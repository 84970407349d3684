"""The one @triton.jit helper every kernel of ours calls first: programmatic dependent launch
(``launch_config.LaunchConfig.pdl``, ``_common.pdl``)."""
import triton
import triton.language as tl


@triton.jit
def pdl_start(USE_PDL: tl.constexpr):
    """Programmatic dependent launch (Hopper and newer; ``_common.pdl``), first thing in every
    kernel of ours: wait until the
    kernel before this one in the stream has finished and its writes are visible, then let
    the kernel after this one launch. Called first thing, before any load or store: the wait
    also keeps this kernel from writing memory the previous one still reads. What it saves
    is the launch: the next kernel's programs are placed while this one drains, and start
    the moment it ends. (A no-op for a kernel launched without the launch attribute, as the
    compiled door launches; never compiled on GPUs without it, nor in the interpreter.)"""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
