"""A plain transformers fine-tuning loop, the reference of bench/finetune_vs_transformers.py: run in its own process
so that, like `src/train.py`, it pays for starting Python and its imports. It imports torch and transformers only.

    python bench/plain_transformers_finetune.py HF_DIR TRAIN.jsonl DEV.jsonl EPOCHS BATCH_SIZE LR SEED

Tokenises each batch as it goes (padding to the longest), AdamW (eps 1e-6, weight decay 0.01 except biases and
LayerNorm), 10% linear warmup then linear decay, gradient norm clipped at 1.0, dev accuracy after every epoch;
prints the accuracies as a JSON list on its last line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import transformers


def main(
    hf_dir: str, train: str, dev: str, epochs: int, batch_size: int, lr: float, seed: int, device: str = "cpu"
) -> list[float]:
    """On CUDA the loop a user would write there: bf16 autocast and the fused AdamW, as `trainer=gpu` runs."""
    torch.manual_seed(seed)
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    model = transformers.BertForSequenceClassification.from_pretrained(hf_dir, num_labels=2).to(device)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda")

    def load(path):
        rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
        return [r["sentence"] for r in rows], torch.tensor([r["label"] for r in rows])

    def batches(texts, labels, shuffle):
        order = torch.randperm(len(texts)) if shuffle else torch.arange(len(texts))
        for start in range(0, len(texts), batch_size):
            index = order[start : start + batch_size]
            encoded = tokenizer(
                [texts[i] for i in index], padding=True, truncation=True, max_length=128, return_tensors="pt"
            )
            yield encoded.to(device), labels[index].to(device)

    train_texts, train_labels = load(train)
    dev_texts, dev_labels = load(dev)
    steps = epochs * -(-len(train_texts) // batch_size)
    no_decay = ("bias", "LayerNorm.weight")
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for n, p in model.named_parameters() if not n.endswith(no_decay)], "weight_decay": 0.01},
            {"params": [p for n, p in model.named_parameters() if n.endswith(no_decay)], "weight_decay": 0.0},
        ],
        lr=lr,
        eps=1e-6,
        fused=device == "cuda",
    )
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, round(0.1 * steps), steps)
    accuracies = []
    for _ in range(epochs):
        model.train()
        for encoded, labels in batches(train_texts, train_labels, shuffle=True):
            with autocast:
                loss = model(**encoded, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
        model.eval()
        correct = 0
        with torch.no_grad(), autocast:
            for encoded, labels in batches(dev_texts, dev_labels, shuffle=False):
                correct += int((model(**encoded).logits.argmax(-1) == labels).sum())
        accuracies.append(correct / len(dev_texts))
    return accuracies


if __name__ == "__main__":
    hf_dir, train, dev, epochs, batch_size, lr, seed, *device = sys.argv[1:]
    print(json.dumps(main(hf_dir, train, dev, int(epochs), int(batch_size), float(lr), int(seed), *device)))
