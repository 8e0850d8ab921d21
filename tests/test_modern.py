"""The modern recipe (ModernBERT's blocks as options of the one encoder): parity with transformers' ModernBERT, both
ways, its BPE tokenizer as it comes, and the one-line refusals of what the encoder does not have."""

import json

import pytest
import torch
import transformers
from helpers.glue_files import glue_data_files, glue_overrides
from helpers.models import MODERN_SPECIALS, random_batch, write_hf_modernbert
from helpers.runs import TINY_MODERN_PRETRAIN, compose_config

from lightbert import evaluate, train
from lightbert.checkpoints.hf_format import (
    hf_config_to_lightbert,
    lightbert_config_to_modernbert,
    lightbert_state_dict_to_modernbert,
)
from lightbert.checkpoints.reading import load_into, load_pretrained
from lightbert.data.encoding import IGNORE_INDEX
from lightbert.errors import ConfigError, UserError
from lightbert.interop.convert import main as convert
from lightbert.model import (
    BertConfig,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from lightbert.model.feature_based import FeatureBasedTagger
from lightbert.model.layouts import UNPADDING
from lightbert.tasks.pretraining.module import pretraining_losses

ATOL = 1e-5


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return write_hf_modernbert(tmp_path_factory.mktemp("modern") / "hf")


def ours_from(directory, model_class=None, **arguments):
    pretrained = load_pretrained(str(directory))
    config = BertConfig.from_dict(pretrained.config)
    model = model_class(config, **arguments) if model_class else BertForPreTraining(config, next_sentence=False)
    assert load_into(model, pretrained) == []  # every weight came from the checkpoint
    return model.eval()


def masked_labels(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Every third real token predicted, the rest IGNORE_INDEX."""
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    chosen = (torch.arange(input_ids.shape[1]) % 3 == 1) & attention_mask.bool()
    labels[chosen] = input_ids[chosen]
    return labels


@pytest.mark.parametrize("unpad", UNPADDING)
def test_modernbert_directory_gives_transformers_logits_and_loss(hf_dir, unpad):
    hf = transformers.ModernBertForMaskedLM.from_pretrained(hf_dir).eval()
    ours = ours_from(hf_dir)
    ours.bert.set_unpadding(unpad)
    assert any(layer.window == 4 for layer in ours.bert.encoder.layer)  # local_attention 8: 4 each side, T=20
    input_ids, _, attention_mask = random_batch(vocab=ours.config.vocab_size)
    labels = masked_labels(input_ids, attention_mask)
    with torch.no_grad():
        logits, nsp = ours(input_ids, None, attention_mask)
        sparse, _ = ours(input_ids, None, attention_mask, masked_positions=labels != IGNORE_INDEX)
        ref = hf(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    real = attention_mask.bool()
    assert nsp is None
    torch.testing.assert_close(logits[real], ref.logits[real], atol=ATOL, rtol=0)
    loss = pretraining_losses(sparse, labels[labels != IGNORE_INDEX])["loss"]
    torch.testing.assert_close(loss, ref.loss, atol=ATOL, rtol=0)


def test_the_window_matters(hf_dir):
    """The parity above is not the sliding window's absence: with every layer global the logits differ."""
    ours = ours_from(hf_dir)
    global_everywhere = BertForPreTraining(
        BertConfig.from_dict({**ours.config.to_dict(), "global_attn_every_n_layers": 1}), next_sentence=False
    )
    global_everywhere.load_state_dict(ours.state_dict())
    input_ids = random_batch(vocab=ours.config.vocab_size)[0]
    with torch.no_grad():
        assert not torch.allclose(ours(input_ids)[0], global_everywhere.eval()(input_ids)[0], atol=1e-3)


def test_bpe_tokenizer_comes_with_the_checkpoint_as_it_is(hf_dir):
    from tokenizers import Tokenizer

    pretrained = load_pretrained(str(hf_dir))
    reference = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    text = "The film was GREAT, the river city team"
    assert pretrained.tokenizer.encode_batch([text])[0] == reference.encode(text, add_special_tokens=False).ids
    tokenizer = pretrained.tokenizer
    ids = {name: reference.token_to_id(name) for name in MODERN_SPECIALS}
    assert (tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id, tokenizer.mask_id, tokenizer.unk_id) == (
        ids["[CLS]"], ids["[SEP]"], ids["[PAD]"], ids["[MASK]"], ids["[UNK]"],
    )  # fmt: skip
    assert tokenizer.cls_id != 2 or tokenizer.pad_id != 0  # not BERT's numbering: looked up by name
    assert pretrained.config["pad_token_id"] == ids["[PAD]"]


def test_to_hf_writes_a_modernbert_transformers_loads_with_the_same_logits(hf_dir, tmp_path):
    assert convert(["from-hf", str(hf_dir), str(tmp_path / "lightbert")]) == 0
    assert convert(["to-hf", str(tmp_path / "lightbert" / "model.ckpt"), str(tmp_path / "out")]) == 0
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "modernbert" and config["architectures"] == ["ModernBertForMaskedLM"]
    back, info = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert type(back).__name__ == "ModernBertForMaskedLM"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    hf = transformers.ModernBertForMaskedLM.from_pretrained(hf_dir).eval()
    input_ids, _, attention_mask = random_batch(vocab=hf.config.vocab_size)
    with torch.no_grad():
        expected = hf(input_ids=input_ids, attention_mask=attention_mask).logits
        got = back.eval()(input_ids=input_ids, attention_mask=attention_mask).logits
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert tokenizer.mask_token == "[MASK]" and tokenizer.cls_token_id == config["cls_token_id"]


HEADS = [  # (transformers' class, lightbert's, its arguments, transformers' config; classifier_pooling)
    ("ModernBertForSequenceClassification", BertForSequenceClassification, {"num_labels": 3}, {"num_labels": 3}, "cls"),
    (
        "ModernBertForSequenceClassification",
        BertForSequenceClassification,
        {"num_labels": 1},
        {"num_labels": 1},
        "mean",
    ),
    ("ModernBertForTokenClassification", BertForTokenClassification, {"num_labels": 5}, {"num_labels": 5}, "cls"),
    ("ModernBertForQuestionAnswering", BertForQuestionAnswering, {}, {}, "cls"),
    ("ModernBertForMultipleChoice", BertForMultipleChoice, {}, {}, "cls"),
    ("ModernBertForMultipleChoice", BertForMultipleChoice, {}, {}, "mean"),
]


@pytest.mark.parametrize(("architecture", "model_class", "ours_arguments", "hf_config", "pooling"), HEADS)
def test_fine_tuning_heads_match_transformers(tmp_path, architecture, model_class, ours_arguments, hf_config, pooling):
    hf_dir = write_hf_modernbert(tmp_path / "hf", architecture, classifier_pooling=pooling, **hf_config)
    hf = getattr(transformers, architecture).from_pretrained(hf_dir).eval()
    ours = ours_from(hf_dir, model_class, **ours_arguments)
    input_ids, _, attention_mask = random_batch(vocab=ours.config.vocab_size)
    real = attention_mask.bool()
    with torch.no_grad():
        if model_class is BertForMultipleChoice:
            input_ids, attention_mask = input_ids.view(1, 3, -1), attention_mask.view(1, 3, -1)
            real = torch.ones(1, dtype=torch.bool)
        got = ours(input_ids, None, attention_mask)
        ref = hf(input_ids=input_ids, attention_mask=attention_mask)
    if model_class is BertForQuestionAnswering:
        torch.testing.assert_close(got[0][real], ref.start_logits[real], atol=ATOL, rtol=0)
        torch.testing.assert_close(got[1][real], ref.end_logits[real], atol=ATOL, rtol=0)
    elif model_class is BertForTokenClassification:
        torch.testing.assert_close(got[real], ref.logits[real], atol=ATOL, rtol=0)
    else:
        torch.testing.assert_close(got, ref.logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ({"hidden_activation": "silu"}, "hidden_activation"),
        ({"decoder_bias": False}, "decoder_bias"),
        ({"layer_types": ["full_attention", "sliding_attention", "full_attention", "full_attention"]}, "layer_types"),
        ({"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0}}}, "rope_type"),
        ({"embedding_dropout": 0.1, "mlp_dropout": 0.0}, "embedding_dropout"),
    ],
)
def test_a_modernbert_setting_the_encoder_lacks_is_one_line(hf_dir, setting, named):
    config = {**json.loads((hf_dir / "config.json").read_text()), **setting}
    with pytest.raises(UserError) as error:
        hf_config_to_lightbert(config, "config.json")
    assert named in str(error.value) and "\n" not in str(error.value)


def test_a_window_larger_than_the_context_is_refused():
    with pytest.raises(ConfigError, match="is shorter than model.local_attention"):
        BertConfig(max_position_embeddings=64, global_attn_every_n_layers=3, local_attention=128)
    BertConfig(max_position_embeddings=64, global_attn_every_n_layers=1, local_attention=128)  # no local layer


def test_bert_default_has_none_of_the_modern_blocks():
    """The paper's BERT stays the default: a config of BERT sizes builds exactly BERT's parameters."""
    names = set(BertForPreTraining(BertConfig(vocab_size=100, num_hidden_layers=2)).state_dict())
    assert "bert.embeddings.position_embeddings.weight" in names
    assert not any("norm." in n.lower() and "LayerNorm" not in n for n in names)
    assert not any(n.startswith("bert.final_norm") or ".attention_norm" in n or ".mlp_norm" in n for n in names)


# -- the first draw of the weights: model.initializer=modernbert against transformers' ModernBERT ----------------

# A ModernBERT config.json, large enough (H=256) that every weight's std is estimated to a few tenths of a percent.
INIT_HF_CONFIG = {
    "model_type": "modernbert",
    "vocab_size": 500,
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "max_position_embeddings": 512,
    "local_attention": 64,
    "pad_token_id": 3,
}
SPECIAL_IDS = {"cls_token_id": 1, "bos_token_id": 1, "sep_token_id": 2, "eos_token_id": 2}  # transformers' in range


def modernbert_std(name: str, hf_config: dict) -> float | None:
    """The std transformers' `ModernBertPreTrainedModel._init_weights` draws the weight `name` with (None: a norm's
    ones or a bias's zeros): "in" for the embeddings, Wqkv and Wi, "out" for the Wo's and the heads' dense layer,
    "final_out" for the classifier."""
    std = hf_config["initializer_range"]
    if name.endswith(("tok_embeddings.weight", "attn.Wqkv.weight", "mlp.Wi.weight")):
        return std
    if name.endswith(("attn.Wo.weight", "mlp.Wo.weight", "head.dense.weight")):
        return std / (2 * hf_config["num_hidden_layers"]) ** 0.5
    if name == "classifier.weight":
        return hf_config["hidden_size"] ** -0.5
    return None


def feature_based_tagger(config, num_labels):  # its classifier reads 2 x 128 = H features, as transformers' does
    return FeatureBasedTagger(config, num_labels, combination="last", lstm_hidden_size=config.hidden_size // 2)


INITIALISED = [  # (transformers' class, lightbert's builder, its arguments, cutoff, transformers' weights it lacks)
    ("ModernBertForMaskedLM", None, {}, 2.0, set()),
    ("ModernBertForSequenceClassification", BertForSequenceClassification, {"num_labels": 64}, 3.0, set()),
    ("ModernBertForTokenClassification", BertForTokenClassification, {"num_labels": 64}, 2.0, set()),
    ("ModernBertForQuestionAnswering", BertForQuestionAnswering, {}, 2.0, set()),
    ("ModernBertForMultipleChoice", BertForMultipleChoice, {}, 2.0, set()),
    (
        "ModernBertForTokenClassification",
        feature_based_tagger,
        {"num_labels": 64},
        2.0,
        {"head.dense.weight", "head.norm.weight"},
    ),
]


@pytest.mark.parametrize(("architecture", "build", "arguments", "cutoff", "lacks"), INITIALISED)
def test_modernbert_initialisation_draws_each_weight_as_transformers(architecture, build, arguments, cutoff, lacks):
    """Each weight of ours, under transformers' name (the `convert to-hf` map), against the same weight of the
    transformers class built from the same config: exact zeros and ones in the same places, every value within
    +-cutoff x the std of its role, and the empirical std within 3% of transformers' tensor's (or 4/sqrt(numel) for
    the small QA and multiple-choice classifiers, about 5 standard errors of the ratio). With BERT's init every case
    fails (measured): the embeddings, Wqkv and Wi 14% too wide, the Wo's and heads' dense 2-2.3x, the classifiers
    2.75x too narrow, and [PAD]'s embedding zero where transformers draws it."""
    config = BertConfig.from_dict(hf_config_to_lightbert({**INIT_HF_CONFIG, "initializer_cutoff_factor": cutoff}))
    assert (config.initializer, config.initializer_cutoff_factor) == ("modernbert", cutoff)  # read from config.json
    hf_config = lightbert_config_to_modernbert(config.to_dict())  # and written back by convert to-hf
    torch.manual_seed(0)
    hf = getattr(transformers, architecture)(transformers.ModernBertConfig(**hf_config, **SPECIAL_IDS, **arguments))
    ours = build(config, **arguments) if build else BertForPreTraining(config, next_sentence=False)
    theirs = hf.state_dict()
    mine = lightbert_state_dict_to_modernbert(ours.state_dict(), architecture)
    if architecture == "ModernBertForMaskedLM":  # the decoder is the embeddings in both, drawn as the embeddings
        assert hf.decoder.weight is hf.model.embeddings.tok_embeddings.weight
        assert ours.cls.predictions.decoder.weight is ours.bert.embeddings.word_embeddings.weight
        del theirs["decoder.weight"]
    assert set(theirs) - set(mine) == lacks
    wrong = []  # every weight that differs, with how
    for name, expected in theirs.items():
        if name in lacks:
            continue
        got = mine[name]
        if not (torch.equal(got == 0, expected == 0) and torch.equal(got == 1, expected == 1)):
            wrong.append(f"{name}: zeros or ones elsewhere than transformers'")
        std = modernbert_std(name, hf_config)
        if std is None:
            assert torch.all((expected == 0) | (expected == 1)), name  # a norm or a bias in transformers
            continue
        bound = cutoff * std * (1 + 1e-6)
        assert expected.abs().max() <= bound, name  # modernbert_std is the std transformers draws with
        if got.abs().max() > bound:
            wrong.append(f"{name}: |w| up to {got.abs().max():.4f}, past {cutoff} x {std:.4f}")
        ratio = (got.std() / expected.std()).item()
        if abs(ratio - 1) >= max(0.03, 4 / expected.numel() ** 0.5):
            wrong.append(f"{name}: std {ratio:.3f} x transformers'")
    assert not wrong, wrong


def test_a_head_on_a_modernbert_directory_starts_its_classifier_as_transformers(hf_dir):
    """init_from a transformers ModernBERT: its config reads as model.initializer=modernbert, so a new task head's
    classifier is drawn with ModernBERT's std, hidden_size ** -0.5, truncated at 2 (BERT's 0.02 would fail), as
    transformers' from_pretrained draws its own."""
    pretrained = load_pretrained(str(hf_dir))
    assert (pretrained.config["initializer"], pretrained.config["initializer_cutoff_factor"]) == ("modernbert", 2.0)
    ours = BertForSequenceClassification(BertConfig.from_dict(pretrained.config), num_labels=3)
    assert load_into(ours, pretrained) == ["classifier.bias", "classifier.weight"]  # left as initialised
    hf = transformers.ModernBertForSequenceClassification.from_pretrained(hf_dir, num_labels=3)
    std = pretrained.config["hidden_size"] ** -0.5
    for classifier in (ours.classifier, hf.classifier):
        weight = classifier.weight.detach()
        assert weight.abs().max() <= 2 * std * (1 + 1e-6) and torch.all(classifier.bias == 0)
        assert abs(weight.std().item() / (0.88 * std) - 1) < 4 / weight.numel() ** 0.5  # 0.88: the truncation's


def fine_tuning_start(overrides: list[str], output_dir) -> tuple[torch.nn.Module, list[str]]:
    """The network a fine-tuning run of `overrides` starts training, built as `train` builds it (its settings,
    `run_model`, the task's module, `load_pretrained_weights`; no data), and the weights that start fresh."""
    from helpers.runs import run_settings

    from lightbert.run.building import instantiate_config, with_vocabulary
    from lightbert.run.model_choice import run_model
    from lightbert.run.run_dir import Start
    from lightbert.tasks.heads import carry_head, task_head
    from lightbert.tasks.pretraining.continued import load_pretrained_weights

    settings = run_settings(compose_config(overrides, output_dir))
    model = run_model(settings, Start(), load_pretrained(settings.init_from))
    tokenizer = model.tokenizer["tokenizer"]
    module = instantiate_config(
        settings.task.module,
        model=with_vocabulary(model.config, tokenizer, model.pretrained),
        optim=settings.optim.hyperparameters(),
        _convert_="all",
    )
    head = task_head(settings.task.module_class, settings.task.module_arguments)
    carry = carry_head(model.pretrained, *head) if head is not None else None
    return module.model, load_pretrained_weights(module.model, model.pretrained, tokenizer, carry)


FAMILIES = [  # (the task's overrides, transformers' class): one task of each head family
    (["task=glue/mrpc"], "ModernBertForSequenceClassification"),
    (["task=conll2003"], "ModernBertForTokenClassification"),
    (
        ["task=squad_v1", "task.max_seq_length=64", "task.doc_stride=16", "task.max_query_length=16"],
        "ModernBertForQuestionAnswering",
    ),
    (["task=swag"], "ModernBertForMultipleChoice"),
]


@pytest.mark.parametrize(("task", "architecture"), FAMILIES, ids=[architecture for _, architecture in FAMILIES])
def test_a_fine_tune_of_a_modernbert_starts_where_transformers_from_pretrained_does(
    hf_dir, tmp_path, task, architecture
):
    """init_from a ModernBertForMaskedLM directory, built as a run builds it: the task head's dense -> GELU ->
    LayerNorm starts from the masked-LM head's, as transformers' ModernBertFor<Task>.from_pretrained loads `head` (one
    module name in both); only the classifier starts fresh. With it copied across, the logits are transformers'
    (measured: at most 4e-7 apart; 0.66 to 3.96 where the head started fresh)."""
    ours, fresh = fine_tuning_start(["trainer=cpu", f"init_from={hf_dir}", *task], tmp_path)
    last_name = "qa_outputs" if architecture == "ModernBertForQuestionAnswering" else "classifier"
    last = getattr(ours, last_name)
    assert fresh == [f"{last_name}.bias", f"{last_name}.weight"]  # the head's dense and LayerNorm are not fresh
    hf = getattr(transformers, architecture).from_pretrained(hf_dir, num_labels=max(last.out_features, 2))
    with torch.no_grad():  # the one part each side draws for itself
        hf.classifier.weight.copy_(last.weight)
        hf.classifier.bias.copy_(last.bias)
    ours, hf = ours.eval(), hf.eval()
    input_ids, _, attention_mask = random_batch(vocab=ours.config.vocab_size)
    real = attention_mask.bool()
    with torch.no_grad():
        if architecture == "ModernBertForMultipleChoice":
            input_ids, attention_mask = input_ids.view(1, 3, -1), attention_mask.view(1, 3, -1)
        got = ours(input_ids, None, attention_mask)
        ref = hf(input_ids=input_ids, attention_mask=attention_mask)
    if architecture == "ModernBertForQuestionAnswering":
        got, ref = torch.stack(got, -1)[real], torch.stack((ref.start_logits, ref.end_logits), -1)[real]
    elif architecture == "ModernBertForTokenClassification":
        got, ref = got[real], ref.logits[real]
    else:
        ref = ref.logits
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)


def test_init_from_takes_the_draw_the_command_line_names(hf_dir, tmp_path):
    """With init_from the checkpoint's config decides the model, but a new head is drawn as model.initializer and
    model.initializer_range say where the command line names them (not silently the checkpoint's modernbert). Naming
    them leaves the checkpoint's dropout alone; a dropout rate named on its own changes that rate only."""
    from helpers.runs import run_settings

    from lightbert.run.model_choice import model_sizes

    pretrained = load_pretrained(str(hf_dir))
    dropout = (pretrained.config["hidden_dropout_prob"], pretrained.config["attention_probs_dropout_prob"])
    assert dropout == (0.0, 0.0)  # ModernBERT's; the default size's would be 0.1

    def sizes(*overrides):
        cfg = compose_config(["trainer=cpu", "task=glue/mrpc", f"init_from={hf_dir}", *overrides], tmp_path)
        return model_sizes(run_settings(cfg), pretrained)

    config = sizes("model.initializer=bert", "model.initializer_range=0.01")
    assert (config.initializer, config.initializer_range, config.hidden_size, config.pooler) == (
        "bert",
        0.01,
        32,
        "head",
    )
    assert (config.hidden_dropout_prob, config.attention_probs_dropout_prob) == dropout
    config = sizes("model.hidden_dropout_prob=0.2")
    assert (config.hidden_dropout_prob, config.attention_probs_dropout_prob) == (0.2, 0.0)


@pytest.mark.parametrize("choice", [None, "adamw"])
def test_the_modern_recipe_takes_stableadamw_unless_the_command_line_picks_another_optimiser(tmp_path, choice):
    """StableAdamW is the recipe's optimiser group (an override in its defaults), not a name set over the group a
    user picked: optim=adamw runs AdamW, with the recipe's rates and decay settings."""
    cfg = compose_config(["task=pretrain_modern", *([f"optim={choice}"] if choice else [])], tmp_path)
    assert (cfg.optim.name, cfg.optim.lr, cfg.optim.decouple_lr) == (choice or "stableadamw", 8e-4, True)
    assert cfg.trainer.gradient_clip_val is None


# -- the modern recipe as a run: task=pretrain_modern on model=modernbert_tiny, then a fine-tune from it ------------

SMALL_MODERN = TINY_MODERN_PRETRAIN


def test_modern_recipe_pretrains_in_phases_and_fine_tunes(tmp_path, corpus_file, caplog):
    caplog.set_level("INFO", logger="lightbert")
    phases = (
        "[{until: 0.5, datamodule: {max_seq_length: 32}}, "
        "{until: 1.0, datamodule: {max_seq_length: 64, batch_size: 2}}]"
    )
    cfg = compose_config(
        [*SMALL_MODERN, "corpus=text", f"corpus.paths=[{corpus_file}]", "trainer.max_steps=4",
         "trainer.val_check_interval=2", f"task.phases={phases}"],
        tmp_path / "pretrain",
    )  # fmt: skip
    results = train(cfg)
    assert results["global_step"] == 4
    assert "val/mlm_accuracy" in results["metrics"] and "val/nsp_loss" not in results["metrics"]
    # Each phase's examples are its documents cut into chunks of its length, said once when they are loaded.
    said = [r.message for r in caplog.records if r.message.startswith("examples: ")]
    assert len(said) == 2 and "chunks of at most 32 tokens" in said[0] and "chunks of at most 64 tokens" in said[1]
    checkpoint = torch.load(results["last_checkpoint"], weights_only=True, map_location="cpu")
    model = checkpoint["hyper_parameters"]["model"]
    assert (model["norm_position"], model["mlp"], model["position_embedding_type"]) == ("pre", "geglu", "rotary")
    assert not any("seq_relationship" in key or "position_embeddings" in key for key in checkpoint["state_dict"])
    assert checkpoint["hyper_parameters"]["objective"] == "mlm"
    # ModernBERT's optimiser: StableAdamW, its weight decay fully decoupled, and no gradient clipping besides.
    optim = checkpoint["hyper_parameters"]["optim"]
    assert (optim["name"], optim["decouple_lr"], optim["weight_decay"]) == ("stableadamw", True, 1e-5)
    assert [g["decouple_lr"] for g in checkpoint["optimizer_states"][0]["param_groups"]] == [True, True]
    assert cfg.trainer.gradient_clip_val is None

    files = glue_data_files(tmp_path / "glue", "mrpc", num_rows=16)
    mrpc = [*glue_overrides("mrpc", files, tmp_path / "pretrain"), "trainer.max_epochs=1"]
    # The classifier head's dense -> GELU -> LayerNorm starts from the pre-trained masked-LM head's, as transformers'
    # from_pretrained starts a ModernBertForSequenceClassification's `head`; the console says so.
    start, fresh = fine_tuning_start(mrpc, tmp_path / "mrpc-start")
    pretrained = {k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items()}
    assert fresh == ["classifier.bias", "classifier.weight"]
    head = {k: v for k, v in start.state_dict().items() if k.startswith("bert.pooler.")}
    assert {"bert.pooler.dense.weight", "bert.pooler.LayerNorm.weight"} <= set(head)
    for key, value in head.items():
        assert torch.equal(value, pretrained[key.replace("bert.pooler.", "cls.predictions.transform.")]), key
    caplog.clear()
    results = train(compose_config(mrpc, tmp_path / "mrpc"))
    assert "val/f1" in results["metrics"]
    said = [r.message for r in caplog.records if "head starts fresh" in r.message]
    assert len(said) == 1, said
    assert "all but its dense -> GELU -> LayerNorm (bert.pooler.dense, bert.pooler.LayerNorm)" in said[0]
    finetuned = torch.load(results["last_checkpoint"], weights_only=True, map_location="cpu")["state_dict"]
    assert "model.bert.pooler.LayerNorm.weight" in finetuned  # ModernBERT's classifier head: dense -> GELU -> norm

    # Exported, the fine-tuned classifier is transformers' ModernBertForSequenceClassification, with its logits.
    assert convert(["to-hf", results["last_checkpoint"], str(tmp_path / "exported")]) == 0
    hf, info = transformers.AutoModelForSequenceClassification.from_pretrained(
        tmp_path / "exported", output_loading_info=True
    )
    assert type(hf).__name__ == "ModernBertForSequenceClassification"
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    ours = ours_from(results["last_checkpoint"], BertForSequenceClassification, num_labels=2)
    input_ids, _, attention_mask = random_batch(vocab=ours.config.vocab_size)
    with torch.no_grad():
        expected = ours(input_ids, None, attention_mask)
        got = hf.eval()(input_ids=input_ids, attention_mask=attention_mask).logits
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["task.objective=mlm_nsp"], "task=pretrain_modern is masked LM alone"),
        (["task=pretrain"], "no next sentence prediction"),  # the modern encoder with BERT's task: NSP asked of it
        (["model.local_attention=16384"], "is shorter than model.local_attention (16384)"),
    ],
)
def test_modern_recipe_refuses_in_one_line_before_writing(tmp_path, corpus_file, overrides, says):
    cfg = compose_config([*SMALL_MODERN, "corpus=text", f"corpus.paths=[{corpus_file}]", *overrides], tmp_path / "run")
    with pytest.raises(ConfigError) as error:
        train(cfg)
    assert says in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_modern_recipe_continues_a_modernbert_checkpoint_with_its_bpe_tokenizer(tmp_path, corpus_file, hf_dir):
    """Continued pre-training from released (here: random) ModernBERT weights: its sizes, its BPE tokenizer as it
    comes (the run's tokenizer.json is the checkpoint's BPE, not a WordPiece trained on the corpus)."""
    cfg = compose_config(
        [*[o for o in SMALL_MODERN if not o.startswith(("model", "task.datamodule.vocab_size"))], "corpus=text",
         f"corpus.paths=[{corpus_file}]", f"init_from={hf_dir}", "trainer.max_steps=2", "trainer.val_check_interval=1",
         "task.phases=null"],
        tmp_path / "run",
    )  # fmt: skip
    results = train(cfg)
    assert results["global_step"] == 2
    saved = json.loads((tmp_path / "run" / "tokenizer.json").read_text())
    assert saved["model"]["type"] == "BPE"
    assert saved["model"]["vocab"] == json.loads((hf_dir / "tokenizer.json").read_text())["model"]["vocab"]
    checkpoint = torch.load(results["last_checkpoint"], weights_only=True, map_location="cpu")
    assert checkpoint["hyper_parameters"]["model"]["hidden_size"] == 32  # the checkpoint's sizes, not model=


@pytest.mark.parametrize("task", ["squad_v2", "conll2003", "swag", "conll2003_features"])
def test_each_task_family_fine_tunes_and_predicts_on_a_modernbert(tmp_path, task):
    """SQuAD, NER, SWAG and the feature-based NER model on a transformers ModernBERT directory (BPE, pre-LN, GeGLU,
    rotary, sliding windows): three steps through the library verb, a validation metric, `evaluate` of the run giving
    that metric again, then `predict` on the run."""
    from helpers.finetuned_runs import fine_tune
    from helpers.ner_files import ner_data_files
    from helpers.predictions import predict, records_of
    from helpers.squad_files import squad_data_files
    from helpers.swag_files import swag_data_files

    modern = write_hf_modernbert(tmp_path / "hf", max_position_embeddings=512)
    common = ["task.batch_size=8", "trainer.max_steps=3", "trainer.val_check_interval=3", "optim.lr=1e-3"]
    if task == "squad_v2":
        files = squad_data_files(tmp_path / "data", "2.0", fmt="jsonl", num_paragraphs=4)
        extra = ["task.max_seq_length=64", "task.doc_stride=16", "task.max_query_length=16"]
    elif task == "swag":
        files, extra = swag_data_files(tmp_path / "data", "jsonl", sizes=(24, 8)), []
    else:
        files = ner_data_files(tmp_path / "data", fmt="jsonl", sizes=(24, 8, 8))
        extra = ["task.lstm_hidden_size=16"] if task == "conll2003_features" else []
    run = fine_tune(tmp_path, task, files, modern, [*common, *extra])
    validated = {name: value for name, value in run.results["metrics"].items() if name.startswith("val/")}
    assert validated, run.results["metrics"]
    # Scored again without training (src/evaluate.py's verb): the one validation of the run, the same metrics.
    given = [o for o in run.overrides if not o.startswith(("init_from=", "trainer.max", "task.data_files.train"))]
    cfg = compose_config([f"init_from={run.dir}", *given], tmp_path / "eval", config_name="evaluate")
    scored = evaluate(cfg)["metrics"]
    for name, value in validated.items():
        assert scored[name] == pytest.approx(value, abs=1e-6), name
    records = [{"words": ["Paris", "is", "big"]}] if task == "conll2003_features" else records_of(run)[:2]
    predictions = predict(run.dir, records, tmp_path)
    assert len(predictions) == len(records) and all(predictions)
