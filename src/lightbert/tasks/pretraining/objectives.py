"""The pre-training objectives the paper compares (§5.1, Table 5), chosen by `task.objective`, and the masking
procedure's shares (Appendix C.2, Table 8), `task.datamodule.masking`; and the examples they read,
`task.datamodule.examples`. Light to import: the entry point checks them before torch loads.

The data (sentence pairs, 50% with a random sentence B: `examples=pairs`) is the same for all three; they differ in
the batches' labels, the attention's direction and the heads:
- `mlm_nsp`: BERT. 15% of tokens masked and predicted, plus next sentence prediction from the pooled [CLS].
- `mlm`: "No NSP". The same masked LM; no NSP head, no NSP loss, no pooler.
- `ltr`: "LTR & No NSP", as OpenAI GPT. Every token attends to its left only, in pre-training and in fine-tuning
  (the model's config says `attention: left_to_right`), and predicts the token that follows it; no masking, no NSP.
  Its classifiers read the last token, as GPT's do, since its [CLS] sees only itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightbert.errors import ParameterError

OBJECTIVES = {
    "mlm_nsp": "masked LM + next sentence prediction (BERT)",
    "mlm": "masked LM, no NSP (Table 5's No NSP)",
    "ltr": "left-to-right LM, no NSP (Table 5's LTR & No NSP)",
}


def check_objective(objective: str) -> None:
    if objective not in OBJECTIVES:
        raise ParameterError(f"{{0}}={objective!r} is not known; valid: {list(OBJECTIVES)}", "objective")


# task.datamodule.examples (lightbert.tasks.pretraining.examples)
EXAMPLES = {
    "pairs": "the paper's [CLS] A [SEP] B [SEP] sentence pairs, half with a random B (NSP's labels)",
    "chunks": "each document's tokens cut in order into [CLS] chunk [SEP] examples (the modern recipe's)",
}


def check_examples(examples: str, objective: str | None) -> None:
    """`examples` known, and not chunks for next sentence prediction (they have no second segment). The message names
    the parameter as `{0}`: the DataModule's `examples`, the config's `task.datamodule.examples`."""
    if examples not in EXAMPLES:
        raise ParameterError(f"{{0}}={examples!r} is not known; valid: {list(EXAMPLES)}", "examples")
    if examples == "chunks" and objective == "mlm_nsp":
        raise ParameterError(
            "{0}=chunks has no sentence pairs, and task.objective=mlm_nsp asks for next sentence prediction: set "
            "task.objective=mlm (masked LM alone), or {0}=pairs for BERT's sentence pairs",
            "examples",
        )


@dataclass(frozen=True)
class MaskingShares:
    """What becomes of a chosen token: [MASK], kept the SAME, or a RANDOM token (the paper's 80/10/10)."""

    mask: float = 0.8
    same: float = 0.1
    random: float = 0.1

    def __post_init__(self) -> None:
        shares = (self.mask, self.same, self.random)
        if any(not 0 <= s <= 1 for s in shares) or abs(sum(shares) - 1) > 1e-6:
            raise ParameterError(
                f"{{0}} must be three shares from 0 to 1 that sum to 1 (mask, same, random), got "
                f"mask={self.mask}, same={self.same}, random={self.random}",
                "masking",
            )
