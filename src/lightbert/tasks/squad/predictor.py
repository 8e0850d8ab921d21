"""Question answering (SQuAD) on new records: `src/predict.py`'s predictor for this head."""

from __future__ import annotations

from typing import TYPE_CHECKING

import datasets
import numpy as np
import torch

from lightbert.tasks.finetuning.predictor import Predictor, Record, Unit
from lightbert.tasks.squad.answers import SquadAnswers
from lightbert.tasks.squad.data import Windowing, make_windows

if TYPE_CHECKING:
    from lightbert.tasks.finetuned import FineTuned


NO_ANSWERS = {"text": [], "answer_start": []}  # a new question has no gold answers


class QuestionAnswering(Predictor):
    reads = '{"question": ..., "context": ...}'
    options = ("null_score_diff_threshold",)  # SQuAD v2.0's: null uses the run's threshold

    def __init__(self, finetuned: FineTuned, max_seq_length: int, options: dict | None = None):
        super().__init__(finetuned, max_seq_length, options)
        settings, given = finetuned.settings, (options or {}).get("null_score_diff_threshold")
        self.version_2 = str(settings["version"]) == "2.0"
        self.threshold = settings["null_threshold"] if given is None else float(given)
        self.windowing = Windowing(max_seq_length, settings["doc_stride"], settings["max_query_length"])

    def encode(self, records: list[Record]) -> list[Unit]:
        questions = [self.text(r, "question") for r in records]
        contexts = [self.text(r, "context") for r in records]
        ids = [str(fields.get("id", number)) for number, fields in records]
        examples = datasets.Dataset.from_dict(
            {
                "id": ids,
                "context": contexts,
                "question": questions,
                "answers": [{"text": [], "answer_start": []}] * len(ids),
            }
        )
        rows, problems = make_windows(examples, self.tokenizer, self.windowing, training=False, version_2=True)
        cut = [i in set(problems.ids.get("question_truncated", [])) for i in ids]
        self.note_cut(
            records,
            cut,
            f"have questions longer than max_query_length={self.windowing.max_query_length} "
            "tokens: cut to it, as in training",
        )
        windows = datasets.Dataset.from_dict({k: rows[k] for k in ("example_idx", "offsets", "max_context")})
        settings = self.finetuned.settings
        self.answers = SquadAnswers(
            examples, windows, self.version_2, settings["n_best_size"], settings["max_answer_length"]
        )
        return [
            Unit(e, i, t)
            for e, i, t in zip(rows["example_idx"], rows["input_ids"], rows["token_type_ids"], strict=True)
        ]

    def outputs(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> np.ndarray:
        start, end = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        return torch.stack([start, end], dim=-1).float().cpu().numpy()  # (B, T, 2)

    def decode(self, records: list[Record], units: list[Unit], outputs: list[np.ndarray]) -> list[dict]:
        logits = {window: output for window, output in enumerate(outputs)}
        out = []
        for example in range(len(records)):
            answer = self.answers.answer(example, logits)
            no_answer = answer.start is None or (self.version_2 and answer.null_odds > self.threshold)
            probability = next((c["probability"] for c in answer.nbest if c["text"] == answer.text), 0.0)
            prediction = {
                "answer": "" if no_answer else answer.text,
                "start": None if no_answer else answer.start,
                "end": None if no_answer else answer.end,
                "score": 0.0 if no_answer else round(probability, 6),
                "no_answer": no_answer,
            }
            if self.version_2:
                prediction["null_odds"] = round(answer.null_odds, 6)
            out.append(prediction)
        return out
