"""`shoal fetch URL --sha256 HEX --out PATH`: download a model artifact and check its digest.
A replica pod's init container, for artifacts in an object store: the file streams to
`PATH.part`, hashed as it arrives, and becomes PATH only when its SHA-256 matches, so a
truncated or altered download never becomes a model; a PATH already there with that digest
is kept.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
from pathlib import Path

import httpx

CHUNK = 1 << 20


class FetchError(Exception):
    pass


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def fetch(url: str, sha256: str, out: Path, *, max_bytes: int, timeout_s: float = 60.0) -> bool:
    """Download `url` to `out` unless it is there already; True when it downloaded."""
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise FetchError(f"--sha256 {sha256!r}: 64 lowercase hex digits")
    if not url.startswith(("https://", "http://")):
        raise FetchError(f"{url!r}: only http(s) URLs")
    if out.exists() and sha256_of(out) == sha256:
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    h, size = hashlib.sha256(), 0
    try:
        with httpx.stream("GET", url, timeout=timeout_s, follow_redirects=True) as r:
            if r.status_code != 200:
                raise FetchError(f"GET {url}: {r.status_code}")
            with open(part, "wb") as f:
                for block in r.iter_bytes(CHUNK):
                    size += len(block)
                    if size > max_bytes:
                        raise FetchError(f"{url}: more than {max_bytes} bytes")
                    h.update(block)
                    f.write(block)
        if h.hexdigest() != sha256:
            raise FetchError(f"{url}: sha256 {h.hexdigest()} is not the expected {sha256}")
        os.replace(part, out)
    except httpx.HTTPError as exc:
        raise FetchError(f"GET {url}: {exc}") from None
    finally:
        part.unlink(missing_ok=True)
    return True


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shoal fetch", description=__doc__.splitlines()[0])
    p.add_argument("url")
    p.add_argument("--sha256", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-gib", type=float, default=64.0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        downloaded = fetch(args.url, args.sha256, Path(args.out), max_bytes=int(args.max_gib * 2**30))
    except (FetchError, OSError) as exc:
        print(f"shoal fetch: {exc}", file=sys.stderr)
        return 2
    print(f"{args.out}: {'downloaded' if downloaded else 'already there'}, sha256 {args.sha256}")
    return 0
