"""A model repository in an S3 bucket: the address Triton takes, a check that the bucket
answers before a server starts, and `bls-publish`, which uploads a local repository.

One address serves both sides: `s3://bucket/path` (AWS, the region from the environment)
or `s3://host:port/bucket/path` (any S3-compatible endpoint, `s3://https://host:port/...`
for TLS), exactly as tritonserver's --model-repository takes it. Credentials and region
come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION),
the same variables tritonserver reads.

Triton copies each model's folder, alone, from the bucket to local disk: a flow model finds
no sibling folder there, so `publish` also puts a copy of the config and labels of every
model a flow calls into the flow's folder (children/<model>/; runtime.children reads them).

S3 has objects, not folders: a folder with no file in it does not exist there. An
ensemble's version folder holds nothing, so `publish` writes a placeholder file into every
empty folder; without it Triton finds no version of the ensemble and fails its load.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PLACEHOLDER", "S3Error", "S3Location", "check_access", "download_for_planning", "is_s3", "main", "publish"]

log = logging.getLogger(__name__)

# The file publish writes into an empty folder so that the folder exists in the bucket.
PLACEHOLDER = ".keep"
# Never uploaded: Python's caches and the launcher's own leftovers.
_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc",)
# download_for_planning fetches files up to this size; larger ones (the artifacts) are only
# checked to exist, with an empty stand-in.
_PLANNING_MAX_BYTES = 1 << 20
_REGION_VARS = ("AWS_DEFAULT_REGION", "AWS_REGION")


class S3Error(RuntimeError):
    """The bucket cannot be used as given: the message says what to set or fix."""


@dataclass(frozen=True)
class S3Location:
    endpoint: str | None  # http(s)://host:port, None for AWS itself
    bucket: str
    prefix: str  # "" or "path/to/repo/" (always ends in /)

    @classmethod
    def parse(cls, url: str) -> "S3Location":
        """`s3://bucket/path`, `s3://host:port/bucket/path` or `s3://https://host:port/bucket/path`."""
        if not is_s3(url):
            raise ValueError(f"not an S3 address: {url!r} (write s3://bucket/path or s3://host:port/bucket/path)")
        rest = url[len("s3://"):]
        scheme = "http"
        for given in ("https://", "http://"):
            if rest.startswith(given):
                scheme, rest = given[:-3], rest[len(given):]
        parts = [p for p in rest.split("/") if p]
        endpoint = None
        if parts and ":" in parts[0]:
            endpoint = f"{scheme}://{parts.pop(0)}"
        if not parts:
            raise ValueError(f"no bucket in {url!r}: write s3://bucket/path or s3://host:port/bucket/path")
        bucket, path = parts[0], "/".join(parts[1:])
        return cls(endpoint, bucket, f"{path}/" if path else "")

    def url(self, *more: str) -> str:
        host = f"{self.endpoint.replace('http://', '')}/" if self.endpoint else ""
        return "s3://" + host + "/".join(p.strip("/") for p in (self.bucket, self.prefix, *more) if p.strip("/"))


def is_s3(repository: str | os.PathLike) -> bool:
    return str(repository).startswith("s3://")


def _client(location: S3Location):
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise S3Error("an S3 model repository needs boto3: pip install 'bls-pipeline[s3]'") from None
    region = next((os.environ[v] for v in _REGION_VARS if os.environ.get(v)), None)
    if region is None:
        raise S3Error("no AWS region: set AWS_DEFAULT_REGION (tritonserver reads it, and S3 needs it to sign "
                      "requests; for a local S3-compatible server any name works, e.g. us-east-1)")
    if not (os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY")):
        raise S3Error("no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                      "(tritonserver reads the same variables)")
    config = Config(region_name=region, retries={"max_attempts": 2, "mode": "standard"},
                    s3={"addressing_style": "path"} if location.endpoint else {})
    # A session of its own: boto3's default one keeps the credentials it first read.
    return boto3.session.Session().client("s3", endpoint_url=location.endpoint, config=config)


def _explain(exc: Exception, location: S3Location) -> S3Error:
    """One line that names what to fix, from a botocore error."""
    from botocore.exceptions import ClientError, EndpointConnectionError

    where = location.url()
    if not isinstance(exc, ClientError) and isinstance(exc.__context__, ClientError):  # boto3's transfer wraps it
        exc = exc.__context__
    if isinstance(exc, EndpointConnectionError):
        return S3Error(f"cannot reach the S3 endpoint of {where}: {exc}")
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidClientTokenId", "AuthFailure"):
            return S3Error(f"S3 refused the credentials for {where} ({code}): check AWS_ACCESS_KEY_ID and "
                           "AWS_SECRET_ACCESS_KEY")
        if code in ("AccessDenied", "403"):
            return S3Error(f"S3 denied access to {where} (AccessDenied): the credentials' policy must allow "
                           "s3:ListBucket and s3:GetObject there (s3:PutObject to publish)")
        if code in ("NoSuchBucket", "404"):
            return S3Error(f"no bucket {location.bucket!r} at {location.endpoint or 'AWS'}: create it, or fix the "
                           "address")
        return S3Error(f"S3 error on {where}: {code}: {exc}")
    return S3Error(f"S3 error on {where}: {type(exc).__name__}: {exc}")


def _keys(client, location: S3Location) -> dict[str, int]:
    """Every object under the location: relative key -> size."""
    found: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=location.bucket, Prefix=location.prefix):
        for obj in page.get("Contents", []):
            found[obj["Key"][len(location.prefix):]] = obj["Size"]
    return found


def check_access(url: str) -> dict[str, int]:
    """The repository's objects (key -> size); S3Error naming the cause when the region, the
    credentials or the bucket are wrong, or when no model is there."""
    location = S3Location.parse(url)
    client = _client(location)
    try:
        keys = _keys(client, location)
    except Exception as exc:  # noqa: BLE001 - turned into one line naming the cause
        raise _explain(exc, location) from None
    if not any(k.count("/") == 1 and k.endswith("/config.pbtxt") for k in keys):
        raise S3Error(f"no model in {location.url()}: no <model>/config.pbtxt there (publish one with bls-publish)")
    return keys


def download_for_planning(url: str, dest: Path) -> Path:
    """A local view of the repository for the launcher's load plan: configs, flows and labels
    as they are, every file larger than 1 MiB (the artifacts) as an empty stand-in (the plan
    checks only that they exist). Tritonserver reads the bucket itself."""
    location = S3Location.parse(url)
    keys = check_access(url)
    client = _client(location)
    for key, size in keys.items():
        target = dest / key
        target.parent.mkdir(parents=True, exist_ok=True)
        if size > _PLANNING_MAX_BYTES:
            target.touch()
            continue
        try:
            client.download_file(location.bucket, location.prefix + key, str(target))
        except Exception as exc:  # noqa: BLE001
            raise _explain(exc, location) from None
    return dest


def _files(root: Path) -> tuple[list[Path], list[Path]]:
    """The files to upload (links followed: S3 has none) and the folders with none."""
    files, empty = [], []
    for folder, dirs, names in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        kept = [Path(folder) / n for n in sorted(names) if not n.endswith(_SKIP_SUFFIXES)]
        files.extend(kept)
        if not kept and not dirs and Path(folder) != root:
            empty.append(Path(folder))
    return files, empty


def _children_copies(repo: Path, models: tuple[str, ...] | None) -> dict[str, Path]:
    """key -> local file: for each flow model (and ensemble step), the config and labels of every model it calls,
    under <flow model>/children/<model>/ (Triton copies a model's folder alone from S3, so
    the flow finds no sibling there: runtime.children.load_child reads these instead)."""
    from ..runtime.load.children import CHILDREN_DIR
    from ..runtime.load.loader import is_flow_model
    from ..base.modelconfig import string_parameters
    from .repository import Repository

    whole = Repository.read(repo)
    copies: dict[str, Path] = {}
    for name in models or tuple(whole.configs):
        # A flow model calls what its flow declares; a step that reads its classifier's
        # config (the ensemble's pre/postprocessing) names it in its `classifier` parameter.
        if name not in whole.configs:
            continue  # a broken config.pbtxt (Repository.broken): uploaded as it is, Triton's load names it
        named = string_parameters(whole.configs[name]).get("classifier")
        children = whole.callees[name] if is_flow_model(repo / name) else (named,) if named else ()
        for child in children:
            config = whole.configs.get(child)
            if config is None:
                continue  # the flow's load names it
            labels = {o.label_filename for o in config.output if o.label_filename}
            for file in ("config.pbtxt", *sorted(labels)):
                if (repo / child / file).is_file():
                    copies[f"{name}/{CHILDREN_DIR}/{child}/{file}"] = repo / child / file
    return copies


@dataclass(frozen=True)
class PublishReport:
    uploaded: tuple[str, ...]  # keys relative to the repository address
    placeholders: tuple[str, ...]  # the folders that got a PLACEHOLDER
    bytes: int


def publish(repo: Path, url: str, *, models: tuple[str, ...] | None = None, placeholders: bool = True,
            progress: bool = True) -> PublishReport:
    """Upload `repo` (or only `models` of it) to the S3 address `url`, links followed, with a
    placeholder in every empty folder (placeholders=False leaves them out: for a test that
    shows why they are needed)."""
    from tqdm import tqdm

    repo = Path(repo)
    if not repo.is_dir() or not any(repo.glob("*/config.pbtxt")):
        raise S3Error(f"no model repository at {repo}: give a folder of model folders")
    if models:
        unknown = [m for m in models if not (repo / m / "config.pbtxt").is_file()]
        if unknown:
            raise S3Error(f"no such model in {repo}: {', '.join(unknown)}")
    location = S3Location.parse(url)
    client = _client(location)
    roots = [repo / m for m in models] if models else [repo]
    files, empty = [], []
    for root in roots:
        f, e = _files(root)
        files += f
        empty += e + ([root] if not f and not e else [])
    copies = _children_copies(repo, models)
    total = sum(p.stat().st_size for p in files) + sum(p.stat().st_size for p in copies.values())
    uploaded, written = [], []
    try:
        # wrong keys or bucket: say so before uploading
        client.list_objects_v2(Bucket=location.bucket, Prefix=location.prefix, MaxKeys=1)
        with tqdm(total=total, unit="B", unit_scale=True, desc=f"publishing to {location.url()}",
                  disable=not progress) as bar:
            for path in files:
                key = path.relative_to(repo).as_posix()
                client.upload_file(str(path), location.bucket, location.prefix + key, Callback=bar.update)
                uploaded.append(key)
            for key, path in copies.items():
                client.upload_file(str(path), location.bucket, location.prefix + key, Callback=bar.update)
                uploaded.append(key)
            if placeholders:
                for folder in empty:
                    key = f"{folder.relative_to(repo).as_posix()}/{PLACEHOLDER}"
                    client.put_object(Bucket=location.bucket, Key=location.prefix + key, Body=b"")
                    written.append(folder.relative_to(repo).as_posix())
    except S3Error:
        raise
    except Exception as exc:  # noqa: BLE001 - one line naming the cause
        raise _explain(exc, location) from None
    return PublishReport(tuple(uploaded), tuple(written), total)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bls-publish",
                                description="Upload a model repository to S3 (empty folders kept with a placeholder).")
    p.add_argument("repository", type=Path, help="the local model repository (e.g. models)")
    p.add_argument("url", help="s3://bucket/path, or s3://host:port/bucket/path for an S3-compatible server")
    p.add_argument("--models", help="comma-separated models to upload (default: all): e.g. a new version of one")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        report = publish(args.repository, args.url, models=tuple(args.models.split(",")) if args.models else None)
    except (S3Error, ValueError) as exc:
        print(f"bls-publish: error: {exc}", file=sys.stderr)
        return 2
    print(f"uploaded {len(report.uploaded)} files ({report.bytes / 1e6:.1f} MB) to {args.url}")
    for folder in report.placeholders:
        print(f"  {folder}/ is empty: wrote {folder}/{PLACEHOLDER} so that it exists in the bucket")
    return 0


if __name__ == "__main__":
    sys.exit(main())
