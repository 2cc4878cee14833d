"""Fixtures of the exporter tests: a real gRPC pod-resources server on a unix socket (as the kubelet
serves it) and a scripted HTTP peer (a dcgm-exporter page)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from exporter.attribution.podresources import api_pb2_grpc
from tests.exporter.kit import Kubelet
from tests.httpstub import Endpoint


@pytest.fixture
def sockdir() -> Iterator[Path]:
    # Unix socket paths are limited to ~107 bytes; pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="tg-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(sockdir: Path) -> Iterator[tuple[Kubelet, grpc.Server, str]]:
    servicer = Kubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    path = str(sockdir / "kubelet.sock")
    assert server.add_insecure_port(f"unix:{path}") != 0
    server.start()
    yield servicer, server, path
    servicer.release.set()
    server.stop(grace=None)


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    ep = Endpoint()
    yield ep
    ep.close()


@pytest.fixture
def api() -> Iterator:
    """An API server's pods endpoint on loopback (tests.exporter.test_podlabels.ApiServer)."""
    from tests.exporter.test_podlabels import ApiServer

    server = ApiServer()
    server.thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()
