"""lightbert against transformers, in one process: a pre-training step, a fine-tuning step and data preparation.

    python bench/pretrain_step.py --model bert_base --seq-len 128            # all three parts
    python bench/pretrain_step.py --model bert_small --part pretrain

- Pre-training step: forward, backward and optimiser step of lightbert's training code
  (`PreTrainingModule._step`: sparse MLM head, unpadding as configured) and of
  `transformers.BertForPreTraining` (attn_implementation="sdpa"), holding the same weights, on the same batch:
  sentence pairs made by our pipeline from real text (the demo corpus, Python's documentation), 15% masked by
  our collator. A modern size (`--model modernbert_base`, ...) runs its own recipe's step instead: masked LM alone
  on contiguous chunks of the documents, 30% masked, against `transformers.ModernBertForMaskedLM`, both stepping
  with the recipe's StableAdamW. Same sizes (vocab 30522), dtype, threads and optimiser (torch AdamW, the fused
  kernel where the device has one, for both, or for a modern size lightbert's StableAdamW for both: the ratio is
  about the model; `--optimizer` picks). Before timing, both give the same loss on the
  batch in eval mode, so they do the same work. Steps are interleaved after warm-up; medians are reported.
- Fine-tuning step: sequence classification on a batch of single sentences of varied length, padded to the
  longest as a fine-tuning collator does; the same comparison.
- Data preparation: MB of raw text per second from a BERT-format file to finished examples (sentences,
  WordPiece ids, sentence pairs, saved as Arrow; then masked batches), against the tokenizer alone encoding
  the same lines (`tokenizers`' `encode_batch_fast`, its fastest call). The tokenizer is trained before the clock
  starts.

FLOPs per step count useful work only, the same for both sides: per real token 6N + 12·L·H·T (N parameters
in the Transformer blocks, T the sequence's real length; a sliding-window layer counts only the pairs in its window),
plus the MLM head (6·(H² + H·V)) on predicted positions only (`lightbert.plugins.callbacks.step_flops`). On CPU the
achieved FLOP/s are compared with a measured fp32 matmul peak on the same threads; on a GPU with its dense bf16 peak
(MFU).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
import transformers
import yaml
from omegaconf import open_dict

from lightbert.checkpoints.hf_format import (
    hf_family,
    lightbert_config_to_hf,
    lightbert_config_to_modernbert,
    lightbert_state_dict_to_hf,
    lightbert_state_dict_to_modernbert,
)
from lightbert.data.batches import PaddingCollator
from lightbert.model import BertConfig, BertForSequenceClassification
from lightbert.model.fp8 import convert_to_fp8
from lightbert.optim import MasterWeights, StableAdamW, parameter_groups
from lightbert.plugins.callbacks import gpu_peak_flops, step_flops
from lightbert.run.speed import unpadding_for
from lightbert.tasks.pretraining.corpus import DemoCorpus, TextCorpus
from lightbert.tasks.pretraining.datamodule import PretrainDataModule
from lightbert.tasks.pretraining.module import PreTrainingModule
from lightbert.tasks.pretraining.packing import PackingCollator, pack_batch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import step_profile  # noqa: E402

VOCAB_SIZE = 30522  # bert-base-uncased's: the sizes are BERT's even where the demo corpus yields fewer pieces


def model_config(name: str, dropout: float = 0.1) -> BertConfig:
    path = REPO / "conf" / "model" / f"{name}.yaml"
    if not path.is_file():
        valid = sorted(p.stem for p in (REPO / "conf" / "model").glob("*.yaml"))
        sys.exit(f"pretrain_step.py: unknown --model {name}; valid: {valid}")
    base = yaml.safe_load((path.parent / "_default.yaml").read_text())  # the encoder's options at BERT's values
    sizes = {**base, **yaml.safe_load(path.read_text())}
    sizes.pop("defaults", None)  # Hydra's list, not a size
    sizes.update(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    return BertConfig.from_dict({**sizes, "vocab_size": VOCAB_SIZE})


def modern(config: BertConfig) -> bool:
    """Whether `config` is the modern encoder (transformers' ModernBERT), which runs the modern recipe's step."""
    return hf_family(config.to_dict(), "--model") == "modernbert"


def hf_twin(ours: torch.nn.Module, config: BertConfig, task: str, tokenizer) -> torch.nn.Module:
    """transformers' model for `task` (pretraining, classification) holding exactly our weights (sdpa attention):
    BERT's classes, or ModernBERT's for the modern encoder (with `tokenizer`'s special tokens' ids)."""
    if modern(config):
        architecture = {"pretraining": "ModernBertForMaskedLM", "classification": "ModernBertForSequenceClassification"}
        values = lightbert_config_to_modernbert(config.to_dict(), tokenizer)
        hf_config = transformers.ModernBertConfig(**values, attn_implementation="sdpa")
        state = lightbert_state_dict_to_modernbert(ours.state_dict(), architecture[task])
    else:
        architecture = {"pretraining": "BertForPreTraining", "classification": "BertForSequenceClassification"}
        hf_config = transformers.BertConfig(**lightbert_config_to_hf(config.to_dict()), attn_implementation="sdpa")
        state = lightbert_state_dict_to_hf(ours.state_dict())
    if task == "classification":
        hf_config.num_labels = 2
    hf = getattr(transformers, architecture[task])(hf_config)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    # The MLM decoder is tied to the word embeddings; the loss check before timing shows the rest loaded.
    assert not unexpected and all("position_ids" in k or "decoder." in k for k in missing), missing
    hf.tie_weights()
    return hf


def training_step(
    model: torch.nn.Module, loss: Callable[[], torch.Tensor], device: torch.device, args, bf16_weights: bool = False
) -> Callable:
    """One optimizer step of `model` on `loss()`: forward (under bf16 autocast if asked), backward, the optimiser
    (`--optimizer`: AdamW, or the modern recipe's StableAdamW). With `bf16_weights` the model is already bf16
    (trainer.precision=bf16-true): no autocast, the optimiser on fp32 masters."""
    fused = device.type in ("cpu", "cuda") and not args.foreach

    def make(groups):
        if args.optimizer == "stableadamw":  # task=pretrain_modern's settings
            return StableAdamW(groups, lr=1e-5, betas=(0.9, 0.98), eps=1e-6, decouple_lr=True)
        return torch.optim.AdamW(groups, lr=1e-5, eps=1e-6, fused=fused)

    groups = parameter_groups(model, 1e-5 if args.optimizer == "stableadamw" else 0.01)
    for group in groups:
        del group["adapt"]  # LAMB's
    optimizer = MasterWeights(groups, make) if bf16_weights else make(groups)

    def step() -> None:
        with autocast(device, args, model_in_bf16=bf16_weights):
            value = loss()
        value.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def autocast(device: torch.device, args, model_in_bf16: bool = False) -> torch.autocast:
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.dtype == "bf16" and not model_in_bf16)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_interleaved(steps: dict, device: torch.device, warmup: int, repeats: int) -> dict[str, float]:
    """Median seconds per call of each step function, calls interleaved so drift hits both alike."""
    for fn in steps.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, fn in steps.items():
            synchronize(device)
            started = time.perf_counter()
            fn()
            synchronize(device)
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(t) for name, t in times.items()}


def matmul_peak(device: torch.device, dtype: torch.dtype) -> float:
    """The machine's practical peak: best FLOP/s of a large square matmul."""
    # On a CPU, 1024 reaches the same peak as 2048 at an eighth of the work (measured on one thread: 151-168 against
    # 129-138 GFLOP/s, 0.2 against 1.6 CPU-s); bf16 is emulated on most CPUs.
    n = 8192 if device.type == "cuda" else 1024 if dtype == torch.float32 else 512
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(10):
        synchronize(device)
        started = time.perf_counter()
        a @ b
        synchronize(device)
        best = min(best, time.perf_counter() - started)
    return 2 * n**3 / best


def report(name: str, seconds: dict, tokens: int, flops: float, peak: float, device: torch.device) -> float:
    """A line per side timed; with --hf-compile also the ratio to transformers compiled. Returns the ratio to
    transformers eager."""
    peak_name = "MFU" if device.type == "cuda" else "of measured matmul peak"
    width = max(map(len, seconds))
    for side, step in seconds.items():
        achieved = flops / step
        print(
            f"{name:<14} {side:<{width}} {step * 1e3:9.1f} ms/step {tokens / step:10.0f} tokens/s "
            f"{achieved / 1e12:7.3f} TFLOP/s  {100 * achieved / peak:5.1f}% {peak_name}"
        )
    if "transformers compiled" in seconds:
        ratio = seconds["transformers compiled"] / seconds["lightbert"]
        print(f"{name} speedup vs transformers compiled: {ratio:.2f}x")
    return seconds["transformers"] / seconds["lightbert"]


def unpadding(args, device: torch.device, packing: bool) -> str:
    """--unpad as speed.unpad sets it (`lightbert.run.speed.unpadding_for`), said as a run says it."""
    setting = {"true": True, "false": False}.get(args.unpad, args.unpad)
    precision = "bf16-mixed" if args.dtype == "bf16" else "32-true"
    how, line = unpadding_for(setting, device.type == "cuda", precision, packing)
    print(line)
    return how


def pretraining_batch(datamodule: PretrainDataModule, batch_size: int, seed: int) -> dict[str, torch.Tensor]:
    train = datamodule.datasets["train"]
    rows = random.Random(seed).sample(range(len(train)), batch_size)
    return datamodule.collator(torch.Generator().manual_seed(seed))([train[i] for i in rows])


def bench_pretrain(args, datamodule: PretrainDataModule, device: torch.device, peak: float) -> float:
    config = model_config(args.model)
    torch.manual_seed(args.seed)
    objective = "mlm" if modern(config) else "mlm_nsp"  # the modern recipe's masked LM alone
    print(f"optimizer: {args.optimizer}, both sides")
    module = PreTrainingModule(config.to_dict(), {"lr": 1e-5, "warmup_ratio": 0.01}, not args.dense_mlm_head, objective)
    module.model.bert.set_unpadding(unpadding(args, device, packing=args.packing))
    hf = hf_twin(module.model, config, "pretraining", datamodule.tokenizer)
    module.to(device)
    hf.to(device)
    plain = {k: v.to(device) for k, v in pretraining_batch(datamodule, args.batch_size, args.seed).items()}
    hf_inputs = {k: plain[k] for k in ("input_ids", "attention_mask", "labels")}
    if objective == "mlm_nsp":
        hf_inputs.update(token_type_ids=plain["token_type_ids"], next_sentence_label=plain["next_sentence_label"])
    batch = plain
    if args.packing:  # the same examples, masked the same way, packed into rows of --seq-len (packing=true)
        collate = PackingCollator(datamodule.collator(), args.seq_len)
        packed = pack_batch(
            {k: v.cpu() for k, v in plain.items()}, args.seq_len, collate.max_examples_per_row, collate.slots,
            datamodule.tokenizer.pad_id,
        )  # fmt: skip
        batch = {k: v.to(device) for k, v in packed.items()}
        print(f"packed: {plain['input_ids'].shape[0]} examples in {batch['input_ids'].shape[0]} rows of {args.seq_len}")

    module.eval()
    hf.eval()
    with torch.no_grad(), autocast(device, args):
        ours_loss, hf_loss = float(module._step(batch)["loss"]), float(hf(**hf_inputs).loss)
    print(f"same batch, same weights, eval mode: loss lightbert {ours_loss:.5f}, transformers {hf_loss:.5f}")
    assert abs(ours_loss - hf_loss) < (1e-3 if args.dtype == "fp32" else 5e-2), "the two models disagree"
    module.train()
    hf.train()
    if args.bf16_weights:
        module.to(torch.bfloat16)
    if args.fp8:  # after the loss check: float8 matmuls move the loss by their rounding
        print(f"speed.fp8: {convert_to_fp8(module.model)} Linear layers of lightbert's model in float8 (torchao)")
    steps = {
        "lightbert": training_step(module.model, lambda: module._step(batch)["loss"], device, args, args.bf16_weights),
        "transformers": training_step(hf, lambda: hf(**hf_inputs).loss, device, args),
    }
    if args.compile:
        module.compile_step(backend=args.compile_backend)  # what speed.compile runs
        print(compile_report(steps["lightbert"]))
    if args.hf_compile:
        steps["transformers compiled"] = compiled_step(hf, hf_inputs, device, args)
    seconds = time_interleaved(steps, device, args.warmup, args.repeats)
    if args.profile:  # one more step of lightbert's, warm now, under torch's profiler (bench/step_profile.py)
        print("\n".join(step_profile.lines(step_profile.profile_step(steps["lightbert"], device))))
    lengths = plain["attention_mask"].sum(1).cpu()  # the useful work is each example's, packed or not
    num_predictions = int((plain["labels"] != -100).sum())
    shape = tuple(batch["input_ids"].shape)
    print(
        f"pre-training {args.model}: batch {shape}, {int(lengths.sum())} real tokens "
        f"({100 * lengths.sum() / batch['input_ids'].numel():.1f}%), {num_predictions} predictions"
    )
    flops = float(step_flops(config, lengths, num_predictions))
    return report("pre-training", seconds, int(lengths.sum()), flops, peak, device)


def compiled_step(hf: torch.nn.Module, inputs: dict, device: torch.device, args) -> Callable[[], None]:
    """--hf-compile: the training step of transformers torch.compile'd, on the same weights (calling `hf` itself
    stays eager), with --compile-backend as lightbert's."""
    compiled = torch.compile(hf, backend=args.compile_backend)
    return training_step(hf, lambda: compiled(**inputs).loss, device, args)


def compile_report(step: Callable[[], None]) -> str:
    """Graph breaks and recompilations of lightbert's compiled step: one warm-up step, then three more."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    started = time.perf_counter()
    step()
    warm = time.perf_counter() - started
    graphs = counters["stats"]["unique_graphs"]
    for _ in range(3):
        step()
    breaks = sum(counters["graph_break"].values())
    recompiles = counters["stats"]["unique_graphs"] - graphs
    reasons = "; ".join(sorted(counters["graph_break"]))[:300]
    return (
        f"torch.compile: {breaks} graph breaks, {recompiles} recompilations after warm-up "
        f"({graphs} graph(s), first step {warm:.1f} s){': ' + reasons if reasons else ''}"
    )


def bench_finetune(args, datamodule: PretrainDataModule, device: torch.device, peak: float) -> float:
    config = model_config(args.model)
    torch.manual_seed(args.seed)
    print(f"optimizer: {args.optimizer}, both sides")
    ours = BertForSequenceClassification(config, num_labels=2)
    ours.bert.set_unpadding(unpadding(args, device, packing=False))
    hf = hf_twin(ours, config, "classification", datamodule.tokenizer)
    ours.to(device)
    hf.to(device)
    # Single sentences of the corpus, 3-60 words and at most 64 pieces, like SST-2's (its longest has 66 with
    # [CLS] and [SEP]): the batch pads to its longest, as a fine-tuning collator does.
    tokenizer = datamodule.tokenizer
    documents = datamodule.documents.shuffle(seed=args.seed).select(range(200))["sentences"]
    sentences = [s for document in documents for s in document if 3 <= len(s.split()) <= 60]
    encoded = [ids for ids in tokenizer.encode_batch(sentences) if len(ids) <= min(64, args.seq_len - 2)]
    rows = []
    for ids in encoded[: args.finetune_batch_size]:
        ids = [tokenizer.cls_id, *ids, tokenizer.sep_id]
        rows.append({"input_ids": ids, "token_type_ids": [0] * len(ids), "label": len(rows) % 2})
    batch = PaddingCollator(tokenizer.pad_id, {"label": ("labels", torch.long)})(rows)
    batch = {k: v.to(device) for k, v in batch.items()}
    inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    if modern(config):  # no segment embeddings: transformers' ModernBERT takes no token_type_ids
        del inputs["token_type_ids"]
    labels = batch["labels"]
    steps = {
        "lightbert": training_step(ours, lambda: F.cross_entropy(ours(**inputs).float(), labels), device, args),
        "transformers": training_step(hf, lambda: hf(**inputs, labels=labels).loss, device, args),
    }
    if args.compile:  # what speed.compile does to a fine-tuning model (padded, --unpad false: one graph per width)
        ours.compile(backend=args.compile_backend)
        print(f"fine-tuning {compile_report(steps['lightbert'])}")
    if args.hf_compile:
        steps["transformers compiled"] = compiled_step(hf, {**inputs, "labels": labels}, device, args)
    seconds = time_interleaved(steps, device, args.warmup, args.repeats)
    lengths = batch["attention_mask"].sum(1).cpu()
    print(
        f"fine-tuning {args.model}: batch {tuple(batch['input_ids'].shape)}, {int(lengths.sum())} real tokens "
        f"({100 * lengths.sum() / batch['input_ids'].numel():.1f}%), lengths {int(lengths.min())}-{int(lengths.max())}"
    )
    return report("fine-tuning", seconds, int(lengths.sum()), float(step_flops(config, lengths)), peak, device)


def bench_data(args, datamodule: PretrainDataModule) -> float:
    """MB/s from a BERT-format text file to cached examples, against `encode_batch_fast` on the same lines."""
    text_file = datamodule.corpus.build(datamodule.cache_dir)  # the demo corpus as a BERT-format file
    megabytes = text_file.stat().st_size / 1e6
    tokenizer = datamodule.tokenizer
    lines = [line for line in text_file.read_text().splitlines() if line.strip()]
    tokenizer_seconds, prepare_seconds, masking_seconds = [], [], []
    for _ in range(args.repeats):  # medians of 5 by default: one run of either is about a second, and CPUs are noisy
        started = time.perf_counter()
        tokenizer.backend.encode_batch_fast(lines, add_special_tokens=False)  # the fastest it gets, ids only
        tokenizer_seconds.append(time.perf_counter() - started)
        with tempfile.TemporaryDirectory() as cache:
            pipeline = PretrainDataModule(
                TextCorpus([str(text_file)]),
                cache_dir=cache,
                tokenizer=tokenizer,
                max_seq_length=args.seq_len,
                max_predictions_per_seq=datamodule.max_predictions_per_seq,
                dupe_factor=1,
                batch_size=32,
                num_workers=0,
                preprocessing_workers=args.threads,
            )
            started = time.perf_counter()
            pipeline.prepare_data()
            pipeline.setup()
            prepare_seconds.append(time.perf_counter() - started)
            started = time.perf_counter()
            num_examples = sum(len(batch["input_ids"]) for batch in pipeline.train_dataloader())
            masking_seconds.append(time.perf_counter() - started)
    tokenizer_s, prepare_s, masking_s = (
        statistics.median(t) for t in (tokenizer_seconds, prepare_seconds, masking_seconds)
    )
    print(
        f"data prep      {megabytes:.2f} MB of text, {len(lines)} lines -> {num_examples} training examples "
        "(dupe_factor 1)\n"
        f"data prep      tokenizer alone {megabytes / tokenizer_s:6.2f} MB/s; lightbert to cached examples "
        f"{megabytes / prepare_s:6.2f} MB/s; with every example also masked and batched once "
        f"{megabytes / (prepare_s + masking_s):6.2f} MB/s ({tokenizer_s / (prepare_s + masking_s):.2f}x)"
    )
    # Masking runs per batch in the DataLoader's workers, beside the training step, not before training.
    return tokenizer_s / prepare_s


class StepTimer(L.Callback):
    """Wall-clock time between the ends of consecutive training steps: everything the Trainer does per step (data
    loading, forward, backward, clipping, optimizer, schedule, callbacks, logging, progress bar)."""

    latest: StepTimer | None = None  # train(cfg) builds its callbacks from the config: this is how to read it back

    def __init__(self) -> None:
        self.ends: list[float] = []
        StepTimer.latest = self

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        synchronize(module.device)
        self.ends.append(time.perf_counter())


def step_seconds(ends: list[float], warmup: int) -> list[float]:
    return [b - a for a, b in zip(ends[warmup:], ends[warmup + 1 :], strict=False)]


def trainer_path_config(args, device: torch.device, out_dir: Path, steps: int):
    """The config `python src/train.py model=... trainer=...` runs, for `steps` steps without a validation."""
    from lightbert.run.configs import compose_config

    overrides = [
        f"model={args.model}",
        f"trainer={args.trainer}",
        f"trainer.accelerator={'cpu' if device.type == 'cpu' else 'gpu'}",
        "trainer.devices=1",
        f"task.batch_size={args.batch_size}",
        f"task.max_seq_length={args.seq_len}",
        f"task.datamodule.vocab_size={VOCAB_SIZE}",
        f"trainer.max_steps={steps}",
        f"trainer.val_check_interval={steps + 1}",  # no validation inside the timed steps
        f"task.checkpoint_every_n_steps={steps + 1}",
        f"logger={args.logger}",
        f"seed={args.seed}",
    ]
    if args.dtype == "bf16" and device.type == "cpu":
        overrides.append("trainer.precision=bf16-mixed")
    return compose_config(overrides, out_dir)


def hand_loop(cfg, steps: int, device: torch.device) -> list[float]:
    """The same module, DataModule, optimizer, schedule, precision and clipping as the Trainer run, in a plain loop."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from lightbert.optim import build_optimizer

    L.seed_everything(cfg.seed)
    datamodule = instantiate(cfg.task.datamodule, _partial_=True)()
    datamodule.prepare_data()
    datamodule.setup("fit")
    model = dict(OmegaConf.to_container(cfg.model, resolve=True))
    model.update(vocab_size=datamodule.tokenizer.vocab_size, pad_token_id=datamodule.tokenizer.pad_id)
    optim = OmegaConf.to_container(cfg.optim, resolve=True)
    module = instantiate(cfg.task.module, model=model, optim=optim, _convert_="all").to(device)
    schedule = build_optimizer(module.model, module.optim_config, int(cfg.trainer.max_steps))
    optimizer, scheduler = schedule["optimizer"], schedule["lr_scheduler"]["scheduler"]
    bf16 = "bf16" in str(cfg.trainer.precision)
    clip = cfg.trainer.gradient_clip_val
    ends = []
    module.train()
    for batch in datamodule.train_dataloader():
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = module._step(batch)["loss"]
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(module.parameters(), clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        ends.append(time.perf_counter())
        if len(ends) == steps:
            break
    return ends


def bench_trainer_path(args, device: torch.device) -> float:
    """Per-step time of pre-training through `lightbert.train` (L.Trainer with the configured trainer,
    callbacks, logger and the real DataModule) over the same steps in a hand-written loop; rounds alternate."""
    from lightbert import train

    steps = args.warmup + args.repeats + 1
    times: dict[str, list[float]] = {"trainer": [], "hand loop": []}
    for _ in range(2):
        with tempfile.TemporaryDirectory() as out:
            cfg = trainer_path_config(args, device, Path(out) / "run", steps)
            with open_dict(cfg):
                cfg.callbacks.step_timer = {"_target_": f"{__name__}.StepTimer"}
            train(cfg)
            times["trainer"] += step_seconds(StepTimer.latest.ends, args.warmup)
            times["hand loop"] += step_seconds(hand_loop(cfg, steps, device), args.warmup)
    trainer_s, loop_s = (statistics.median(times[k]) for k in ("trainer", "hand loop"))
    print(
        f"trainer path   trainer={args.trainer} {args.model}, batch {args.batch_size} x {args.seq_len}: "
        f"Trainer {trainer_s * 1e3:.1f} ms/step, hand loop {loop_s * 1e3:.1f} ms/step "
        f"(medians of {len(times['trainer'])} steps each)"
    )
    return trainer_s / loop_s


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's settings, the device's defaults filled in (bench/gpu_check.py builds its cases with it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bert_base", help="a conf/model/ size: bert_base, bert_small, ...")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=None, help="pre-training batch (default 8 CPU, 64 GPU)")
    parser.add_argument("--finetune-batch-size", type=int, default=32)
    parser.add_argument("--part", choices=["pretrain", "finetune", "data", "trainer", "all"], default="all")
    parser.add_argument("--trainer", default=None, help="--part trainer: the trainer config (default cpu, or gpu)")
    parser.add_argument("--logger", default="csv", help="--part trainer: the logger config (csv, wandb, ...)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default=None, help="default fp32 CPU, bf16 GPU")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads for both sides")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cache-dir", default=os.environ.get("LIGHTBERT_CACHE", "~/.cache/lightbert"), help="demo corpus, vocab"
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile lightbert's model (speed.compile)")
    parser.add_argument(
        "--compile-backend", default="inductor", help="--compile's and --hf-compile's backend (aot_eager: graphs only)"
    )
    parser.add_argument("--hf-compile", action="store_true", help="also time transformers torch.compile'd")
    parser.add_argument("--packing", action="store_true", help="lightbert on the same examples packed into rows")
    parser.add_argument(
        "--unpad", choices=["true", "false", "groups", "varlen"], default="true",
        help="lightbert's unpadding, as speed.unpad (true: by the device; false: padded)",
    )  # fmt: skip
    parser.add_argument(
        "--optimizer", choices=["adamw", "stableadamw"], default=None,
        help="both sides' optimiser (default: the recipe's: stableadamw for a modern size, adamw for BERT's)",
    )  # fmt: skip
    parser.add_argument("--foreach", action="store_true", help="AdamW's foreach implementation (optim.fused=false)")
    parser.add_argument("--dense-mlm-head", action="store_true", help="MLM head on every position")
    parser.add_argument(
        "--profile", action="store_true", help="pre-training: one more step under torch's profiler, by kind of work"
    )
    parser.add_argument(
        "--bf16-weights", action="store_true",
        help="lightbert's model in bf16 with fp32 master weights, no autocast (trainer.precision=bf16-true); bf16",
    )  # fmt: skip
    parser.add_argument(
        "--fp8", action="store_true",
        help="lightbert's encoder matmuls in float8 (speed.fp8=true; torchao; emulated, slowly, on a CPU)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    args.dtype = args.dtype or ("bf16" if device.type == "cuda" or args.bf16_weights else "fp32")
    if args.bf16_weights and args.dtype != "bf16":
        sys.exit("pretrain_step.py: --bf16-weights compares bf16 runs; drop --dtype fp32")
    args.batch_size = args.batch_size or (64 if device.type == "cuda" else 8)
    # The recipe's optimiser where not given: StableAdamW for a modern size, AdamW for BERT's (an unknown size is
    # refused here, naming the valid ones)
    args.optimizer = args.optimizer or ("stableadamw" if modern(model_config(args.model)) else "adamw")
    args.trainer = args.trainer or ("gpu" if device.type == "cuda" else "cpu")
    return args


def demo_datamodule(args: argparse.Namespace) -> PretrainDataModule:
    """The demo corpus's pre-training examples at --seq-len, prepared (cached under --cache-dir after the first time):
    the paper's sentence pairs, 15% masked; for a modern size its recipe's (task=pretrain_modern): contiguous chunks
    of each document, 30% masked, for masked LM alone."""
    recipe = {}
    if modern(model_config(args.model)):
        recipe = {"examples": "chunks", "objective": "mlm", "masked_lm_prob": 0.3}
    datamodule = PretrainDataModule(
        DemoCorpus(),
        cache_dir=args.cache_dir,
        vocab_size=VOCAB_SIZE,
        max_seq_length=args.seq_len,
        batch_size=args.batch_size,
        num_workers=0,
        seed=args.seed,
        **recipe,
    )
    datamodule.prepare_data()
    datamodule.setup()
    return datamodule


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 on both sides
    datamodule = demo_datamodule(args)
    peak = gpu_peak_flops(device) or matmul_peak(device, torch.float32 if args.dtype == "fp32" else torch.bfloat16)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {args.threads} threads"
    print(
        f"machine: {name}; torch {torch.__version__}, transformers {transformers.__version__}; {args.dtype}; "
        f"peak {peak / 1e12:.3f} TFLOP/s ({'datasheet' if device.type == 'cuda' else 'measured matmul'})"
    )
    if args.part in ("data", "all"):
        print(f"data preparation (to cached examples) vs tokenizer alone: {bench_data(args, datamodule):.2f}x")
    if args.part in ("finetune", "all"):
        print(f"fine-tuning speedup vs transformers: {bench_finetune(args, datamodule, device, peak):.2f}x")
    if args.part in ("trainer", "all"):
        ratio = bench_trainer_path(args, device)
        print(f"trainer path (src/train.py) per step over the hand loop: {ratio:.2f}x (1.00: no overhead)")
    if args.part in ("pretrain", "all"):
        print(f"speedup vs transformers: {bench_pretrain(args, datamodule, device, peak):.2f}x")


if __name__ == "__main__":
    main()
