"""Object-storage options without a server: what counts as a URL, and credentials refused as options (unit tier)."""
import pytest

from data_prep import io, objstore
from tests.support.data_prep import run_cli

pytestmark = pytest.mark.unit


def test_urls_and_plain_paths():
    assert objstore.is_url("s3://b/k") and objstore.is_url("gs://b/k")
    assert not objstore.is_url("/data/x.jsonl") and not objstore.is_url("file:///data/x") and not objstore.is_url("a")
    assert io.abspath("file:///data/x.jsonl") == "/data/x.jsonl" and io.abspath("s3://b/k/") == "s3://b/k/"
    assert io.join("s3://b/out/", "shard_000000.bin") == "s3://b/out/shard_000000.bin"


@pytest.mark.parametrize("name", ["key", "secret", "token", "aws_secret_access_key", "client_secret", "Password"])
def test_credentials_are_not_options(name):
    with pytest.raises(ValueError, match="AWS_SECRET_ACCESS_KEY"):
        objstore.configure({name: "x"})


def test_cli_refuses_a_secret_option_without_echoing_it(tmp_path):
    r = run_cli("tokenize", tmp_path, "-o", "s3://b/o", "-t", "tok.model", "--storage-option", "secret=hunter2-SENT",
                check=False)
    assert r.returncode == 2 and "credentials are not taken as options" in r.stderr
    assert "hunter2-SENT" not in r.stderr + r.stdout
