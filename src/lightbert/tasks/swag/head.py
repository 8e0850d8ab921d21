"""SWAG's head in the registry (lightbert.tasks.heads): multiple choice, one score per (context, ending) pair."""

from __future__ import annotations

from lightbert.model import BertForMultipleChoice
from lightbert.tasks.heads import Head, HeadArguments, register
from lightbert.tasks.swag.module import MultipleChoiceModule
from lightbert.tasks.swag.predictor import MultipleChoice

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
