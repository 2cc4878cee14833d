# One image for the exporter (`truegpu exporter`) and the analyzer (`truegpu serve`); see docker-compose.yml.
# NVML needs no driver libraries in the image: the NVIDIA Container Toolkit mounts libnvidia-ml at run time.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY truegpu truegpu
COPY exporter exporter
COPY analyzer analyzer
COPY dashboards dashboards
COPY alerts alerts
COPY fixtures fixtures
RUN pip install --no-cache-dir -e . && truegpu --version \
    && mkdir -p /data && chown 65534:65534 /data
# /data: the analyzer's cost rollups (a named volume takes this owner on first use).
USER 65534:65534
# 9835: exporter /metrics, 9836: analyzer /metrics
EXPOSE 9835 9836
ENTRYPOINT []
CMD ["truegpu", "exporter", "--source", "simulated", "--scenario", "mixed-fleet", "--listen", ":9835"]
