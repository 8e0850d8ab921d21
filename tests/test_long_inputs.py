"""Inputs of millions of tokens cost time linear in their length: the two that hung for over 9 minutes finish.

Each runs in a child process with a generous time limit, so that a regression fails the test instead of hanging
the suite (the limit is a guard, not a measurement: both take about a second here).
"""

from __future__ import annotations

import random
import subprocess
import textwrap

import pytest
from helpers import runtime

from lightbert.data.encoding import truncate_pair
from lightbert.tasks.pretraining.examples import truncate_seq_pair
from lightbert.tasks.squad.data import doc_windows, max_context_flags

GUARD_SECONDS = 120


def run_child(code: str) -> str:
    """`code` in a child on a user's install (`helpers.runtime`): it imports lightbert only."""
    run = subprocess.run(
        [runtime.python(), "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=GUARD_SECONDS
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def test_a_corpus_with_a_sentence_of_a_million_tokens_makes_its_pairs():
    out = run_child(
        """
        import datasets
        from lightbert.tasks.pretraining.examples import create_pretraining_examples
        documents = [[[5 + (i % 50) for i in range(8)] for _ in range(6)] for _ in range(150)]
        documents[7] = [[5 + (i % 50) for i in range(1_200_000)]]  # one line of ~4.7 MB of text
        examples = create_pretraining_examples(
            datasets.Dataset.from_dict({"sentence_ids": documents}), max_seq_length=128, short_seq_prob=0.1,
            dupe_factor=2, seed=0, cls_id=2, sep_id=3,
        )
        print(len(examples), max(len(ids) for ids in examples["input_ids"]))
        """
    )
    count, longest = map(int, out.split())
    assert count > 150 and longest <= 128


def test_a_squad_context_of_two_megabytes_gives_its_windows(tmp_path):
    out = run_child(
        """
        import datasets
        from lightbert.tasks.squad.data import Windowing, make_windows
        from lightbert.data.tokenizer import train_wordpiece
        tokenizer = train_wordpiece(["the river is blue and the sky is grey"] * 50, vocab_size=60)
        context = "the river is blue and the sky is grey. " * 46_000  # 1.8 MB
        answer_start = context.index("blue", len(context) // 2)
        raw = datasets.Dataset.from_dict({
            "id": ["q"], "context": [context], "question": ["what colour is the river?"],
            "answers": [{"text": ["blue"], "answer_start": [answer_start]}],
        })
        for training in (True, False):
            rows, problems = make_windows(raw, tokenizer, Windowing(384, 128, 64), training, version_2=False)
            print(len(rows["input_ids"]), sum(1 for s in rows["start_positions"] if s > 0))
        """
    )
    (train_windows, train_answers), (eval_windows, eval_answers) = (map(int, line.split()) for line in out.splitlines())
    assert train_windows == eval_windows > 1000 and train_answers >= 1 and eval_answers >= 1


@pytest.mark.parametrize("seed", range(5))
def test_fast_cuts_equal_the_reference_one_token_at_a_time(seed):
    """The linear-time cuts give exactly what cutting one token at a time gives (truncate_seq_pair: as many)."""

    def reference_pair(a, b, max_tokens):
        a, b = list(a), list(b)
        while len(a) + len(b) > max_tokens:
            (a if len(a) > len(b) else b).pop()
        return a, b

    def reference_seq_pair(a, b, max_tokens, rng):
        while len(a) + len(b) > max_tokens:
            longer = a if len(a) > len(b) else b
            if rng.random() < 0.5:
                del longer[0]
            else:
                longer.pop()

    def reference_flags(windows, index):
        start, length = windows[index]
        flags = []
        for position in range(start, start + length):
            scores = [
                (min(position - s, s + n - 1 - position) + 0.01 * n, -i)
                for i, (s, n) in enumerate(windows)
                if s <= position < s + n
            ]
            flags.append(-max(scores)[1] == index)
        return flags

    rng = random.Random(seed)
    for _ in range(500):
        a, b = list(range(rng.randint(0, 40))), list(range(100, 100 + rng.randint(0, 40)))
        limit = rng.randint(0, 70)
        assert truncate_pair(a, b, limit) == reference_pair(a, b, limit)
        ours, theirs = (list(a), list(b)), (list(a), list(b))
        truncate_seq_pair(*ours, limit, random.Random(seed))
        reference_seq_pair(*theirs, limit, random.Random(seed))
        # The same number of tokens cut from each side; what is kept is a window of it (its draws are its own:
        # test_random_cuts_have_the_reference_distribution).
        assert [len(x) for x in ours] == [len(x) for x in theirs]
        for kept, whole in zip(ours, (a, b), strict=True):
            assert kept == whole[kept[0] - whole[0] :][: len(kept)] if kept else True
    for _ in range(100):
        windows = doc_windows(rng.randint(1, 200), rng.randint(1, 50), rng.randint(1, 30))
        for index in range(len(windows)):
            assert max_context_flags(windows, index) == reference_flags(windows, index)


def test_random_cuts_have_the_reference_distribution():
    """truncate_seq_pair's one binomial draw per side gives the reference's distribution of kept windows: the front
    cuts of each side over 4000 seeds, against Binomial(r, 1/2) and against the reference's coin per token."""
    from math import comb

    def reference_fronts(a, b, max_tokens, rng):
        fronts, ends = [0, 0], [len(a), len(b)]
        while ends[0] - fronts[0] + ends[1] - fronts[1] > max_tokens:
            longer = 0 if ends[0] - fronts[0] > ends[1] - fronts[1] else 1
            if rng.random() < 0.5:
                fronts[longer] += 1
            else:
                ends[longer] -= 1
        return fronts

    a, b, limit = list(range(40)), list(range(100, 118)), 26  # a loses its lead of 22, then a and b 5 each
    ours, theirs = [[0] * 41, [0] * 41], [[0] * 41, [0] * 41]
    for seed in range(4000):
        kept = (list(a), list(b))
        truncate_seq_pair(*kept, limit, random.Random(seed))
        for side in (0, 1):
            ours[side][kept[side][0] - (a, b)[side][0]] += 1
        for side, front in enumerate(reference_fronts(a, b, limit, random.Random(seed))):
            theirs[side][front] += 1
    for side, cut in ((0, 27), (1, 5)):
        binomial = [comb(cut, k) / 2**cut if k <= cut else 0 for k in range(41)]
        for counts in (ours[side], theirs[side]):
            assert sum(abs(c / 4000 - p) for c, p in zip(counts, binomial, strict=True)) / 2 < 0.04
