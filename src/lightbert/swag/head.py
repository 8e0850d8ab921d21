"""SWAG's head in the registry (lightbert.heads): multiple choice, one score per (context, ending) pair."""

from __future__ import annotations

from lightbert.heads import Head, HeadArguments, register
from lightbert.model import BertForMultipleChoice
from lightbert.swag.module import MultipleChoiceModule
from lightbert.swag.predictor import MultipleChoice

register(
    Head(
        "multiple_choice",
        MultipleChoiceModule,
        lambda config, a: BertForMultipleChoice(config),
        "BertForMultipleChoice",
        MultipleChoice,
        arguments=lambda hp: HeadArguments(),
        reads_cls=True,
        choices=2,
    )
)
