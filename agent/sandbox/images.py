"""OCI images a task runs in (``gpulayer submit --image``): fetched, checked, unpacked rootless, cached.

An image job names its OCI manifest and blobs by digest; they are artifacts
like any other, so the artifact cache downloads each one and verifies that its
bytes hash to its digest (a lying digest fails the task, nothing kept). Then,
before anything is unpacked, every layer is read through and refused
(`ImageError`, the task fails with the reason) for an absolute path, a ``..``
component, a device node or fifo, a hard link to a path that is not an earlier
file of the layer, a symlink whose relative target climbs above the image's
root, a member under a symlink of its own layer, or a whiteout (``.wh.``) that
names no plain entry. What passes is laid out as an OCI layout (blobs hard
linked from the cache) and unpacked by ``umoci unpack --rootless`` (which joins
every path inside the root itself) into ``<cache>/images/<manifest hex>/rootfs``.
The unpacked root is kept by manifest digest, shared read-only by the tasks of
that image, and evicted least recently used under the artifact cache's limit.

How it runs is `run.py`'s ``wrap_image``: the same bubblewrap sandbox, with the
image as its root.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import stat
import subprocess
import tarfile
import threading
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from gpulayer.protocol.jobspec import OCI_CONFIG as CONFIG_TYPE
from gpulayer.protocol.jobspec import OCI_LAYERS as LAYER_TYPES
from gpulayer.protocol.jobspec import OCI_MANIFEST as MANIFEST_TYPE
from gpulayer.protocol.jobspec import ImageSpec

from ..artifacts.cache import ArtifactCache, digest_hex
from ..artifacts.caps import UnpackLimit
from ..errors import DigestMismatch, TaskSetupError
from ..events import log_event

#: Bytes a manifest or config blob may have.
MAX_JSON_BYTES = 4 * 1024 * 1024
#: The directory of the image cache under the artifact cache's root.
IMAGES_DIR = "images"
META = "image.json"
#: The PATH of a task in an image whose config sets none (docker's).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
UMOCI_TIMEOUT_S = 1800.0
#: The mode bits no unpacked file or folder keeps: setuid, setgid, and write for others (`tame`).
TAMED_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_IWOTH


class ImageError(TaskSetupError):
    """An image that cannot be used: the task fails with this reason."""


@dataclass(frozen=True)
class Layer:
    digest: str
    media_type: str
    size: int


@dataclass(frozen=True)
class Manifest:
    config: str
    layers: list[Layer]


@dataclass
class ImageConfig:
    """What of the image's config a task run honours."""

    env: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    workdir: str = ""
    user: str = ""


@dataclass(frozen=True)
class Prepared:
    """An unpacked image ready for a task: its root and its config."""

    manifest: str
    rootfs: Path
    config: ImageConfig


def _json(data: bytes, what: str) -> dict:
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise ImageError(f"the image's {what} is not JSON") from None
    if not isinstance(obj, dict):
        raise ImageError(f"the image's {what} is not a JSON object")
    return obj


def parse_manifest(data: bytes) -> Manifest:
    """The config and layers an OCI image manifest names; ImageError for anything else."""
    obj = _json(data, "manifest")
    if obj.get("mediaType", MANIFEST_TYPE) != MANIFEST_TYPE or obj.get("schemaVersion") != 2:
        raise ImageError(f"not an OCI image manifest (mediaType {obj.get('mediaType')!r}); convert it with "
                         "`skopeo copy docker-archive:X oci-archive:Y`")
    config = obj.get("config")
    if not isinstance(config, dict) or config.get("mediaType") != CONFIG_TYPE:
        raise ImageError(f"the manifest's config is not an OCI image config ({CONFIG_TYPE})")
    digest_hex(config.get("digest", ""))
    layers = []
    for entry in obj.get("layers") or []:
        if not isinstance(entry, dict) or entry.get("mediaType") not in LAYER_TYPES:
            kind = entry.get("mediaType") if isinstance(entry, dict) else entry
            raise ImageError(f"layer of media type {kind!r}: this worker unpacks {' and '.join(LAYER_TYPES)}")
        size = entry.get("size")
        if not isinstance(size, int) or size < 0:
            raise ImageError(f"layer {entry.get('digest')!r} has no size")
        digest_hex(entry.get("digest", ""))
        layers.append(Layer(entry["digest"], entry["mediaType"], size))
    return Manifest(config["digest"], layers)


def _strings(value: object, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ImageError(f"the image config's {what} is not a list of strings")
    return list(value)


def parse_config(data: bytes) -> ImageConfig:
    """Env, Entrypoint, Cmd, WorkingDir and User of an OCI image config."""
    obj = _json(data, "config")
    if obj.get("os", "linux") != "linux":
        raise ImageError(f"the image is for {obj.get('os')!r}, not linux")
    conf = obj.get("config") or {}
    if not isinstance(conf, dict):
        raise ImageError("the image config's config is not an object")
    env: dict[str, str] = {}
    for item in _strings(conf.get("Env"), "Env"):
        name, _, value = item.partition("=")
        if name:
            env[name] = value
    workdir = conf.get("WorkingDir") or ""
    user = conf.get("User") or ""
    if not isinstance(workdir, str) or not isinstance(user, str):
        raise ImageError("the image config's WorkingDir and User must be strings")
    if workdir and not workdir.startswith("/"):
        workdir = "/" + workdir
    return ImageConfig(env, _strings(conf.get("Entrypoint"), "Entrypoint"), _strings(conf.get("Cmd"), "Cmd"),
                       workdir, user)


def _clean(name: str) -> list[str]:
    """A layer member's path as components; ImageError for an absolute path or ``..``."""
    text = name.removeprefix("./")
    if text.startswith("/") or "\x00" in text:
        raise ImageError(f"unsafe layer: {name!r} is an absolute path")
    parts = [part for part in text.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise ImageError(f"unsafe layer: {name!r} has a '..' component")
    return parts


def _climbs(link_dir: list[str], target: str) -> bool:
    """Whether a relative symlink target, read from ``link_dir``, leaves the image's root."""
    depth = len(link_dir)
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part not in ("", "."):
            depth += 1
    return False


def check_member(member: tarfile.TarInfo, kinds: dict[str, str]) -> None:
    """Raise ImageError when one layer member could write outside the image's root (``kinds``: the earlier
    members of its layer, path to kind)."""
    parts = _clean(member.name)
    if not parts:
        return  # the layer's root itself
    name = "/".join(parts)
    if member.ischr() or member.isblk() or member.isfifo() or not (
            member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise ImageError(f"unsafe layer: {member.name!r} is a device node or other special file")
    for depth in range(1, len(parts)):
        if kinds.get("/".join(parts[:depth])) == "symlink":
            raise ImageError(f"unsafe layer: {member.name!r} lies under a symlink of the same layer")
    base = parts[-1]
    if base.startswith(WHITEOUT):
        hidden = base[len(WHITEOUT):]
        if base != OPAQUE and (not hidden or hidden in (".", "..") or hidden.startswith(WHITEOUT)):
            raise ImageError(f"unsafe layer: whiteout {member.name!r} names no entry")
        if not member.isreg():
            raise ImageError(f"unsafe layer: whiteout {member.name!r} is not a plain file")
    if member.issym():
        target = member.linkname
        if not target or "\x00" in target:
            raise ImageError(f"unsafe layer: symlink {member.name!r} has an empty target")
        if not target.startswith("/") and _climbs(parts[:-1], target):
            raise ImageError(f"unsafe layer: symlink {member.name!r} -> {target!r} leads outside the image")
    if member.islnk():
        try:
            target_parts = _clean(member.linkname)
        except ImageError:
            raise ImageError(f"unsafe layer: hard link {member.name!r} -> {member.linkname!r} leads outside "
                             "the image") from None
        if kinds.get("/".join(target_parts)) != "file":
            raise ImageError(f"unsafe layer: hard link {member.name!r} -> {member.linkname!r} names no earlier "
                             "file of the layer")
    kinds[name] = "file" if member.isreg() else "symlink" if member.issym() else "dir" if member.isdir() else "link"


class _Counted:
    """A stream that counts the bytes read from it (a layer's tar, decompressed)."""

    def __init__(self, stream: BinaryIO):
        self.stream, self.count = stream, 0

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.count += len(data)
        return data


def check_layer(path: Path, max_bytes: int) -> int:
    """Read a layer (tar or tar+gzip) through; its member count. ImageError for an unsafe member, a tar that
    cannot be read, or one that unpacks to more than ``max_bytes``.

    A tar that ends right after its last member's data, without that member's padding and the end-of-archive
    blocks (Debian's ``umoci insert`` 0.4.7 writes such a layer when its last entry is a file), is read as
    ending there, as ``umoci unpack`` reads it; one whose last member's data is cut short is refused."""
    kinds: dict[str, str] = {}
    total = count = 0
    with open(path, "rb") as raw:
        gzipped = raw.read(2) == b"\x1f\x8b"
    try:
        with (gzip.open(path, "rb") if gzipped else open(path, "rb")) as stream:
            counted = _Counted(stream)  # type: ignore[arg-type]
            with tarfile.open(fileobj=counted, mode="r|") as archive:  # type: ignore[call-overload]
                for member in _members(archive, counted):
                    check_member(member, kinds)
                    total += max(member.size, 0)
                    count += 1
                    if total > max_bytes:
                        raise ImageError(f"the layer unpacks to more than {max_bytes} bytes, the worker's cache limit")
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise ImageError(f"a layer of the image is not a readable tar: {exc}") from None
    return count


def _members(archive: tarfile.TarFile, counted: _Counted) -> Iterator[tarfile.TarInfo]:
    """The members of a streamed tar, ending quietly where only the last one's padding (and the
    end-of-archive blocks) are missing; tarfile.ReadError where its data is cut short."""
    members, last = iter(archive), None
    while True:
        try:
            member = next(members)
        except StopIteration:
            return
        except tarfile.ReadError:
            if last is not None and last.isreg() and counted.count >= last.offset_data + last.size:
                return
            raise
        last = member
        yield member


def tree_bytes(root: Path) -> int:
    """The bytes of the regular files under ``root`` (links not followed)."""
    total = 0
    for top, _dirs, files in os.walk(root):
        for name in files:
            try:
                info = os.lstat(os.path.join(top, name))
            except OSError:
                continue
            if not os.path.islink(os.path.join(top, name)):
                total += info.st_size
    return total


def tame(root: Path) -> int:
    """Clear the setuid and setgid bits and others' write bit of everything under ``root`` (links aside): a
    layer's setuid-root file must not be one on the worker (issue 36), nor a world-writable file or folder
    one that any local user changes under every task of the image. The number of entries changed."""
    changed = 0
    for top, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = os.path.join(top, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode) or not mode & TAMED_BITS:
                continue
            os.chmod(path, stat.S_IMODE(mode) & ~TAMED_BITS)  # not a link: lstat said so, and the tree is ours
            changed += 1
    return changed


def list_images(cache_root: str | os.PathLike) -> list[dict]:
    """The images cached under an artifact cache's root (``gpulayer image list``), most recently used first:
    each ``{"digest", "ref", "bytes", "last_used"}``."""
    images = Path(cache_root) / IMAGES_DIR
    found = []
    for entry in sorted(images.iterdir()) if images.is_dir() else []:
        meta = entry / META
        if entry.name.startswith(".") or not meta.is_file():
            continue
        try:
            info = json.loads(meta.read_text())
            found.append({"digest": info["manifest"], "ref": info.get("ref"), "bytes": int(info.get("bytes", 0)),
                          "last_used": meta.stat().st_mtime})
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(found, key=lambda image: -image["last_used"])


class ImageCache:
    """Unpacked images by manifest digest under ``<cache root>/images``, within the cache's size limit."""

    def __init__(self, cache: ArtifactCache, umoci: str | None = None):
        self.cache = cache
        self.root = cache.root / IMAGES_DIR
        self.umoci = umoci if umoci is not None else shutil.which("umoci")
        self._lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._in_use: dict[str, int] = {}
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            os.chmod(self.root, 0o700)  # the agent's alone: no other local user enters an unpacked image
        except PermissionError:  # another user's folder: the artifact cache's checks at start say so
            log_event("image_cache_not_private", level=30, path=str(self.root))
        self.sweep_leftovers()

    def sweep_leftovers(self) -> list[str]:
        """Remove the build and eviction folders an agent killed mid-way left (``.build-<hex>-<pid>-...``,
        ``.gone-...``) whose agent is gone; returns their names."""
        removed = []
        for entry in self.root.iterdir() if self.root.is_dir() else []:
            if not entry.name.startswith((".build-", ".gone-")):
                continue
            if entry.name.startswith(".build-"):
                pid = entry.name.split("-")[2]
                if pid.isdigit() and (int(pid) == os.getpid() or os.path.exists(f"/proc/{pid}")):
                    continue  # an agent still running (maybe another one sharing the cache) is building it
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
        return removed

    def prepare(self, spec: ImageSpec, say: Callable[[str], None]) -> Prepared:
        """The unpacked image of ``spec`` (fetched and unpacked when this worker lacks it), held until
        `release`. Raises ImageError (or another TaskSetupError) with the reason."""
        manifest = spec.manifest or self._named(spec.ref or "")
        hex_digest = digest_hex(manifest)
        with self._lock:
            lock = self._locks.setdefault(hex_digest, threading.Lock())
            self._in_use[hex_digest] = self._in_use.get(hex_digest, 0) + 1
        try:
            with lock:
                home = self.root / hex_digest
                if not (home / META).is_file():
                    self._unpack(manifest, spec, home, say)
                else:
                    say(f"image {spec.ref or manifest} from the worker's cache")
                meta = json.loads((home / META).read_text())
                os.utime(home / META)
        except BaseException:
            self.release(manifest)
            raise
        return Prepared(manifest, home / "rootfs", ImageConfig(**meta["config"]))

    def release(self, manifest: str) -> None:
        """A task is done with its image (it may be evicted again)."""
        hex_digest = digest_hex(manifest)
        with self._lock:
            left = self._in_use.get(hex_digest, 0) - 1
            if left > 0:
                self._in_use[hex_digest] = left
            else:
                self._in_use.pop(hex_digest, None)

    def _named(self, ref: str) -> str:
        for image in list_images(self.cache.root):
            if ref in (image["ref"], image["digest"]) or (len(ref) >= 12 and digest_hex(image["digest"]).startswith(
                    ref.removeprefix("sha256:"))):
                return image["digest"]
        raise ImageError(f"no image {ref!r} in this worker's cache (`gpulayer image list` on the worker); submit "
                         "the image archive or layout instead")

    def _blob(self, digest: str, max_bytes: int) -> Path:
        try:
            return self.cache.get(digest, max_bytes)
        except DigestMismatch as exc:
            raise ImageError(f"image blob {digest}: {exc}") from None
        except UnpackLimit:
            raise ImageError(f"image blob {digest} is larger than its manifest says ({max_bytes} bytes)") from None

    def _unpack(self, manifest: str, spec: ImageSpec, home: Path, say: Callable[[str], None]) -> None:
        if self.umoci is None:
            raise ImageError("this worker cannot unpack images: umoci is not installed (Debian package umoci)")
        started = time.monotonic()
        build = self.root / f".build-{digest_hex(manifest)}-{os.getpid()}-{threading.get_ident()}"
        shutil.rmtree(build, ignore_errors=True)
        blobs = build / "layout" / "blobs" / "sha256"
        blobs.mkdir(parents=True)

        def fetched(digest: str, max_bytes: int) -> Path:
            # Linked into the build at once: the cache may evict it as the next blob arrives (an image larger
            # than the cache's limit), and a link keeps its bytes until the build is removed.
            return _link(self._blob(digest, max_bytes), blobs / digest_hex(digest))
        try:
            manifest_path = fetched(manifest, MAX_JSON_BYTES)
            parsed = parse_manifest(manifest_path.read_bytes())
            named = set(spec.blobs)
            for digest in [parsed.config, *(layer.digest for layer in parsed.layers)]:
                if digest not in named:
                    raise ImageError(f"the manifest names blob {digest}, which the job's image does not list")
            config = parse_config(fetched(parsed.config, MAX_JSON_BYTES).read_bytes())
            for layer in parsed.layers:
                check_layer(fetched(layer.digest, layer.size), self.cache.max_bytes)
            (build / "layout" / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
            size = manifest_path.stat().st_size
            (build / "layout" / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
                {"mediaType": MANIFEST_TYPE, "digest": manifest, "size": size,
                 "annotations": {"org.opencontainers.image.ref.name": "task"}}]}))
            done = subprocess.run([self.umoci, "unpack", "--rootless", "--image", f"{build / 'layout'}:task",
                                   str(build / "bundle")], capture_output=True, text=True, timeout=UMOCI_TIMEOUT_S)
            if done.returncode != 0:
                why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
                raise ImageError(f"umoci could not unpack the image: {why}")
            staged = build / "image"
            staged.mkdir()
            os.rename(build / "bundle" / "rootfs", staged / "rootfs")
            os.chmod(staged / "rootfs", 0o755)
            tame(staged / "rootfs")
            used = tree_bytes(staged / "rootfs")
            (staged / META).write_text(json.dumps({"manifest": manifest, "ref": spec.ref, "bytes": used,
                                                   "config": asdict(config)}))
            shutil.rmtree(home, ignore_errors=True)
            os.rename(staged, home)
        except subprocess.TimeoutExpired:
            raise ImageError("umoci took too long to unpack the image") from None
        finally:
            shutil.rmtree(build, ignore_errors=True)
        say(f"image {spec.ref or manifest} unpacked: {len(parsed.layers)} layers, {used} bytes, "
            f"{time.monotonic() - started:.1f} s")
        log_event("image_unpacked", manifest=manifest, ref=spec.ref, bytes=used)
        self.evict(keep=digest_hex(manifest))

    def evict(self, keep: str | None = None) -> list[str]:
        """Remove the least recently used images not in use until the images and artifacts fit the cache's
        limit; returns the digests removed."""
        removed = []
        artifacts = sum(size for _, size, _ in self.cache.entries())
        images = list_images(self.cache.root)
        total = artifacts + sum(image["bytes"] for image in images)
        for image in reversed(images):  # oldest first
            if total <= self.cache.max_bytes:
                break
            hex_digest = digest_hex(image["digest"])
            with self._lock:
                if hex_digest == keep or self._in_use.get(hex_digest):
                    continue
                doomed = self.root / hex_digest
                gone = self.root / f".gone-{hex_digest}-{time.monotonic_ns()}"
                try:
                    os.rename(doomed, gone)
                except OSError:
                    continue
            shutil.rmtree(gone, ignore_errors=True)
            total -= image["bytes"]
            removed.append(image["digest"])
            log_event("image_evicted", manifest=image["digest"], bytes=image["bytes"])
        return removed


def _link(source: Path, target: Path) -> Path:
    """``target``, a hard link of ``source`` (a copy across file systems)."""
    if not target.exists():
        try:
            os.link(source, target)
        except OSError:
            shutil.copyfile(source, target)
    return target
