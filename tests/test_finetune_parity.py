"""Fine-tuning behaves like transformers: the same checkpoint, data and hyperparameters give the same losses.

lightbert runs through `train(cfg)` (Lightning, Hydra configs, GLUE DataModule); the reference replays the
very batches it saw through `transformers.BertForSequenceClassification` with torch's AdamW and
`transformers.get_linear_schedule_with_warmup`, clipping the gradient norm at 1.0 like HF's Trainer.
Dropout is off on both sides so the comparison is exact rather than statistical.
"""

import lightning as L
import torch
import transformers
from helpers.glue_files import glue_data_files, glue_overrides
from helpers.models import write_hf_bert
from helpers.runs import compose_config

from lightbert import train
from lightbert.tasks.glue.module import SequenceClassificationModule


class RecordTraining(L.Callback):
    """Saves the initial classifier, every training batch and its loss: what the reference replays."""

    def __init__(self, path: str):
        self.path = path
        self.record: dict = {"batches": [], "losses": []}

    def on_train_start(self, trainer, module):
        self.record["classifier"] = {k: v.clone() for k, v in module.model.classifier.state_dict().items()}

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.record["batches"].append({k: v.clone() for k, v in batch.items()})
        self.record["losses"].append(float(outputs["loss"]))

    def on_train_end(self, trainer, module):
        torch.save(self.record, self.path)


def test_fine_tuning_matches_transformers_step_by_step(tmp_path):
    hf_dir = write_hf_bert(tmp_path / "bert")
    files = glue_data_files(tmp_path / "data", "mrpc", num_rows=48)
    record_path = tmp_path / "record.pt"
    lr, weight_decay, eps = 3e-4, 0.01, 1e-6
    cfg = compose_config(
        [
            *glue_overrides("mrpc", files, hf_dir),  # 2 epochs in batches of 8
            f"optim.lr={lr}",
            "model.hidden_dropout_prob=0",
            "model.attention_probs_dropout_prob=0",
            f"+callbacks.record._target_={__name__}.RecordTraining",
            f"+callbacks.record.path={record_path}",
        ],
        tmp_path / "run",
    )
    results = train(cfg)
    record = torch.load(record_path, weights_only=True)
    steps = len(record["batches"])
    assert steps == results["global_step"] == 12

    reference = transformers.BertForSequenceClassification.from_pretrained(
        hf_dir, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    reference.classifier.load_state_dict(record["classifier"])
    no_decay = ("bias", "LayerNorm.weight")  # HF Trainer's grouping
    groups = [
        {
            "params": [p for n, p in reference.named_parameters() if not n.endswith(no_decay)],
            "weight_decay": weight_decay,
        },
        {"params": [p for n, p in reference.named_parameters() if n.endswith(no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=eps)
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, round(0.1 * steps), steps)
    reference.train()
    reference_losses = []
    for batch in record["batches"]:
        out = reference(
            input_ids=batch["input_ids"],
            token_type_ids=batch["token_type_ids"],
            attention_mask=batch["attention_mask"],
            labels=batch["labels"],
        )
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        reference_losses.append(out.loss.item())

    torch.testing.assert_close(torch.tensor(record["losses"]), torch.tensor(reference_losses), atol=1e-4, rtol=0)
    assert abs(reference_losses[-1] - reference_losses[0]) > 1e-3  # the weights really moved
    # After training, both models give the same logits.
    assert torch.load(results["last_checkpoint"], weights_only=True)["global_step"] == steps
    ours = SequenceClassificationModule.load_from_checkpoint(results["last_checkpoint"], weights_only=True).eval()
    reference.eval()
    batch = record["batches"][0]
    with torch.no_grad():
        expected = reference(
            input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"], attention_mask=batch["attention_mask"]
        ).logits
        torch.testing.assert_close(ours(batch), expected, atol=1e-4, rtol=0)
