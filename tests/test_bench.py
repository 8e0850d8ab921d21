"""bench/pretrain_step.py runs end to end (tiny sizes, one repeat) and checks itself before it times anything."""

import argparse
import csv
import gzip
import importlib
import json
import re
import sys
from pathlib import Path

import pytest
import torch
from helpers.runs import forked_benchmarks

from lightbert.model import BertConfig
from lightbert.plugins.callbacks import step_flops

REPO = Path(__file__).resolve().parents[1]


def test_step_flops_count_the_blocks_attention_and_predicted_head_rows():
    config = BertConfig()  # BERT_BASE: 85M parameters in the 12 blocks
    one_token = step_flops(config, torch.tensor([1]), 0)
    assert one_token == 6 * 12 * (4 * 768**2 + 2 * 768 * 3072) + 12 * 12 * 768
    full = step_flops(config, torch.tensor([128, 64]), 20)
    blocks = 6 * 84_934_656
    expected = 192 * blocks + 12 * 12 * 768 * (128**2 + 64**2) + 6 * 20 * (768**2 + 768 * 30522)
    assert full == expected


def test_step_flops_count_geglu_weights_and_only_the_windows_pairs_in_local_layers():
    """The modern encoder: GeGLU's 3·H·I feed-forward weights, and a sliding-window layer's attention over the pairs
    its window holds, counted here from the band itself."""
    config = BertConfig(num_hidden_layers=4, mlp="geglu", intermediate_size=1152, global_attn_every_n_layers=3,
                        local_attention=16, norm_position="pre", final_norm=True)  # fmt: skip
    lengths = torch.tensor([5, 9, 40])  # shorter than the window's reach, about it, and well past it
    positions = [torch.arange(int(t)) for t in lengths]
    local_pairs = sum(int(((p[:, None] - p[None, :]).abs() <= 8).sum()) for p in positions)
    global_pairs = sum(int(t) ** 2 for t in lengths)
    blocks = 4 * (4 * 768**2 + 3 * 768 * 1152)
    expected = 54 * 6 * blocks + 12 * 768 * (2 * global_pairs + 2 * local_pairs) + 6 * 7 * (768**2 + 768 * 30522)
    assert local_pairs < global_pairs  # 40 tokens reach past the window: the count differs from a global layer's
    assert step_flops(config, lengths, 7) == expected


def run_bench(script: str, *args: str) -> list[str]:
    """The benchmark's output lines, after checking that it ran to the end (`python bench/SCRIPT ARGS`, forked from
    a process that has done the imports: `helpers.runs.forked_benchmarks`). pretrain_step.py on one thread (its
    default is 2): on this size two threads' start-up and hand-offs cost up to 20x the CPU of the step itself, and a
    test's subject is the script's lines, not its threads (gpu_check.py hands it the worker's count the same way)."""
    if script == "pretrain_step.py" and "--threads" not in args:
        args = (*args, "--threads", "1")
    result = forked_benchmarks.run(script.removesuffix(".py"), *args)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()


def test_benchmark_runs_and_ends_with_the_ratio_line():
    lines = run_bench(
        "pretrain_step.py", "--model", "bert_tiny", "--seq-len", "64", "--batch-size", "4", "--finetune-batch-size",
        "8", "--warmup", "0", "--repeats", "1", "--profile",
    )  # fmt: skip
    assert re.fullmatch(r"speedup vs transformers: \d+\.\d\dx", lines[-1]), lines[-1]
    # --profile: one more pre-training step under torch's profiler, a line per kind of work, then its JSON
    profiled = [line for line in lines if line.startswith("profile ") and not line.startswith("profile json: ")]
    assert len(profiled) == 9 and re.fullmatch(r"profile +one steady step, [\d.]+ ms, \d+ kernel launches", profiled[0])
    assert [line.split()[1] for line in profiled[1:]] == ["GEMM", "attention", "normalization", "element-wise",
                                                          "loss", "optimizer", "copies", "host"]  # fmt: skip
    assert any(line.startswith("profile json: {") for line in lines)
    assert any(re.fullmatch(r"fine-tuning speedup vs transformers: \d+\.\d\dx", line) for line in lines)
    assert any(line.startswith("data preparation (to cached examples) vs tokenizer alone: ") for line in lines)
    assert any(line.startswith("trainer path (src/train.py) per step over the hand loop: ") for line in lines)
    # Before timing, both models gave the same loss on the batch with the same weights.
    losses = re.search(r"loss lightbert ([\d.]+), transformers ([\d.]+)", "\n".join(lines))
    assert losses and abs(float(losses[1]) - float(losses[2])) < 1e-3
    assert sum("ms/step" in line and "tokens/s" in line for line in lines) == 4  # both sides of both steps


def test_the_modern_step_runs_its_recipe_against_transformers_modernbert():
    """A modern size runs the modern recipe's step (masked LM alone on chunks, 30% masked, packed) against
    transformers' ModernBertForMaskedLM holding the same weights: the same loss before timing, and the ratio line."""
    lines = run_bench(
        "pretrain_step.py", "--model", "modernbert_tiny", "--seq-len", "64", "--batch-size", "4", "--packing",
        "--part", "pretrain", "--warmup", "0", "--repeats", "1",
    )  # fmt: skip
    assert re.fullmatch(r"speedup vs transformers: \d+\.\d\dx", lines[-1]), lines[-1]
    assert "optimizer: stableadamw, both sides" in lines  # the recipe's optimiser, in the timed step
    losses = re.search(r"loss lightbert ([\d.]+), transformers ([\d.]+)", "\n".join(lines))
    assert losses and abs(float(losses[1]) - float(losses[2])) < 1e-3
    # 30% of a chunk's tokens are predicted, where BERT's pairs would have 15%
    shape = next(line for line in lines if line.startswith("pre-training modernbert_tiny: batch "))
    real, predicted = map(int, re.search(r"(\d+) real tokens .* (\d+) predictions", shape).groups())
    assert 0.25 < predicted / real < 0.35, shape


def test_inference_benchmark_runs_checks_parity_and_ends_with_the_ratio_line():
    lines = run_bench(
        "predict_vs_pipeline.py", "--model", "bert_tiny", "--sentences", "32", "--repeats", "1", "--warmup", "0",
        "--vocab-size", "2000",
    )  # fmt: skip
    assert re.fullmatch(r"predict speedup vs transformers\.pipeline: \d+\.\d\dx", lines[-1]), lines[-1]
    assert sum("examples/s" in line for line in lines) == 3  # lightbert and two pipeline batch sizes


def bench_module(name: str):
    """bench/<name>.py as a module."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(REPO / "bench"))


def switch_table():
    return bench_module("switch_table")


def test_the_padded_fine_tuning_step_compiles_to_one_graph_and_is_compared_with_transformers_compiled():
    """`--part finetune --unpad false --compile`: the padded classifier step has no graph break (so one CUDA graph per
    padded width on a GPU); `--hf-compile` adds transformers compiled, with its own ratio line. switch_table.py
    reads every figure of that output."""
    lines = run_bench(
        "pretrain_step.py", "--model", "bert_tiny", "--seq-len", "64", "--finetune-batch-size", "8", "--part",
        "finetune", "--unpad", "false", "--compile", "--compile-backend", "aot_eager", "--hf-compile", "--warmup", "1",
        "--repeats", "1",
    )  # fmt: skip
    report = next(line for line in lines if line.startswith("fine-tuning torch.compile:"))
    assert report.startswith("fine-tuning torch.compile: 0 graph breaks, 0 recompilations after warm-up (1 graph(s)")
    sides = [m[1] for line in lines if (m := re.match(r"fine-tuning +(\S.*?) +[\d.]+ ms/step", line))]
    assert sides == ["lightbert", "transformers", "transformers compiled"], sides
    assert any(re.fullmatch(r"fine-tuning speedup vs transformers compiled: \d+\.\d\dx", line) for line in lines)
    assert re.fullmatch(r"fine-tuning speedup vs transformers: \d+\.\d\dx", lines[-1]), lines[-1]
    found = switch_table().row("finetune padded+compile", "\n".join(lines), 0)
    assert set(found) == {"case", "ms", "peak", "vs eager", "vs compiled", "graphs"}, found
    assert found["graphs"] == "0 breaks, 0 recompilations" and found["vs eager"] == lines[-1].split()[-1]


def test_switch_table_runs_each_case_in_its_own_process_and_writes_one_table(tmp_path):
    """One case end to end (the compiled losses: bench/mlm_loss.py checks them against eager before timing); the
    pre-training cases' commands are pretrain_step.py's switches."""
    out = tmp_path / "switches.md"
    lines = run_bench("switch_table.py", "--quick", "--cases", "losses compiled", "--out", str(out))
    table = out.read_text().splitlines()
    assert table == lines[-3:]  # printed and written
    assert table[0] == (
        "| case | lightbert ms/step | % of matmul peak | vs transformers | vs transformers compiled | torch.compile |"
    )
    assert re.fullmatch(r"\| losses compiled \| [\d.]+ \| - \| - \| - \| \d+\.\d\dx the eager losses \|", table[2])
    args = argparse.Namespace(device="cuda", gpu=True, quick=False, model="bert_base", seq_len=128, batch_size=256,
                              hf_compile=True)  # fmt: skip
    command = switch_table().case_command("packing+compile", args)
    assert command[1].endswith("bench/pretrain_step.py")
    assert command[2:] == ["--device", "cuda", "--packing", "--compile", "--part", "pretrain", "--model", "bert_base",
                           "--seq-len", "128", "--batch-size", "256", "--hf-compile"]  # fmt: skip


def test_switch_table_keeps_a_failed_case_in_its_row():
    table = switch_table()
    failed = table.row("fp8", "Traceback ...\nRuntimeError: CUDA out of memory | tried 2 GiB", 1)
    assert failed == {"case": "fp8", "error": "RuntimeError: CUDA out of memory | tried 2 GiB"}
    rendered = table.table([failed], "MFU").splitlines()
    assert rendered[2] == "| fp8 | failed: RuntimeError: CUDA out of memory / tried 2 GiB | | | | |"
    assert rendered[2].count("|") == rendered[0].count("|")


@pytest.mark.slow  # a fresh process that traces and compiles the step
@pytest.mark.parametrize(
    ("shape", "switches"), [(["64", "8"], []), (["16", "2"], ["--fp8"])], ids=["plain", "fp8"]
)  # fp8 on 2 rows of 16: CPU emulates float8 matmuls in time linear in the tokens (a naive kernel, about 30 MFLOP/s),
# and 5 steps run (4 in the compile report, 1 timed): 41 CPU-s at 4 x 32, 25 here; 2 rows (Dynamo specializes a 1)
def test_the_packed_step_compiles_with_no_graph_break_or_recompilation(shape, switches):
    """`--packing --compile` reports Dynamo's graph breaks and recompilations after warm-up: none (aot_eager: the
    same graphs as Inductor's, without minutes of C++ compiling here); with torchao's float8 matmuls too."""
    seq_len, batch_size = shape
    lines = run_bench(
        "pretrain_step.py", "--model", "bert_tiny", "--seq-len", seq_len, "--batch-size", batch_size, "--part",
        "pretrain", "--packing", "--compile", "--compile-backend", "aot_eager", "--warmup", "0", "--repeats", "1",
        *switches,
    )  # fmt: skip
    assert any(line.startswith("speed.fp8: 10 Linear layers") for line in lines) == bool(switches)
    report = next(line for line in lines if line.startswith("torch.compile:"))
    two_graphs = "(2 graph(s)"  # the model's and the losses'
    assert report.startswith(f"torch.compile: 0 graph breaks, 0 recompilations after warm-up {two_graphs}"), report
    assert re.fullmatch(r"speedup vs transformers: \d+\.\d\dx", lines[-1]), lines[-1]


def test_the_bf16_model_with_master_weights_runs_in_the_benchmark():
    """`--bf16-weights` (trainer.precision=bf16-true): lightbert's model in bf16 with fp32 master weights and no
    autocast, against transformers under bf16 autocast; the two agree on the loss before anything is timed."""
    lines = run_bench(
        "pretrain_step.py", "--model", "bert_tiny", "--seq-len", "64", "--batch-size", "4", "--part", "pretrain",
        "--bf16-weights", "--warmup", "0", "--repeats", "1",
    )  # fmt: skip
    assert any("; bf16; " in line for line in lines)
    losses = re.search(r"loss lightbert ([\d.]+), transformers ([\d.]+)", "\n".join(lines))
    assert losses and abs(float(losses[1]) - float(losses[2])) < 5e-2
    assert re.fullmatch(r"speedup vs transformers: \d+\.\d\dx", lines[-1]), lines[-1]


@pytest.mark.slow  # about 20 CPU-s: the Python documentation parsed for the corpus, a fresh process for the measurement
def test_scale_benchmark_runs_on_a_small_corpus_and_ends_with_the_ratio_line(tmp_path):
    lines = run_bench("scale_data.py", "--megabytes", "0.3", "--batches", "3", "--corpus-dir", str(tmp_path))
    assert re.fullmatch(r"data preparation vs tokenizer alone: \d+\.\d\dx", lines[-1]), lines[-1]
    cache = re.search(r"cache (\d+\.\d\d) bytes per text byte", "\n".join(lines))
    assert cache and 0 < float(cache[1]) < 2  # documents once and offsets, not examples dupe_factor times
    assert any(line.startswith("extrapolated to 20 GB: ") for line in lines)


ROFF_PAGE = r""".\" a comment the reader drops
.TH MOUNTD 8 "2024" "nfs-utils"
.SH NAME
mountd \- NFS mount daemon
.SH SYNOPSIS
.B rpc.mountd
.RI [ options ]
.SH DESCRIPTION
The
.B rpc.mountd
daemon implements the server side of the NFS MOUNT protocol.
It checks each request against the list of \fIexported\fR file systems.
.PP
Options:
.nf
rpc.mountd \-p 4002 \-\-no\-udp
.fi
A client asks it for a file handle before it mounts \(em and the daemon answers.
.SH OPTIONS
.TP
.B \-p
Listen on the given port instead of one the portmapper chooses for it.
"""


def test_the_continued_pretraining_benchmark_reads_manual_pages_as_prose_and_keeps_pages_whole(tmp_path):
    """The benchmark's second domain as it reads it: roff source to the prose of each section (fonts, escapes and
    code blocks out, NAME and SYNOPSIS not sentences), and a task whose pages are each on one side of the split."""
    bench = bench_module("continued_pretraining")
    page = tmp_path / "mountd.8.gz"
    with gzip.open(page, "wt") as f:
        f.write(ROFF_PAGE)
    sections = bench.man_page(page)
    assert sections["NAME"] == ["mountd - NFS mount daemon"]
    sentences = bench.prose_sentences(sections["DESCRIPTION"] + sections["OPTIONS"])
    assert sentences == [
        "The rpc.mountd daemon implements the server side of the NFS MOUNT protocol.",
        "It checks each request against the list of exported file systems.",
        "A client asks it for a file handle before it mounts - and the daemon answers.",
        "-p Listen on the given port instead of one the portmapper chooses for it.",  # a .TP tag leads, as man shows it
    ]
    pages = [(f"p{i}.{section}", section, [f"Sentence {j} of page {i} in section {section}." for j in range(3)])
             for section in (1, 8) for i in range(40)]  # fmt: skip
    files = bench.section_task(pages, tmp_path, (20, 10))
    rows = {which: list(csv.DictReader(path.open())) for which, path in files.items()}
    for which, count in (("train", 20), ("validation", 10)):
        labels = [int(r["label"]) for r in rows[which]]
        assert labels.count(0) == labels.count(1) == count  # balanced
        for r in rows[which]:  # the label is the page's section
            assert int(r["label"]) == int(r["sentence"].endswith("section 8."))
    page_of = lambda sentence: sentence.split(" of ")[1].split(" in ")[0]  # noqa: E731
    train_pages = {page_of(r["sentence"]) + r["label"] for r in rows["train"]}
    dev_pages = {page_of(r["sentence"]) + r["label"] for r in rows["validation"]}
    assert not train_pages & dev_pages  # no page on both sides


def test_the_kernel_work_benchmark_checks_each_change_and_counts_its_operations():
    """bench/kernel_work.py: each change gives the numbers of what it replaced before it is timed; the fused QKV
    projection and the multi-tensor optimizer steps dispatch fewer aten operations (a GPU's kernel launches)."""
    lines = run_bench(
        "kernel_work.py", "--hidden", "64", "--layers", "1", "--tokens", "64", "--vocab-size", "300", "--repeats", "1",
        "--warmup", "0",
    )  # fmt: skip
    ops = {m[1].strip(): int(m[2]) for m in (re.match(r"  (.+?)\s+[\d.]+ ms\s+(\d+) aten ops", x) for x in lines) if m}
    assert ops["one fused Linear (H -> 3H)"] < ops["three Linear (H -> H)"]
    assert ops["multi-tensor (_foreach)"] < ops["per-parameter loop"] / 3
    assert ops["multi-tensor casts"] < ops["per-weight casts"]
    assert ops["300 rows"] == ops["320 rows (padded)"]  # the padding adds no operation: the logits are a view


def proxy_batches(count: int, seed: int = 0) -> tuple[dict, dict]:
    """Sentence pairs of 6-60 tokens, padded to the full width as a GPU's padded batches are, and the same pairs
    packed into rows of that width."""
    from test_packing import WIDTH, masking, sentence_pairs

    from lightbert.tasks.pretraining.masking import MaskingCollator
    from lightbert.tasks.pretraining.packing import PackingCollator

    pairs = sentence_pairs(count, seed=seed)
    padded = MaskingCollator(
        vocab_size=120, pad_id=0, mask_id=3, special_ids=[0, 1, 2, 3, 4], pad_to_multiple_of=WIDTH
    )(pairs)
    return padded, PackingCollator(masking(), WIDTH)(pairs)


def test_executed_over_useful_flops_shows_padding_and_dense_head_waste():
    """bench/step_proxies.py's FLOP counts (torch's FlopCounterMode, the CPU's fused attention included): on short
    pairs padded to the full width, the padded step executes more than the unpadded layouts, varlen executes what MFU
    counts useful (the pooler, NSP and the empty prediction slots aside), and the MLM head over every position is the
    largest waste."""
    from test_packing import CONFIG

    proxies = bench_module("step_proxies")
    padded, packed = proxy_batches(16)
    real = float(padded["attention_mask"].float().mean())
    assert real < 0.7  # pairs of 6-60 tokens in rows of 64
    ratios = proxies.flop_ratios(CONFIG, padded, packed)
    assert list(ratios) == [case for case, *_ in proxies.LAYOUTS]
    assert 1.0 <= ratios["varlen"] < 1.15, ratios
    assert ratios["varlen"] <= ratios["length groups"] < ratios["padded"], ratios
    assert ratios["packed + varlen"] < ratios["padded"] and ratios["packed"] < ratios["padded"], ratios
    assert ratios["padded"] > 1 / real * 0.8  # the blocks' work grows with the padded positions
    # The dense head runs its transform and decoder (6 (H² + H·V) a position, forward and backward) on every position
    # of every row where the sparse head runs them on the row's prediction slots.
    rows, width = padded["input_ids"].shape
    slots = padded["masked_positions"].shape[1]
    useful = step_flops(CONFIG, padded["attention_mask"].sum(1), int((padded["labels"] != -100).sum()))
    # The decoder's rows as the model holds them (the vocabulary padded to a multiple of 64 inside the model).
    vocab_rows = proxies.module_for(CONFIG, "off", True).model.bert.embeddings.word_embeddings.weight.shape[0]
    head = 6 * (CONFIG.hidden_size**2 + CONFIG.hidden_size * vocab_rows) * rows * (width - slots)
    waste = (ratios["padded, dense MLM head"] - ratios["padded"]) * useful
    assert abs(waste - head) < 1e-6 * head, (waste, head)


def test_the_gpu_default_step_compiles_to_one_graph_on_meta_tensors():
    """bench/step_proxies.py's graph proxy: the model on the GPU's default unpadding (as `unpadding_for` decides for
    a CUDA GPU in bf16-mixed), on meta tensors in bf16, compiled (aot_eager) over batches of different masks, packed
    and not: one graph, no break, no recompilation."""
    from test_packing import CONFIG

    proxies = bench_module("step_proxies")
    for packing in (False, True):
        found = proxies.gpu_default_graphs(CONFIG, [proxy_batches(8, seed)[packing] for seed in range(3)], packing)
        assert (found["graphs"], found["breaks"], found["recompilations"]) == (1, 0, 0), (packing, found)


def test_the_embedding_benchmarks_pairs_repeat_no_text_and_hold_out_files_of_their_own(tmp_path):
    """bench/embedding_trainer.py's data: (summary line, next paragraph) pairs from the standard library's docstrings,
    every text once over both splits, the held-out pairs from source files the training pairs do not come from. (Its
    two sides, trained and scored, run in tests/test_gpu_check.py's sentence-embeddings part.)"""
    bench = bench_module("embedding_trainer")
    paths = bench.prepare_data(tmp_path, num_train=64, num_dev=40)
    rows = {s: [json.loads(line) for line in p.read_text().splitlines()] for s, p in paths.items()}
    texts = [r[c] for split in rows.values() for r in split for c in ("anchor", "positive")]
    assert len(rows["train"]) == 64 and len(rows["validation"]) >= 40 and len(set(texts)) == len(texts)
    sources = {}
    for source, anchor, _ in bench.docstring_pairs():
        sources.setdefault(anchor, source)
    held_out = {sources[r["anchor"]] for r in rows["validation"]}
    assert not held_out & {sources[r["anchor"]] for r in rows["train"]}
