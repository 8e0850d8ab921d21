"""A resume on another number of devices, with real processes: the data position is the step and a step is the same
examples whatever the devices, so with the global batch kept (task.global_batch_size, the accumulation adapting) a
2 -> 1 or 1 -> 2 resume trains each example exactly once, as the uninterrupted run did; another global batch, which
would re-train or skip examples, is refused with the key that keeps it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from helpers.runs import TINY_PRETRAIN, run_train_recorded, snapshot, write_bert_corpus

pytestmark = pytest.mark.slow


def examples_by_step(path: Path) -> dict[int, Counter]:
    steps: dict[int, Counter] = {}
    for line in path.read_text().splitlines():
        step, _, digest = line.split()
        steps.setdefault(int(step), Counter())[digest] += 1
    return steps


def devices(n: int) -> list[str]:
    return [f"trainer.devices={n}", "trainer.strategy=ddp"]  # as trainer=ddp's devices=-1 on another node


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_bert_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt", num_documents=10)


def recording(corpus: Path) -> list[str]:
    return [*TINY_PRETRAIN, f"corpus.paths=[{corpus}]", "task.global_batch_size=8", "trainer.val_check_interval=4",
            "task.checkpoint_every_n_steps=4",
            "+callbacks.record._target_=helpers.loss_recorder.RecordExamples"]  # fmt: skip


@pytest.fixture(scope="module")
def reference(tmp_path_factory, corpus) -> Path:
    """The reference, unbroken, on one device (a step's global batch is the same examples on any number of devices):
    the examples of each of its 8 steps, one run for both resumes (it is the same command for both)."""
    where = tmp_path_factory.mktemp("reference")
    recorded = [f"hydra.run.dir={where / 'whole'}", f"+callbacks.record.path={where / 'whole.txt'}"]
    whole = run_train_recorded(*recording(corpus), *devices(1), "trainer.max_steps=8", *recorded)
    assert whole.returncode == 0, whole.stderr[-3000:]
    return where / "whole.txt"


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_a_resume_on_another_device_count_trains_each_example_once(tmp_path, corpus, reference, before, after):
    base = recording(corpus)
    run = tmp_path / "run"
    first = run_train_recorded(*base, *devices(before), "trainer.max_steps=8", f"hydra.run.dir={run}",
                               f"+callbacks.record.path={tmp_path / 'killed.txt'}",
                               "+callbacks.kill._target_=helpers.loss_recorder.KillAtStep", "+callbacks.kill.step=6",
                               new_session=True)  # fmt: skip
    assert first.returncode == -9, first.stderr[-3000:]
    resumed = run_train_recorded(*base, *devices(after), "trainer.max_steps=8", f"hydra.run.dir={run}",
                                 f"+callbacks.record.path={tmp_path / 'resumed.txt'}", "resume=true")  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    out = resumed.stdout + resumed.stderr
    assert out.count(f"resuming on {after} device(s), the checkpoint's job had {before}: the global batch stays 8") == 1
    reference = examples_by_step(reference)
    killed, continued = examples_by_step(tmp_path / "killed.txt"), examples_by_step(tmp_path / "resumed.txt")
    assert sorted(continued) == [5, 6, 7, 8]  # from the checkpoint of step 4 (validation), not from the start
    for step in range(1, 9):
        assert (killed if step <= 4 else continued)[step] == reference[step], step
    seen = Counter(d for step in range(1, 9) for d in (killed if step <= 4 else continued)[step].elements())
    assert sum(seen.values()) == 8 * 8 and set(seen) == set(Counter(d for c in reference.values() for d in c))


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory, corpus) -> list[str]:
    """A 4-step run on one device, as if stopped after its last checkpoint: its command, for both refusals (a
    refused resume leaves its directory as it was: each test checks it)."""
    run = tmp_path_factory.mktemp("stopped")
    base = [*TINY_PRETRAIN, f"corpus.paths=[{corpus}]", "trainer.val_check_interval=2", f"hydra.run.dir={run}"]
    first = run_train_recorded(*base, "trainer.max_steps=4")
    assert first.returncode == 0, first.stderr[-3000:]
    (run / "results.json").unlink()  # as if stopped after its last checkpoint
    return base


@pytest.mark.parametrize("resize", [["trainer.devices=2", "trainer.strategy=ddp"], ["task.batch_size=8"]])
def test_a_resume_with_another_global_batch_is_refused_naming_the_key(stopped_run, resize):
    run = Path(stopped_run[-1].removeprefix("hydra.run.dir="))
    before = snapshot(run)
    again = run_train_recorded(*stopped_run, "trainer.max_steps=4", *resize, "resume=true")
    assert again.returncode == 2, again.stderr[-3000:]
    assert snapshot(run) == before  # nothing written: the next refusal finds the same run
    error = again.stderr.strip().splitlines()[-1]
    assert "was trained with 4 sequences per step (4 per device x 1 device(s) x 1 accumulated)" in error, error
    assert "task.global_batch_size=4" in error
