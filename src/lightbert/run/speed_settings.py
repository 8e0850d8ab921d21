"""`speed.*` (conf/train.yaml), typed and checked: switches that change how fast a run goes, never its numbers. Read by
the run's settings (`run.settings`), applied by `run.speed`. Torch-free, as the settings are."""

from __future__ import annotations

from dataclasses import dataclass

from lightbert.errors import ConfigError

# torch.compile's modes: reduce-overhead captures CUDA graphs (a launch-bound step, e.g. the paper's per-device
# batch), one per input shape: `speed.fix_batch_shapes` gives its batches a few shapes, and `SpeedSettings` and
# `RunSettings` refuse what changes them every batch.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# speed.unpad -> BertModel.unpad; true picks by the device (`run.speed.unpadding_for`).
UNPAD_SETTINGS = {False: "off", "groups": "groups", "varlen": "varlen"}
MATMUL_PRECISIONS = {"highest": "full fp32 matmuls", "high": "TF32 matmuls", "medium": "bf16 matmuls for fp32"}


@dataclass(frozen=True)
class SpeedSettings:
    """`speed.*` (conf/train.yaml): switches that change how fast a run goes, never its numbers."""

    unpad: bool | str = True
    compile: bool | None = None  # None: by the device (`compiles`)
    compile_mode: str = "default"
    matmul_precision: str = "high"
    fp8: bool = False

    def __post_init__(self) -> None:
        if self.unpad is not True and self.unpad not in UNPAD_SETTINGS:
            raise ConfigError(
                f"speed.unpad={self.unpad} is not known; valid: true (by the device), false, groups, varlen"
            )
        if self.compile not in (True, False, None):
            raise ConfigError(f"speed.compile={self.compile} is not known; valid: null (by the device), true, false")
        if self.compile_mode not in COMPILE_MODES:
            raise ConfigError(f"speed.compile_mode={self.compile_mode} is not known; valid: {', '.join(COMPILE_MODES)}")
        if self.matmul_precision not in MATMUL_PRECISIONS:
            raise ConfigError(
                f"speed.matmul_precision must be one of {', '.join(MATMUL_PRECISIONS)}, got {self.matmul_precision}"
            )

    def compiles(self, on_cuda: bool, training: bool = True) -> bool:
        """speed.compile, null resolved by the device: a training run on a CUDA GPU compiles (the step measured
        1.36x the eager one on an H100, bench/RESULTS.md), unless speed.unpad=groups, whose host syncs split the
        step into pieces; a CPU run and an evaluation stay eager (on a CPU compiling measured slower)."""
        if self.compile is not None:
            return self.compile
        return on_cuda and training and self.unpad != "groups"

    def cuda_graphs(self, compiles: bool) -> bool:
        """Whether the step runs in CUDA graphs (compile_mode=reduce-overhead), given whether it compiles."""
        return compiles and self.compile_mode == "reduce-overhead"
