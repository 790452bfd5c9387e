"""Object storage through fsspec: ``s3://`` (s3fs), ``gs://`` (gcsfs, if installed) and any other fsspec protocol.

Used by io.py only; everything else goes through io. What an object store changes, and how this handles it:
- no rename: outputs are written to a local staging file and uploaded whole (``upload``: one PUT, or a multipart
  upload above ``upload_part_size``); an object becomes visible only when its upload completes, never half-written;
- reads are ranged GETs of ``read_block`` bytes read ahead sequentially (``open_read``): a byte range or a parquet
  row group of a multi-GB object costs that range, not the object;
- listings are paged (S3 ListObjectsV2: 1,000 keys a page) and done once per run: ``list_tree`` keeps only
  (size, modification time) per object, and ``size``/``mtime_ns``/``exists`` answer from it without a request per
  file. A prefix listed this way is known whole: an object missing from it does not exist (no HEAD to ask again);
  writes through this module update what is known.
- credentials come from the provider's own chain (for S3: botocore's env vars, ~/.aws, instance roles); options
  given here (``configure``) may set endpoints and the like, never keys, so no secret is ever on a command line.
- no credentials, credentials refused, access denied or an unreachable endpoint become one ``StorageAccessError``
  (a PermissionError: the CLI exits 2) naming the URL, the cause and the fix (``access_error``), never a credential
  and never the provider's traceback.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import posixpath
import socket
import time
from datetime import datetime
from typing import BinaryIO, Dict, List, Optional, Tuple

log = logging.getLogger(__name__)

READ_BLOCK = 8 << 20  # bytes per ranged GET when streaming a unit (s3fs's own default is 50 MB)
PROBE_BLOCK = 64 << 10  # bytes per ranged GET when looking for a newline near a unit boundary
UPLOAD_PART = 64 << 20  # multipart upload part size: S3 allows 5 MiB..5 GiB and 10,000 parts (s3fs grows it past that)

# Option names that would carry a credential: refused, so secrets never reach argv, a rendered Slurm script,
# plan.json or a log. Any name containing one of these words (account_key, access_key, sas_token, client_secret...).
SECRET_WORDS = ("key", "secret", "token", "password", "passphrase", "credential", "connection_string")
CREDENTIAL_CHAINS = ("AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_PROFILE, ~/.aws/credentials or an instance role "
                     "for S3, GOOGLE_APPLICATION_CREDENTIALS for GCS, AZURE_STORAGE_CONNECTION_STRING or "
                     "AZURE_STORAGE_ACCOUNT_KEY for Azure")

# What each action needs on S3 (docs/object_storage.md, Permissions), for the access-denied message.
S3_PERMISSIONS = {"list": "s3:ListBucket", "read": "s3:GetObject and s3:ListBucket",
                  "write": "s3:PutObject, s3:GetObject, s3:DeleteObject and s3:ListBucket"}
# Error codes meaning the credentials themselves were refused (not a missing permission).
REFUSED_CREDENTIAL_CODES = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
                            "TokenRefreshRequired", "InvalidClientTokenId", "AuthFailure", "RequestTimeTooSkewed")
# Exception class names (botocore, google-auth, azure) for "no usable credentials" and "cannot connect": matched by
# name so that no provider package has to be importable here.
CREDENTIAL_ERROR_NAMES = ("Credential", "TokenLoad", "TokenRetrieval", "AuthToken", "SSO", "ProfileNotFound")
CONNECTION_ERROR_NAMES = ("EndpointConnectionError", "ConnectTimeoutError", "ProxyConnectionError",
                          "ClientConnectorError", "ServerTimeoutError", "ConnectionRefusedError")


class StorageAccessError(PermissionError):
    """No credentials, credentials refused, access denied or an unreachable endpoint for a URL: one line naming the
    URL, the cause and the fix (never a credential). A PermissionError, so the CLI reports it and exits 2."""


def _class_names(exc: BaseException) -> List[str]:
    return [c.__name__ for c in type(exc).__mro__]


def _error_code(exc: BaseException) -> str:
    """The service's error code (S3: AccessDenied, InvalidAccessKeyId...) from the exception or its cause."""
    for e in (exc, exc.__cause__, exc.__context__):
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            return str(response.get("Error", {}).get("Code") or "")
    return ""


def _endpoint() -> str:
    ep = _options.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return redact(str(ep)) if ep else "the provider's default"


def access_error(url: str, exc: BaseException, action: str = "read", role: str = "") -> Optional[StorageAccessError]:
    """The one-line error for a credential, permission or connection failure of ``action`` (list, read, write) on
    ``url`` (``role``: "input", "output", to name it so); None for anything else (a missing object, a corrupt file),
    which the caller handles as before."""
    if isinstance(exc, StorageAccessError):
        return exc
    names, code = _class_names(exc), _error_code(exc)
    where = f"{role} {redact(url)}" if role else redact(url)
    if any(k in n for n in names for k in CREDENTIAL_ERROR_NAMES):
        return StorageAccessError(f"{where}: no usable credentials ({type(exc).__name__}); set them in the "
                                  f"provider's chain: {CREDENTIAL_CHAINS}")
    if code in REFUSED_CREDENTIAL_CODES:
        return StorageAccessError(f"{where}: the storage service refused the credentials ({code}); check the keys, "
                                  f"profile or session token your provider chain gives (an expired session: log in "
                                  f"again), and the endpoint ({_endpoint()})")
    if isinstance(exc, PermissionError):
        need = S3_PERMISSIONS[action] if str(url).startswith("s3://") else f"{action} access"
        # a HEAD's refusal carries no code, only its status: refused credentials look the same
        invalid = " (or are not valid)" if code in ("", "403") else ""
        return StorageAccessError(f"{where}: access denied ({code or 'permission denied'}) to {action} it; the "
                                  f"credentials in use need {need} there{invalid} (docs/object_storage.md, "
                                  f"Permissions)")
    if any(n in CONNECTION_ERROR_NAMES for n in names):
        return StorageAccessError(f"{where}: cannot reach the storage endpoint {_endpoint()} "
                                  f"({type(exc).__name__}); check --storage-option endpoint_url / "
                                  f"AWS_ENDPOINT_URL_S3 and the network")
    return None


def _maps_access_errors(action: str, url_arg: int = 0):
    """Decorator: a credential, permission or connection failure of the wrapped function becomes
    ``access_error(<its positional argument url_arg>, ...)``; every other exception passes unchanged."""
    def wrap(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                mapped = access_error(args[url_arg], e, action)
                if mapped is None or mapped is e:
                    raise
                raise mapped from e
        return wrapper
    return wrap


_options: Dict[str, object] = {}
_part_size = UPLOAD_PART
_known: Dict[str, Tuple[int, int, str]] = {}  # URL -> (size, mtime_ns, ETag), from listings and our own writes
_listed: set = set()  # prefixes (URL + "/") whose whole listing is in _known


def is_url(path: str) -> bool:
    """True for a URL fsspec reads remotely (``s3://``, ``gs://``...); plain paths and ``file://`` are local."""
    scheme, sep, _ = str(path).partition("://")
    return bool(sep) and scheme.isidentifier() and scheme not in ("file", "local")


def local_path(path: str) -> str:
    """``file:///x`` -> ``/x``; anything else unchanged."""
    for prefix in ("file://", "local://"):
        if str(path).startswith(prefix):
            return path[len(prefix):]
    return path


def join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name if is_url(base) else os.path.join(base, name)


def _netloc(url: str) -> str:
    return str(url).partition("://")[2].split("/", 1)[0]


# Query parameters that carry a credential: presigned / signed URLs (S3 SigV4 X-Amz-Signature, X-Amz-Credential,
# X-Amz-Security-Token; S3 SigV2 Signature + AWSAccessKeyId; GCS X-Goog-Signature / Signature; Azure SAS sig) and any
# parameter named like a secret (access_token, key...). Such a URL is a bearer credential: whoever reads it can
# read (or write) the object until it expires.
_SIGNATURE_PARAMS = ("sig", "signature")


def _secret_query_params(url: str) -> list[str]:
    """Names of the query parameters of ``url`` that carry a credential (case-insensitive), in order."""
    from urllib.parse import parse_qsl, urlsplit

    query = urlsplit(str(url)).query
    names = [name for name, _ in parse_qsl(query, keep_blank_values=True)]
    return [n for n in names if n.lower() in _SIGNATURE_PARAMS or "signature" in n.lower()
            or any(w in n.lower() for w in SECRET_WORDS)]


def redact(url: str) -> str:
    """The URL with any user:password@ replaced by ***@ and the value of every credential-carrying query parameter
    (presigned URLs) by *** (for messages)."""
    url = str(url)
    netloc = _netloc(url)
    if "@" in netloc:
        scheme = url.partition("://")[0]
        url = f"{scheme}://***@{netloc.rpartition('@')[2]}{url[len(scheme) + 3 + len(netloc):]}"
    secret = {n.lower() for n in _secret_query_params(url)}
    if secret:
        base, _, query = url.partition("?")
        query, _, fragment = query.partition("#")
        parts = [f"{k}=***" if k.lower() in secret else f"{k}{sep}{v}"
                 for k, sep, v in (item.partition("=") for item in query.split("&"))]
        url = base + "?" + "&".join(parts) + (f"#{fragment}" if fragment else "")
    return url


def check_url(url: str, what: str = "URL") -> None:
    """Refuse a URL carrying credentials (``s3://user:pass@bucket/...``, ``http://user:pass@host``, a presigned
    ``https://...?X-Amz-Signature=...``): inputs and the output are recorded in plan.json, manifests, Slurm scripts and
    error messages. The message never echoes them."""
    # a bucket or host name cannot contain "@" (S3, GCS, Azure naming rules): one in the authority is userinfo
    if "://" in str(url) and "@" in _netloc(url):
        raise ValueError(f"{what} {redact(url)}: credentials in a URL are refused (they would be recorded in "
                         f"plan.json, manifests, Slurm scripts and errors); remove the user:password@ part and use "
                         f"the provider's own chain instead: {CREDENTIAL_CHAINS}")
    secret = sorted(_secret_query_params(url), key=lambda n: "sig" not in n.lower()) if "://" in str(url) else []
    if secret:  # name the signature first: the parameter users recognise
        raise ValueError(f"{what} {redact(url)}: a presigned or signed URL is refused: its {secret[0]}= parameter "
                         "is a credential (anyone who reads the URL can use it until it expires) and would be "
                         "recorded in plan.json, manifests, Slurm scripts and errors; give the plain object URL "
                         "(s3://bucket/key, gs://bucket/key, az://container/key) and let the provider's own chain "
                         f"supply the credential: {CREDENTIAL_CHAINS}")


def check_options(options: Dict[str, object]) -> None:
    """Refuse credentials as options: they belong in the provider's chain (env, ~/.aws, instance role)."""
    for name, value in options.items():
        if any(w in name.lower() for w in SECRET_WORDS):
            raise ValueError(f"--storage-option {name}=...: credentials are not taken as options (they would be on "
                             "the command line, in rendered Slurm scripts and in the run's settings); use the "
                             f"provider's own chain instead: {CREDENTIAL_CHAINS}")
        if isinstance(value, str):
            check_url(value, f"--storage-option {name}")


def configure(options: Optional[Dict[str, object]] = None, part_size: int = UPLOAD_PART) -> None:
    """Options for every remote filesystem of this process (e.g. ``endpoint_url`` of an S3-compatible store), and
    the multipart part size. Called by the driver and by each worker with the run's settings."""
    global _options, _part_size
    options = dict(options or {})
    check_options(options)
    if options != _options:
        _known.clear()
        _listed.clear()
    _options, _part_size = options, part_size


def filesystem(url: str):
    """(fsspec filesystem, path without protocol); fsspec caches the instance, so its connection pool is reused."""
    import fsspec.core

    check_url(url)
    try:
        return fsspec.core.url_to_fs(url, **_options)
    except ImportError as e:  # e.g. gs:// without gcsfs
        raise ValueError(f"{url}: no filesystem for this URL ({e}); install its fsspec package (s3fs, gcsfs...)") \
            from None


def _mtime_ns(info: dict) -> int:
    """A modification time from an fsspec info dict (S3 LastModified, gcs updated, local mtime), in ns; 0 if none."""
    for k in ("LastModified", "mtime", "updated", "last_modified", "modified"):
        v = info.get(k)
        if v is None:
            continue
        if isinstance(v, datetime):
            return int(v.timestamp() * 1e9)
        if isinstance(v, (int, float)):
            return int(v * 1e9)
        try:
            return int(datetime.fromisoformat(str(v).replace("Z", "+00:00")).timestamp() * 1e9)
        except ValueError:
            continue
    return 0


def _url(fs, path: str) -> str:
    return fs.unstrip_protocol(path)


def _remember(url: str, info: dict) -> None:
    _known[url] = (int(info.get("size") or 0), _mtime_ns(info), str(info.get("ETag") or ""))


def _under_listed(url: str) -> bool:
    return any(url.startswith(p) for p in _listed)


@_maps_access_errors("list")
def list_tree(url: str, progress_every: float = 2.0) -> List[str]:
    """Every object under ``url`` (a prefix), sorted, listed once with paged requests; only (size, time) is kept per
    object, for ``size``/``mtime_ns``. Long listings log their progress (objects, rate) at most every
    ``progress_every`` seconds, checked at each page."""
    fs, root = filesystem(url)
    t0 = last = time.monotonic()
    found: List[str] = []

    def note(info: dict) -> None:
        if info.get("type", "file") == "file":
            u = _url(fs, info["name"])
            _remember(u, info)
            found.append(u)

    def page_done() -> None:
        nonlocal last
        now = time.monotonic()
        if now - last >= progress_every:
            last = now
            log.info(f"listing {url}: {len(found):,} objects, {len(found) / max(now - t0, 1e-9):,.0f}/s")

    _walk_objects(fs, root, note, page_done)
    _listed.add(url.rstrip("/") + "/")
    if time.monotonic() - t0 >= progress_every:
        log.info(f"listed {url}: {len(found):,} objects in {time.monotonic() - t0:.1f} s")
    return sorted(found)


def _walk_objects(fs, root: str, note, page_done) -> None:
    """Call ``note(info)`` for each object under ``root`` and ``page_done()`` after each page. s3fs: one flat
    ListObjectsV2 request per 1,000 keys, each page handled as it arrives (nothing but our (size, time) is kept);
    other filesystems: fsspec's ``find`` (one listing, whole)."""
    if hasattr(fs, "_list_pages") and hasattr(fs, "split_path") and not getattr(fs, "version_aware", False):
        import fsspec.asyn

        bucket, key, _ = fs.split_path(root)
        prefix = key.rstrip("/") + "/" if key else ""

        async def page_through():
            # s3fs has no public per-page iterator; its paginator runs on its own event loop, as fs.find does
            async for page in fs._list_pages("list_objects_v2", Bucket=bucket, Prefix=prefix, **fs.req_kw):
                for c in page.get("Contents", []):
                    note({"name": f"{bucket}/{c['Key']}", "size": c["Size"], "LastModified": c["LastModified"],
                          "ETag": c.get("ETag"), "type": "file"})
                page_done()

        fsspec.asyn.sync(fs.loop, page_through)
        return
    for info in fs.find(root, detail=True).values():
        note(info)
    page_done()


def refresh_listing(url: str) -> None:
    """List an output prefix again (whole, paged), so completion checks see what other nodes wrote meanwhile."""
    prefix = url.rstrip("/") + "/"
    for u in [u for u in _known if u.startswith(prefix)]:
        del _known[u]
    _listed.discard(prefix)
    list_tree(url)


@_maps_access_errors("read")
def info(url: str) -> Optional[Tuple[int, int]]:
    """(size, mtime_ns) of an object, or None when it does not exist."""
    if url in _known:
        return _known[url][:2]
    if _under_listed(url):
        return None
    fs, path = filesystem(url)
    try:
        i = fs.info(path)
    except FileNotFoundError:
        return None
    if i.get("type") == "directory":
        return None
    _remember(url, i)
    return _known[url][:2]


@_maps_access_errors("read")
def exists(url: str) -> bool:
    if info(url) is not None:
        return True
    if _under_listed(url):
        return False
    fs, path = filesystem(url)
    return fs.exists(path)  # a prefix ("directory") of objects


def size(url: str) -> int:
    i = info(url)
    if i is None:
        raise FileNotFoundError(f"{url}: no such object")
    return i[0]


def mtime_ns(url: str) -> int:
    i = info(url)
    if i is None:
        raise FileNotFoundError(f"{url}: no such object")
    return i[1]


@_maps_access_errors("read")
def open_read(url: str, block_size: int = 0) -> BinaryIO:
    if url not in _known and _under_listed(url):
        raise FileNotFoundError(f"{url}: no such object")
    fs, path = filesystem(url)
    kw = {"block_size": block_size or READ_BLOCK, "cache_type": "readahead"}
    if url not in _known:
        f = fs.open(path, "rb", **kw)
    else:
        # what the listing said: no HEAD per open (a unit opens its object once, planning once per boundary); s3fs
        # checks each range's ETag against it, so an object rewritten mid-run fails the read instead of mixing
        n, _, etag = _known[url]
        try:
            f = fs.open(path, "rb", size=n, **kw)
        except TypeError:  # a filesystem whose files take no size
            f = fs.open(path, "rb", **kw)
        if hasattr(type(f), "details"):
            f.details = {"name": path, "size": n, "type": "file", **({"ETag": etag} if etag else {})}
    # a BufferedReader on top: the readers use readline(limit), which fsspec's file objects do not take
    return io.BufferedReader(f, buffer_size=min(block_size or READ_BLOCK, 1 << 20))


@_maps_access_errors("list")
def glob(pattern: str) -> List[str]:
    fs, path = filesystem(pattern)
    out = []
    for p, i in fs.glob(path, detail=True).items():
        if i.get("type", "file") == "file":
            u = _url(fs, p)
            _remember(u, i)
            out.append(u)
    return sorted(out)


def _forget(url: str) -> None:
    _known.pop(url, None)


@_maps_access_errors("write")
def write_bytes(url: str, data: bytes) -> None:
    fs, path = filesystem(url)
    fs.pipe_file(path, data)
    _forget(url)
    if _under_listed(url):
        _known[url] = (len(data), time.time_ns(), "")


@_maps_access_errors("write", url_arg=1)
def upload(local: str, url: str) -> None:
    """Upload a finished local file: one PUT below 2 parts, else a multipart upload of ``_part_size`` parts that S3
    assembles only on completion (a killed upload leaves no object, only parts a bucket lifecycle rule expires)."""
    fs, path = filesystem(url)
    n = os.path.getsize(local)
    if hasattr(fs, "split_path"):  # s3fs: its put_file takes the part size
        fs.put_file(local, path, chunksize=_part_size)
    else:
        fs.put_file(local, path)
    _forget(url)
    if _under_listed(url):
        _known[url] = (n, time.time_ns(), "")


@_maps_access_errors("write")
def remove(url: str) -> None:
    if url not in _known and _under_listed(url):
        return
    fs, path = filesystem(url)
    try:
        fs.rm_file(path)
    except FileNotFoundError:
        pass
    _forget(url)


def check_writable(url: str) -> None:
    """Prove an object can be written under ``url`` (and removed); PermissionError names the URL and what to check
    (no credential is ever part of the message: botocore's errors name the operation, not the keys)."""
    probe = join(url, f".write_probe.{socket.gethostname()}.{os.getpid()}")
    try:
        write_bytes(probe, b"ok")
        remove(probe)
    except StorageAccessError as e:  # named after the output, not the probe object
        cause = e.__cause__ or e
        raise (access_error(url, cause, "write", role="output") or e) from cause
    except (OSError, ValueError) as e:
        raise PermissionError(f"output {url} is not writable ({type(e).__name__}: {e}); check the bucket exists, "
                              f"the credentials in your provider chain may write there, and the endpoint "
                              f"({_endpoint()}); or choose another --output") from e


def basename(url: str) -> str:
    return posixpath.basename(url.rstrip("/"))
