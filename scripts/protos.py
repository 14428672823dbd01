"""Regenerate the pigeon.v1 *_pb2.py modules from their .proto files (run from anywhere):

    python scripts/protos.py

The protos import google/api/annotations.proto (their REST routes), which googleapis-common-protos installs."""

from __future__ import annotations

import glob
import os
import sys

from google.api import annotations_pb2
from grpc_tools import protoc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SITE = os.path.dirname(os.path.dirname(os.path.dirname(annotations_pb2.__file__)))  # holds google/api
STD = os.path.join(os.path.dirname(protoc.__file__), "_proto")


def main() -> int:
    protos = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "pigeon/api/proto/*.proto")))
    for p in protos:
        rc = protoc.main(["protoc", f"-I{ROOT}", f"-I{SITE}", f"-I{STD}", f"--python_out={ROOT}", p])
        if rc != 0:
            print(f"protoc failed on {p}", file=sys.stderr)
            return rc
        print(f"generated {p[:-6]}_pb2.py")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
