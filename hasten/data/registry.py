"""The datasets hasten knows: their files, official addresses, pinned SHA-256 values, shapes and class names.

A FileSpec with no pinned SHA-256 is never downloaded. `sources` decides where the files are found.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hasten.data import readers
from hasten.data.cifar import LAYOUTS, CifarLayout, batch_folder
from hasten.data.readers import Reader
from hasten.errors import DataError


@dataclass(frozen=True)
class FileSpec:
    """One file of a dataset: official name, pinned SHA-256 (None: not pinned, never downloaded), addresses."""

    filename: str
    sha256: str | None
    urls: tuple[str, ...]
    content_sha256: str | None = None  # of the gunzipped payload

    @property
    def names(self) -> tuple[str, ...]:
        """File names accepted in a folder: the official one, and the same without `.gz`."""
        unpacked = self.filename.removesuffix(".gz")
        return (self.filename, unpacked) if unpacked != self.filename else (self.filename,)


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset: its files by role, where a system package puts them, and what it holds."""

    name: str
    files: Mapping[str, FileSpec] = field(default_factory=dict, hash=False)
    system_folders: tuple[str, ...] = ()
    install_hint: str = ""
    train_size: int = 0
    test_size: int = 0
    image_shape: tuple[int, int, int] = (1, 28, 28)
    num_classes: int = 10
    classes: tuple[str, ...] = ()  # empty when the names come from the data files
    cifar_layout: CifarLayout | None = None  # its extracted batch folder stands in for the archive
    reader: Reader = field(default=readers.read_idx, compare=False)  # files (or seed) -> arrays and class names
    # a mirror image is an image of the same class (clothes, objects); false where it is not (digits, letters,
    # gratings): horizontal flips (data.augment.flip, train.tta_flip) default to this
    mirror_invariant: bool = False

    def missing_in(self, folder: Path) -> list[str]:
        """Official names of the files `folder` lacks; empty when it holds the whole dataset."""
        if self.cifar_layout is not None and batch_folder(folder, self.cifar_layout) is not None:
            return []
        return [f.filename for f in self.files.values() if self.path_of(folder, f) is None]

    @staticmethod
    def path_of(folder: Path, file: FileSpec) -> Path | None:
        """The path of `file` in `folder` under one of its accepted names, or None."""
        return next((folder / n for n in file.names if (folder / n).is_file()), None)


# sha256sum format: SHA-256 of the official file, then <dataset>/<file>. Sources: tensorflow_datasets
# url_checksums (mnist, fashion_mnist, kmnist) and torchvision/keras (CIFAR), each matching the MD5 the
# publisher lists. Debian's Fashion-MNIST files are a recompression of these and hash differently.
PINNED_SHA256 = """
3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84  fashion-mnist/train-images-idx3-ubyte.gz
a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845  fashion-mnist/train-labels-idx1-ubyte.gz
346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073  fashion-mnist/t10k-images-idx3-ubyte.gz
67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5  fashion-mnist/t10k-labels-idx1-ubyte.gz
440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609  mnist/train-images-idx3-ubyte.gz
3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c  mnist/train-labels-idx1-ubyte.gz
8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6  mnist/t10k-images-idx3-ubyte.gz
f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6  mnist/t10k-labels-idx1-ubyte.gz
51467d22d8cc72929e2a028a0428f2086b092bb31cfb79c69cc0a90ce135fde4  kmnist/train-images-idx3-ubyte.gz
e38f9ebcd0f3ebcdec7fc8eabdcdaef93bb0df8ea12bee65224341c8183d8e17  kmnist/train-labels-idx1-ubyte.gz
edd7a857845ad6bb1d0ba43fe7e794d164fe2dce499a1694695a792adfac43c5  kmnist/t10k-images-idx3-ubyte.gz
20bb9a0ef54c7db3efc55a92eef5582c109615df22683c380526788f98e42a1c  kmnist/t10k-labels-idx1-ubyte.gz
6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce  cifar10/cifar-10-python.tar.gz
85cd44d02ba6437773c5bbd22e183051d648de2e7d6b014e1ef29b855ba677a7  cifar100/cifar-100-python.tar.gz
"""

# SHA-256 of the gunzipped IDX payload (their MD5s are the ones torchvision pins), so that a recompressed
# copy, such as Debian's dataset-fashion-mnist, still verifies in `info`.
CONTENT_SHA256 = """
c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888  fashion-mnist/train-images-idx3-ubyte.gz
bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9  fashion-mnist/train-labels-idx1-ubyte.gz
5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b  fashion-mnist/t10k-images-idx3-ubyte.gz
0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34  fashion-mnist/t10k-labels-idx1-ubyte.gz
ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db  mnist/train-images-idx3-ubyte.gz
65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5  mnist/train-labels-idx1-ubyte.gz
0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7  mnist/t10k-images-idx3-ubyte.gz
ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2  mnist/t10k-labels-idx1-ubyte.gz
"""


def _sums(table: str) -> dict[str, str]:
    return {path: digest for digest, path in (line.split() for line in table.strip().splitlines())}


_PINNED, _CONTENT = _sums(PINNED_SHA256), _sums(CONTENT_SHA256)

IDX_FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}


def _file(dataset: str, filename: str, base_urls: tuple[str, ...]) -> FileSpec:
    key = f"{dataset}/{filename}"
    urls = tuple(base + filename for base in base_urls)
    return FileSpec(filename, _PINNED.get(key), urls, _CONTENT.get(key))


def _idx_dataset(
    name: str, base_urls: tuple[str, ...], classes: tuple[str, ...], hint: str = "", mirror_invariant: bool = False
) -> DatasetSpec:
    return DatasetSpec(
        name,
        files={role: _file(name, filename, base_urls) for role, filename in IDX_FILES.items()},
        system_folders=(f"/usr/share/datasets/{name}",),
        install_hint=hint,
        train_size=60000,
        test_size=10000,
        image_shape=(1, 28, 28),
        classes=classes,
        mirror_invariant=mirror_invariant,
    )


def _cifar_dataset(name: str, num_classes: int, classes: tuple[str, ...] = ()) -> DatasetSpec:
    layout = LAYOUTS[name]
    return DatasetSpec(
        name,
        files={"archive": _file(name, layout.archive, ("https://www.cs.toronto.edu/~kriz/",))},
        system_folders=(f"/usr/share/datasets/{name}",),
        train_size=50000,
        test_size=10000,
        image_shape=(3, 32, 32),
        num_classes=num_classes,
        classes=classes,
        cifar_layout=layout,
        reader=readers.read_cifar_spec,
        mirror_invariant=True,
    )


DIGIT_NAMES = tuple(str(d) for d in range(10))
FASHION_NAMES = tuple("T-shirt/top,Trouser,Pullover,Dress,Coat,Sandal,Shirt,Sneaker,Bag,Ankle boot".split(","))
# romanised hiragana of KMNIST's kmnist_classmap.csv (お き す つ な は ま や れ を), as torchvision names them
KMNIST_NAMES = ("o", "ki", "su", "tsu", "na", "ha", "ma", "ya", "re", "wo")
CIFAR10_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
DEBIAN_FASHION = (
    "on Debian or Ubuntu: apt-get install dataset-fashion-mnist (puts it in /usr/share/datasets/fashion-mnist)"
)

SPECS: dict[str, DatasetSpec] = {
    "fashion-mnist": _idx_dataset(
        "fashion-mnist",
        ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
        FASHION_NAMES,
        DEBIAN_FASHION,
        mirror_invariant=True,
    ),
    "mnist": _idx_dataset(
        "mnist", ("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/"), DIGIT_NAMES
    ),
    "kmnist": _idx_dataset("kmnist", ("http://codh.rois.ac.jp/kmnist/dataset/kmnist/",), KMNIST_NAMES),
    "cifar10": _cifar_dataset("cifar10", 10, CIFAR10_NAMES),
    "cifar100": _cifar_dataset("cifar100", 100),  # the 100 names come from the archive's meta file
    # 1797 images split 80/20 in datasets.py; nothing to fetch
    "digits": DatasetSpec(
        "digits",
        install_hint="ships with scikit-learn",
        train_size=1437,
        test_size=360,
        image_shape=(1, 8, 8),
        classes=DIGIT_NAMES,
        reader=readers.read_digits,
    ),
    # sizes are load_dataset's defaults (synthetic_size=512 and a quarter of it)
    "synthetic": DatasetSpec(
        "synthetic",
        install_hint="generated from the seed",
        train_size=512,
        test_size=128,
        classes=DIGIT_NAMES,
        reader=readers.read_synthetic,
    ),
}

DATASETS: tuple[str, ...] = tuple(SPECS)  # the one list of dataset names: the recipe's data.name takes these


def mirror_invariant(name: str) -> bool:
    """Whether a horizontal mirror keeps an image's class in dataset `name`; False for data hasten does not know
    (an image folder, a user's dataset), where a mirror may well change the class."""
    spec = SPECS.get(name)
    return spec.mirror_invariant if spec is not None else False


def get_spec(name: str, specs: Mapping[str, DatasetSpec] | None = None) -> DatasetSpec:
    """The spec registered as `name`; DataError listing the known names otherwise."""
    registry = SPECS if specs is None else specs
    if name not in registry:
        raise DataError(f"unknown dataset {name!r}; known datasets: {', '.join(registry)}")
    return registry[name]
