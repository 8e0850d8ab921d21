"""The embedding head in the registry (lightbert.tasks.heads): the encoder pooled to one vector per text.

Its Hugging Face form is the bare encoder (`BertModel`, `ModernBertModel`) with sentence-transformers' files beside it
(modules.json, the pooling's config): a directory with those is an embedding model, one without is a pre-trained
encoder (`Head.sentence_embedding`: the class alone does not say which)."""

from __future__ import annotations

from lightbert.model.embedding import BertForEmbedding
from lightbert.tasks.embedding.module import EmbeddingModule
from lightbert.tasks.embedding.predictor import Embedding
from lightbert.tasks.heads import Head, HeadArguments, register


def _arguments(hp: dict) -> HeadArguments:
    """A run's module arguments -> the network's: its pooling and normalisation (as `_from_checkpoint` chose them)."""
    return HeadArguments(pooling=hp.get("pooling") or "mean", normalize=hp.get("normalize") is not False)


def _from_checkpoint(found: HeadArguments | None) -> dict:
    """task.pooling / task.normalize left null: init_from's own where it is an embedding model (a sentence-transformers
    directory, an embedding run), else mean pooling, normalised (sentence-transformers' usual retrieval model)."""
    if found is None:
        return {"pooling": "mean", "normalize": True}
    return {"pooling": found.pooling, "normalize": found.normalize}


register(
    Head(
        "embedding",
        EmbeddingModule,
        lambda config, a: BertForEmbedding(config, a.pooling or "mean", a.normalize),
        "BertModel",
        Embedding,
        onnx_outputs=("sentence_embedding",),
        arguments=_arguments,
        sentence_embedding=True,
        from_checkpoint=_from_checkpoint,
    )
)
