"""Contrastive fine-tuning of a sentence embedding model (`task=embedding`).

The shared encoder, pooled to one vector per text (`lightbert.model.embedding`), trained with InfoNCE over in-batch
negatives and hard negatives (`loss.contrastive_loss`), every parameter. A batch's texts are embedded in one forward
pass, or in mini-batches through `GradCache` (`task.mini_batch_size`).

Validation scores retrieval on the held-out pairs (`metrics`): every anchor a query against every distinct positive of
the split, on the embeddings gathered from every device, so the scores are the whole split's whatever the devices.
`val/loss` is the contrastive loss within each device's evaluation batch (its negatives are that batch's, so it moves
with `task.datamodule.eval_batch_size`; the retrieval scores do not).
"""

from __future__ import annotations

import torch

from lightbert.data.batches import is_padding
from lightbert.tasks.embedding.loss import GradCache, contrastive_loss
from lightbert.tasks.embedding.metrics import positive_ranks, retrieval_scores
from lightbert.tasks.heads import HEADS
from lightbert.tasks.task_module import TaskModule


def split_texts(embeddings: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A batch's embeddings (N, H) as (anchors (B, H), positives (B, H), negatives (B x k, H) or None)."""
    negatives = embeddings[2 * rows :]
    return embeddings[:rows], embeddings[rows : 2 * rows], negatives if len(negatives) else None


class EmbeddingModule(TaskModule):
    head = "embedding"

    def __init__(
        self,
        model: dict,
        optim: dict,
        pooling: str = "mean",
        normalize: bool = True,
        scale: float = 20.0,
        symmetric: bool = False,
        gather: bool = True,
        mini_batch_size: int | None = None,
    ):
        super().__init__(model, optim)
        self.model = HEADS[self.head].network(self.config, {"pooling": pooling, "normalize": normalize})
        self.scale, self.symmetric, self.gather = float(scale), bool(symmetric), bool(gather)
        self.grad_cache = GradCache(self.model.parameters, mini_batch_size) if mini_batch_size else None
        self._validation: list[tuple[torch.Tensor, ...]] = []

    def loss(self, embeddings: torch.Tensor, batch: dict, gather: bool | None = None) -> torch.Tensor:
        anchors, positives, negatives = split_texts(embeddings, batch["rows"])
        gather = self.gather if gather is None else gather
        return contrastive_loss(anchors, positives, negatives, self.scale, self.symmetric, gather)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        if self.grad_cache is None:
            loss = self.loss(self(batch), batch)
        else:

            def embed(part: slice) -> torch.Tensor:
                inputs = (batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
                return self.model(*(tensor[part] for tensor in inputs))

            loss = self.grad_cache(batch["input_ids"].shape[0], embed, lambda embeddings: self.loss(embeddings, batch))
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["rows"])
        return loss

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        embeddings = self(batch)
        padding = is_padding(batch)
        rows = batch["rows"]
        # Within the device's batch: evaluation batches differ in size between devices, which a gather cannot take.
        loss = self.loss(embeddings, batch, gather=False) if rows > 1 else embeddings.new_zeros(())
        self.log_mean("val/loss", self.val_losses[0], loss, 0 if padding or rows < 2 else rows)
        if not padding:
            anchors, positives, _ = split_texts(embeddings.detach(), rows)
            self._validation.append((batch["document"], anchors.float(), positives.float()))

    def log_metrics(self) -> None:
        documents, anchors, positives = self._gathered_validation()
        self._validation = []
        # The corpus: each distinct positive once (rows with one `document` share their positive's text), from the
        # first validated row that has it; a validation of part of the split (trainer.limit_val_batches) included.
        distinct, relevant = torch.unique(documents, return_inverse=True)  # relevant: each row's place in the corpus
        rows = torch.arange(len(documents), device=documents.device)
        first = torch.full_like(distinct, len(documents)).scatter_reduce(0, relevant, rows, "amin")
        ranks = positive_ranks(anchors, positives[first], relevant)
        for name, value in retrieval_scores(ranks).items():
            self.log_computed(f"val/{name}", value, prog_bar=name == "ndcg_at_10")

    def _gathered_validation(self) -> tuple[torch.Tensor, ...]:
        """This validation's (document, anchor and positive embeddings) from every device: each example once
        (the evaluation sampler gives each device its own share)."""
        hidden = self.config.hidden_size
        device = self.device
        parts = self._validation or [
            (torch.zeros(0, dtype=torch.long, device=device), *(torch.zeros(0, hidden, device=device),) * 2)
        ]
        local = [torch.cat(column) for column in zip(*parts, strict=True)]
        if self.trainer.world_size == 1:
            return tuple(local)
        counts = self.all_gather(torch.tensor(len(local[0]), device=device)).view(-1)
        most = int(counts.max())
        gathered = []
        for tensor in local:
            padded = tensor.new_zeros((most, *tensor.shape[1:]))
            padded[: len(tensor)] = tensor
            every = self.all_gather(padded)  # (world, most, ...)
            gathered.append(torch.cat([every[r, : int(n)] for r, n in enumerate(counts)]))
        return tuple(gathered)
