"""sentence-transformers' directory format, both ways: what a `SentenceTransformer.save` directory says of its pooling,
normalisation and length (`read`), and the files that make an exported encoder one (`write`).

A sentence-transformers directory is a Hugging Face encoder (config.json, weights, tokenizer; at the top or in the
folder its first module names) with `modules.json` listing the modules a text goes through: `Transformer`, then
`Pooling` (its config in e.g. `1_Pooling/config.json`), then optionally `Normalize`. lightbert runs exactly that
chain, with the poolings `lightbert.model.embedding` has; any other module (a `Dense` projection, a `LayerNorm`, a
CNN, ...) or pooling (max, weighted mean, several at once) is refused in one line naming it, never skipped: the
vectors would not be the model's. Both of sentence-transformers' config styles are read (`pooling_mode` since v5,
the `pooling_mode_*_tokens` booleans before); `write` uses the older, which every version reads.
"""

from __future__ import annotations

import json
from pathlib import Path

from lightbert.errors import UserError
from lightbert.model_config import POOLINGS

MODULES_FILE = "modules.json"
# sentence-transformers' pooling names -> lightbert's (POOLINGS); the older config's booleans -> the same names
POOLING_NAMES = {"mean": "mean", "cls": "cls", "lasttoken": "last"}
LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


def is_sentence_transformers_dir(path: Path) -> bool:
    return (path / MODULES_FILE).is_file()


def _json(file: Path) -> dict | list:
    """A JSON file's content, or one line naming the file."""
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise UserError(f"could not read {file}: {error}") from None


def read(path: Path) -> tuple[Path, dict]:
    """The folder of a sentence-transformers directory that holds its encoder, and what the other modules do:
    {"pooling": one of POOLINGS, "normalize": bool, "max_seq_length": int or None}. Refuses (`UserError`) a module
    or pooling lightbert does not run."""
    modules = _json(path / MODULES_FILE)
    if not isinstance(modules, list) or not modules or not all(isinstance(m, dict) for m in modules):
        raise UserError(
            f'{path / MODULES_FILE} is not a list of modules ({{"type": ..., "path": ...}} each); it is not a '
            "sentence-transformers directory lightbert can read"
        )
    kinds = [(str(m.get("type", "")).rsplit(".", 1)[-1], m.get("path", "")) for m in modules]
    names = [kind for kind, _ in kinds]
    supported = names[:2] == ["Transformer", "Pooling"] and names[2:] in ([], ["Normalize"])
    if not supported:
        others = [n for n in names if n not in ("Transformer", "Pooling", "Normalize")]
        what = f"a {', '.join(others)} module" if others else f"its modules in the order {names}"
        raise UserError(
            f"{path} is a sentence-transformers model with {what}, which lightbert does not run (it runs Transformer "
            "-> Pooling -> Normalize (optional)); use sentence-transformers for this model"
        )
    encoder = path / kinds[0][1]
    pooling_config = _json(path / kinds[1][1] / "config.json")
    if not isinstance(pooling_config, dict):
        raise UserError(f"{path / kinds[1][1] / 'config.json'} is not a pooling config (a JSON object)")
    mode = pooling_config.get("pooling_mode")  # v5's: a name (or a list of them); before, one boolean per mode
    if mode is not None:
        modes = list(mode) if isinstance(mode, list) else [mode]
    else:
        modes = [mode for key, mode in LEGACY_POOLING_KEYS.items() if pooling_config.get(key)]
    if len(modes) != 1 or modes[0] not in POOLING_NAMES:
        raise UserError(
            f"{path / kinds[1][1] / 'config.json'}: pooling {modes or 'none'} is not one lightbert runs; it runs one "
            f"of {', '.join(POOLING_NAMES)} (sentence-transformers' names)"
        )
    _refuse_what_changes_the_text(path, encoder)
    return encoder, {
        "pooling": POOLING_NAMES[modes[0]],
        "normalize": names[2:] == ["Normalize"],
        "max_seq_length": _max_seq_length(path, encoder),
    }


def _refuse_what_changes_the_text(path: Path, encoder: Path) -> None:
    """sentence-transformers changes a text before its tokenizer where `sentence_bert_config.json` says
    do_lower_case (it lowercases) or `config_sentence_transformers.json` names a default prompt (it prepends it);
    lightbert encodes the text as given, so such a model is refused rather than run on other inputs."""
    bert_config = encoder / "sentence_bert_config.json"
    if bert_config.is_file() and _json(bert_config).get("do_lower_case"):
        raise UserError(
            f"{bert_config}: do_lower_case is true (sentence-transformers lowercases every text before its tokenizer), "
            "which lightbert does not do; use sentence-transformers for this model"
        )
    st_config = path / "config_sentence_transformers.json"
    prompt = _json(st_config).get("default_prompt_name") if st_config.is_file() else None
    if prompt:
        raise UserError(
            f"{st_config}: default_prompt_name is {prompt!r} (sentence-transformers puts a prompt before every text), "
            "which lightbert does not do; use sentence-transformers for this model"
        )


def _max_seq_length(path: Path, encoder: Path) -> int | None:
    """What sentence-transformers cuts texts to: `sentence_bert_config.json`'s max_seq_length, else the tokenizer's
    model_max_length (sentence-transformers v5 keeps it there)."""
    for file, key in ((encoder / "sentence_bert_config.json", "max_seq_length"),
                      (encoder / "tokenizer_config.json", "model_max_length")):  # fmt: skip
        content = _json(file) if file.is_file() else None
        if isinstance(content, dict):
            value = content.get(key)
            if isinstance(value, int) and 0 < value < 10**6:  # transformers writes 1e30 for "no limit"
                return value
    return None


def write(out_dir: Path, pooling: str, normalize: bool, max_seq_length: int, hidden_size: int) -> None:
    """sentence-transformers' files beside an exported encoder in `out_dir`: its modules (Transformer -> Pooling ->
    Normalize where the model normalises), the pooling's config and the length texts are cut to."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (out_dir / "2_Normalize").mkdir()
    (out_dir / MODULES_FILE).write_text(json.dumps(modules, indent=2) + "\n")
    (out_dir / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}, indent=2) + "\n"
    )
    ours = {"mean": "mean", "cls": "cls", "last": "lasttoken"}[pooling]
    config = {"word_embedding_dimension": hidden_size}
    config |= {key: mode == ours for key, mode in LEGACY_POOLING_KEYS.items()}
    (out_dir / "1_Pooling").mkdir()
    (out_dir / "1_Pooling" / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"}, indent=2) + "\n"
    )
