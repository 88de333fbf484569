import dataclasses
import typing
from pathlib import Path

import pytest

from attnkit import config as config_module
from attnkit.config import (
    RULE,
    DataConfig,
    ExperimentConfig,
    SearchConfig,
    TokenizerConfig,
    TrainConfig,
    apply_overrides,
    drop_legacy_keys,
    from_dict,
    load_config,
    save_config,
    to_dict,
)
from attnkit.errors import UserError

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "tasks" / "configs").glob("*.yaml"))


def _sections(cls=ExperimentConfig):
    yield cls
    for name, kind in typing.get_type_hints(cls).items():
        if dataclasses.is_dataclass(kind):
            yield from _sections(kind)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_recipe_loads(path):
    config = load_config(path)
    assert config.name == path.stem


def flattened(section: dict, prefix: str = "") -> dict:
    """A config's dict as dotted keys, ``train.lr`` and the like."""
    keys = {}
    for key, value in section.items():
        if isinstance(value, dict):
            keys.update(flattened(value, f"{prefix}{key}."))
        else:
            keys[f"{prefix}{key}"] = value
    return keys


TRANSLATION_SCHEDULE = {"train.batch_tokens", "train.epochs", "train.lr", "train.warmup_steps", "train.patience", "train.max_minutes"}


@pytest.mark.parametrize(
    "recipe, precision, schedule",
    [
        ("multi30k_de_en_transformer", "bf16", TRANSLATION_SCHEDULE | {"train.decay_epochs"}),  # the GPU variant was measured without the decay
        ("multi30k_de_en_subword", "auto", TRANSLATION_SCHEDULE),
        # the fine-tuned backbone blocks' rate follows the decoder's by the same rule
        ("flickr8k", "auto", {"train.batch_tokens", "train.epochs", "train.lr", "train.warmup_steps", "image_encoder.backbone_lr"}),
    ],
)
def test_the_gpu_recipes_are_the_cpu_recipes_with_gpu_batches(recipe, precision, schedule):
    """A *_gpu.yaml changes the training schedule only (batches by tokens, the learning rates by the square-root rule,
    warm-up, epochs): the model, data and search stay the CPU recipe's, so its scores compare with the CPU recipe's."""
    folder = CONFIGS[0].parent
    cpu, gpu = (flattened(to_dict(load_config(folder / f"{recipe}{suffix}.yaml"))) for suffix in ("", "_gpu"))
    assert {key for key in cpu if cpu[key] != gpu[key]} - {"name"} == schedule
    assert gpu["train.batch_tokens"] > 0 and gpu["train.precision"] == precision
    assert gpu["train.lr"] > cpu["train.lr"]  # larger batches, a larger rate


def test_unknown_key_names_it_and_lists_the_valid_keys(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("decoder:\n  hiden_size: 5\n")
    with pytest.raises(UserError) as error:
        load_config(path)
    assert "decoder.hiden_size" in str(error.value) and "hidden_size" in str(error.value)


def test_keys_that_are_not_strings_are_unknown_keys(tmp_path):
    path = tmp_path / "numbers.yaml"
    path.write_text("decoder: {1: 2, ~: 3, hiden: 4}\n")
    with pytest.raises(UserError, match=r"unknown config keys decoder\.1, decoder\.None, decoder\.hiden"):
        load_config(path)


def test_overrides_are_typed_and_nested():
    config = load_config(None, ["decoder.hidden_size=64", "train.lr=1e-4", "decoder.style=bahdanau", "train.epochs=3"])
    assert config.decoder.hidden_size == 64 and config.train.lr == 1e-4 and config.decoder.style == "bahdanau"
    with pytest.raises(UserError, match="must be int"):
        load_config(None, ["decoder.hidden_size=big"])
    with pytest.raises(UserError, match="must be int"):
        load_config(None, ["train.epochs=true"])
    with pytest.raises(UserError, match="unknown config key"):
        load_config(None, ["decoder.colour=red"])
    for bad in ("decoder.hidden_size", "=4", "decoder..size=3", ".x=1"):
        with pytest.raises(UserError, match="section.key=value"):
            load_config(None, [bad])
    with pytest.raises(UserError, match="must be int, got {'x': 1}"):
        load_config(None, ["decoder.hidden_size.x=1"])
    with pytest.raises(UserError, match="hidden_size is not a section"):
        load_config(None, ["decoder.hidden_size=5", "decoder.hidden_size.x=1"])


@pytest.mark.parametrize("value", ["[1,", "{a: 1", "'unterminated", "a: b: c", "@x"])
def test_an_override_that_is_not_yaml_is_a_user_error(value):
    with pytest.raises(UserError, match="not valid YAML") as error:
        load_config(None, [f"train.lr={value}"])
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.batch_size=0", "config key train.batch_size must be at least 1, got 0"),
        ("train.log_every=0", "train.log_every must be at least 1"),
        ("train.valid_beam_size=-2", "train.valid_beam_size must be at least 1"),
        ("train.epochs=-1", "train.epochs must be at least 1"),
        ("train.epochs=0", "train.epochs must be at least 1"),
        ("decoder.hidden_size=-3", "decoder.hidden_size must be at least 1"),
        ("decoder.embedding_size=0", "decoder.embedding_size must be at least 1"),
        ("decoder.attention_size=0", "decoder.attention_size must be at least 1"),
        ("decoder.num_layers=0", "decoder.num_layers must be at least 1"),
        ("decoder.readout_size=-1", "decoder.readout_size must be at least 0"),
        ("text_encoder.hidden_size=-3", "text_encoder.hidden_size must be at least 1"),
        ("text_encoder.num_layers=0", "text_encoder.num_layers must be at least 1"),
        ("train.lr=-1", "train.lr must be greater than 0, got -1.0"),
        ("train.lr=0", "train.lr must be greater than 0"),
        ("train.lr=.nan", "train.lr must be a finite number"),
        ("train.max_minutes=.inf", "train.max_minutes must be a finite number"),
        ("decoder.dropout=1.5", r"decoder.dropout must be in \[0, 1\), got 1.5"),
        ("decoder.dropout=1", r"decoder.dropout must be in \[0, 1\)"),
        ("text_encoder.dropout=-0.1", "text_encoder.dropout must be in"),
        ("image_encoder.dropout=1.0", "image_encoder.dropout must be in"),
        ("train.teacher_forcing=1.01", r"train.teacher_forcing must be in \[0, 1\]"),
        ("train.caption_share=-0.5", r"train.caption_share must be in \[0, 1\]"),
        ("train.label_smoothing=1", r"train.label_smoothing must be in \[0, 1\)"),
        ("train.lr_factor=1", r"train.lr_factor must be in \(0, 1\)"),
        ("train.lr_factor=0", r"train.lr_factor must be in \(0, 1\)"),
        ("train.weight_decay=-1e-4", "train.weight_decay must be at least 0"),
        ("train.clip_norm=-1", "train.clip_norm must be at least 0"),
        ("train.min_lr=-1", "train.min_lr must be at least 0"),
        ("train.patience=-1", "train.patience must be at least 0"),
        ("train.lr_patience=-1", "train.lr_patience must be at least 0"),
        ("train.attention_regularization=-1", "train.attention_regularization must be at least 0"),
        ("train.valid_max_examples=-1", "train.valid_max_examples must be at least 0"),
        ("train.num_workers=-1", "train.num_workers must be at least 0"),
        ("train.threads=-2", "train.threads must be at least 0"),
        ("train.seed=-1", "train.seed must be in"),
        ("train.seed=99999999999999999999", "train.seed must be in"),
        ("train.device=tpu", "train.device must be auto, cpu, cuda or cuda:N, got 'tpu'"),
        ("train.device=cuda:x", "train.device must be"),
        ("train.precision=fp8", "config key train.precision: unknown precision 'fp8'; choose one of auto, fp32, bf16, fp16"),
        ("decoder.rnn=rnn", "decoder.rnn: unknown decoder RNN 'rnn'; choose one of gru, lstm"),
        ("decoder.style=transformer", "decoder.style: unknown decoder style 'transformer'; choose one of luong, bahdanau"),
        ("decoder.score=cosine", "decoder.score: unknown attention score 'cosine'; choose one of dot, general, concat, additive, scaled_dot, none"),
        ("decoder.init=random", "decoder.init: unknown decoder init 'random'; choose one of bridge, zeros"),
        ("text_encoder.rnn=transformer", "text_encoder.rnn: unknown text encoder RNN 'transformer'; choose one of gru, lstm, none"),
        ("data.tokenizer.kind=bpe", "data.tokenizer.kind: unknown tokenizer kind 'bpe'; choose one of moses, nltk, space"),
        ("image_encoder.backbone=vgg16", "image_encoder.backbone: unknown image backbone 'vgg16'"),
        ("image_encoder.grid_size=-1", "image_encoder.grid_size must be at least 0"),
        ("image_encoder.image_size=0", "image_encoder.image_size must be at least 32"),
        ("image_encoder.image_size=1", "image_encoder.image_size must be at least 32, got 1"),
        ("image_encoder.memory_size=-1", "image_encoder.memory_size must be at least 0"),
        ("image_encoder.blocks=-1", "image_encoder.blocks must be at least 0"),
        ("image_encoder.trainable_blocks=-1", "image_encoder.trainable_blocks must be at least 0"),
        ("image_encoder.backbone_lr=-1", "image_encoder.backbone_lr must be at least 0"),
        ("image_encoder.weights=", "image_encoder.weights must be a non-empty string"),
        ("image_encoder.weights_sha256=abc", "image_encoder.weights_sha256 must be empty, none or a SHA-256 hex digest"),
        ("data.min_freq=0", "data.min_freq must be at least 1"),
        ("data.max_vocab=-1", "data.max_vocab must be at least 0"),
        ("data.max_source_length=0", "data.max_source_length must be at least 1"),
        ("data.max_target_length=-5", "data.max_target_length must be at least 1"),
        ("data.path=", "data.path must be a non-empty string"),
        ("search.beam_size=0", "search.beam_size must be at least 1"),
        ("search.length_penalty=-1", "search.length_penalty must be at least 0"),
        ("search.max_length_ratio=-1", "search.max_length_ratio must be at least 0"),
        ("search.max_length_offset=-1", "search.max_length_offset must be at least 0"),
        ("task=summarisation", "config key task: unknown task 'summarisation'; choose one of translation, captioning, multitask, pretrain"),
        ("name=", "config key name must be a non-empty string"),
    ],
)
def test_out_of_range_values_name_their_key(override, message):
    with pytest.raises(UserError, match=message):
        load_config(None, [override])


@pytest.mark.parametrize("normaliser", ["entmax15", "sparsemax"])
def test_a_sparse_normaliser_without_attention_is_refused_in_one_message(normaliser):
    with pytest.raises(UserError, match=rf"^config key decoder.normaliser: {normaliser} normalises attention scores, and decoder.score=none has none "):
        load_config(None, ["decoder.score=none", f"decoder.normaliser={normaliser}"])
    assert load_config(None, ["decoder.score=none"]).decoder.normaliser == "softmax"  # the default stays valid
    assert load_config(None, [f"decoder.normaliser={normaliser}"]).decoder.score == "general"


def test_zero_stays_valid_where_it_means_off_or_auto():
    overrides = [
        "train.patience=0", "train.clip_norm=0", "train.max_minutes=0", "train.threads=0", "train.num_workers=0",
        "train.valid_max_examples=0", "train.lr_patience=0", "train.label_smoothing=0", "train.weight_decay=0", "train.min_lr=0",
        "train.teacher_forcing=0", "train.caption_share=1", "train.seed=0", "train.device=cuda:1", "train.precision=bf16",
        "image_encoder.grid_size=0", "image_encoder.memory_size=0", "image_encoder.blocks=0", "image_encoder.backbone_lr=0",
        "image_encoder.weights_sha256=none", f"image_encoder.weights_sha256={'ab' * 32}", "image_encoder.backbone=local_cnn",
        "decoder.readout_size=0", "decoder.dropout=0", "decoder.score=none", "text_encoder.rnn=none", "data.max_vocab=0",
        "data.feature_cache=", "search.max_length_ratio=0", "search.length_penalty=0", "output_dir=",
    ]  # fmt: skip
    config = load_config(None, overrides)
    assert config.train.patience == 0 and config.image_encoder.grid_size == 0 and config.decoder.score == "none"
    assert load_config(None, ["search.max_length_offset=0"]).search.max_length_offset == 0  # with the default ratio


@pytest.mark.parametrize("ratio, offset", [(0, 0), (0.5, 0)])
def test_an_output_length_limit_that_allows_no_word_is_refused(ratio, offset):
    """ratio x source length + offset below 1 for a one-word source: search would clamp every such output to one word."""
    with pytest.raises(UserError, match="search.max_length_ratio and search.max_length_offset: .* allows no word for a one-word source"):
        load_config(None, [f"search.max_length_ratio={ratio}", f"search.max_length_offset={offset}"])
    assert load_config(None, ["search.max_length_ratio=1", "search.max_length_offset=0"]).search.max_length_ratio == 1
    assert load_config(None, ["search.max_length_ratio=0", "search.max_length_offset=1"]).search.max_length_offset == 1


def test_every_number_and_choice_declares_its_rule():
    """A new numeric field must say its range where it is declared (``checked(default, rule)``)."""
    for cls in _sections():
        hints = typing.get_type_hints(cls)
        for item in dataclasses.fields(cls):
            if hints[item.name] in (int, float):
                assert RULE in item.metadata, f"{cls.__name__}.{item.name} has no rule"


def test_every_default_is_valid_and_direct_construction_is_checked():
    assert from_dict(ExperimentConfig, {}) == ExperimentConfig()
    with pytest.raises(UserError, match="config key train.batch_size must be at least 1, got 0"):
        TrainConfig(batch_size=0)
    with pytest.raises(UserError, match="data.tokenizer.kind: unknown tokenizer kind 'bpe'"):
        DataConfig(tokenizer=TokenizerConfig(kind="bpe"))
    with pytest.raises(UserError, match="search.beam_size must be int"):
        SearchConfig(beam_size="5")
    with pytest.raises(UserError, match="train.epochs"):
        dataclasses.replace(TrainConfig(), epochs=-1)


def test_each_choice_list_is_the_one_beside_the_code_and_errors_list_it():
    from attnkit import attention, cells, decoders, model, pretraining, translation
    from attnkit.decoders import rnn
    from attnkit.captioning import TASK as CAPTIONING
    from attnkit.encoders import image, text
    from attnkit.vocab import Tokenizer

    lists = {
        "decoder.score": attention.SCORE_FUNCTIONS,
        "decoder.family": decoders.FAMILIES,
        "decoder.style": rnn.STYLES,
        "decoder.init": rnn.INITS,
        "decoder.rnn": cells.CELLS,
        "text_encoder.rnn": text.RNNS,
        "image_encoder.backbone": image.BACKBONES,
    }
    for key, names in lists.items():
        assert load_config(None, [f"{key}={next(iter(names))}"])  # every listed name is valid ...
        with pytest.raises(UserError, match=f"config key {key}: unknown .* 'nonsense'; choose one of {', '.join(names)}$"):
            load_config(None, [f"{key}=nonsense"])  # ... and the message lists exactly that list
    assert attention.SCORES == tuple(name for name in attention.SCORE_FUNCTIONS if name != attention.NO_ATTENTION)
    assert text.RNNS == (*cells.CELLS, text.NO_RNN)
    assert config_module.TOKENIZERS == Tokenizer.KINDS
    assert set(config_module.TASKS) == {translation.TASK, CAPTIONING, model.MULTITASK, pretraining.TASK}


def test_n_best_is_gone_and_an_old_stored_config_still_reads():
    assert "n_best" not in {f.name for f in dataclasses.fields(SearchConfig)}
    with pytest.raises(UserError, match="search.n_best was removed.*--n-best"):
        load_config(None, ["search.n_best=3"])
    old = to_dict(ExperimentConfig())
    old["search"]["n_best"] = 1
    cleaned = drop_legacy_keys(old)
    assert from_dict(ExperimentConfig, cleaned) == ExperimentConfig()
    assert old["search"]["n_best"] == 1, "the caller's dict is left as it was"
    assert drop_legacy_keys({"search": 5}) == {"search": 5} and drop_legacy_keys({}) == {}


def test_round_trip_through_yaml_and_dict(tmp_path):
    config = load_config(None, ["decoder.score=additive", "data.tokenizer.kind=nltk"])
    save_config(config, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == config
    assert from_dict(ExperimentConfig, to_dict(config)) == config
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"], "no temporary file is left behind"


def test_a_failed_config_write_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    save_config(ExperimentConfig(name="before"), path)
    before = path.read_bytes()

    def crash(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", crash)
    with pytest.raises(OSError):
        save_config(ExperimentConfig(name="after"), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_missing_or_broken_config_file(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "broken.yaml").write_text("decoder: [1, 2\n")
    with pytest.raises(UserError, match="not valid YAML") as error:
        load_config(tmp_path / "broken.yaml")
    assert "\n" not in str(error.value)
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(UserError, match="must hold a mapping"):
        load_config(tmp_path / "list.yaml")
    (tmp_path / "section.yaml").write_text("decoder: 5\n")
    with pytest.raises(UserError, match="config section 'decoder' must be a mapping"):
        load_config(tmp_path / "section.yaml")



@pytest.mark.parametrize(
    "text, message",
    [
        ("", "holds no settings"),
        ("# only a comment\n", "holds no settings"),
        ("[]\n", "must hold a mapping of sections, not list"),
        ("0\n", "must hold a mapping of sections, not int"),
        ("false\n", "must hold a mapping of sections, not bool"),
        ("train: {lr: 0.005, epochs: 2}\ndecoder: {hidden_size: 32}\ntrain: {batch_size: 16}\n", "the key 'train' is given twice at line 3"),
        ("train:\n  epochs: 2\n  epochs: 3\n", "the key 'epochs' is given twice at line 3"),
        ("name: x\n? [1, 2]\n: 3\n", "found unhashable key at line 2"),
        ("name: a\n---\nname: b\n", "expected a single document in the stream, but found another document at line 2"),
    ],
)
def test_a_config_file_that_would_train_other_settings_than_it_shows_is_refused(tmp_path, text, message):
    """A falsy file (empty, [], 0) trained the defaults for 20 epochs; a key given twice was merged, the last one
    winning, so a second train: section dropped the first one whole."""
    (tmp_path / "recipe.yaml").write_text(text)
    with pytest.raises(UserError, match=message):
        load_config(tmp_path / "recipe.yaml")


def test_plain_values_are_read_as_yaml_1_2_reads_them(tmp_path):
    """YAML 1.1 read 010 as octal 8, 1:04 as 64 and no/yes/on/off as booleans (Norwegian's code, no, was False)."""
    config = load_config(None, ["train.epochs=010", "train.seed=0123", "train.batch_size=1_000", "train.lr=1e-3", "train.keep_epochs=0x10", "data.source_lang=no", "data.target_lang=on", "name=1:04"])
    assert (config.train.epochs, config.train.seed, config.train.batch_size, config.train.lr, config.train.keep_epochs) == (10, 123, 1000, 0.001, 16)
    assert (config.data.source_lang, config.data.target_lang, config.name) == ("no", "on", "1:04")
    (tmp_path / "recipe.yaml").write_text("name: 2026-12-01\ntrain: {compile: true, tensorboard: False, max_minutes: .5}\n")
    config = load_config(tmp_path / "recipe.yaml")
    assert (config.name, config.train.compile, config.train.tensorboard, config.train.max_minutes) == ("2026-12-01", True, False, 0.5)
    with pytest.raises(UserError, match="train.compile must be bool, got 'yes'"):
        load_config(None, ["train.compile=yes"])
    (tmp_path / "merged.yaml").write_text("train:\n  <<: {epochs: 3, lr: 0.5}\n  lr: 0.25\n")  # a merge's keys may be overridden
    assert (load_config(tmp_path / "merged.yaml").train.epochs, load_config(tmp_path / "merged.yaml").train.lr) == (3, 0.25)



@pytest.mark.parametrize("name", ["1e5", "-.5", "+.5", ".1e3", "0o17", "0x1F", "010", "no", "on", "1:04", "2026-12-01", "true", "~", "1_000"])
def test_a_saved_config_reads_back_whatever_its_text_looks_like(tmp_path, name):
    """config.yaml is written by a dumper that quotes what either YAML 1.1 or this reader takes for a number or a
    boolean: PyYAML's own wrote name: 1e5 unquoted, which read back as 100000.0, and the run folder's config broke."""
    config = load_config(CONFIGS[0], [f"name='{name}'"])
    save_config(config, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == config and config.name == name


@pytest.mark.parametrize("override", ["train.lr=0o_", "train.lr=._", "train.lr=-._", "train.lr=0x_", "train.lr={[1]: 2}", "train.epochs=" + "9" * 5000, "train.lr=1" + "0" * 400])
def test_malformed_or_endless_numbers_are_one_message(override):
    with pytest.raises(UserError):
        load_config(None, [override])

@pytest.mark.parametrize("override", ["name='a\\0b'", "output_dir='runs/\\0'", "data.source_lang='d\\0e'"])
def test_a_nul_character_in_a_name_or_path_is_refused_by_its_key(override):
    """YAML's "\\0" escape made a NUL, which reached mkdir as ValueError's traceback."""
    with pytest.raises(UserError, match=r"config key (name|output_dir|data.source_lang) holds a NUL character"):
        load_config(None, [override.replace("'", '"')])


def test_a_number_no_tensor_could_hold_is_refused_by_its_key():
    with pytest.raises(UserError, match="config key decoder.hidden_size is too large: 99999999999999999999"):
        load_config(None, ["decoder.hidden_size=99999999999999999999"])

def test_unreadable_config_files_are_user_errors(tmp_path, monkeypatch):
    (tmp_path / "latin1.yaml").write_bytes("task: translation\nname: caf\xe9\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"not UTF-8 text \(line 2 is not\)"):
        load_config(tmp_path / "latin1.yaml")
    (tmp_path / "folder.yaml").mkdir()
    with pytest.raises(UserError, match="is a directory"):
        load_config(tmp_path / "folder.yaml")
    (tmp_path / "locked.yaml").write_text("name: x\n")

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", denied)  # chmod does not stop root, which tests may run as
    with pytest.raises(UserError, match="cannot read config file .*locked.yaml: Permission denied"):
        load_config(tmp_path / "locked.yaml")


def test_overrides_apply_to_a_stored_dict_in_place():
    values = {"train": {"epochs": 2}}
    assert apply_overrides(values, ["train.epochs=5", "search.beam_size=2"]) is values
    assert values == {"train": {"epochs": 5}, "search": {"beam_size": 2}}


def test_training_mosaics_are_a_share_of_photos_and_refuse_gold_attention():
    for task in ("captioning", "multitask"):
        assert load_config(None, [f"task={task}", "data.mosaic_share=0.25"]).data.mosaic_share == 0.25
    with pytest.raises(UserError, match="data.mosaic_share"):
        load_config(None, ["task=captioning", "data.mosaic_share=1.5"])
    with pytest.raises(UserError, match="data.mosaic_share cannot go with train.attention_supervision"):
        load_config(None, ["task=captioning", "data.mosaic_share=0.5", "train.attention_supervision=1"])
    with pytest.raises(UserError, match="config key data.mosaic_share: mosaics are made of training photos .*task translation has none"):
        load_config(None, ["data.mosaic_share=0.5"])  # translation, the default task
    assert load_config(None, ["data.mosaic_share=0"]).task == "translation"


def test_model_differences_name_what_defines_a_model_and_nothing_else():
    saved = to_dict(load_config(None, ["data.source_lang=fr", "image_encoder.weights_sha256=none"]))
    asked = to_dict(
        load_config(
            None,
            [
                "decoder.heads=2", "image_encoder.image_size=64", "data.tokenizer.lowercase=false", "task=captioning",
                # what may change: training's length, pace and budget, the device, the data's place, decoding, regularisation
                "train.epochs=40", "train.max_minutes=5", "train.patience=9", "train.lr=0.1", "train.device=cpu", "train.precision=fp32",
                "train.threads=1", "train.num_workers=2", "train.log_every=5", "train.keep_epochs=3", "data.path=elsewhere",
                "data.feature_cache=", "output_dir=runs/x", "name=other", "search.beam_size=2", "decoder.dropout=0.3",
                "image_encoder.backbone_lr=0.01", "image_encoder.weights=none", "decoder.attention_head=1",
                "data.source_lang=", "image_encoder.weights_sha256=",  # empty: filled in by training, not a change
            ],
        )
    )  # fmt: skip
    assert config_module.model_differences(saved, asked) == [
        "task 'translation' vs 'captioning'", "data.tokenizer.lowercase True vs False", "image_encoder.image_size 224 vs 64",
    ], "decoder.heads differs too, but the rnn decoder family of both reads none"  # fmt: skip
    assert config_module.model_differences(saved, saved) == []
    assert config_module.model_differences(saved, to_dict(load_config(None, ["data.source_lang=de"]))) == ["data.source_lang 'fr' vs 'de'"]
    transformer = ["decoder.family=transformer", "decoder.embedding_size=512", "decoder.hidden_size=512"]
    assert config_module.model_differences(to_dict(load_config(None, transformer)), to_dict(load_config(None, [*transformer, "decoder.heads=2"]))) == ["decoder.heads 8 vs 2"]
    # a key that only one of the two models reads counts: the rnn decoder reads decoder.rnn
    assert config_module.model_differences(to_dict(load_config(None, transformer)), to_dict(load_config(None, ["decoder.rnn=lstm"]))) == [
        "decoder.family 'transformer' vs 'rnn'", "decoder.embedding_size 512 vs 256", "decoder.rnn 'gru' vs 'lstm'",
    ]  # fmt: skip
    # neither Transformer reads decoder.rnn or decoder.score: a checkpoint saved with other values of them is the same model
    assert config_module.model_differences(to_dict(load_config(None, transformer)), to_dict(load_config(None, [*transformer, "decoder.rnn=lstm", "decoder.score=scaled_dot"]))) == []


# -- the keys a model does not read ------------------------------------------------------------------------
# One small config per branch of unread_keys: each family of each part, the absent parts of each task.
UNREAD_CASES = {
    "rnn translator, general score": ["text_encoder.hidden_size=5", "decoder.hidden_size=10", "decoder.attention_size=7"],
    "word-only encoder, dot score, tied": ["text_encoder.rnn=none", "text_encoder.embedding_size=6", "decoder.hidden_size=6", "decoder.embedding_size=6", "decoder.score=dot", "decoder.tie_embeddings=true"],
    "transformer translator": ["text_encoder.family=transformer", "text_encoder.embedding_size=8", "text_encoder.hidden_size=8", "text_encoder.heads=2", "text_encoder.feedforward_size=12", "decoder.family=transformer", "decoder.embedding_size=8", "decoder.hidden_size=8", "decoder.heads=2", "decoder.feedforward_size=12"],
    "captioner, additive score": ["task=captioning", "image_encoder.backbone=local_cnn", "image_encoder.weights=none", "image_encoder.image_size=32", "image_encoder.grid_size=2", "image_encoder.memory_size=6", "decoder.hidden_size=6", "decoder.score=additive", "decoder.style=bahdanau", "data.tokenizer.kind=space"],
    "masked-LM pre-training": ["task=pretrain", "text_encoder.family=transformer", "text_encoder.embedding_size=8", "text_encoder.hidden_size=8", "text_encoder.heads=2", "text_encoder.feedforward_size=12"],
}


def _built(config: ExperimentConfig):
    """The network ``config`` builds, from seed 0, and its output on one fixed batch (eval mode: no dropout)."""
    import torch

    from attnkit.interfaces import PaddedTokens, Pixels
    from attnkit.model import build_captioning_model, build_translation_model
    from attnkit.pretraining import MaskedLanguageModel
    from attnkit.vocab import Vocabulary

    vocab = Vocabulary.build([["w%d" % i for i in range(7)]])
    torch.manual_seed(0)
    ids, target = torch.tensor([[4, 5, 6, 7], [8, 9, 10, 0]]), torch.tensor([[1, 4, 5], [1, 6, 0]])
    text = PaddedTokens(ids, torch.tensor([4, 3]))
    with torch.no_grad():
        if config.task == "pretrain":
            model = MaskedLanguageModel.build(config, vocab).eval()
            return model, model.encoder(text).memory
        if config.task == "captioning":
            model = build_captioning_model(config, vocab).eval()
            source = Pixels(torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)))
        else:
            model = build_translation_model(config, vocab, vocab).eval()
            source = text
        return model, model.decoder(model.encode(source), target, 1.0, True).logits


def _other_values(config: ExperimentConfig, key: str) -> list:
    """Other values of dotted ``key`` to try: the other choices of a choice, the other boolean, numbers near it."""
    *sections, name = key.split(".")
    section = config
    for part in sections:
        section = getattr(section, part)
    value, rule = getattr(section, name), next(f for f in dataclasses.fields(section) if f.name == name).metadata.get(RULE)
    if isinstance(value, bool):
        return [not value]
    if rule is not None and rule.choices is not None:
        return [choice for choice in rule.choices() if choice != value]
    if isinstance(value, (int, float)):
        return [value + 1, value * 2 + 1, 1, 2, value / 2 + 0.25]  # the last for a share or a dropout
    return [value + "x", "none", "0" * 64]  # any text; the rules of weights and weights_sha256


@pytest.mark.parametrize("case", UNREAD_CASES, ids=list(UNREAD_CASES))
def test_every_key_marked_not_read_can_change_without_changing_the_model(case):
    """What config.yaml marks "not read" is checked, not assumed: each such key (each key of a section marked as
    absent) changed to every other value the config accepts builds the very same network, to the weights (same
    seed) and its output on a batch."""
    base = load_config(None, UNREAD_CASES[case])
    unread = config_module.unread_keys(base)
    assert unread, "each case has keys its model does not read"
    model, output = _built(base)
    keys = list(config_module.unread_given(base, flattened(to_dict(base))))
    for key in keys:
        tried = 0
        for value in _other_values(base, key):
            try:
                changed = load_config(None, [*UNREAD_CASES[case], f"{key}={value}"])
            except UserError:
                continue  # a value the config refuses can never take effect
            other_model, other_output = _built(changed)
            first, second = model.state_dict(), other_model.state_dict()
            assert list(first) == list(second) and all(first[name].equal(second[name]) for name in first), f"{key}={value} changed the weights"
            assert output.equal(other_output), f"{key}={value} changed the output"
            tried += 1
        # a key of an absent section may be refused outright (text_encoder.init_from belongs to translation); a key
        # marked by name must have been tried, or the test proves nothing for it
        assert tried or key not in unread, f"no other value of {key} was accepted"


def test_a_key_the_model_reads_is_never_marked_not_read():
    """The check above can fail: a key the model does read, changed, changes the model."""
    base = load_config(None, UNREAD_CASES["rnn translator, general score"])
    assert "decoder.attention_size" not in config_module.unread_keys(load_config(None, ["decoder.score=additive"]))
    _, output = _built(base)
    _, other = _built(load_config(None, [*UNREAD_CASES["rnn translator, general score"], "decoder.rnn=lstm"]))
    assert output.shape == other.shape and not output.equal(other)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_a_saved_recipe_marks_what_its_model_does_not_read_and_reads_back_the_same(path, tmp_path):
    config = load_config(path)
    save_config(config, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert load_config(tmp_path / "config.yaml") == config
    flat = flattened(to_dict(config))
    marked = config_module.unread_keys(config)
    assert text.count("# not read: ") == len(marked) > 0
    assert all(key in flat or any(name.startswith(key + ".") for name in flat) for key in marked), "each marked key is a key of the config"
    if config.decoder.family == "transformer":
        assert "  rnn: gru  # not read: the transformer decoder family has no RNN cell\n" in text


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_no_recipe_sets_a_key_its_model_does_not_read(path):
    """A recipe that sets ``decoder.score`` under a Transformer decoder seems to choose something and chooses nothing."""
    assert config_module.unread_given(load_config(path), config_module.recipe_keys(config_module.read_recipe(path))) == {}


def test_a_comment_that_would_change_what_the_file_reads_is_left_out(tmp_path, monkeypatch):
    """A comment after the first line of a value YAML writes over several lines would cut it: such a file is written
    without comments (no key marked today has such a value; the rule is there for the day one does)."""
    config = load_config(None, ["output_dir=" + "a b " * 40])
    monkeypatch.setattr(config_module, "unread_keys", lambda _: {"output_dir": "long", "decoder.heads": "short"})
    save_config(config, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert load_config(tmp_path / "config.yaml") == config and "# not read" not in text and text.count("\n") > 60
