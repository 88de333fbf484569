"""The feature cache: a hit returns what was computed; another backbone, grid or weights file misses."""

import os

import pytest
import torch
from PIL import Image

from attnkit.config import ImageEncoderConfig
from attnkit.data.features import FeatureCache, encoder_identity
from attnkit.encoders.image import ImageEncoder
from attnkit.errors import UserError
from attnkit.files import file_digest


def _photos(folder, count=3):
    paths = []
    for i in range(count):
        path = folder / f"p{i}.png"
        Image.new("RGB", (40, 30), (40 * i, 90, 200 - 40 * i)).save(path)
        paths.append(path)
    return paths


def _encoder(weights, **changes):
    settings = dict(backbone="resnet18", weights=str(weights), image_size=64, grid_size=2, memory_size=8)
    settings.update(changes)
    return ImageEncoder(ImageEncoderConfig(**settings)).eval()


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    import torchvision

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("weights") / "resnet18.pth"
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), path)
    return path


def test_hits_return_the_computed_features_and_changes_invalidate(tmp_path, weights):
    photos = _photos(tmp_path)
    encoder = _encoder(weights)
    cache = FeatureCache(tmp_path / "cache", encoder_identity(encoder))
    first = cache.get(photos, encoder.grid_features)
    assert first.shape == (3, 512, 2, 2) and first.dtype == torch.float16
    assert (cache.stats.hits, cache.stats.misses) == (0, 3)

    again = FeatureCache(tmp_path / "cache", encoder_identity(encoder))
    assert torch.equal(again.get(photos, encoder.grid_features), first)
    assert (again.stats.hits, again.stats.misses) == (3, 0)

    # Another grid, another weights file, an edited image: misses, never the stale features.
    other_grid = FeatureCache(tmp_path / "cache", encoder_identity(_encoder(weights, grid_size=1)))
    assert other_grid.get(photos[:1], _encoder(weights, grid_size=1).grid_features).shape == (1, 512, 1, 1)
    assert other_grid.stats.misses == 1
    changed = tmp_path / "changed.pth"
    state = torch.load(weights, weights_only=True)
    state["fc.bias"] += 1
    torch.save(state, changed)
    assert FeatureCache(tmp_path / "cache", encoder_identity(_encoder(changed))).folder != again.folder
    cut = _encoder(weights, blocks=3)  # stem and the first two residual blocks: 64 channels
    assert FeatureCache(tmp_path / "cache", encoder_identity(cut)).folder != again.folder
    assert cut.grid_features(torch.zeros(1, 3, 64, 64)).shape == (1, 64, 2, 2)
    Image.new("RGB", (40, 30), (0, 0, 0)).save(photos[0])
    os.utime(photos[0], ns=(1, 1))
    edited = FeatureCache(tmp_path / "cache", encoder_identity(encoder))
    edited.get(photos, encoder.grid_features)
    assert (edited.stats.hits, edited.stats.misses) == (2, 1)


def test_an_image_is_known_by_its_bytes_not_its_path_or_time(tmp_path, weights):
    """The demo writes its generated scenes anew each run: the same bytes, a new modification time, must hit."""
    import shutil

    photos = _photos(tmp_path)
    encoder = _encoder(weights)
    first = FeatureCache(tmp_path / "cache", encoder_identity(encoder)).get(photos, encoder.grid_features)
    for photo in photos:  # written again, identically
        photo.write_bytes(photo.read_bytes())
        os.utime(photo, ns=(10**18, 10**18))
    copied = shutil.copy(photos[0], tmp_path / "elsewhere.png")
    again = FeatureCache(tmp_path / "cache", encoder_identity(encoder))
    assert torch.equal(again.get([*photos, copied], encoder.grid_features), torch.cat([first, first[:1]]))
    assert (again.stats.hits, again.stats.misses) == (4, 0)


def test_cached_features_give_the_encoder_output_of_the_pixels(tmp_path, weights):
    from attnkit.data.images import load_image
    from attnkit.interfaces import GridFeatures, Pixels

    photos = _photos(tmp_path, 2)
    encoder = _encoder(weights)
    cache = FeatureCache(tmp_path / "cache", encoder_identity(encoder))
    from_cache = encoder(GridFeatures(cache.get(photos, encoder.grid_features).float()))
    pixels = torch.stack([load_image(p, 64, encoder.normalization) for p in photos])
    direct = encoder(Pixels(pixels))
    assert torch.allclose(from_cache.memory, direct.memory, atol=1e-2, rtol=1e-2)  # float16 storage
    assert from_cache.layout.height == 2 and from_cache.mask.all()


def test_fine_tuning_the_last_blocks_caches_the_frozen_prefix_and_trains_on_it(tmp_path, weights):
    from attnkit.data.images import load_image
    from attnkit.interfaces import GridFeatures, Pixels

    photos = _photos(tmp_path, 2)
    frozen, tuned = _encoder(weights), _encoder(weights, trainable_blocks=2)  # resnet18's last two residual blocks train
    assert tuned.caches and not tuned.is_frozen
    identity = encoder_identity(tuned)
    assert identity["frozen_blocks"] == len(tuned.backbone) - 2 and FeatureCache(tmp_path / "cache", identity).folder != FeatureCache(tmp_path / "cache", encoder_identity(frozen)).folder
    cache = FeatureCache(tmp_path / "cache", identity)
    prefix = cache.get(photos, tuned.cacheable_features)
    assert prefix.shape == (2, 256, 4, 4)  # the map before the last two blocks (stride 16 of 64 px), not the pooled grid
    pixels = torch.stack([load_image(p, 64, tuned.normalization) for p in photos])
    from_cache, direct = tuned(GridFeatures(prefix.float())), tuned(Pixels(pixels))
    assert torch.allclose(from_cache.memory, direct.memory, atol=1e-2, rtol=1e-2) and from_cache.layout.height == 2
    tuned.train()
    tuned(GridFeatures(prefix.float())).memory.sum().backward()  # the cached prefix feeds blocks that learn
    blocks = list(tuned.backbone)
    assert all(p.grad is not None for block in blocks[-2:] for p in block.parameters() if p.requires_grad)
    assert all(p.grad is None for block in blocks[:-2] for p in block.parameters())
    whole = _encoder(weights, trainable_blocks=len(frozen.backbone))
    assert not whole.caches
    with pytest.raises(ValueError, match="need frozen backbone blocks"):
        whole(GridFeatures(prefix.float()))


def test_a_random_backbone_is_not_cached(tmp_path):
    encoder = _encoder("none")
    with pytest.raises(ValueError, match="not cached"):
        FeatureCache(tmp_path, encoder_identity(encoder))


def test_a_full_disk_while_caching_is_an_oserror_the_scripts_report_in_one_line(tmp_path, weights, monkeypatch):
    import errno
    import io

    from attnkit import files

    class FullDisk(io.FileIO):
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    encoder = _encoder(weights)
    cache = FeatureCache(tmp_path / "cache", encoder_identity(encoder))
    monkeypatch.setattr(files, "open", lambda path, mode: FullDisk(path, mode), raising=False)
    with pytest.raises(OSError) as error:
        cache.get(_photos(tmp_path, 1), encoder.grid_features)
    assert error.value.errno == errno.ENOSPC


def test_a_mosaic_is_cached_as_its_pixels_and_photos_keep_their_keys(tmp_path, weights):
    import hashlib

    from attnkit.data.images import MosaicFile, image_tensor, open_mosaic

    photos = _photos(tmp_path, 4)
    encoder = _encoder(weights)
    cache = FeatureCache(tmp_path / "cache", encoder_identity(encoder))
    sheet = MosaicFile(tuple(photos))
    features = cache.get([photos[0], sheet], encoder.grid_features)
    pixels = image_tensor(open_mosaic(photos, 64), 64, encoder.normalization)
    with torch.no_grad():
        expected = encoder.grid_features(pixels[None]).half()[0]
    torch.testing.assert_close(features[1], expected)
    reordered = MosaicFile((photos[1], photos[0], photos[2], photos[3]))  # another arrangement is another image
    cache.get([sheet, reordered], encoder.grid_features)
    assert (cache.stats.hits, cache.stats.misses) == (1, 3)
    # A photo's entry is named by its bytes' digest.
    assert (cache.folder / f"{hashlib.sha256(file_digest(photos[0]).encode()).hexdigest()[:24]}.pt").is_file()


def test_a_recorded_digest_must_name_the_weights_read_and_a_checkpoint_s_network_takes_it(weights):
    """A run's saved config carries its weights' digest; a new run of that config with another weights file must not
    key the cache (or its checkpoint) by the old one. A network built for a checkpoint's weights reads no file."""
    from attnkit.errors import UserError

    digest = file_digest(weights)
    assert _encoder(weights, weights_sha256=digest).weights_digest == digest == _encoder(weights).weights_digest
    with pytest.raises(UserError, match=r"image_encoder.weights_sha256 is abababababab\.\.\., but the weights read \(.*resnet18.pth\) are "):
        _encoder(weights, weights_sha256="ab" * 32).weights_digest
    settings = dict(backbone="resnet18", weights=str(weights), image_size=64, grid_size=2, memory_size=8, weights_sha256="ab" * 32)
    assert ImageEncoder(ImageEncoderConfig(**settings), load_weights=False).weights_digest == "ab" * 32


def test_a_cache_folder_that_is_a_file_is_one_message(tmp_path, weights):
    """data.feature_cache naming a file reached mkdir as NotADirectoryError's traceback."""
    identity = encoder_identity(_encoder(weights))
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match=r"feature cache .*file: cannot keep features in .*file is a file, not a folder"):
        FeatureCache(tmp_path / "file", identity)
    key_folder = FeatureCache(tmp_path / "cache", identity).folder
    (key_folder / "encoder.json").unlink()
    key_folder.rmdir()
    key_folder.write_text("x")  # the encoder's own folder is a file
    with pytest.raises(UserError, match="is a file, not a folder"):
        FeatureCache(tmp_path / "cache", identity)


def test_an_entry_that_loads_but_is_no_feature_grid_of_this_encoder_is_recomputed(tmp_path, weights):
    """Only an entry torch could not load was recomputed: one of another shape reached torch.stack (or a dict, its
    TypeError)."""
    photos, encoder = _photos(tmp_path), _encoder(weights)
    cache = FeatureCache(tmp_path / "cache", encoder_identity(encoder))
    truth = cache.get(photos, encoder.grid_features)
    entries = [cache._entry(photo) for photo in photos]
    torch.save(truth[0, :, :1, :1].clone(), entries[0])  # another grid
    torch.save({"not": "features"}, entries[1])
    again = FeatureCache(tmp_path / "cache", encoder_identity(encoder))
    assert torch.allclose(again.get(photos, encoder.grid_features), truth, atol=1e-2)  # recomputed in another batch
    assert (again.stats.hits, again.stats.misses) == (1, 2)
    torch.save(truth[0, :, :1, :1].clone(), entries[2])  # nothing to compute but two shapes: one is computed to tell
    last = FeatureCache(tmp_path / "cache", encoder_identity(encoder))
    assert torch.allclose(last.get(photos, encoder.grid_features), truth, atol=1e-2)
    assert torch.load(entries[2], weights_only=True).shape == truth[2].shape


def test_a_cache_that_may_only_be_read_still_serves_and_computes_the_rest(tmp_path, weights, monkeypatch, capsys):
    """caption --cache accepts a read-only cache ("a full cache may be read-only"), yet one image not in it stopped
    the whole run at the failed write, the cached images' captions too."""
    import errno

    from attnkit.data import features

    photos, encoder = _photos(tmp_path), _encoder(weights)
    FeatureCache(tmp_path / "cache", encoder_identity(encoder)).get(photos[:2], encoder.grid_features)

    def read_only(path, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(features, "save_torch_atomic", read_only)
    cache = FeatureCache(tmp_path / "cache", encoder_identity(encoder))
    found = cache.get(photos, encoder.grid_features)
    assert found.shape[0] == 3 and (cache.stats.hits, cache.stats.misses) == (2, 1)
    assert capsys.readouterr().err.count("cannot store new features (Read-only file system)") == 1
