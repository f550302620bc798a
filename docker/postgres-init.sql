-- Run once by the postgres image on an empty data volume (/docker-entrypoint-initdb.d/).
-- One server, one database per store, so that no tool's migrations touch another's tables:
--   prefect     the Prefect server's database        (postgresql+asyncpg://.../prefect)
--   mlflow      the MLflow tracking server's store   (postgresql://.../mlflow)
--   pipelinerl  the platform database (Alembic, migrations/)  (postgresql://.../pipelinerl)
-- The owner is POSTGRES_USER (docker-compose.yml). POSTGRES_DB stays 'postgres' so that the image
-- does not create one of these itself and make this script fail.
CREATE DATABASE prefect;
CREATE DATABASE mlflow;
CREATE DATABASE pipelinerl;
