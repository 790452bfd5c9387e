"""A real S3-protocol server on loopback for the object-storage tests: moto's standalone server in a subprocess.

``s3_server(tmp)`` starts ``python -m moto.server`` on 127.0.0.1 and a free port, waits until it answers, and stops it
(and only it) at the end. The server keeps a request log (moto's recorder) that the tests read to count real
requests (ListObjectsV2 pages, GETs), server side: no mock in the client.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from typing import Dict, Iterator, List

from recipes.parallel.rendezvous import free_port

# Test credentials: moto accepts any; sentinels, so a test can prove they reach no log, manifest or command line.
ACCESS_KEY = "AKIASENTINEL0ACCESS7"
SECRET_KEY = "s3cr3t/SENTINEL+k3y9f2"
MIN_PART = 256 << 10  # the server's smallest multipart part (S3: 5 MiB), so tests upload in parts without 5 MiB shards


@dataclass
class S3Server:
    endpoint: str
    recording: str

    def env(self, **extra) -> Dict[str, str]:
        """An environment whose botocore finds this server and the sentinel credentials by its own chain."""
        env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                   AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL_S3=self.endpoint,
                   AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
        env.pop("AWS_PROFILE", None)
        env.update(extra)
        return env

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name="us-east-1")

    def _api(self, action: str) -> bytes:
        req = urllib.request.Request(f"{self.endpoint}/moto-api/recorder/{action}", method="POST" if action !=
                                     "download-recording" else "GET")
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.read()

    @contextlib.contextmanager
    def recording_requests(self) -> Iterator[List[dict]]:
        """Record the server's requests inside the block; the list is filled (method, url) when it ends."""
        out: List[dict] = []
        self._api("reset-recording")
        self._api("start-recording")
        try:
            yield out
        finally:
            self._api("stop-recording")
            for line in self._api("download-recording").decode().splitlines():
                if line.strip():
                    e = json.loads(line)
                    out.append({"method": e["method"], "url": e["url"], "headers": e.get("headers", {})})


@contextlib.contextmanager
def s3_server(tmp: str) -> Iterator[S3Server]:
    port = free_port()
    recording = os.path.join(tmp, "moto_requests.jsonl")
    env = dict(os.environ, MOTO_RECORDER_FILEPATH=recording, S3_UPLOAD_PART_MIN_SIZE=str(MIN_PART))
    log = open(os.path.join(tmp, "moto_server.log"), "wb")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"moto server did not start (exit {proc.poll()}); see {log.name}")
                time.sleep(0.2)
        yield S3Server(endpoint, recording)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
