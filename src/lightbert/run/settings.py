"""A run's settings: built once from the composed Hydra config (`RunSettings.from_config`), then read by every stage
of the run as typed, frozen fields. The config is checked as a whole first (`run.config_checks`: it resolves, has
its parts, and every number is checked once, in one pass over one table); then each part checks how its values go
together in `__post_init__` (litgpt's `args.py` way), and the optimiser's and the model's settings are their typed
configs (`OptimConfig`, `BertConfig`), each checking how its values go together as it is made. A command with a bad
value is refused with one message naming the key the command line accepts, before anything is read or written; no
stage below this module reads the config by its string keys.

Torch-free at import, so that a refused command is refused before torch loads; the devices a trainer resolves to
(`-1`, `auto`) are worked out on first use (`TrainerSettings.devices_per_node`), by Lightning's own parsing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from lightbert.errors import ConfigError, ParameterError
from lightbert.model_config import POOLINGS, BertConfig
from lightbert.optim_config import OptimConfig
from lightbert.run.phases import Phase, phases_of
from lightbert.run.speed_settings import SpeedSettings
from lightbert.settings_fields import CountOrFile, Number, setting, values_of
from lightbert.tasks.pretraining.objectives import OBJECTIVES, MaskingShares, check_examples

# Lightning's precisions (lightning.fabric.connector._PRECISION_INPUT), here so that a refusal needs no torch.
PRECISIONS = ("16-true", "16-mixed", "bf16-true", "bf16-mixed", "32-true", "64-true", "16", "bf16", "32", "64",
              "transformer-engine", "transformer-engine-float16")  # fmt: skip


def _choice(group: str) -> str | None:
    """The option the command line (or the defaults) chose for a config group, e.g. `glue/mrpc` for task."""
    return HydraConfig.get().runtime.choices.get(group) if HydraConfig.initialized() else None


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


@dataclass(frozen=True)
class CheckedConfig:
    """The composed config once checked (`run.config_checks.checked_config`), what `RunSettings.from_config` is built
    from: `config` is a copy of it that holds each checked value as checked, `numbers` those values by key."""

    config: DictConfig
    numbers: dict[str, Any]


@dataclass(frozen=True)
class TrainerSettings:
    """`trainer.*`: where and how the run goes. `config` is the node Lightning's Trainer is built from."""

    config: DictConfig = field(repr=False)
    option: str | None  # the trainer= choice, for messages
    accelerator: str
    devices: Any  # as given: a count, -1 or auto for all, or device indices
    precision: str
    strategy: str  # its name on the run line: auto, ddp, fsdp, ...
    progress_bar: bool
    # The numbers, each with its kind and range (`settings_fields`); no default: every trainer config sets them (the
    # YAML's is the one default). log_every_n_steps, gradient_clip_val, val_check_interval: Lightning reads `config`.
    num_nodes: int = setting(number=Number(int, minimum=1))
    max_steps: int = setting(number=Number(int, minimum=-1))
    accumulate_grad_batches: int = setting(number=Number(int, minimum=1))
    log_every_n_steps: int = setting(number=Number(int, minimum=1))
    max_epochs: int | None = setting(number=Number(int, minimum=-1, nullable=True))
    gradient_clip_val: float | None = setting(number=Number(float, nullable=True))
    val_check_interval: float | None = setting(number=Number(float, positive=True, nullable=True))

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"trainer.precision={self.precision!r} is not a precision; valid: {', '.join(PRECISIONS)}"
            )
        if self.precision == "16-true":
            # Lightning's 16-true scales no loss: small fp16 gradients underflow to zero.
            raise ConfigError(
                "trainer.precision=16-true holds the model in fp16 with no loss scaling, and small gradients underflow "
                "to zero: use trainer.precision=16-mixed (scaled loss), or bf16-true on a GPU that has bf16"
            )
        if self.precision == "bf16-true" and self.accumulate_grad_batches > 1:
            # The micro-batches' gradients add up in the bf16 .grad of the model (about 1% error over 128 of them).
            raise ConfigError(
                f"trainer.precision=bf16-true adds up gradients in bf16, which loses precision over "
                f"trainer.accumulate_grad_batches={self.accumulate_grad_batches}: set "
                "trainer.accumulate_grad_batches=1 (a larger task.batch_size instead) or trainer.precision=bf16-mixed"
            )
        if self.max_steps == -1 and self.max_epochs in (-1, None):
            raise ConfigError(
                "trainer.max_steps=-1 and trainer.max_epochs=-1 leave the run without an end: set one of them, "
                "e.g. trainer.max_steps=1000"
            )
        self._check_devices_text()

    def _check_devices_text(self) -> None:
        if self.devices is None or isinstance(self.devices, list):
            return
        text = str(self.devices).strip()
        counts = [part.strip() for part in text.split(",") if part.strip()]
        numbers = counts and all(part.lstrip("-").isdigit() for part in counts)
        if text == "auto" or (numbers and (len(counts) > 1 or int(counts[0]) != 0)):  # "0,1" are device indices
            return
        raise ConfigError(
            f"trainer.devices={self.devices!r} is not a number of devices: give a count (1, 2, ...), -1 or auto for "
            "all, or a list of device indices such as [0,1]"
        )

    @property
    def wants_cuda(self) -> bool:
        return self.accelerator in ("gpu", "cuda")

    @cached_property
    def on_cuda(self) -> bool:
        """Whether the run goes on CUDA GPUs here (accelerator auto: when there is one)."""
        from lightbert.distributed import runs_on_cuda

        return runs_on_cuda(self.accelerator)

    @cached_property
    def devices_per_node(self) -> int:
        """The devices per node the trainer will use (`-1` and `auto` resolved as Lightning resolves them)."""
        from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator

        if self.on_cuda:
            return len(CUDAAccelerator.parse_devices(self.devices) or [])
        if self.devices in ("auto", -1, "-1"):
            return 1  # Lightning's CPU accelerator: one process
        return int(CPUAccelerator.parse_devices(self.devices))

    @property
    def world_size(self) -> int:
        return self.devices_per_node * self.num_nodes

    @classmethod
    def from_config(cls, trainer: DictConfig, numbers: dict[str, Any]) -> TrainerSettings:
        """`numbers`: the config's numbers, checked (`run.config_checks.checked_config`)."""
        strategy = trainer.get("strategy", "auto")
        if OmegaConf.is_dict(strategy):
            target = str(strategy.get("_target_", ""))
            strategy = "fsdp" if "fsdp" in target.lower() else target.rsplit(".", 1)[-1]
        return cls(
            config=trainer,
            option=_choice("trainer"),
            accelerator=str(trainer.get("accelerator", "auto")),
            devices=_plain(trainer.get("devices", "auto")),
            precision=str(trainer.get("precision", "32-true")),
            strategy=str(strategy),
            progress_bar=bool(trainer.get("enable_progress_bar", True)),
            **values_of(cls, "trainer", numbers),
        )


@dataclass(frozen=True)
class TaskSettings:
    """`task.*`: the objective, its data and the paper's defaults. `datamodule` and `module` are the nodes the task's
    LightningDataModule and LightningModule are built from."""

    name: str
    option: str | None  # the task= choice, for messages
    datamodule: DictConfig = field(repr=False)
    module: DictConfig = field(repr=False)
    data_files: dict[str, str] | None  # fine-tuning: the given files by split (None for pre-training)
    objective: str | None  # pre-training's
    packing: bool
    sparse_mlm_head: bool
    # The numbers, each with its kind and range (`settings_fields`): no default where every task's config sets it (the
    # YAML's is the one default), else None where this task's config does not have it (each is one task's or a few).
    # task.datamodule's are handed to the DataModule within `datamodule`, as checked.
    batch_size: int = setting(number=Number(int, minimum=1))
    global_batch_size: int | None = setting(number=Number(int, minimum=1, nullable=True))
    max_seq_length: int | None = setting(number=Number(int, minimum=1, nullable=True))
    num_workers: int | str = setting(number=Number(int, or_auto=True), key="datamodule.num_workers")
    checkpoint_every_n_steps: int | None = setting(None, number=Number(int, minimum=1, nullable=True))
    cpu_val_check_interval: int | None = setting(None, number=Number(int, minimum=1, nullable=True))
    scale: float | None = setting(None, number=Number(float, positive=True))  # task=embedding: 1 / temperature
    mini_batch_size: int | None = setting(None, number=Number(int, minimum=1, nullable=True))  # embedding's GradCache
    eval_batch_size: int | None = setting(
        None, number=Number(int, minimum=1, nullable=True), key="datamodule.eval_batch_size"
    )
    dupe_factor: int | None = setting(None, number=Number(int, minimum=1), key="datamodule.dupe_factor")
    # null: from the masking rate
    max_predictions_per_seq: int | None = setting(
        None, number=Number(int, minimum=1, nullable=True), key="datamodule.max_predictions_per_seq"
    )
    vocab_size: int | None = setting(None, number=Number(int, minimum=1), key="datamodule.vocab_size")
    # Words appended to init_from's vocabulary: a count, or a file of them (`tasks.pretraining.domain_words`).
    add_words: int | str | None = setting(None, number=CountOrFile("words"), key="datamodule.add_words")
    # A share of the training batches between two validations (pre-training); null reads the whole held-out split.
    validation_share: float | None = setting(
        None, number=Number(float, positive=True, largest=1, nullable=True), key="datamodule.validation_share"
    )

    def __post_init__(self) -> None:
        if self.objective is not None and self.objective not in OBJECTIVES:
            raise ConfigError(f"task.objective={self.objective!r} is not known; valid: {list(OBJECTIVES)}")
        if self.pooling is not None and self.pooling not in POOLINGS:
            raise ConfigError(f"task.pooling={self.pooling!r} is not known; valid: {list(POOLINGS)} or null")
        masking = self.datamodule.get("masking")
        if masking is not None:
            try:
                MaskingShares(**masking)
            except ParameterError as error:
                raise ConfigError(error.template.format("task.datamodule.masking")) from None  # its one parameter

    @property
    def fine_tuning(self) -> bool:
        return self.data_files is not None

    # What the stages read of task.datamodule and task.module, typed here: below this module they are handed whole to
    # the builder (`run.building`), never read by key (tests/test_layout.py).
    @property
    def tokenizer_path(self) -> str | None:
        return self.datamodule.get("tokenizer_path")

    @property
    def lowercase(self) -> bool:
        return bool(self.datamodule.get("lowercase", True))

    @property
    def cache_dir(self) -> str | None:
        given = self.datamodule.get("cache_dir")
        return str(given) if given else None

    @property
    def whole_word_masking(self) -> bool:
        return self.datamodule.get("whole_word_masking") is True

    @property
    def hub_dataset(self) -> str | None:
        return self.datamodule.get("hub_dataset")

    @property
    def pooling(self) -> str | None:
        """A sentence embedding task's task.pooling as given (checked in `__post_init__`); None: init_from's."""
        return self.module.get("pooling")

    @property
    def module_class(self) -> type:
        """The task's LightningModule class (its `head`, none for pre-training)."""
        from hydra.utils import get_class

        return get_class(str(self.module._target_))

    @property
    def module_arguments(self) -> dict:
        """task.module's values, resolved: what its head is built with (`Head.arguments`)."""
        return OmegaConf.to_container(self.module, resolve=True)

    @property
    def token_types(self) -> int:
        """How many segments the task's inputs use (its DataModule class says)."""
        from hydra.utils import get_class

        return get_class(str(self.datamodule._target_)).token_types(self.datamodule)

    @classmethod
    def from_config(cls, task: DictConfig, numbers: dict[str, Any]) -> TaskSettings:
        """`numbers`: the config's numbers, checked (`run.config_checks.checked_config`)."""
        files = task.get("data_files")
        return cls(
            name=str(task.name),
            option=_choice("task"),
            datamodule=task.datamodule,
            module=task.module,
            data_files=None if files is None else {split: str(path) for split, path in files.items() if path},
            objective=task.get("objective"),
            packing=task.datamodule.get("packing") is True,
            sparse_mlm_head=task.module.get("sparse_mlm_head") is True,
            **values_of(cls, "task", numbers),
        )


@dataclass(frozen=True)
class Batches:
    """The global batch: task.batch_size x devices x nodes x accumulation. `task.global_batch_size` keeps it whatever
    the devices and nodes by deriving the accumulation (a resize of the job, a requeue onto other nodes)."""

    per_device: int
    devices: int  # per node
    nodes: int
    accumulate: int
    global_batch: int


@dataclass(frozen=True)
class RunSettings:
    """Everything a run reads, checked: see the module's docstring. `config` is the composed config as a whole, for
    the record in `.hydra/` and the loggers' hyperparameters."""

    config: DictConfig = field(repr=False)
    output_dir: Path
    seed: int = setting(number=Number(int, largest=2**32 - 1))  # numpy's and Python's seeds
    init_from: str | None
    resume: bool  # resume=true: continue from checkpoints/last.ckpt
    overrides: tuple[str, ...]  # the command line's
    # The sizes and regularisation asked for, checked as it is made; its vocab_size is the tokenizer's (None until the
    # DataModule has one: run.building.with_vocabulary). init_from's checkpoint decides its own sizes.
    model: BertConfig
    model_option: str | None  # the model= choice
    model_overrides: tuple[str, ...]  # the command line's model=... and model.<key>=... (asking for sizes)
    task: TaskSettings
    trainer: TrainerSettings
    speed: SpeedSettings
    optim: OptimConfig  # each value as its field checked it
    phases: tuple[Phase, ...]
    callbacks: tuple[DictConfig, ...] = field(repr=False)
    corpus: DictConfig | None = field(repr=False)  # pre-training's corpus= group

    def __post_init__(self) -> None:
        if self.task.fine_tuning and not self.init_from and not self.task.tokenizer_path:
            raise ConfigError(
                f"task={self.task.option or self.task.name} fine-tunes a pre-trained model: set init_from=<checkpoint> "
                "(a lightbert .ckpt or run directory, a Hugging Face directory, or a hub id); its tokenizer comes "
                "with it"
            )
        if self.task.name == "pretrain_modern" and self.task.objective != "mlm":
            raise ConfigError(
                f"task=pretrain_modern is masked LM alone (the modern recipe has no next sentence prediction), and "
                f"task.objective={self.task.objective} asks for another objective; drop it, or use task=pretrain for "
                "BERT's MLM + NSP"
            )
        self._check_examples()
        if self.trainer.precision == "16-mixed" and self.trainer.strategy == "fsdp":
            # Lightning's ModelParallelStrategy (FSDP2) refuses it: a loss scaler would judge each device's gradient
            # shard alone, and one device could skip a step that another takes.
            raise ConfigError(
                "trainer.precision=16-mixed (fp16 with a loss scaler) does not run under trainer=fsdp; use "
                "trainer.precision=bf16-mixed (Ampere GPUs and later) or 32-true"
            )
        finds_unused = "find_unused" in self.trainer.strategy or OmegaConf.select(
            self.trainer.config, "strategy.find_unused_parameters", default=False
        )
        if self.task.module.get("mini_batch_size") and (self.trainer.strategy == "fsdp" or finds_unused):
            # GradCache hands each parameter its gradient from its own backward passes: FSDP's sharded parameters get
            # theirs only through FSDP's own backward, and DDP looking for unused parameters marks them all unused
            # (the loss GradCache returns has no graph back to them), then sees them ready twice.
            raise ConfigError(
                f"task.mini_batch_size (GradCache) does not run under trainer.strategy={self.trainer.strategy}; use "
                "trainer=ddp with it, or task.mini_batch_size=null"
            )
        if self.trainer.precision == "bf16-true" and self.trainer.strategy == "fsdp":
            # lightbert.optim.MasterWeights keeps the fp32 weights in its own state, which FSDP's sharded optimizer
            # state does not know; FSDP with bf16-mixed keeps fp32 shards and computes in bf16 already.
            raise ConfigError(
                "trainer.precision=bf16-true (a bf16 model with fp32 master weights in the optimizer) does not run "
                "under trainer=fsdp; use trainer.precision=bf16-mixed with FSDP"
            )
        self._check_cuda_graphs()

    def _check_examples(self) -> None:
        """task.datamodule.examples (pairs or chunks) for the run and each of its phases, with the objective each
        reads: chunks have no sentence pairs for NSP. Refused here, before anything is written."""
        if self.task.objective is None:  # fine-tuning
            return
        run = {"examples": self.task.datamodule.get("examples", "pairs"), "objective": self.task.objective}
        for number, phase in enumerate(self.phases):
            asked = run | {key: phase.datamodule[key] for key in run if key in phase.datamodule}
            try:
                check_examples(**asked)
            except ParameterError as error:
                where = f"task.phases[{number}] sets {asked}: " if asked != run else ""
                raise ConfigError(where + error.template.format("task.datamodule.examples")) from None

    def _check_cuda_graphs(self) -> None:
        """speed.compile_mode=reduce-overhead records CUDA graphs, which torch cannot combine with gradient
        accumulation (a replay overwrites the gradients being accumulated: "accessing gradient tensor output of
        CUDAGraphs that has been overwritten", pytorch#169545), and which record one graph per input shape."""
        if not self.cuda_graphs:
            return
        if self.trainer.accumulate_grad_batches > 1:
            raise ConfigError(
                f"speed.compile_mode=reduce-overhead (CUDA graphs) cannot run with trainer.accumulate_grad_batches="
                f"{self.trainer.accumulate_grad_batches}: a graph's replay overwrites the gradients being accumulated; "
                "set trainer.accumulate_grad_batches=1 (a larger task.batch_size instead) or speed.compile_mode=default"
            )
        unpad = self.speed.unpad
        if unpad == "groups" or (unpad == "varlen" and not self.task.packing):
            raise ConfigError(
                f"speed.compile_mode=reduce-overhead records one CUDA graph per input shape, and speed.unpad={unpad} "
                "changes the token count every batch: use speed.unpad=true (padded on a GPU) or speed.unpad=false"
            )
        unpacked = self.task.datamodule.get("packing") is False
        if unpacked and self.task.sparse_mlm_head and self.task.objective != "ltr":
            raise ConfigError(
                "speed.compile_mode=reduce-overhead records one CUDA graph per input shape, and unpacked "
                "pre-training's MLM head runs on a number of masked tokens that changes every batch: set "
                "task.datamodule.packing=true"
            )

    @property
    def compiles(self) -> bool:
        """Whether a training run compiles its step (`SpeedSettings.compiles`); the device is asked only when
        speed.compile is null (an accelerator that is not cpu)."""
        if self.speed.compile is not None or self.trainer.accelerator == "cpu":
            return bool(self.speed.compile)
        return self.speed.compiles(self.trainer.on_cuda)

    @property
    def cuda_graphs(self) -> bool:
        """Whether a training run's step runs in CUDA graphs (the device asked only for reduce-overhead)."""
        return self.speed.compile_mode == "reduce-overhead" and self.compiles

    @property
    def corpus_label(self) -> str:
        """Pre-training's corpus as the run line names it: the hub dataset, the files, or the demo."""
        corpus = self.corpus or {}
        return corpus.get("name") or ",".join(corpus.get("paths") or []) or "demo"

    @cached_property
    def batches(self) -> Batches:
        """The job's batches, its devices resolved; a global batch the devices cannot make is refused here."""
        trainer, wanted = self.trainer, self.task.global_batch_size
        devices, nodes, per_device = trainer.devices_per_node, trainer.num_nodes, self.task.batch_size
        accumulate = trainer.accumulate_grad_batches
        if wanted is None:
            return Batches(per_device, devices, nodes, accumulate, per_device * devices * nodes * accumulate)
        one_pass = per_device * devices * nodes
        if wanted % one_pass:
            raise ConfigError(
                f"task.global_batch_size={wanted} is not a multiple of task.batch_size ({per_device}) x {devices} "
                f"device(s) x {nodes} node(s) = {one_pass}; set task.batch_size so that it divides, or another "
                "task.global_batch_size"
            )
        if accumulate != 1 and accumulate != wanted // one_pass:
            raise ConfigError(
                f"task.global_batch_size={wanted} sets the accumulation ({wanted // one_pass} on {devices} device(s) "
                f"x {nodes} node(s)), and trainer.accumulate_grad_batches={accumulate} asks for another; set one of "
                "the two"
            )
        accumulate = wanted // one_pass
        # What cannot accumulate (refused above for trainer.accumulate_grad_batches) is refused for a derived one too.
        cannot = "trainer.precision=bf16-true (bf16 gradients)" if trainer.precision == "bf16-true" else None
        if self.cuda_graphs:
            cannot = "speed.compile_mode=reduce-overhead (CUDA graphs)"
        if accumulate > 1 and cannot:
            raise ConfigError(
                f"task.global_batch_size={wanted} needs {accumulate} accumulated batches per step on these devices, "
                f"and {cannot} cannot accumulate; raise task.batch_size so that one pass makes the global batch, or "
                "unset task.global_batch_size"
            )
        return Batches(per_device, devices, nodes, accumulate, wanted)

    @classmethod
    def from_config(cls, checked: CheckedConfig) -> RunSettings:
        """`checked`: the config checked as a whole (`run.config_checks.checked_config`). What the run builds is its
        copy that holds the numbers as checked (`1e3` as 1000): one value, checked once."""
        cfg, numbers = checked.config, checked.numbers
        trainer = TrainerSettings.from_config(cfg.trainer, numbers)
        task = TaskSettings.from_config(cfg.task, numbers)
        overrides = tuple(str(o) for o in cfg.get("overrides") or [])
        speed = cfg.get("speed") or {}
        optim = {**OmegaConf.to_container(cfg.optim, resolve=True), **values_of(OptimConfig, "optim", numbers)}
        return cls(
            config=cfg,
            output_dir=Path(cfg.paths.output_dir),
            **values_of(cls, "", numbers),
            init_from=str(cfg.init_from) if cfg.get("init_from") else None,
            resume=bool(cfg.get("resume", False)),
            overrides=overrides,
            model=BertConfig.from_dict({"vocab_size": None, **OmegaConf.to_container(cfg.model, resolve=True)}),
            model_option=_choice("model"),
            model_overrides=tuple(o for o in overrides if o.lstrip("+~").startswith(("model=", "model."))),
            task=task,
            trainer=trainer,
            speed=SpeedSettings(**{k: _plain(v) for k, v in speed.items()}),
            optim=OptimConfig.from_config(optim),
            phases=tuple(phases_of(cfg.task.get("phases"), trainer.max_steps)),
            callbacks=tuple((cfg.get("callbacks") or {}).values()),
            corpus=cfg.get("corpus"),
        )
