"""The encoder and heads: reference behaviour, numerics equal to transformers, validated sizes."""

import pytest
import torch
import torch.nn.functional as F
import transformers
from helpers.models import TINY, random_batch

from lightbert.errors import ConfigError
from lightbert.model import BertConfig, BertForPreTraining, BertModel
from lightbert.model.bert import to_checkpoint


def hf_twin(config: BertConfig, ours: torch.nn.Module) -> transformers.BertForPreTraining:
    """A transformers BertForPreTraining holding exactly our weights."""
    hf = transformers.BertForPreTraining(transformers.BertConfig(**config.to_dict(), attn_implementation="sdpa"))
    state = ours.state_dict()
    state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"]
    hf.load_state_dict(state, strict=True)
    return hf.eval()


def test_state_dict_names_are_hugging_face_names():
    ours = BertForPreTraining(TINY)
    hf = transformers.BertForPreTraining(transformers.BertConfig(**TINY.to_dict()))
    # transformers keeps a second name for the MLM bias; everything else matches one to one.
    assert set(hf.state_dict()) - set(ours.state_dict()) == {"cls.predictions.decoder.bias"}
    assert set(ours.state_dict()) <= set(hf.state_dict())


def test_logits_and_hidden_states_equal_transformers():
    ours = BertForPreTraining(TINY).eval()
    hf = hf_twin(TINY, ours)
    input_ids, token_type_ids, attention_mask = random_batch()
    with torch.no_grad():
        mlm, nsp = ours(input_ids, token_type_ids, attention_mask)
        _, _, hidden = ours.bert(input_ids, token_type_ids, attention_mask, output_hidden_states=True)
        reference = hf(
            input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask, output_hidden_states=True
        )
    real = attention_mask.bool()
    torch.testing.assert_close(mlm[real], reference.prediction_logits[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(nsp, reference.seq_relationship_logits, atol=1e-5, rtol=1e-5)
    assert len(hidden) == len(reference.hidden_states) == TINY.num_hidden_layers + 1
    for ours_h, hf_h in zip(hidden, reference.hidden_states, strict=True):
        torch.testing.assert_close(ours_h[real], hf_h[real], atol=1e-5, rtol=1e-5)


def test_the_fused_qkv_projection_loads_and_trains_as_transformers_three():
    """One Linear (3H outputs) for query, key and value: transformers' state dict loads into it (joined), ours
    names them apart (split), and a training step's loss and every gradient equal transformers' (the fused
    gradient, split, equals its three)."""
    config = BertConfig(**{**TINY.to_dict(), "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})
    hf = transformers.BertForPreTraining(transformers.BertConfig(**config.to_dict(), attn_implementation="sdpa"))
    ours = BertForPreTraining(config)
    ours.load_state_dict({k: v for k, v in hf.state_dict().items() if k != "cls.predictions.decoder.bias"})
    attention = ours.bert.encoder.layer[1].attention.self
    assert [n for n, _ in attention.named_parameters()] == ["qkv.weight", "qkv.bias"]
    theirs = hf.bert.encoder.layer[1].attention.self
    assert torch.equal(attention.qkv.weight, torch.cat([theirs.query.weight, theirs.key.weight, theirs.value.weight]))
    input_ids, token_type_ids, attention_mask = random_batch()
    labels = torch.where(attention_mask.bool(), input_ids, -100)
    mlm, nsp = ours(input_ids, token_type_ids, attention_mask)
    loss = F.cross_entropy(mlm.flatten(0, 1), labels.flatten()) + nsp.logsumexp(-1).mean()
    loss.backward()
    reference = hf(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
    hf_loss = F.cross_entropy(reference.prediction_logits.flatten(0, 1), labels.flatten())
    (hf_loss + reference.seq_relationship_logits.logsumexp(-1).mean()).backward()
    torch.testing.assert_close(loss, hf_loss + reference.seq_relationship_logits.logsumexp(-1).mean())
    grads = to_checkpoint(ours, {n: p.grad for n, p in ours.named_parameters()})  # transformers' layout
    hf_grads = {n: p.grad for n, p in hf.named_parameters() if p.grad is not None}
    assert set(grads) == set(hf_grads)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, hf_grads[name], atol=1e-6, rtol=1e-4, msg=name)


def test_the_padded_vocabulary_changes_no_loss_and_no_gradient(monkeypatch):
    """The word embeddings' and MLM decoder's rows padded to a multiple of 64 inside the model (300 -> 320 here): the
    same logits, losses, accuracy and gradients as a model of exactly the vocabulary's rows (padding switched off);
    no padding row is predicted (no logit), none gets a gradient, none is saved."""
    from lightbert.model import bert
    from lightbert.tasks.pretraining.module import pretraining_losses

    config = BertConfig(**{**TINY.to_dict(), "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})
    padded = BertForPreTraining(config)
    monkeypatch.setattr(bert, "VOCAB_MULTIPLE", 1)
    exact = BertForPreTraining(config)
    exact.load_state_dict(padded.state_dict())
    embeddings = "bert.embeddings.word_embeddings.weight"
    assert padded.get_parameter(embeddings).shape[0] == 320 and exact.get_parameter(embeddings).shape[0] == 300
    assert padded.state_dict()[embeddings].shape[0] == padded.state_dict()["cls.predictions.bias"].shape[0] == 300
    input_ids, token_type_ids, attention_mask = random_batch()
    labels = torch.where(attention_mask.bool(), input_ids, -100)
    labels[:, ::3] = -100
    masked = labels != -100
    runs = {}
    for name, model in (("padded", padded), ("exact", exact)):
        mlm, nsp = model(input_ids, token_type_ids, attention_mask, masked_positions=masked)
        losses = pretraining_losses(mlm, labels[masked], nsp, torch.tensor([0, 1, 0]))
        losses["loss"].backward()
        runs[name] = mlm, losses, {n: p.grad for n, p in model.named_parameters()}
    (mlm, losses, grads), (exact_mlm, exact_losses, exact_grads) = runs["padded"], runs["exact"]
    assert mlm.shape[-1] == 300  # no padding row predicted
    torch.testing.assert_close(mlm, exact_mlm, atol=1e-6, rtol=1e-5)
    for key in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy"):
        torch.testing.assert_close(losses[key], exact_losses[key], atol=1e-6, rtol=1e-6, msg=key)
    assert grads.keys() == exact_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad[:300] if grad.shape[0] == 320 else grad, exact_grads[name], msg=name)
    assert not grads[embeddings][300:].any() and not grads["cls.predictions.bias"][300:].any()


def test_sparse_mlm_head_equals_dense_rows():
    model = BertForPreTraining(TINY).eval()
    input_ids, token_type_ids, attention_mask = random_batch()
    masked = torch.zeros_like(input_ids, dtype=torch.bool)
    masked[0, [1, 4]] = True
    masked[2, 3] = True
    with torch.no_grad():
        dense, _ = model(input_ids, token_type_ids, attention_mask)
        sparse, _ = model(input_ids, token_type_ids, attention_mask, masked_positions=masked)
    torch.testing.assert_close(sparse, dense[masked])


def test_padding_never_changes_real_token_outputs():
    model = BertModel(TINY).eval()
    input_ids, token_type_ids, _ = random_batch(batch=1, seq_len=12)
    padded_ids = torch.cat([input_ids, torch.zeros(1, 9, dtype=torch.long)], dim=1)
    padded_types = torch.cat([token_type_ids, torch.zeros(1, 9, dtype=torch.long)], dim=1)
    # Garbage under the padding must not leak either.
    padded_ids[0, 12:] = torch.randint(5, 300, (9,))
    mask = torch.cat([torch.ones(1, 12, dtype=torch.long), torch.zeros(1, 9, dtype=torch.long)], dim=1)
    with torch.no_grad():
        alone, pooled_alone, _ = model(input_ids, token_type_ids, torch.ones_like(input_ids))
        padded, pooled_padded, _ = model(padded_ids, padded_types, mask)
    torch.testing.assert_close(padded[:, :12], alone, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(pooled_padded, pooled_alone, atol=1e-6, rtol=1e-6)


def test_unpadding_gives_the_padded_outputs_and_gradients():
    """speed.unpad: layers on the real tokens only (attention in length groups, or variable-length attention, here
    its one-sequence-at-a-time path of the CPU); real-token outputs and every gradient stay the same."""
    config = BertConfig(**{**TINY.to_dict(), "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})
    model = BertForPreTraining(config)
    input_ids, token_type_ids, attention_mask = random_batch()
    labels = input_ids.masked_fill(torch.rand(input_ids.shape, generator=torch.Generator().manual_seed(1)) > 0.3, -100)
    labels[attention_mask == 0] = -100
    outputs, grads = {}, {}
    for unpad in ("off", "groups", "varlen"):
        model.zero_grad()
        model.bert.set_unpadding(unpad)
        mlm, nsp = model(input_ids, token_type_ids, attention_mask)
        sequence, pooled, hidden = model.bert(input_ids, token_type_ids, attention_mask, output_hidden_states=True)
        loss = F.cross_entropy(mlm.flatten(0, 1), labels.flatten()) + nsp.sum()
        loss.backward()
        real = attention_mask.bool()
        outputs[unpad] = [mlm[real], nsp, sequence[real], pooled, *(h[real] for h in hidden)]
        grads[unpad] = {n: p.grad.clone() for n, p in model.named_parameters()}
    for unpad in ("groups", "varlen"):
        for padded, unpadded in zip(outputs["off"], outputs[unpad], strict=True):
            torch.testing.assert_close(unpadded, padded, atol=1e-5, rtol=1e-5)
        for name, grad in grads["off"].items():
            torch.testing.assert_close(grads[unpad][name], grad, atol=1e-5, rtol=1e-5, msg=f"{unpad}: {name}")


@pytest.mark.parametrize(("layers", "hidden", "heads", "expected_millions"), [(12, 768, 12, 110), (24, 1024, 16, 340)])
def test_parameter_counts_equal_transformers(layers, hidden, heads, expected_millions):
    config = BertConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=4 * hidden
    )
    with torch.device("meta"):  # count without allocating 1.3 GB for BERT_LARGE
        ours = BertForPreTraining(config)
        hf = transformers.BertForPreTraining(transformers.BertConfig(**config.to_dict()))
    # As the checkpoint holds them: the rows the model pads its vocabulary with (to a multiple of 64) are not BERT's.
    ours_count = sum(t.numel() for k, t in ours.state_dict().items() if k != "cls.predictions.decoder.weight")
    assert ours_count == sum(p.numel() for p in hf.parameters())
    assert sum(p.numel() for p in ours.parameters()) - ours_count == (30528 - 30522) * (hidden + 1)
    assert abs(ours_count / 1e6 - expected_millions) / expected_millions < 0.05  # the paper's 110M / 340M


def test_initialisation_follows_the_reference():
    model = BertForPreTraining(
        BertConfig(vocab_size=2000, hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024)
    )
    qkv = model.bert.encoder.layer[0].attention.self.qkv  # query, key and value in one
    assert abs(qkv.weight.std().item() - 0.02) < 0.002
    assert torch.all(qkv.bias == 0)
    layer_norm = model.bert.embeddings.LayerNorm
    assert torch.all(layer_norm.weight == 1) and torch.all(layer_norm.bias == 0)
    assert torch.all(model.cls.predictions.bias == 0)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight  # tied


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"hidden_size": 100, "num_attention_heads": 12}, "hidden_size"),
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
        ({"intermediate_size": -1}, "intermediate_size"),
        ({"hidden_size": "big"}, "hidden_size"),
        ({"hidden_dropout_prob": 1.5}, "hidden_dropout_prob"),
    ],
)
def test_bad_sizes_fail_naming_the_field(change, field):
    with pytest.raises(ConfigError, match=f"model.{field}"):
        BertConfig(**change)


def test_unknown_model_key_lists_valid_keys():
    with pytest.raises(ConfigError, match="hidden_sise.*valid keys"):
        BertConfig.from_dict({"hidden_sise": 128})


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.hidden_size=129", "model.hidden_size (129) must be divisible by model.num_attention_heads (2)"),
        ("model.num_hidden_layers=0", "model.num_hidden_layers must be a positive integer, got 0"),
        ("model.hidden_dropout_prob=1.5", "model.hidden_dropout_prob must be in [0, 1), got 1.5"),
        ("model.initializer=xavier", "model.initializer must be one of ['bert', 'modernbert'], got 'xavier'"),
        ("model.initializer_cutoff_factor=0", "model.initializer_cutoff_factor must be a positive number, got 0"),
        ("+model.hidden_layers=3", "unknown model config key(s) ['hidden_layers']"),
    ],
)
def test_each_model_setting_is_checked_once_by_the_settings_builder(tmp_path, override, message):
    """The run's settings hold the model's typed config: a bad size is refused there, naming its key, before
    anything is written (the module's BertConfig is the same class's rules)."""
    from helpers.runs import compose_config, run_settings

    with pytest.raises(ConfigError) as refused:
        run_settings(compose_config(["trainer=cpu", "model=bert_tiny", override], tmp_path / "run"))
    assert message in str(refused.value)
    assert not (tmp_path / "run").exists()


def test_the_settings_leave_the_vocabulary_to_the_tokenizer(tmp_path):
    from types import SimpleNamespace

    from helpers.runs import compose_config, run_settings

    from lightbert.run.building import with_vocabulary

    model = run_settings(compose_config(["trainer=cpu", "model=bert_tiny"], tmp_path / "run")).model
    assert isinstance(model, BertConfig) and (model.hidden_size, model.vocab_size) == (128, None)
    with pytest.raises(ValueError, match="vocab_size is not set"):
        BertModel(model)
    tokenizer = SimpleNamespace(vocab_size=300, pad_id=0)
    built = with_vocabulary(model, tokenizer, None)
    assert (built["vocab_size"], built["pad_token_id"], built["hidden_size"]) == (300, 0, 128)
    assert BertModel(BertConfig.from_dict(built)).state_dict()["embeddings.word_embeddings.weight"].shape[0] == 300


def test_a_runs_settings_are_built_before_torch_loads(tmp_path):
    """A refused command is refused before torch's seconds of import: the settings and their typed configs are
    torch-free."""
    import subprocess
    import sys

    from helpers.runs import REPO

    probe = (
        "import sys; from lightbert.run.configs import compose_config; "
        "from lightbert.run.config_checks import checked_config; from lightbert.run.settings import RunSettings; "
        f"cfg = compose_config(['trainer=cpu', 'model=bert_tiny'], {str(tmp_path / 'run')!r}); "
        "settings = RunSettings.from_config(checked_config(cfg)); "
        "print(type(settings.model).__name__, type(settings.optim).__name__, 'torch' in sys.modules)"
    )
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True)
    assert shown.stdout.split() == ["BertConfig", "OptimConfig", "False"], shown.stderr[-2000:]
