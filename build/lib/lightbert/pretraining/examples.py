"""Sentence-pair examples for masked LM + next sentence prediction, as in the paper (§3.1, Appendix A.2).

A port of google-research/bert's `create_pretraining_data.py` (`create_instances_from_document` and
`truncate_seq_pair`), run on token ids inside `datasets.map`. Differences from the reference:
- Masking is not done here but in the collator (`lightbert.pretraining.masking`), fresh every epoch, so
  `dupe_factor` (the task file's default 10, the reference's) only re-draws the sentence pairing, not the masks.
- The random state is per document (seeded by seed, duplicate and document index), so the examples are
  the same whatever the number of preprocessing processes.
- Sentences that tokenize to nothing and documents without sentences are dropped before pairing.
- A chunk closes at the target length only once it holds two sentences (or at the document's end), so a
  sentence longer than the target still gets the 50% chance of its true next sentence as B.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import datasets

from lightbert.data.encoding import encode_pair
from lightbert.data.local_files import progress_bars_for

IS_NEXT, NOT_NEXT = 0, 1  # Hugging Face's convention for `next_sentence_label`


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random) -> None:
    """Trim the longer side, one token at a time from its front or back at random, until the pair fits.

    The reference's draws, one per token cut, with each cut O(1) (the ends move; the lists are cut once at the end):
    a sentence of millions of tokens costs time linear in its length, not quadratic.
    """
    ends = [[0, len(tokens_a)], [0, len(tokens_b)]]  # [first, past-last] of what is kept, for a and b
    kept = [len(tokens_a), len(tokens_b)]
    while kept[0] + kept[1] > max_num_tokens:
        longer = 0 if kept[0] > kept[1] else 1
        if rng.random() < 0.5:
            ends[longer][0] += 1
        else:
            ends[longer][1] -= 1
        kept[longer] -= 1
    tokens_a[:] = tokens_a[ends[0][0] : ends[0][1]]
    tokens_b[:] = tokens_b[ends[1][0] : ends[1][1]]


def create_instances_from_document(
    documents: Sequence[list[list[int]]],
    document_index: int,
    max_seq_length: int,
    short_seq_prob: float,
    rng: random.Random,
    cls_id: int,
    sep_id: int,
) -> list[dict]:
    """All `[CLS] A [SEP] B [SEP]` examples of one document (a list of tokenized sentences)."""
    document = documents[document_index]
    max_num_tokens = max_seq_length - 3  # room for [CLS], [SEP], [SEP]
    # Mostly fill the whole sequence, but sometimes (short_seq_prob) aim shorter, so fine-tuning on short
    # inputs is not a distribution shift. As in the reference, one target per document.
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances = []
    current_chunk: list[list[int]] = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        # Close the chunk at the target length, but never on one lone sentence mid-document: the
        # reference would then be forced to a random B, which tilts NSP towards NotNext on corpora of
        # long sentences (55% on the demo corpus); taking the next sentence too keeps the 50/50 draw.
        if i == len(document) - 1 or (current_length >= target_seq_length and len(current_chunk) >= 2):
            if current_chunk:
                a_end = rng.randint(1, len(current_chunk) - 1) if len(current_chunk) >= 2 else 1
                tokens_a = [t for sentence in current_chunk[:a_end] for t in sentence]
                tokens_b: list[int] = []
                if len(current_chunk) == 1 or rng.random() < 0.5:
                    next_label = NOT_NEXT
                    target_b_length = target_seq_length - len(tokens_a)
                    # Up to 10 tries for another document; a one-document corpus falls back to itself.
                    for _ in range(10):
                        random_index = rng.randint(0, len(documents) - 1)
                        if random_index != document_index:
                            break
                    random_document = documents[random_index]
                    random_start = rng.randint(0, len(random_document) - 1)
                    for sentence in random_document[random_start:]:
                        tokens_b.extend(sentence)
                        if len(tokens_b) >= target_b_length:
                            break
                    # The segments after A were not used: put them back for the next example.
                    i -= len(current_chunk) - a_end
                else:
                    next_label = IS_NEXT
                    tokens_b = [t for sentence in current_chunk[a_end:] for t in sentence]
                truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                input_ids, token_type_ids = encode_pair(tokens_a, tokens_b, cls_id, sep_id)
                instances.append(
                    {"input_ids": input_ids, "token_type_ids": token_type_ids, "next_sentence_label": next_label}
                )
            current_chunk = []
            current_length = 0
        i += 1
    return instances


class _ColumnView(Sequence):
    """Random access to one column of an Arrow-backed dataset, without materialising it in memory.

    Rows in `loaded` (the batch being processed, already in memory) are not read again.
    """

    def __init__(self, dataset: datasets.Dataset, column: str, loaded: dict[int, list]):
        # The Arrow column itself (memory-mapped), read row by row: twice as fast as datasets' row formatting.
        self.dataset, self.column, self.loaded = dataset, dataset.with_format("arrow").data.column(column), loaded

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> list[list[int]]:
        if index in self.loaded:
            return self.loaded[index]
        row = int(index)
        if self.dataset._indices is not None:  # a selected or shuffled view: map to the table row
            row = self.dataset._indices.column(0)[row].as_py()
        return self.column[row].as_py()


def _create_instances_batch(
    batch: dict,
    indices: list[int],
    documents: datasets.Dataset,
    max_seq_length: int,
    short_seq_prob: float,
    dupe_factor: int,
    seed: int,
    cls_id: int,
    sep_id: int,
) -> dict:
    all_documents = _ColumnView(documents, "sentence_ids", dict(zip(indices, batch["sentence_ids"], strict=True)))
    out: dict[str, list] = {"input_ids": [], "token_type_ids": [], "next_sentence_label": []}
    for document_index in indices:  # document-major, so batching and sharding never change the order
        for dupe in range(dupe_factor):
            rng = random.Random(f"{seed}/{dupe}/{document_index}")
            for instance in create_instances_from_document(
                all_documents, document_index, max_seq_length, short_seq_prob, rng, cls_id, sep_id
            ):
                for key, value in instance.items():
                    out[key].append(value)
    return out


EXAMPLE_FEATURES = datasets.Features(
    {
        "input_ids": datasets.Sequence(datasets.Value("int32")),
        "token_type_ids": datasets.Sequence(datasets.Value("int8")),
        "next_sentence_label": datasets.Value("int8"),
    }
)


def create_pretraining_examples(
    documents: datasets.Dataset,
    max_seq_length: int,
    short_seq_prob: float,
    dupe_factor: int,
    seed: int,
    cls_id: int,
    sep_id: int,
    num_proc: int | None = None,
) -> datasets.Dataset:
    """Examples from a dataset with a `sentence_ids` column (documents of tokenized sentences)."""
    with progress_bars_for(len(documents)):
        return documents.map(
            _create_instances_batch,
            batched=True,
            batch_size=256,
            with_indices=True,
            remove_columns=documents.column_names,
            features=EXAMPLE_FEATURES,
            num_proc=num_proc,
            load_from_cache_file=False,  # the caller caches the result; datasets' hash can't see code changes here
            fn_kwargs={
                "documents": documents,
                "max_seq_length": max_seq_length,
                "short_seq_prob": short_seq_prob,
                "dupe_factor": dupe_factor,
                "seed": seed,
                "cls_id": cls_id,
                "sep_id": sep_id,
            },
            desc="Creating sentence-pair examples",
        )
