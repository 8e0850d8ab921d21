"""Retrieval scores of an embedding model on held-out pairs: every anchor a query, every distinct positive of the split
a document of the corpus, each query's one relevant document its own positive.

Scored as sentence-transformers' InformationRetrievalEvaluator and MTEB score one relevant document per query, by
cosine similarity: recall@1 and recall@10 (is the positive among the first k), MRR@10 (1 / its rank, 0 past 10) and
NDCG@10 (1 / log2(rank + 1), 0 past 10; the ideal DCG of one relevant document is 1). A tie with the positive ranks
the positive after the documents it ties with (the pessimistic rank), so a collapsed model scores 0, not 1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

RETRIEVAL_METRICS = ("recall_at_1", "recall_at_10", "mrr_at_10", "ndcg_at_10")  # MTEB's names


def positive_ranks(queries: torch.Tensor, documents: torch.Tensor, relevant: torch.Tensor, chunk: int = 1024):
    """Each query's rank (1 = first) of its relevant document: `queries` (Q, H), `documents` (D, H), `relevant` (Q,)
    the index of each query's document. Scored `chunk` queries at a time (a (chunk, D) matrix at most)."""
    queries, documents = F.normalize(queries.float(), dim=-1), F.normalize(documents.float(), dim=-1)
    ranks = []
    for start in range(0, len(queries), chunk):
        scores = queries[start : start + chunk] @ documents.T  # (chunk, D)
        own = scores.gather(1, relevant[start : start + chunk, None])  # (chunk, 1)
        ranks.append((scores >= own).sum(1))  # its own score counts itself: rank 1 when nothing ties or beats it
    return torch.cat(ranks)


def retrieval_scores(ranks: torch.Tensor) -> dict[str, float]:
    """The metrics of `RETRIEVAL_METRICS` from each query's rank of its relevant document."""
    ranks = ranks.double()
    top10 = ranks <= 10
    return {
        "recall_at_1": (ranks <= 1).double().mean().item(),
        "recall_at_10": top10.double().mean().item(),
        "mrr_at_10": torch.where(top10, 1.0 / ranks, 0.0).mean().item(),
        "ndcg_at_10": torch.where(top10, 1.0 / torch.log2(ranks + 1), 0.0).mean().item(),
    }
