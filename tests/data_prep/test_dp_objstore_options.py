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


@pytest.mark.parametrize("name", ["account_key", "connection_string", "access_key", "sas_token", "client_credential",
                                  "AWS_SESSION_TOKEN", "passphrase"])
def test_any_name_with_a_credential_word_is_refused_naming_the_provider_chains(name):
    with pytest.raises(ValueError, match="AZURE_STORAGE_CONNECTION_STRING") as e:
        objstore.configure({name: "x"})
    assert f"--storage-option {name}=..." in str(e.value) and "GOOGLE_APPLICATION_CREDENTIALS" in str(e.value)


def test_ordinary_options_are_accepted_and_reach_the_filesystem():
    options = {"endpoint_url": "http://127.0.0.1:9000", "anon": False, "use_ssl": True, "requester_pays": False,
               "default_block_size": 1 << 20}
    try:
        objstore.configure(options)
        fs, path = objstore.filesystem("s3://b/k")  # s3fs builds the instance without contacting anything
        assert fs.storage_options == options and path == "b/k"
        assert (fs.endpoint_url, fs.default_block_size, fs.requester_pays) == ("http://127.0.0.1:9000", 1 << 20, False)
    finally:
        objstore.configure({})
    assert objstore.filesystem("s3://b/k")[0].storage_options == {}  # reset: the next run starts without them


@pytest.mark.parametrize("url", ["s3://AKIAUSER:hunter2-SENT@bucket/in", "gs://hunter2-SENT@bucket/x",
                                 "http://user:hunter2-SENT@host:9000"])
def test_urls_with_userinfo_are_refused_without_echoing_them(url):
    for check in (lambda: objstore.check_url(url, "input"), lambda: objstore.filesystem(url),
                  lambda: objstore.configure({"endpoint_url": url})):
        with pytest.raises(ValueError, match="credentials in a URL are refused") as e:
            check()
        assert "hunter2-SENT" not in str(e.value) and "***@" in str(e.value)
    objstore.check_url("s3://bucket/key@v2/x.jsonl")  # an "@" in the key is no userinfo


def test_cli_refuses_userinfo_in_inputs_output_and_endpoint_without_echoing_it(tmp_path):
    secret = "s3://AKIAUSER:hunter2-SENT@bucket/p"
    for args in (["tokenize", secret, "-o", tmp_path / "o"], ["tokenize", tmp_path, "-o", secret],
                 ["tokenize", tmp_path, "-o", "s3://b/o", "--storage-option", "endpoint_url=http://u:hunter2-SENT@h"],
                 ["slurm", "--tasks", 2, "--dry-run", "--scripts-dir", tmp_path / "scripts", "--", "tokenize",
                  secret, "-o", tmp_path / "o"]):
        r = run_cli(*args, "-t", "tok.model", check=False)
        assert r.returncode == 2 and "credentials in a URL are refused" in r.stderr, r.stderr
        assert "hunter2-SENT" not in r.stderr + r.stdout
    assert not (tmp_path / "o").exists() and not (tmp_path / "scripts").exists()


PRESIGNED = [  # each carries SENT in its credential parameters only
    "https://bucket.s3.amazonaws.com/in/a.jsonl?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIASENT%2F20261201"
    "%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20261201T000000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host"
    "&X-Amz-Signature=0a1bSENT",
    "s3://bucket/in/a.jsonl?X-Amz-Security-Token=FwoSENT&X-Amz-Signature=99SENT",
    "https://storage.googleapis.com/bucket/a.jsonl?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=svcSENT"
    "&X-Goog-Signature=77SENT",
    "https://acct.blob.core.windows.net/container/a.jsonl?sv=2022-11-02&se=2026-12-31&sp=r&sig=abSENT%3D",
    "https://bucket.s3.amazonaws.com/a.jsonl?AWSAccessKeyId=AKIASENT&Expires=1767225600&Signature=c2lnSENT",
]


@pytest.mark.parametrize("url", PRESIGNED)
def test_presigned_urls_are_refused_naming_the_parameter_without_echoing_it(url):
    for check in (lambda: objstore.check_url(url, "input"), lambda: objstore.filesystem(url),
                  lambda: objstore.configure({"endpoint_url": url})):
        with pytest.raises(ValueError, match="a presigned or signed URL is refused: its [A-Za-z-]*[Ss]ig[a-z]*= ") \
                as e:
            check()
        assert "SENT" not in str(e.value) and "=***" in str(e.value) and "AWS_ACCESS_KEY_ID" in str(e.value)
    objstore.check_url("s3://bucket/a.jsonl?versionId=3")  # a query without a credential is no signature


def test_cli_refuses_presigned_inputs_output_and_endpoint_before_writing_anything(tmp_path):
    """The filter of userinfo let these through: they reached plan.json, manifests and the rendered Slurm script."""
    import argparse

    from data_prep.cli import _storage_option
    from data_prep.settings import Settings

    url = PRESIGNED[0]
    for args, flag in ((["tokenize", tmp_path, "-o", url], "-o/--output "),
                       (["slurm", "--tasks", 2, "--dry-run", "--scripts-dir", tmp_path / "scripts", "--", "tokenize",
                         url, "-o", tmp_path / "o"], "input ")):
        r = run_cli(*args, "-t", "tok.model", check=False)
        assert r.returncode == 2 and flag + "https://" in r.stderr and "presigned or signed URL" in r.stderr, r.stderr
        assert "SENT" not in r.stderr + r.stdout
    assert not (tmp_path / "o").exists() and not (tmp_path / "scripts").exists()
    with pytest.raises(ValueError, match="^input https://.*presigned") as e:
        Settings(inputs=[url], output_dir=str(tmp_path / "o"), tokenizer="tok.model")
    with pytest.raises(argparse.ArgumentTypeError, match="^--storage-option endpoint_url https://.*presigned") as e2:
        _storage_option(f"endpoint_url={url}")
    assert "SENT" not in str(e.value) + str(e2.value)
