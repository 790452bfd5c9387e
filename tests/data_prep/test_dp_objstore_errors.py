"""Object storage without credentials, with refused credentials or without permission: one line naming the URL, exit
2, no secret, before any work (issue 22 item 4); `slurm --dry-run` probes the inputs and the output (a probe object
written and deleted) before any script is written.

Against moto's real S3 server on loopback (tests/support/s3.py), with its IAM enforcement switched on for the tests
that need it (POST /moto-api/reset-auth 0: every request is then checked against moto's IAM users and policies) and
off again after. Tier ``ssh``: the tests start a service (the S3 server)."""

import contextlib
import json
import urllib.request

import pytest
from tests.support.data_prep import run_cli
from tests.support.s3 import ACCESS_KEY, SECRET_KEY, s3_server

pytestmark = pytest.mark.ssh

DOCS = [f"document {i} with a few words of text" for i in range(30)]


def _policy(*statements):
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": list(actions), "Resource": list(resources)} for actions, resources in statements]})


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """The server, a corpus bucket, an output bucket, and two IAM users (made while IAM is not enforced): a reader
    (list and read both buckets, write nothing) and a lister (list the corpus, read no object)."""
    with s3_server(str(tmp_path_factory.mktemp("s3auth"))) as server:
        c = server.client()
        for b in ("corpus", "shards"):
            c.create_bucket(Bucket=b)
        c.put_object(Bucket="corpus", Key="in/part.jsonl", Body=b"".join(json.dumps({"text": t}).encode() + b"\n"
                                                                           for t in DOCS))
        import boto3

        iam = boto3.client("iam", endpoint_url=server.endpoint, aws_access_key_id=ACCESS_KEY,
                           aws_secret_access_key=SECRET_KEY, region_name="us-east-1")
        both = ["arn:aws:s3:::corpus", "arn:aws:s3:::corpus/*", "arn:aws:s3:::shards", "arn:aws:s3:::shards/*"]
        users = {"reader": _policy((["s3:GetObject", "s3:ListBucket"], both)),
                 "lister": _policy((["s3:ListBucket"], ["arn:aws:s3:::corpus"]))}
        server.keys = {}
        for user, policy in users.items():
            iam.create_user(UserName=user)
            iam.put_user_policy(UserName=user, PolicyName="p", PolicyDocument=policy)
            k = iam.create_access_key(UserName=user)["AccessKey"]
            server.keys[user] = (k["AccessKeyId"], k["SecretAccessKey"])
        yield server


@contextlib.contextmanager
def iam_enforced(server):
    def reset(count: str):
        req = urllib.request.Request(f"{server.endpoint}/moto-api/reset-auth", data=count.encode(), method="POST",
                                     headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(req, timeout=30).read()

    reset("0")
    try:
        yield
    finally:
        reset("inf")


def _env(server, user=None, keys=None):
    """botocore's own chain only: the endpoint, and the user's keys (or the given ones, or none at all)."""
    env = server.env(AWS_EC2_METADATA_DISABLED="true")
    key_id, secret = keys or (server.keys[user] if user else (None, None))
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        env.pop(k, None)
    if key_id:
        env.update(AWS_ACCESS_KEY_ID=key_id, AWS_SECRET_ACCESS_KEY=secret)
    return env


def _refused(r) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "botocore" not in r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


def test_no_credentials_is_one_line_naming_the_url(tmp_path, s3, sp_model):
    r = run_cli("tokenize", "s3://corpus/in/", "-o", tmp_path / "out", "-t", sp_model, "-j", "1", check=False,
                env_extra=_env(s3))
    line = _refused(r)
    assert line.startswith("error: s3://corpus/in/: no usable credentials (NoCredentialsError); set them in the "
                           "provider's chain: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_PROFILE")
    assert not (tmp_path / "out" / "plan.json").exists()


def test_refused_keys_are_one_line_and_never_printed(tmp_path, s3, sp_model):
    wrong = ("AKIAWRONGSENTINEL000", "wr0ng/SENTINEL+secret")
    with iam_enforced(s3):
        r = run_cli("tokenize", "s3://corpus/in/", "-o", tmp_path / "out", "-t", sp_model, "-j", "1", check=False,
                    env_extra=_env(s3, keys=wrong))
    line = _refused(r)
    assert line.startswith("error: s3://corpus/in/: the storage service refused the credentials "
                           "(InvalidAccessKeyId); check the keys, profile or session token")
    assert s3.endpoint in line  # the endpoint it asked, to check
    for secret in wrong:
        assert secret not in r.stdout + r.stderr


def test_an_output_the_credentials_cannot_write_is_refused_before_any_work(tmp_path, s3, sp_model):
    with iam_enforced(s3):
        r = run_cli("tokenize", "s3://corpus/in/", "-o", "s3://shards/run", "-t", sp_model, "-j", "1", check=False,
                    env_extra=_env(s3, "reader"))
    line = _refused(r)
    assert line == ("error: output s3://shards/run: access denied (AccessDenied) to write it; the credentials in "
                    "use need s3:PutObject, s3:GetObject, s3:DeleteObject and s3:ListBucket there "
                    "(docs/object_storage.md, Permissions)")
    assert s3.client().list_objects_v2(Bucket="shards", Prefix="run/").get("KeyCount", 0) == 0
    assert s3.keys["reader"][1] not in r.stdout + r.stderr


def test_an_input_that_can_be_listed_but_not_read_is_refused_by_the_probe(tmp_path, s3, sp_model):
    out = tmp_path / "out"
    with iam_enforced(s3):
        r = run_cli("tokenize", "s3://corpus/in/", "-o", out, "-t", sp_model, "-j", "1", check=False,
                    env_extra=_env(s3, "lister"))
    line = _refused(r)
    assert line.startswith("error: input s3://corpus/in/part.jsonl: access denied (AccessDenied) to read it; the "
                           "credentials in use need s3:GetObject and s3:ListBucket there")
    assert sorted(p.name for p in out.iterdir()) == []  # refused before the plan: nothing written


def test_slurm_dry_run_probes_inputs_and_output_before_writing_scripts(tmp_path, s3, sp_model):
    scripts = tmp_path / "scripts"
    args = ["slurm", "--tasks", "4000", "--dry-run", "--scripts-dir", scripts, "--", "tokenize", "s3://corpus/in/",
            "-o", "s3://shards/web", "-t", sp_model]
    with iam_enforced(s3):
        r = run_cli(*args, check=False, env_extra=_env(s3, "reader"))
    assert _refused(r).startswith("error: output s3://shards/web: access denied (AccessDenied) to write it")
    assert not scripts.exists()

    r = run_cli(*args, env_extra=_env(s3, keys=(ACCESS_KEY, SECRET_KEY)))  # IAM off: the probe object goes through
    assert "# probed: inputs: 1 file(s) or object(s) listed" in r.stdout
    assert "# probed: s3://corpus/in/part.jsonl: field 'text' holds text" in r.stdout
    assert "# probed: output s3://shards/web: writable (a probe object was written and deleted)" in r.stdout
    assert (scripts / "array_0000.sbatch").exists()
    assert s3.client().list_objects_v2(Bucket="shards", Prefix="web/").get("KeyCount", 0) == 0  # probe removed
