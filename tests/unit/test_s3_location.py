"""The S3 addresses bls-publish and bls-serve take: tritonserver's own forms."""

from __future__ import annotations

import pytest

from bls_pipeline.serve.s3 import S3Location, is_s3


@pytest.mark.parametrize("url, endpoint, bucket, prefix", [
    ("s3://bucket/path/to/models", None, "bucket", "path/to/models/"),
    ("s3://bucket", None, "bucket", ""),
    ("s3://127.0.0.1:9000/bucket/models", "http://127.0.0.1:9000", "bucket", "models/"),
    ("s3://https://minio.local:443/bucket/models/", "https://minio.local:443", "bucket", "models/"),
])
def test_parse(url, endpoint, bucket, prefix):
    location = S3Location.parse(url)
    assert (location.endpoint, location.bucket, location.prefix) == (endpoint, bucket, prefix)
    assert S3Location.parse(location.url()) == location  # the address Triton gets back


@pytest.mark.parametrize("url", ["s3://", "s3://127.0.0.1:9000/", "/models", "gs://bucket/models"])
def test_an_address_without_a_bucket_says_what_to_write(url):
    with pytest.raises(ValueError, match="s3://bucket/path"):
        S3Location.parse(url)


def test_is_s3():
    assert is_s3("s3://b/m") and not is_s3("models") and not is_s3("/tmp/s3:/x")
