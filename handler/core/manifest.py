"""The packed-model manifest: what a packed model directory holds and how to check it at init."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from handler.core.errors import ModelLoadError
from handler.core.records import field, record

MANIFEST_NAME = "manifest.json"
FORMAT = "warmstart-packed-model"
FORMAT_VERSION = 1
FAMILIES = (
    "bert",
    "roberta",
    "xlm-roberta",
    "distilbert",
    "mpnet",
    # onnx only (infra/pack/families.py): the graph holds the whole model, the run time needs nothing of the family
    "electra",
    "deberta-v2",
    "modernbert",
    "gte",
    "nomic_bert",
    "qwen2",
    "qwen3",
    "gemma3_text",
    "gemma",  # decoder rerankers only (bge-reranker-v2-gemma)
    "gemma2",
    # task generate only (infra/pack/lm_pack.py): onnxruntime-genai's graph holds the whole model
    "llama",
    "phi3",
    "mistral",
)
_HEX = "0123456789abcdef"  # a SHA-256 is 64 of these: checked with string operations, no regex compiled at init
MAX_DEPTH = 64  # JSON nesting a manifest may have (a packed one has 6 levels); deeper is refused
DTYPES = ("float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool")


@record
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int | str, ...]  # a str is a symbolic (free) dimension

    @classmethod
    def parse(cls, raw: Any, where: str) -> TensorSpec:
        try:
            name, dtype, shape = raw["name"], raw["dtype"], raw["shape"]
        except (TypeError, KeyError) as e:
            raise ValueError(f"{where}: a tensor spec needs name, dtype and shape ({e})") from None
        if dtype not in DTYPES:
            raise ValueError(f"{where}: dtype {dtype!r} of {name!r}; valid: {', '.join(DTYPES)}")
        return cls(str(name), dtype, tuple(d if isinstance(d, int) else str(d) for d in shape))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@record
class FileEntry:
    size: int
    sha256: str


@record
class Manifest:
    root: Path
    id: str
    version: str
    task: str
    default_backend: str
    files: dict[str, FileEntry]
    backends: dict[str, dict[str, Any]]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    tokenizer: dict[str, Any] = field(default_factory=dict)
    pooling: dict[str, Any] = field(default_factory=dict)
    max_seq_length: int | None = None
    family: str | None = None
    dimension: int | None = None  # the output width, where the model has one
    # The fields only its task reads, as its task's spec checked them (`TaskSpec.fields`, at model load);
    # {} when read without a task hook (`load_manifest(root)`: packing tools, structure checks).
    options: dict[str, Any] = field(default_factory=dict)
    unsupported_backends: dict[str, str] = field(default_factory=dict)  # backend → why it cannot run this model
    # hidden, layers, heads, intermediate as packed (handler.core.memory budgets activations by them); {} before
    shape: dict[str, int] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def key(self) -> str:
        return f"{self.id}@{self.version}"

    @property
    def precision(self) -> dict[str, Any]:
        """dtype, quantization and the pack-time quality gate's figure (`pack --dtype/--quantize`): what the init
        report and status show. A pack without the entry is float32."""
        raw = self.raw.get("precision")
        if not isinstance(raw, dict):
            return {"dtype": "float32", "quantization": None}
        out: dict[str, Any] = {"dtype": raw.get("dtype", "float32"), "quantization": raw.get("quantization")}
        quality = raw.get("quality")
        if isinstance(quality, dict):
            out["quality"] = {k: quality.get(k) for k in ("metric", "figure", "min_quality", "items") if k in quality}
        return out

    def files_for(self, backend: str) -> list[str]:
        """The files one backend needs (its weights, the tokenizer): what init checks and maps."""
        names = list(self.backends[backend].get("files", []))
        if self.tokenizer.get("file"):
            names.append(self.tokenizer["file"])
        return [n for n in names if n in self.files]

    def golden(self) -> dict[str, Any] | None:
        """The golden answers recorded at pack time (infra.pack.golden), for the PreTraffic hook's status request:
        in their own file (`golden_file`, listed in `files`), read and checked against its recorded SHA-256 only
        when asked, so a start never parses them; or inline under `golden` in a manifest packed before they
        moved out. None: the pack has none."""
        inline = self.raw.get("golden")
        if inline is not None:
            return dict(inline)
        name = self.raw.get("golden_file")
        if name is None:
            return None
        path = self.path(name)
        data = read_regular(path)
        import hashlib  # deferred: never on a start's path (a status request with golden asks for this)

        if hashlib.sha256(data).hexdigest() != self.files[name].sha256:
            raise ModelLoadError(f"{path}: SHA-256 differs from the manifest's (the golden answers were changed)")
        try:
            value = parse_json(data)
        except ValueError as e:
            raise ModelLoadError(f"{path}: invalid golden answers: {e}") from None
        if not isinstance(value, dict):
            raise ModelLoadError(f"{path}: the golden answers must be a JSON object, not {type(value).__name__}")
        return value

    def path(self, name: str) -> Path:
        if name not in self.files:
            raise ModelLoadError(f"{self.root / MANIFEST_NAME}: file {name!r} is used but not listed in 'files'")
        return self.root / name


TaskFields = Callable[[str, dict[str, Any]], dict[str, Any]]  # (task, raw manifest) → Manifest.options


def load_manifest(root: Path, task_fields: TaskFields | None = None) -> Manifest:
    """Read and check a manifest: structure, and that every listed file exists with its listed size.

    Sizes are cheap (one stat each) and catch truncated copies; SHA-256 is `verify_sha256`'s job.
    `task_fields`: checks the task's own fields (`handler.tasks.catalog.load_manifest` passes its spec's; this
    layer knows no task), a ValueError reported as this manifest's fault.
    """
    path = root / MANIFEST_NAME
    if not root.is_dir():
        raise ModelLoadError(
            f"model directory {root} does not exist (set WARMSTART_MODEL or run `warmstart pack --default`)"
        )
    if not os.path.lexists(path):
        raise ModelLoadError(f"{path}: missing; {root} is not a packed model (run `warmstart pack`)")
    try:
        raw = _parsed(path)
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e})") from None
    try:
        manifest = _parse(root, raw, task_fields)
    except (KeyError, TypeError, ValueError) as e:
        raise ModelLoadError(f"{path}: invalid manifest: {e}") from None
    for name, entry in manifest.files.items():
        file = root / name
        try:
            info = file.stat()
        except FileNotFoundError:
            raise ModelLoadError(f"{file}: listed in the manifest but missing") from None
        except OSError as e:  # a parent that is a file (NotADirectoryError), no permission, a name too long
            raise ModelLoadError(f"{file}: listed in the manifest as {name!r} but unreadable: {e.strerror}") from None
        if not stat.S_ISREG(info.st_mode):  # a directory, or a FIFO that would block the first read forever
            raise ModelLoadError(f"{file}: listed in the manifest as {name!r} but not a regular file")
        size = info.st_size
        if size != entry.size:
            raise ModelLoadError(f"{file}: size {size} bytes, manifest says {entry.size} (truncated or replaced)")
    return manifest


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key!r} appears twice in one object (JSON would keep only the last)")
        out[key] = value
    return out


_CONTAINERS = frozenset((dict, list))  # what json.loads makes that holds values (exactly these types)


def _too_deep() -> ValueError:
    return ValueError(f"nested more than {MAX_DEPTH} levels deep")


# A start parses its manifest once: the prefetch (handler.runtime.prefetch) reads it first, before the imports,
# and hands its parse to the load that follows, which takes it only while the file it opens is the one that was
# read (same device, inode, size and mtime); otherwise, and for every later load, the file is read again.
_early: tuple[tuple[int, int, int, int], Any] | None = None


def _identity(fd: int) -> tuple[int, int, int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def read_early(path: Path) -> Any:
    """The manifest at `path` parsed and checked as `load_manifest` parses it (`open_regular`'s refusals,
    `parse_json`'s), kept for the first `load_manifest` of the same file."""
    global _early
    with os.fdopen(open_regular(path), "rb") as f:
        identity = _identity(f.fileno())
        value = parse_json(f.read())
    _early = (identity, value)
    return value


def _parsed(path: Path) -> Any:
    """`read_early`'s parse when it is of this very file (the descriptor opened now), else the file parsed."""
    global _early
    early, _early = _early, None
    with os.fdopen(open_regular(path), "rb") as f:
        if early is not None and early[0] == _identity(f.fileno()):
            return early[1]
        return parse_json(f.read())


def parse_json(data: bytes | str) -> Any:
    """A manifest's JSON, with a key given twice refused: `json.loads` would silently keep the last entry,
    and two `files` entries for one name would check one size and SHA-256 and skip the other. Nesting past
    `MAX_DEPTH` is refused as a ValueError too: past the interpreter's recursion limit the parser itself
    raises RecursionError, and anything deep that did parse could recurse that far later (a copy, a dump)."""
    try:
        value = json.loads(data, object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise _too_deep() from None
    # Iterative (the check itself must not recurse), and only into containers that hold containers: whether one
    # does is asked of `map(type, ...)` in C, so the golden answers' thousand floats cost no Python step each
    # (the walk that looked at every value was ~1% of init's instructions).
    stack: list[tuple[Any, int]] = [(value, 1)] if type(value) in _CONTAINERS else []
    while stack:
        item, depth = stack.pop()
        children = item.values() if type(item) is dict else item
        if _CONTAINERS.isdisjoint(map(type, children)):
            continue
        if depth + 1 > MAX_DEPTH:
            raise _too_deep()
        stack += [(child, depth + 1) for child in children if type(child) in _CONTAINERS]
    return value


def check_file_name(name: str) -> None:
    """A `files` name must be a canonical relative POSIX path inside the model directory: not empty, no NUL,
    not absolute, no `..` or `.` parts, no `//` or trailing `/` (so two spellings never name one file)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"files entry {name!r}: an empty file name")
    if "\0" in name:
        raise ValueError(f"files entry {name!r}: the name holds a NUL byte")
    # String operations, not PurePosixPath (two per name): the same rule, a part of '', '.' or '..' is what a
    # '//', a trailing '/', a './' or a '..' leaves after splitting on '/'.
    parts = name.split("/")
    if name.startswith("/") or ".." in parts:
        raise ValueError(f"files entry {name!r}: must be relative and stay inside the model directory")
    if "" in parts or "." in parts:
        raise ValueError(f"files entry {name!r}: not a canonical relative path (no '.', '//' or trailing '/')")


def _parse(root: Path, raw: dict[str, Any], task_fields: TaskFields | None = None) -> Manifest:
    if raw.get("format") != FORMAT or raw.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"format must be {FORMAT!r} version {FORMAT_VERSION}")
    task = raw["task"]
    if not isinstance(task, str) or not task:
        raise ValueError(f"task {task!r} is not a task name")
    files = {}
    for name, entry in raw["files"].items():
        check_file_name(name)
        size, digest = entry["size"], entry["sha256"]
        if type(size) is not int or size < 0:
            raise ValueError(f"files entry {name!r}: size {size!r} is not a non-negative integer")
        if not isinstance(digest, str) or len(digest) != 64 or digest.strip(_HEX):
            raise ValueError(f"files entry {name!r}: sha256 {digest!r} is not 64 lowercase hex digits")
        files[name] = FileEntry(size, digest)
    backends = {str(k): dict(v) for k, v in raw["backends"].items()}
    if raw["default_backend"] not in backends:
        raise ValueError(f"default_backend {raw['default_backend']!r} is not among backends {sorted(backends)}")
    unsupported = raw.get("unsupported_backends") or {}
    if not isinstance(unsupported, dict) or not all(isinstance(v, str) for v in unsupported.values()):
        raise ValueError("unsupported_backends must be an object of backend name → reason (a string)")
    if set(unsupported) & set(backends):
        raise ValueError(f"backends {sorted(set(unsupported) & set(backends))} are both packed and unsupported")
    return Manifest(
        root=root,
        id=str(raw["id"]),
        version=str(raw["version"]),
        task=task,
        default_backend=str(raw["default_backend"]),
        files=files,
        backends=backends,
        inputs=tuple(TensorSpec.parse(t, "inputs") for t in raw["inputs"]),
        outputs=tuple(TensorSpec.parse(t, "outputs") for t in raw["outputs"]),
        tokenizer=dict(raw.get("tokenizer") or {}),
        pooling=dict(raw.get("pooling") or {}),
        max_seq_length=raw.get("max_seq_length"),
        family=_choice(raw, "family", FAMILIES),
        dimension=_positive(raw, "dimension"),
        unsupported_backends={str(k): v for k, v in unsupported.items()},
        shape=_shape(raw),
        raw=raw,
        options=task_fields(task, raw) if task_fields is not None else {},
    )


def _choice(raw: dict[str, Any], key: str, valid: tuple[str, ...]) -> str | None:
    value = raw.get(key)
    if value is not None and value not in valid:
        raise ValueError(f"{key} {value!r}; valid: {', '.join(valid)}")
    return value


def _positive(raw: dict[str, Any], key: str) -> int | None:
    value = raw.get(key)
    if value is not None and (type(value) is not int or value < 1):
        raise ValueError(f"{key} {value!r} is not a positive integer")
    return value


# `logits`: the width of a per-token output the graph holds before it pools (an MLM head's vocabulary: SPLADE).
SHAPE_KEYS = ("hidden", "layers", "heads", "intermediate", "logits")


def _shape(raw: dict[str, Any]) -> dict[str, int]:
    shape = raw.get("shape") or {}
    if not isinstance(shape, dict):
        raise ValueError(f"shape {shape!r} is not an object of {', '.join(SHAPE_KEYS)}")
    return {key: v for key in SHAPE_KEYS if (v := _positive(shape, key)) is not None}


_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def open_regular(path: Path) -> int:
    """A read-only descriptor of `path`, refused (ModelLoadError) unless it is a regular file. A model directory is
    untrusted: a FIFO at a listed name blocks a plain `open` forever (no writer), and a device such as /dev/zero
    reads forever. So: opened non-blocking (a FIFO opens at once, a socket fails with ENXIO), no controlling tty,
    then `fstat` of the descriptor itself: what was opened is what is checked, with no window to swap the name
    between a `stat` and the `open`. O_NONBLOCK has no effect on a regular file's reads."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:  # missing, a symlink loop (ELOOP), a socket (ENXIO), no permission
        raise ModelLoadError(f"{path}: cannot be opened: {e.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
        raise ModelLoadError(f"{path}: {kind}, not a regular file (a model's files must be regular files)")
    return fd


def read_regular(path: Path) -> bytes:
    """All of a regular file's bytes (`open_regular`'s refusals)."""
    with os.fdopen(open_regular(path), "rb") as f:
        return f.read()


@contextmanager
def regular_path(path: Path) -> Iterator[str]:
    """A name for a library that opens files itself (torch's mapping, the tokenizers' vocabulary): the checked
    descriptor's /proc/self/fd entry, which opens that very file, whatever now sits at `path`. Without /proc (not
    Linux): `path` itself, checked just before."""
    fd = open_regular(path)
    try:
        proc = f"/proc/self/fd/{fd}"
        yield proc if os.path.exists(proc) else str(path)
    finally:
        os.close(fd)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    import hashlib  # deferred: loads libcrypto (4.5 MB), and plain init hashes nothing (docs/coldstart.md)

    digest = hashlib.sha256()
    with os.fdopen(open_regular(path), "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def verify_sha256(manifest: Manifest, names: list[str] | None = None) -> None:
    """Hash the listed files (or `names`) and compare; reads every byte, so it is opt-in at init."""
    for name in names if names is not None else list(manifest.files):
        actual = sha256_file(manifest.root / name)
        if actual != manifest.files[name].sha256:
            raise ModelLoadError(
                f"{manifest.root / name}: SHA-256 {actual[:16]}… does not match the manifest's "
                f"{manifest.files[name].sha256[:16]}… (corrupt or replaced)"
            )


def replace_dir(staging: Path, out: Path) -> None:
    """Publish a fully written `staging` directory as `out`, replacing an older one: readers see the old
    directory or the new one, never a mix (two renames; the old one is removed afterwards). The old one goes
    aside into a fresh directory of our own (`mkdtemp` beside it), never a fixed name such as `.NAME.old`,
    which could be someone else's directory. `warmstart pack` publishes through it too."""
    import shutil  # deferred: never needed by a plain init
    import tempfile

    if not os.path.lexists(out):
        os.rename(staging, out)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    try:
        os.rename(out, aside / out.name)
    except OSError:
        aside.rmdir()
        raise
    os.rename(staging, out)
    shutil.rmtree(aside, ignore_errors=True)
