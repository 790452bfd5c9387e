"""The storage error mapping (objstore.access_error) on the provider libraries' own exceptions: which failures become
one StorageAccessError line naming the URL (the CLI exits 2 on it), and which pass unchanged. The same failures from
a real S3 server, end to end through the CLI, are in test_dp_objstore_errors.py; this covers the cases a loopback
server cannot produce quickly (an unreachable endpoint: botocore retries for ~15 s)."""

import botocore.exceptions as be
import pytest

from data_prep import objstore

pytestmark = pytest.mark.unit


def _client_error(code: str) -> PermissionError:
    """What s3fs raises for a refused request: a PermissionError caused by botocore's ClientError."""
    cause = be.ClientError({"Error": {"Code": code, "Message": "server words"}}, "ListObjectsV2")
    try:
        raise PermissionError("server words") from cause
    except PermissionError as e:
        return e


def test_unreachable_endpoint_names_it_and_the_settings_to_check(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:1")
    e = objstore.access_error("s3://b/in/", be.EndpointConnectionError(endpoint_url="http://127.0.0.1:1/b"), "list")
    assert str(e) == ("s3://b/in/: cannot reach the storage endpoint http://127.0.0.1:1 (EndpointConnectionError); "
                      "check --storage-option endpoint_url / AWS_ENDPOINT_URL_S3 and the network")


def test_credential_failures_and_denials_are_told_apart():
    assert "no usable credentials (PartialCredentialsError)" in str(
        objstore.access_error("s3://b/k", be.PartialCredentialsError(provider="env", cred_var="AWS_SECRET_ACCESS_KEY")))
    assert "no usable credentials (ProfileNotFound)" in str(
        objstore.access_error("s3://b/k", be.ProfileNotFound(profile="prod")))
    assert "refused the credentials (ExpiredToken)" in str(objstore.access_error("s3://b/k", _client_error(
        "ExpiredToken")))
    denied = str(objstore.access_error("gs://b/k", _client_error("AccessDenied"), "write", role="output"))
    assert denied.startswith("output gs://b/k: access denied (AccessDenied) to write it; the credentials in use "
                             "need write access there")
    assert "server words" not in denied  # the service's own text is not repeated (it may quote request details)


def test_other_failures_pass_unchanged_through_the_mapping():
    assert objstore.access_error("s3://b/k", FileNotFoundError("no such key")) is None
    assert objstore.access_error("s3://b/k", ValueError("corrupt")) is None

    @objstore._maps_access_errors("read")
    def missing(url):
        raise FileNotFoundError(url)

    with pytest.raises(FileNotFoundError):
        missing("s3://b/k")

    @objstore._maps_access_errors("read")
    def no_keys(url):
        raise be.NoCredentialsError()

    with pytest.raises(objstore.StorageAccessError, match=r"^s3://b/k: no usable credentials"):
        no_keys("s3://b/k")
