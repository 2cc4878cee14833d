FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY truegpu truegpu
COPY exporter exporter
COPY analyzer analyzer
COPY dashboards dashboards
COPY alerts alerts
COPY fixtures fixtures
RUN pip install --no-cache-dir -e .
EXPOSE 9835
ENTRYPOINT []
