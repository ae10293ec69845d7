# MLflow tracking server with the PostgreSQL driver (the upstream image has none).
# Relay logs params, metrics, tags and registry aliases only; model files live in Relay's store.
FROM python:3.11-slim-bookworm
RUN pip install --no-cache-dir mlflow==3.17.2 psycopg2-binary==2.9.13
USER nobody
EXPOSE 5000
