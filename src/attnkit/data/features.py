"""On-disk cache of a frozen image encoder's grid features, so the decoder trains fast on a CPU.

Legend: C backbone channels, g grid side.

Layout: ``ROOT/<encoder key>/<image key>.pt``, one float16 tensor (C, g, g) per image: a frozen backbone's
pooled grid, or (C', H', W') the frozen prefix's map when the last blocks fine-tune.

* The **encoder key** hashes everything that decides the features: backbone
  name, the weights file's content (size + SHA-256 of its bytes; "none" for
  random weights, which are seeded and so reproducible only by accident: a
  random backbone is never cached), image size, grid size, input
  normalisation and this module's format version. Another backbone, grid or
  weights file therefore lands in another folder: stale features are never read.
* The **image key** is the SHA-256 of the image file's bytes: an edited image is a miss, and the same
  photo written again (the demo's generated scenes, a restored checkout: a new modification time) or
  found at another path is a hit. A training mosaic (:class:`~attnkit.data.images.MosaicFile`) hashes
  its four photos' keys in quadrant order. Each file is read once per process for its key (a file whose
  path, size and modification time have not changed keeps the digest it had).
"""

from __future__ import annotations

import errno
import hashlib
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from attnkit.data.images import ImageSource, MosaicFile, load_image_source, require_files
from attnkit.errors import UserError, describe_os_error
from attnkit.files import content_digest, save_torch_atomic, write_json_atomic
from attnkit.precision import without_autocast

FORMAT_VERSION = 3  # 3: photos turned upright by their EXIF orientation; 2: images keyed by their bytes (1: by path, size and modification time)


def encoder_identity(encoder) -> dict:
    """What decides an image encoder's pooled grid features (``encoder``: an ImageEncoder)."""
    config = encoder.config
    identity = {
        "format": FORMAT_VERSION,
        "backbone": config.backbone,
        "weights_sha256": encoder.weights_digest,
        "image_size": config.image_size,
        "grid_size": config.grid_size,
        "normalization": [list(v) for v in encoder.normalization],
    }
    if config.blocks:  # a cut backbone; the whole one keeps the key it always had, so existing caches stay valid
        identity["blocks"] = config.blocks
    if not encoder.is_frozen:  # the frozen prefix's map, before the fine-tuned blocks and the pooling
        identity["frozen_blocks"] = encoder.frozen_blocks
    return identity


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0


class FeatureCache:
    """Grid features of images under one encoder identity; computes and stores the missing ones.

    ``keep_in_memory``: features once read stay in memory, so images read again and again (the validation
    photos, every epoch) are read from disk once.
    """

    def __init__(self, root: str | Path, identity: dict, keep_in_memory: bool = False):
        if identity.get("weights_sha256") == "none":
            raise ValueError("a randomly initialised backbone is not cached: its features depend on the seed")
        self.root, self.identity = Path(root), identity
        self.kept: dict[Path, Tensor] | None = {} if keep_in_memory else None
        key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
        self.folder = Path(root) / key
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            info = self.folder / "encoder.json"
            if not info.exists():
                write_json_atomic(info, identity)
        except OSError as error:
            blocked = next((p for p in (Path(root), self.folder) if p.exists() and not p.is_dir()), None)
            why = f"{blocked} is a file, not a folder" if blocked is not None else error.strerror or str(error)
            raise UserError(f"feature cache {root}: cannot keep features in {self.folder} ({why})") from None
        self.shape: torch.Size | None = None  # (C, g, g) of every entry, once one has been computed here
        self.unwritable = ""  # why new entries cannot be stored (a cache that may only be read), once a write failed
        self.stats = CacheStats()

    def kept_in_memory(self) -> "FeatureCache":
        """The same cache, keeping what it reads in memory (``keep_in_memory``)."""
        return FeatureCache(self.root, self.identity, keep_in_memory=True)

    def _entry(self, image: ImageSource) -> Path:
        return self.folder / f"{hashlib.sha256(_file_key(image).encode()).hexdigest()[:24]}.pt"

    def get(self, images: Sequence[str | Path | MosaicFile], compute: Callable[[Tensor], Tensor], batch_size: int = 32) -> Tensor:
        """(N, C, g, g) float16 features of ``images`` (files, or mosaics of four); ``compute`` maps (B, 3, H, W)
        pixels to (B, C, g, g) (or to the frozen prefix's (B, C', H', W')).

        Runs outside autocast: the features must not depend on the training precision (the key does not
        hold it), and stacking fp16 under CPU bf16 autocast fails. Raises ImageError for the first
        unreadable image (check images beforehand to skip bad ones).
        """
        with without_autocast():
            return self._get(images, compute, batch_size)

    def _get(self, images: Sequence[str | Path | MosaicFile], compute: Callable[[Tensor], Tensor], batch_size: int) -> Tensor:
        paths = [image if isinstance(image, MosaicFile) else Path(image) for image in images]
        require_files(photo for image in paths for photo in (image.photos if isinstance(image, MosaicFile) else (image,)))
        entries = [self._entry(p) for p in paths]
        found: dict[int, Tensor] = {}
        missing = []
        for i, entry in enumerate(entries):
            if self.kept is not None and entry in self.kept:
                found[i] = self.kept[entry]
                continue
            feature = self._read(entry)
            if feature is not None:
                found[i] = feature
            else:
                missing.append(i)
        if found and not missing and self.shape is None and len({f.shape for f in found.values()}) > 1:
            missing.append(min(found))  # entries of two shapes and none computed yet: compute one to learn the true shape
            del found[missing[-1]]
        self.stats.hits += len(found)
        self.stats.misses += len(missing)
        self._compute(paths, entries, missing, found, compute, batch_size)
        wrong = [i for i, feature in found.items() if feature.shape != self.shape] if self.shape is not None else []
        if wrong:  # an entry of another shape (not written by this encoder's key): recomputed, never trusted
            self.stats.hits -= len(wrong)
            self.stats.misses += len(wrong)
            self._compute(paths, entries, wrong, found, compute, batch_size)
        if self.kept is not None:
            self.kept.update((entries[i], feature) for i, feature in found.items())
        return torch.stack([found[i] for i in range(len(paths))]) if paths else torch.empty(0)

    @staticmethod
    def _read(entry: Path) -> Tensor | None:
        """An entry's features, or None when there is none or it is damaged (then it is removed and recomputed):
        a file torch cannot read, or anything but one (C, g, g) float16 tensor."""
        if not entry.is_file():
            return None
        try:
            feature = torch.load(entry, map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001  (truncated, random bytes, another format: all are recomputed)
            feature = None
        if isinstance(feature, Tensor) and feature.dtype == torch.float16 and feature.dim() == 3:
            return feature
        entry.unlink(missing_ok=True)
        return None

    def _compute(
        self, paths: Sequence[Path | MosaicFile], entries: Sequence[Path], indices: Sequence[int], found: dict[int, Tensor], compute: Callable[[Tensor], Tensor], batch_size: int
    ) -> None:
        """Compute, store and put in ``found`` the features of ``paths[i]`` for each i in ``indices``."""
        size, normalization = self.identity["image_size"], self.identity["normalization"]
        for start in range(0, len(indices), batch_size):
            chunk = indices[start : start + batch_size]
            pixels = torch.stack([load_image_source(paths[i], size, normalization) for i in chunk])  # (B, 3, H, W)
            with torch.no_grad():
                features = compute(pixels).to("cpu", torch.float16)  # (B, C, g, g)
            self.shape = features.shape[1:]
            for i, feature in zip(chunk, features):
                self._keep(entries[i], feature)
                found[i] = feature

    def _keep(self, entry: Path, feature: Tensor) -> None:
        """Store one entry. A cache that may only be read (a shared one, read-only or not ours) is said once and gone on
        without: the features are computed all the same, and the cached ones are still read. A full disk stays an
        error: the run's own files would fail next."""
        if self.unwritable:
            return
        try:
            save_torch_atomic(entry, feature.clone(), durable=False)  # a damaged entry is recomputed
        except OSError as error:
            if not isinstance(error, PermissionError) and error.errno != errno.EROFS:
                raise
            self.unwritable = describe_os_error(error)
            print(f"warning: feature cache {self.root}: cannot store new features ({error.strerror}); they are computed, not kept", file=sys.stderr)


def _file_key(image: ImageSource) -> str:
    """What identifies an image's content: the SHA-256 of its file's bytes (a mosaic: its photos' in order)."""
    if isinstance(image, MosaicFile):
        return "mosaic|" + "|".join(_file_key(photo) for photo in image.photos)
    stat = image.stat()
    seen = (str(image.resolve()), stat.st_size, stat.st_mtime_ns)
    if seen not in _DIGESTS:
        _DIGESTS[seen] = content_digest(image)
    return _DIGESTS[seen]


_DIGESTS: dict[tuple[str, int, int], str] = {}  # (path, size, mtime) -> content digest, so a file is hashed once per process
