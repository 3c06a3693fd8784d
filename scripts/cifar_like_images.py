#!/usr/bin/env python3
"""CIFAR-10-like inputs for issue 41 item 5, through the example's own transform, written to a .npy file.

CIFAR-10 cannot be downloaded here (only PyPI is reachable, and no PyPI wheel checked ships it), so
this makes 32 x 32 RGB images of two kinds and puts them through DeepSpeedExamples'
``training/pipeline_parallelism/train.py`` transform up to ``ToTensor``'s uint8 source:
``Resize(256)`` (PIL bilinear, what torchvision's Resize does to a PIL image) and ``CenterCrop(224)``.
``ToTensor`` (/255) and ``Normalize`` are done by ``scripts/adam_sum_order.py`` when it reads them.

- ``natural``: random square crops (48 px to 2/3 of the short side, random flip) of the colour
  photographs scikit-image ships in its wheel (astronaut, chelsea, coffee, motorcycle, rocket,
  hubble, retina, ihc), shrunk to 32 x 32 as CIFAR's were (antialiased); natural-image statistics.
- ``smooth``: 4 x 4 uniform random colours upsampled bicubically to 32 x 32, plus a little noise.

Needs Pillow, numpy and scikit-image (a venv of its own, not the project's):

    python scripts/cifar_like_images.py --kind natural --count 1536 --out /tmp/natural224.npy

writes ``/tmp/natural224.npy`` (count x 3 x 224 x 224 uint8) and ``/tmp/natural224.labels.npy``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "motorcycle_left.png", "rocket.jpg",
          "hubble_deep_field.jpg", "retina.jpg", "ihc.png")


def photos() -> list[Image.Image]:
    import skimage
    folder = Path(skimage.__file__).parent / "data"
    return [Image.open(folder / name).convert("RGB") for name in PHOTOS]


def natural(count: int, rng: np.random.Generator) -> tuple[list[Image.Image], np.ndarray]:
    """Random crops of the photographs, shrunk to CIFAR's 32 x 32, and the photograph each came from."""
    sources, out = photos(), []
    source = rng.integers(len(sources), size=count)
    for index in source:
        photo = sources[index]
        short = min(photo.size)
        side = int(rng.integers(48, max(49, short * 2 // 3)))
        left, top = int(rng.integers(photo.size[0] - side + 1)), int(rng.integers(photo.size[1] - side + 1))
        crop = photo.crop((left, top, left + side, top + side)).resize((32, 32), Image.LANCZOS)
        out.append(crop.transpose(Image.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else crop)
    return out, source


def smooth(count: int, rng: np.random.Generator) -> tuple[list[Image.Image], None]:
    """Low-frequency random colour fields with a little pixel noise (no classes)."""
    out = []
    for _ in range(count):
        coarse = Image.fromarray(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)).resize((32, 32), Image.BICUBIC)
        noisy = np.asarray(coarse, dtype=np.float64) + rng.normal(0, 6, (32, 32, 3))
        out.append(Image.fromarray(np.clip(noisy, 0, 255).round().astype(np.uint8)))
    return out, None


def example_transform(image: Image.Image) -> np.ndarray:
    """train.py's Resize(256) then CenterCrop(224), as torchvision does them on a PIL image; CHW uint8."""
    big = image.resize((256, 256), Image.BILINEAR)
    top = int(round((256 - 224) / 2.0))
    return np.asarray(big.crop((top, top, top + 224, top + 224)), dtype=np.uint8).transpose(2, 0, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kind", choices=("natural", "smooth"), default="natural")
    p.add_argument("--count", type=int, default=1536, help="2 ranks x 3 steps x 16 micro-batches x 8")
    p.add_argument("--labels", choices=("random", "source"), default="random",
                   help="source: a natural image's label is its photograph (8 classes learnable from pixels)")
    p.add_argument("--seed", type=int, default=41)
    p.add_argument("--out", required=True, help="a .npy path; labels go beside it as .labels.npy")
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    images, source = (natural if args.kind == "natural" else smooth)(args.count, rng)
    labels = rng.integers(0, 10, args.count) if args.labels == "random" or source is None else source
    out = np.lib.format.open_memmap(args.out, mode="w+", dtype=np.uint8, shape=(args.count, 3, 224, 224))
    for index, image in enumerate(images):
        out[index] = example_transform(image)
    out.flush()
    np.save(args.out.removesuffix(".npy") + ".labels.npy", labels.astype(np.int64))
    print(f"{args.out}: {args.count} {args.kind} images, mean {out.mean() / 255:.3f}, std {out.std() / 255:.3f}")


if __name__ == "__main__":
    main()
