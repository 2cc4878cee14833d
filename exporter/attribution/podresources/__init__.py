"""Kubelet pod-resources v1 API: the .proto and its generated Python stubs.

``api.proto`` is the Kubernetes definition (Apache-2.0, header kept). ``api_pb2.py`` and
``api_pb2_grpc.py`` are generated and committed so the exporter needs no protoc at
install time. Regenerate them (needs the dev dependency grpcio-tools) with::

    .venv/bin/python -m exporter.attribution.podresources.regenerate

The stubs import ``grpc`` and ``google.protobuf``; only import them when Kubernetes
attribution is enabled (``exporter.attribution.kubernetes`` does so lazily).
"""
